"""Arithmetic: one setting, chosen at load, that says how the graph's numbers are computed.

  f32   float32 everywhere, weights dequantized exactly: the HF / PyTorch reference
  ggml  llama.cpp's CPU backend on this CPU's code path (quant/ggml_path.py: AVX-512, AVX2 or
        scalar), run with flash attention off, an f16 K/V cache and no weight repacking:
        activations quantized to 8-bit blocks before each quantized product and integer dot
        products (quant/ggml_kernels.py, selected in the QuantTensor at load); K and V kept in
        f16 and q rounded to f16 for KQ, the softmax output rounded to f16 for KQV; ggml's exp,
        SiLU, GELU table, softmax, norms and RoPE angles (ops/ggml_math.py)

Each arithmetic is a kernel set, chosen once when the model is made: the block code takes an
Arith and calls its functions; it never asks which one it has. The reference set of each
arithmetic computes every node the tracer and the editors see (and the values training
differentiates); its fused set (fused()) replaces runs of nodes by one compiled call where
nothing observes them: the forward takes it when no hook is attached. f32's fused set has the
prompt's attention over the KV cache (attend_rows), one query row's (attend_one) and the q/k
norm + RoPE + scale pass (qk_rows); ggml's is its reference set.
"""
from typing import Callable, NamedTuple

import numpy as np

from ..ops import ggml_decode, ggml_math
from ..ops.activations import ACTIVATIONS, GELU_TANH_COEF, SQRT_2_OVER_PI
from ..ops.attention import attention_mix, attention_probs, attention_scores
from ..ops.fastmath import glu_rows, qk_rows
from ..ops.norms import layernorm_forward, rmsnorm_forward
from ..ops.rope import rope_angles, rope_forward
from ..quant import ggml_path
from ..quant.blocks import F16_TABLE
from .decode_kernels import attend_one, attend_rows, rms_norm1, rope_step


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
    attend1: Callable           # (qk [H+Hkv, hd] normed, v [Hkv, hd], rot, K, V, n, window, cfg, q_scaled) -> [H, hd]:
                                # one token's attention for model/decode.py, with the forward's bits
    glu: Callable | None        # (gate, up, gelu, gu) -> act(gate), act(gate) * up in one pass (glu_halves)
    qk_rows: Callable | None    # fused sets: ops/fastmath.py's qk_rows (head norm, RoPE, q scale in one pass)
    attend_one: Callable | None   # fused sets: decode_kernels.attend_one (one query row over the cache)
    attend_rows: Callable | None  # fused sets: decode_kernels.attend_rows (a prompt's rows over the cache)


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


def _ggml_attend1(qk, v, rot, K, V, n, window, cfg, q_scaled):
    """One token's attention as forward() computes it in ggml mode for T = 1 (model/decode.py's
    fast path): qk [H + Hkv, hd] (normed, not rotated), v [Hkv, hd], rot: (cos, sin, neox) of
    position n or None, K / V: this layer's f16 cache [Hkv, n_ctx, hd] (position n written here),
    positions lo..n attended, q_scaled: Gemma's q scaled after RoPE -> [H, hd]. The rows keep
    positions 0..n with -inf before lo, as forward()'s mask does: ggml's softmax sums in groups
    of 8 from position 0, and the f16 dots in groups of 32, so slicing the window would move them."""
    H, Hkv, hd = qk.shape[0] - v.shape[0], v.shape[0], v.shape[1]
    lo = max(0, n - window + 1) if window else 0                    # a sliding window: positions lo..n
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


def qk_in_one_pass(cfg, dtype):
    """whether qk_rows (and the one-token step's rope_step, its loop) computes this config's q/k head
    norm, RoPE and q scale: float32, the normal or NeoX pairing, per-head norms (not OLMoE's norm
    over all heads). The forward and the step take the same path by it, so they keep the same bits."""
    return dtype == np.float32 and not cfg.qk_norm_full and cfg.rope_pairing in ("normal", "neox")


def _f32_attend1(qk, v, rot, K, V, n, window, cfg, q_scaled):
    """One token's attention in float32 as the forward computes it for a one-token step with
    nothing hooked (the fused set: RoPE and Gemma's q scale as qk_rows, the cache written,
    attend_one), so a decoded token has the forward's bits -> [H, hd]"""
    H, hd, scale = qk.shape[0] - v.shape[0], qk.shape[1], cfg.scale
    if rot is not None and qk_in_one_pass(cfg, qk.dtype):
        q = np.empty((1, H, hd), np.float32)                        # qk_rows on q and k, the cache write
        rope_step(qk.reshape(1, H + v.shape[0], hd), v, rot[0][None], rot[1][None], cfg.rope_pairing == "neox",
                  np.float32(scale), q_scaled, K, V, n, q)
        q = q[0]
    else:                                                           # the reference ops (OLMoE's q/k norm, GLM's pairs)
        q, k = qk[:H], qk[H:]
        if rot is not None:
            q, k = _rope(q, rot, cfg), _rope(k, rot, cfg)
        if q_scaled:
            q = q * np.asarray(scale, dtype=q.dtype)
        K[:, n], V[:, n] = k, v
        q = np.ascontiguousarray(q)
    f = q.dtype.type
    out = np.empty((H, hd), q.dtype)
    attend_one(q, K, V, n, max(0, n - window + 1) if window else 0, f(1.0 if q_scaled else scale),
               f(cfg.attn_softcap or 0.0), out)                    # Gemma: q was scaled already
    return out


def _rope(a, rot, cfg):
    """a [h, hd] q or k of one position rotated by rot's angles, as the forward's reference ops"""
    h, hd = a.shape
    return rope_forward(a.reshape(1, 1, h, hd), rot[0][None], rot[1][None], cfg.rope_pairing).reshape(h, hd)


def glu_halves(gate, up, gelu, gu=None):
    """gate, up [..., d_ff] float32 -> act(gate), act(gate) * up, each [..., d_ff], in one compiled
    pass (ops/fastmath.py's glu_rows; SiLU, or GELU's tanh form). gu: the [..., 2 d_ff] = [gate, up]
    product whose halves gate and up are (read in place), or None: gate and up are C-ordered arrays."""
    d = gate.shape[-1]
    if gu is not None:
        g2 = u2 = gu.reshape(-1, 2 * d)
        u_off = d
    else:
        g2, u2, u_off = gate.reshape(-1, d), up.reshape(-1, d), 0
    act, h = np.empty((g2.shape[0], d), np.float32), np.empty((g2.shape[0], d), np.float32)
    glu_rows(g2, 0, u2, u_off, gelu, np.float32(SQRT_2_OVER_PI), np.float32(GELU_TANH_COEF), act, h)
    return act.reshape(gate.shape), h.reshape(gate.shape)


F32 = Arith("f32", rmsnorm_forward, layernorm_forward, rope_angles, rope_forward, attention_scores, attention_probs,
            attention_mix, {k: a.forward for k, a in ACTIVATIONS.items()}, np.float32, rms_norm1, _f32_attend1,
            glu_halves, None, None, None)

GGML = Arith("ggml", ggml_math.rms_norm, ggml_math.layer_norm, ggml_math.rope_angles, ggml_math.rope, _ggml_kq,
             ggml_math.soft_max, _ggml_kqv, {**F32.act, "silu": ggml_math.silu, "gelu_tanh": ggml_math.gelu}, np.float16,
             ggml_decode.rms_norm1, _ggml_attend1, None, None, None, None)

ARITH = {"f32": F32, "ggml": GGML}
FUSED = {"f32": F32._replace(qk_rows=qk_rows, attend_one=attend_one, attend_rows=attend_rows), "ggml": GGML}


def fused(arith):
    """arith's fused kernel set: what the forward runs when nothing observes its nodes"""
    return FUSED[arith.name]


def arith_named(name):
    """"f32" | "ggml" -> Arith"""
    if name not in ARITH:
        raise ValueError(f"arith must be one of {', '.join(ARITH)}, not {name!r}")
    if name == "ggml" and ggml_path.PATH_ERROR is not None:      # FFNLAB_GGML_PATH asks for what this CPU lacks
        raise ggml_path.PATH_ERROR
    return ARITH[name]
