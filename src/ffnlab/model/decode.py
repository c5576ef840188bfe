"""One decoding step: a single new token against the KV cache, in as few NumPy calls as possible.

The same math as forward() (model/transformer.py) for T = 1, with the same kernels in the same
order, so a decoded token's logits and cache entries are forward()'s bits in both arithmetics
(tests/unit/test_decode_is_the_forward.py, every family):
  x = embed(tok)
  per layer:  h = x + [post_attn_norm](wo @ attend(rope(q), rope(k) + cache, v + cache))
              x = h + [post_ffn_norm](ffn(ffn_norm(h)))           (model/ffn.py's ffn_forward_one)
  logits = head @ output_norm(x)
It exists for speed only. Decoding a token streams every weight once (~540 MB of float32 for
SmolLM2), so its time is the matrix-vector products plus the cost of every Python and NumPy call
in between. forward() pays for generality (batches, masks, GQA reshapes, tensor names, hooks,
backward caches): a one-token forward() with nothing hooked took 1.31x this step's time on
SmolLM2 Q4_1 and 1.16x on Gemma 3 Q4_K_M in float32, 1.42x and 1.21x in ggml arithmetic (one
thread, Intel Xeon, 2026-12-02). Here the weights of each layer are looked up once into a Layer
(cached on the Model), there is no batch axis and no mask (a sliding window is the first
position attended), and RMSNorm of a vector, RoPE and the whole attention of a layer are one
compiled call each: ~15 calls per layer where forward() makes ~70.

Model.forward_last uses it for one token when no hooks are attached (model/hooks.py).
"""
import math
from typing import NamedTuple

import numpy as np

from ..families import family
from ..ops.linear import linear_forward
from .arith import F32
from .attention import scales_q
from .ffn import FFNWeights, ffn_forward_one, ffn_weights
from .packing import packed
from .params import lm_head_name
from .transformer import lm_head


class Layer(NamedTuple):
    """One block's weights for decoding (None where the architecture has no such tensor)."""
    attn_norm: tuple                 # (weight, bias or None)
    qkv: np.ndarray | None           # [q_dim + 2*kv_dim, d_model]: packed or GPT-2's fused matrix
    q: np.ndarray | None             # the separate projections when there is no qkv matrix
    k: np.ndarray | None             # (None where q is the packed q/k stack: v's type differs)
    v: np.ndarray | None
    qkv_b: np.ndarray | None         # [q_dim + 2*kv_dim] biases (Qwen2, GPT-2)
    q_norm: np.ndarray | None        # [hd] Gemma 3 per-head norms
    k_norm: np.ndarray | None
    wo: np.ndarray                   # [d_model (+ zero rows, see packing.py), q_dim]
    wo_b: np.ndarray | None
    post_attn_norm: tuple | None
    ffn_norm: tuple
    ffn: FFNWeights                  # with gate_up packed (gated FFNs)
    post_ffn_norm: tuple | None
    window: int                      # sliding window (0: attends to every cached position)
    rope: tuple | None               # (theta, scale)


class Plan(NamedTuple):
    key: tuple                       # ids of the params arrays it was built from
    layers: list
    output_norm: tuple
    head: np.ndarray                 # [vocab, d_model]


def params_key(p):
    return tuple(map(id, p.values()))


def make_plan(p, cfg, packs=None) -> Plan:
    def norm(name):
        return (p[name + ".weight"], p.get(name + ".bias")) if name + ".weight" in p else None

    layers = []
    for il in range(cfg.n_layer):
        blk = f"blk.{il}."
        qkv_names = [blk + f"attn_{w}.weight" for w in "qkv"]
        qkv = p[blk + "attn_qkv.weight"] if cfg.fused_qkv else packed(packs, p, il, "qkv", qkv_names)
        biases = [p.get(blk + f"attn_{w}.bias") for w in "qkv"]
        if cfg.fused_qkv:
            qkv_b = p.get(blk + "attn_qkv.bias")
        elif any(b is not None for b in biases):                      # one vector; zeros where a bias is absent
            dims = (cfg.q_dim, cfg.kv_dim, cfg.kv_dim)
            qkv_b = np.concatenate([b if b is not None else np.zeros(d, p[qkv_names[0]].dtype)
                                    for b, d in zip(biases, dims)])
        else:
            qkv_b = None
        qk = None if qkv is not None or cfg.fused_qkv else packed(packs, p, il, "qk", qkv_names[:2])
        gate_up = packed(packs, p, il, "gate_up", (blk + "ffn_gate.weight", blk + "ffn_up.weight")) if cfg.gated else None
        layers.append(Layer(
            attn_norm=norm(blk + "attn_norm"), qkv=qkv,
            q=None if qkv is not None else _first(qk, p[qkv_names[0]]),
            k=None if qkv is not None or qk is not None else p[qkv_names[1]],
            v=None if qkv is not None else p[qkv_names[2]], qkv_b=qkv_b,
            q_norm=p.get(blk + "attn_q_norm.weight"), k_norm=p.get(blk + "attn_k_norm.weight"),
            wo=_first(packed(packs, p, il, "attn_output", (blk + "attn_output.weight",)), p[blk + "attn_output.weight"]),
            wo_b=p.get(blk + "attn_output.bias"),
            post_attn_norm=norm(blk + "post_attention_norm") if cfg.post_attn_norm else None,
            ffn_norm=norm(blk + "ffn_norm"), ffn=ffn_weights(p, il, gate_up, cfg),
            post_ffn_norm=norm(blk + "post_ffw_norm") if cfg.post_ffn_norm else None,
            window=cfg.sliding_window if cfg.is_sliding(il) else 0,
            rope=cfg.layer_rope(il) if cfg.uses_rope(il) else None))
    return Plan(params_key(p), layers, norm("output_norm"), p[lm_head_name(cfg)])


def _first(*arrays):
    return next(a for a in arrays if a is not None)


def decode_step(p, cfg, plan: Plan, tok, kv, arith=F32):
    """tok: int, kv: KVCache (batch 1) -> logits [vocab] of the token at position kv.n
    arith: model/arith.py's F32 or GGML (its norms, RoPE angles, attention and activations)"""
    n = kv.n
    if n + 1 > kv.n_ctx:
        raise ValueError(f"{n + 1} positions exceed the context length {kv.n_ctx}")
    x = p["token_embd.weight"][tok]                                   # [d_model]
    if cfg.embed_scale:
        x = x * np.asarray(math.sqrt(cfg.d_model), dtype=x.dtype)
    if cfg.embedding_multiplier:                                      # Granite
        x = x * np.asarray(cfg.embedding_multiplier, dtype=x.dtype)
    if cfg.positions == "learned":
        x = x + p["position_embd.weight"][n]
    rotations = {}                                                    # (theta, scale) -> this position's rotation
    for il, L in enumerate(plan.layers):
        if L.rope is not None and L.rope not in rotations:
            rotations[L.rope] = _rotation(n, cfg, L.rope, x.dtype, arith)
        a = _attention(_norm(x, L.attn_norm, cfg, arith), L, cfg, n, kv.k[il][0], kv.v[il][0], rotations.get(L.rope),
                       arith)
        if L.post_attn_norm:
            a = _norm(a, L.post_attn_norm, cfg, arith)
        if cfg.residual_multiplier:                                   # Granite
            a = a * np.asarray(cfg.residual_multiplier, dtype=a.dtype)
        h = x if cfg.parallel_residual else x + a                     # [d_model] residual
        f = ffn_forward_one(_norm(h, L.ffn_norm, cfg, arith), L.ffn, cfg.ffn, arith, family(cfg.arch).graph.fused_gate_up)
        if cfg.parallel_residual:
            x = (f + x) + a                                           # GPT-NeoX: (ffn + x) + attn
            continue
        if L.post_ffn_norm:
            f = _norm(f, L.post_ffn_norm, cfg, arith)
        if cfg.residual_multiplier:
            f = f * np.asarray(cfg.residual_multiplier, dtype=f.dtype)
        x = h + f                                                     # [d_model] residual
    kv.n = n + 1
    return lm_head(_norm(x, plan.output_norm, cfg, arith), plan.head, cfg)[0]   # [d_model] -> [vocab]


def _rotation(n, cfg, key, dtype, arith=F32):
    """RoPE at position n: (cos [n_rot/2], sin [n_rot/2], neox pairing?) for arith.attend1"""
    cos, sin = arith.rope_angles([n], cfg.n_rot, *key)               # [1, n_rot/2] float64 (ggml: float32)
    return cos[0].astype(dtype), sin[0].astype(dtype), cfg.rope_pairing != "normal"


def _norm(x, wb, cfg, arith=F32):
    """x: [D] or [h, D] -> the block's norm with (weight, bias)"""
    if wb is None:                                                    # no such norm (OLMo 2's pre norms)
        return x
    w, b = wb
    if cfg.norm == "layernorm":
        return arith.layer_norm(x, w, b, cfg.norm_eps)[0]
    if x.ndim == 1 and x.dtype == np.float32:                         # one compiled call, the forward's bits
        return arith.rms_norm1(x, w, cfg.norm_eps)
    return arith.rms_norm(x, w, cfg.norm_eps)[0]                      # per head (Gemma 3's q/k norms)


def _attention(x, L, cfg, n, K, V, rot, arith=F32):
    """x: [d_model] (attn_norm output), K/V: this layer's cache [Hkv, n_ctx, hd] -> [d_model];
    writes position n's key and value into K and V."""
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    if L.qkv is not None:
        qkv = linear_forward(x, L.qkv)                                # [q_dim + 2*kv_dim]: one product
    else:
        qkv = np.concatenate([linear_forward(x, w) for w in (L.q, L.k, L.v) if w is not None])
    if L.qkv_b is not None:
        qkv += L.qkv_b
    qk = qkv[:(H + Hkv) * hd].reshape(H + Hkv, hd)                    # q heads, then k heads
    v = qkv[(H + Hkv) * hd:].reshape(Hkv, hd)
    if L.q_norm is not None and cfg.qk_norm_full:                    # OLMoE: one norm over all q (k) heads
        qk = np.concatenate([_norm(qk[:H].reshape(-1), (L.q_norm, None), cfg, arith).reshape(H, hd),
                             _norm(qk[H:].reshape(-1), (L.k_norm, None), cfg, arith).reshape(Hkv, hd)])
    elif L.q_norm is not None:                                        # Gemma 3, Qwen3: RMS-norm each head
        qk = np.concatenate([_norm(qk[:H], (L.q_norm, None), cfg, arith), _norm(qk[H:], (L.k_norm, None), cfg, arith)])
    out = arith.attend1(qk, v, rot, K, V, n, L.window, cfg, scales_q(cfg))   # [H, hd]; writes position n
    y = linear_forward(out.reshape(H * hd), L.wo)[:cfg.d_model]      # [q_dim] -> [d_model (+ padding)]
    if L.wo_b is not None:
        y += L.wo_b
    return y
