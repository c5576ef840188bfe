"""One decoding step: a single new token against the KV cache, in as few NumPy calls as possible.

The same math as forward() (model/transformer.py) for T = 1, with the same kernels in the same
order, so a decoded token's logits and cache entries are forward()'s bits in both arithmetics
(tests/unit/test_decode_is_the_forward.py, every family):
  x = embed(tok)
  per layer:  h = x + [post_attn_norm](wo @ attend(rope(q), rope(k) + cache, v + cache))
              x = h + [post_ffn_norm](ffn(ffn_norm(h)))           (model/ffn.py's ffn_forward, on one row)
  logits = head @ output_norm(x)
It exists for speed only. Decoding a token streams every weight once (~540 MB of float32 for
SmolLM2), so its time is the matrix-vector products plus the cost of every Python and NumPy call
in between. forward() pays for generality (batches, masks, GQA reshapes, tensor names, hooks,
backward caches): a one-token forward() with nothing hooked took 1.31x this step's time on
SmolLM2 Q4_1 and 1.16x on Gemma 3 Q4_K_M in float32, 1.42x and 1.21x in ggml arithmetic (one
thread, Intel Xeon, 2026-12-02). Here the weights are the model's records (model/weights.py,
read once and kept on the Model), there is no batch axis and no mask (a sliding window is the
first position attended), and RMSNorm of a vector, RoPE and the whole attention of a layer are
one compiled call each.

Model.forward_last uses it for one token when no hooks are attached (model/hooks.py).
"""
import math

import numpy as np

from ..families import family
from ..ops.linear import linear_forward
from .arith import F32
from .attention import scales_q
from .ffn import ffn_forward
from .transformer import lm_head


def decode_step(weights, cfg, tok, kv, arith=F32):
    """weights: model/weights.py's Weights, tok: int, kv: KVCache (batch 1) -> logits [vocab] of the
    token at position kv.n
    arith: model/arith.py's F32 or GGML (its norms, RoPE angles, attention and activations)"""
    n = kv.n
    if n + 1 > kv.n_ctx:
        raise ValueError(f"{n + 1} positions exceed the context length {kv.n_ctx}")
    x = weights.token_embd[tok]                                       # [d_model]
    if cfg.embed_scale:
        x = x * np.asarray(math.sqrt(cfg.d_model), dtype=x.dtype)
    if cfg.embedding_multiplier:                                      # Granite
        x = x * np.asarray(cfg.embedding_multiplier, dtype=x.dtype)
    if cfg.positions == "learned":
        x = x + weights.position_embd[n]
    rotations = {}                                                    # (theta, scale) -> this position's rotation
    graph = family(cfg.arch).graph
    q_scaled = scales_q(cfg)                                          # Gemma: q times the scale after RoPE
    for L in weights.layers:
        if L.rope is not None and L.rope not in rotations:
            rotations[L.rope] = _rotation(n, cfg, L.rope, x.dtype, arith)
        a = _attention(_norm(x, L.attn_norm, cfg, arith), L, cfg, n, kv.k[L.il][0], kv.v[L.il][0],
                       rotations.get(L.rope), q_scaled, arith)
        if L.post_attn_norm:
            a = _norm(a, L.post_attn_norm, cfg, arith)
        if cfg.residual_multiplier:                                   # Granite
            a = a * np.asarray(cfg.residual_multiplier, dtype=a.dtype)
        h = x if cfg.parallel_residual else x + a                     # [d_model] residual
        f_in = _norm(h, L.ffn_norm, cfg, arith)                       # [d_model] (the experts route rows: [1, d_model])
        f = ffn_forward(f_in if L.moe is None else f_in[None], L.ffn, cfg.ffn, fused_gate_up=graph.fused_gate_up,
                        arith=arith)[0].reshape(-1)                   # -> [d_model]
        if cfg.parallel_residual:
            x = (f + x) + a                                           # GPT-NeoX: (ffn + x) + attn
            continue
        if L.post_ffn_norm:
            f = _norm(f, L.post_ffn_norm, cfg, arith)
        if cfg.residual_multiplier:
            f = f * np.asarray(cfg.residual_multiplier, dtype=f.dtype)
        x = h + f                                                     # [d_model] residual
    kv.n = n + 1
    return lm_head(_norm(x, weights.output_norm, cfg, arith), weights.head, cfg)[0]   # [d_model] -> [vocab]


def _rotation(n, cfg, key, dtype, arith=F32):
    """RoPE at position n: (cos [n_rot/2], sin [n_rot/2], neox pairing?) for arith.attend1"""
    cos, sin = arith.rope_angles([n], cfg.n_rot, *key)               # [1, n_rot/2] float64 (ggml: float32)
    return cos[0].astype(dtype), sin[0].astype(dtype), cfg.rope_pairing != "normal"


def _norm(x, n, cfg, arith=F32):
    """x: [D] or [h, D] -> the block's norm with n: model/weights.py's Norm (or (weight, None))"""
    if n is None:                                                     # no such norm (OLMo 2's pre norms)
        return x
    w, b = n[0], n[1]
    if cfg.norm == "layernorm":
        return arith.layer_norm(x, w, b, cfg.norm_eps)[0]
    if x.ndim == 1 and x.dtype == np.float32:                         # one compiled call, the forward's bits
        return arith.rms_norm1(x, w, cfg.norm_eps)
    return arith.rms_norm(x, w, cfg.norm_eps)[0]                      # per head (Gemma 3's q/k norms)


def _attention(x, L, cfg, n, K, V, rot, q_scaled, arith=F32):
    """x: [d_model] (attn_norm output), L: the layer's LayerWeights, K/V: this layer's cache
    [Hkv, n_ctx, hd], rot: position n's rotation or None, q_scaled: the graph scales q (scales_q)
    -> [d_model]; writes position n's key and value into K and V."""
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    if len(L.qkv) == 1:
        qkv = linear_forward(x, L.qkv[0][0])                          # [q_dim + 2*kv_dim]: one product
    else:
        qkv = np.concatenate([linear_forward(x, w) for w, _ in L.qkv])
    # the biases of the parts that have one, read from the records: an update in place shows
    for b, r in ((L.wqkv_b, 0),) if cfg.fused_qkv else ((L.q_b, 0), (L.k_b, H * hd), (L.v_b, (H + Hkv) * hd)):
        if b is not None:
            qkv[r:r + b.shape[0]] += b
    qk = qkv[:(H + Hkv) * hd].reshape(H + Hkv, hd)                    # q heads, then k heads
    v = qkv[(H + Hkv) * hd:].reshape(Hkv, hd)
    if L.q_norm is not None and cfg.qk_norm_full:                    # OLMoE: one norm over all q (k) heads
        qk = np.concatenate([_norm(qk[:H].reshape(-1), (L.q_norm, None), cfg, arith).reshape(H, hd),
                             _norm(qk[H:].reshape(-1), (L.k_norm, None), cfg, arith).reshape(Hkv, hd)])
    elif L.q_norm is not None:                                        # Gemma 3, Qwen3: RMS-norm each head
        qk = np.concatenate([_norm(qk[:H], (L.q_norm, None), cfg, arith), _norm(qk[H:], (L.k_norm, None), cfg, arith)])
    out = arith.attend1(qk, v, rot, K, V, n, L.window, cfg, q_scaled)     # [H, hd]; writes position n
    y = linear_forward(out.reshape(H * hd), L.wo_padded)[:cfg.d_model]      # [q_dim] -> [d_model (+ padding)]
    if L.wo_b is not None:
        y += L.wo_b
    return y
