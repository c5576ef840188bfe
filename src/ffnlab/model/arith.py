"""Arithmetic: one setting, chosen at load, that says how the graph's numbers are computed.

  f32   float32 everywhere, weights dequantized exactly: the HF / PyTorch reference
  ggml  llama.cpp's CPU backend on this CPU's code path (quant/ggml_path.py: AVX-512, AVX2 or
        scalar), run with flash attention off, an f16 K/V cache and no weight repacking:
        activations quantized to 8-bit blocks before each quantized product and integer dot
        products (quant/ggml_kernels.py, selected in the QuantTensor at load); K and V kept in
        f16 and q rounded to f16 for KQ, the softmax output rounded to f16 for KQV; ggml's exp,
        SiLU, GELU table, softmax, norms and RoPE angles (ops/ggml_math.py)

The block code takes an Arith and calls its functions; it never asks which one it has.
"""
from typing import Callable, NamedTuple

import numpy as np

from ..ops import ggml_decode, ggml_math
from ..ops.activations import ACTIVATIONS
from ..ops.attention import attention_mix, attention_probs, attention_scores
from ..ops.norms import layernorm_forward, rmsnorm_forward
from ..ops.rope import rope_angles, rope_forward
from ..quant import ggml_path
from ..quant.blocks import F16_TABLE
from .decode_kernels import rms_norm1


class Arith(NamedTuple):
    name: str
    rms_norm: Callable          # (x [..., D], w [D] or None, eps) -> y, (x_hat, rstd)
    layer_norm: Callable        # (x, w, b, eps) -> y, (x_hat, rstd)
    rope_angles: Callable       # (pos [T], head_dim, theta, scale) -> cos, sin [T, hd/2]
    rope: Callable              # (x [..., T, H, hd], cos, sin, pairing) -> rotated x
    kq: Callable                # (q [B, T, H, hd], k [B, S, Hkv, hd]) -> raw scores [B, H, T, S]
    soft_max: Callable          # (kq, scale, allowed [T, S] or None) -> probs [B, H, T, S]
    kqv: Callable               # (probs, v [B, S, Hkv, hd]) -> [B, H, T, hd]
    act: dict                   # activation name (ops/activations.py) -> forward function
    kv_dtype: type              # what the KV cache stores
    rms_norm1: Callable         # (x [D], w [D], eps) -> y: one vector's RMSNorm, one compiled call (model/decode.py)
    attend1: Callable | None    # one token's attention for model/decode.py (None: decode_kernels.attend1)


def _ggml_kq(q, k):
    """q: [B, T, H, hd], k: [B, S, Hkv, hd] -> [B, H, T, S]. ggml_mul_mat(k, q): k is f16 (the
    cache), so q is converted to f16 (the vec_dot_type of F16); the f16 x f16 products are exact
    in float32 and summed in tinyBLAS's lanes (ops/ggml_math.py's f16_matmul)"""
    B, T, H, hd = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    qg = q.reshape(B, T, Hkv, H // Hkv, hd).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, H // Hkv * T, hd)
    kq = ggml_math.f16_matmul(k.transpose(0, 2, 1, 3), qg, T, "m")           # [B, Hkv, G*T, S]
    return kq.reshape(B, H, T, S)


def _ggml_kqv(probs, v):
    """probs: [B, H, T, S], v: [B, S, Hkv, hd] -> [B, H, T, hd]. ggml_mul_mat(v, kq_soft_max):
    v is f16 (stored transposed), so the probabilities are rounded to f16 first"""
    B, H, T, S = probs.shape
    Hkv, hd = v.shape[2], v.shape[3]
    out = ggml_math.f16_matmul(v.transpose(0, 2, 3, 1), probs.reshape(B, Hkv, H // Hkv * T, S), T, "k")   # [B, Hkv, G*T, hd]
    return out.reshape(B, H, T, hd)


def _ggml_attend1(qk, v, rot, K, V, n, lo, cfg, q_scaled):
    """One token's attention as forward() computes it in ggml mode for T = 1 (model/decode.py's
    fast path): qk [H + Hkv, hd] (normed, not rotated), v [Hkv, hd], rot: (cos, sin, neox) of
    position n or None, K / V: this layer's f16 cache [Hkv, n_ctx, hd] (position n written here),
    positions lo..n attended, q_scaled: Gemma's q scaled after RoPE -> [H, hd]. The rows keep
    positions 0..n with -inf before lo, as forward()'s mask does: ggml's softmax sums in groups
    of 8 from position 0, and the f16 dots in groups of 32, so slicing the window would move them."""
    H, Hkv, hd = qk.shape[0] - v.shape[0], v.shape[0], v.shape[1]
    if rot is not None:
        qk = np.array(qk, np.float32)
        ggml_decode.rope1(qk[:, :2 * rot[0].shape[0]], rot[0], rot[1], rot[2])
    q, scale = qk[:H], cfg.scale
    if q_scaled:
        q, scale = q * np.asarray(scale, dtype=q.dtype), 1.0
    K[:, n], V[:, n] = qk[H:], v                                     # rounded to f16 by the cache
    if cfg.attn_softcap:                                            # Gemma 2: the general ops
        kq = ggml_math.f16_matmul(K[:, :n + 1], q.reshape(Hkv, H // Hkv, hd), 1, "m")   # [Hkv, G, S]: ggml_vec_dot_f16
        c = cfg.attn_softcap
        kq = np.tanh(kq * np.asarray(scale / c, dtype=kq.dtype)) * np.asarray(c, dtype=kq.dtype)
        allowed = (np.arange(n + 1) >= lo)[None] if lo else None      # [1, S]
        probs = ggml_math.soft_max(kq, 1.0, allowed)                 # [Hkv, G, S]
        return ggml_math.f16_matmul(V[:, :n + 1].transpose(0, 2, 1), probs, 1, "k").reshape(H, hd)   # [Hkv, G, hd]
    out = np.empty((H, hd), np.float32)
    ggml_decode.attend1(np.ascontiguousarray(q, np.float32), K.view(np.uint16), V.view(np.uint16), F16_TABLE, n, lo,
                        scale, out, ggml_path.LANES[ggml_path.PATH])
    return out


F32 = Arith("f32", rmsnorm_forward, layernorm_forward, rope_angles, rope_forward, attention_scores, attention_probs,
            attention_mix, {k: a.forward for k, a in ACTIVATIONS.items()}, np.float32, rms_norm1, None)

GGML = Arith("ggml", ggml_math.rms_norm, ggml_math.layer_norm, ggml_math.rope_angles, ggml_math.rope, _ggml_kq, ggml_math.soft_max,
             _ggml_kqv, {**F32.act, "silu": ggml_math.silu, "gelu_tanh": ggml_math.gelu}, np.float16, ggml_decode.rms_norm1, _ggml_attend1)

ARITH = {"f32": F32, "ggml": GGML}


def arith_named(name):
    """"f32" | "ggml" -> Arith"""
    if name not in ARITH:
        raise ValueError(f"arith must be one of {', '.join(ARITH)}, not {name!r}")
    if name == "ggml" and ggml_path.PATH_ERROR is not None:      # FFNLAB_GGML_PATH asks for what this CPU lacks
        raise ggml_path.PATH_ERROR
    return ARITH[name]
