"""The attention sub-layer: q/k/v projections, optional q/k norms, RoPE, causal attention, output projection.

Weight names are the GGUF tensor names of one block (attn_q, attn_k, attn_v or fused attn_qkv,
attn_q_norm, attn_k_norm, attn_output). Trace names follow llama.cpp's graph (Qcur, Kcur, Vcur,
kq, kq_soft_max, kqv, kqv_out, attn_out).
"""
import numpy as np

from ..ops.attention import attention_backward, attention_forward
from ..ops.linear import linear_backward, linear_forward
from ..ops.norms import rmsnorm_backward, rmsnorm_forward
from ..ops.rope import rope_angles, rope_backward, rope_forward


class KVCache:
    """Keys and values of the positions seen so far, per layer: [B, n_ctx, Hkv, hd] each.

    Keys are stored after RoPE, so a new token only rotates its own key."""

    def __init__(self, cfg, batch=1, dtype=np.float32, n_ctx=None):
        n_ctx = n_ctx or cfg.n_ctx
        shape = (batch, n_ctx, cfg.n_kv_head, cfg.head_dim)
        self.k = [np.zeros(shape, dtype) for _ in range(cfg.n_layer)]
        self.v = [np.zeros(shape, dtype) for _ in range(cfg.n_layer)]
        self.n_ctx = n_ctx
        self.n = 0                      # positions filled (the next token's position)

    def clear(self):
        self.n = 0


def _lin(x, p, wname, bname):
    return linear_forward(x, p[wname], p.get(bname))


def attention_forward_layer(x, p, cfg, il, pos, allowed, kv=None, emit=None):
    """x: [B, T, d_model] (attn_norm output), pos: [T] absolute positions, allowed: [T, S] mask
    -> out [B, T, d_model], cache for the backward.

    kv: a KVCache to append to (inference); its first kv.n positions are the past.
    """
    B, T, _ = x.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    blk = f"blk.{il}."
    if cfg.fused_qkv:
        qkv = _lin(x, p, blk + "attn_qkv.weight", blk + "attn_qkv.bias")        # [B, T, 3*d_model]
        if emit:
            emit("wqkv", "MUL_MAT", linear_forward(x, p[blk + "attn_qkv.weight"]), (blk + "attn_qkv.weight", "attn_norm"))
            if blk + "attn_qkv.bias" in p:
                emit("bqkv", "ADD", qkv, ("wqkv", blk + "attn_qkv.bias"))
        q, k, v = np.split(qkv, [cfg.q_dim, cfg.q_dim + cfg.kv_dim], axis=-1)
        src = "bqkv" if blk + "attn_qkv.bias" in p else "wqkv"
        q, k, v = q.reshape(B, T, H, hd), k.reshape(B, T, Hkv, hd), v.reshape(B, T, Hkv, hd)
        if emit:
            emit("Qcur", "VIEW", q, (src,))
            emit("Kcur", "VIEW", k, (src,))
            emit("Vcur", "VIEW", v, (src,))
    else:
        q = _proj(x, p, blk, "q", "Qcur", emit).reshape(B, T, H, hd)            # [B, T, H, hd]
        k = _proj(x, p, blk, "k", "Kcur", emit).reshape(B, T, Hkv, hd)          # [B, T, Hkv, hd]
        v = _proj(x, p, blk, "v", "Vcur", emit).reshape(B, T, Hkv, hd)          # [B, T, Hkv, hd]
        if emit:
            emit("Qcur", "RESHAPE", q, ("Qcur",))
            emit("Kcur", "RESHAPE", k, ("Kcur",))
            emit("Vcur", "RESHAPE", v, ("Vcur",))
    q_pre, k_pre = q, k
    qn_cache = kn_cache = None
    if cfg.qk_norm:
        # Gemma 3: RMS-norm each head's query and key vector (over hd) before RoPE
        q, qn_cache = rmsnorm_forward(q, p[blk + "attn_q_norm.weight"], cfg.norm_eps)
        if emit: emit("Qcur_normed", "MUL", q, ("norm", blk + "attn_q_norm.weight"))
        k, kn_cache = rmsnorm_forward(k, p[blk + "attn_k_norm.weight"], cfg.norm_eps)
        if emit: emit("Kcur_normed", "MUL", k, ("norm", blk + "attn_k_norm.weight"))
    cos = sin = None
    if cfg.positions == "rope":
        cos, sin = rope_angles(pos, hd, cfg.layer_rope_theta(il), cfg.layer_rope_scale(il))
        q = rope_forward(q, cos, sin, cfg.rope_pairing)
        k = rope_forward(k, cos, sin, cfg.rope_pairing)
        if emit:
            emit("Qcur", "ROPE", q, ("Qcur_normed" if cfg.qk_norm else "Qcur", "inp_pos"))
            emit("Kcur", "ROPE", k, ("Kcur_normed" if cfg.qk_norm else "Kcur", "inp_pos"))
    k_all, v_all = k, v
    if kv is not None:
        n0 = kv.n
        kv.k[il][:B, n0:n0 + T] = k
        kv.v[il][:B, n0:n0 + T] = v
        k_all = kv.k[il][:B, :n0 + T]                                            # [B, S, Hkv, hd]
        v_all = kv.v[il][:B, :n0 + T]
    out, (kq, probs) = attention_forward(q, k_all, v_all, cfg.scale, allowed)   # out [B, H, T, hd]
    if emit:
        emit("kq", "MUL_MAT", kq, ("k", "q"))
        emit("kq_soft_max", "SOFT_MAX", probs, ("kq", "kq_mask"))
        emit("kqv", "MUL_MAT", out, ("v", "kq_soft_max"))
    merged = out.transpose(0, 2, 1, 3).reshape(B, T, H * hd)                     # [B, H, T, hd] -> [B, T, H*hd]
    if emit: emit("kqv_out", "CONT", merged, ("kqv_merged",))
    wo, bo = blk + "attn_output.weight", blk + "attn_output.bias"
    y = linear_forward(merged, p[wo])                                             # [B, T, H*hd] -> [B, T, d_model]
    if bo in p:
        if emit: emit("kqv_wo", "MUL_MAT", y, (wo, "kqv_out"))
        y += p[bo]
        if emit: emit("attn_out", "ADD", y, ("kqv_wo", bo))
    elif emit:
        emit("attn_out", "MUL_MAT", y, (wo, "kqv_out"))
    cache = (x, q_pre, k_pre, qn_cache, kn_cache, q, k, v, cos, sin, probs, merged)
    return y, cache


def _proj(x, p, blk, which, node, emit):
    w, b = blk + f"attn_{which}.weight", blk + f"attn_{which}.bias"
    y = linear_forward(x, p[w])
    if emit: emit(node, "MUL_MAT", y, (w, "attn_norm"))
    if b in p:
        y += p[b]
        if emit: emit(node, "ADD", y, (node, b))
    return y


def attention_backward_layer(dy, p, cfg, il, cache):
    """dy: [B, T, d_model] -> dx [B, T, d_model], grads {tensor name: array}"""
    x, q_pre, k_pre, qn_cache, kn_cache, q, k, v, cos, sin, probs, merged = cache
    B, T, _ = x.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    blk = f"blk.{il}."
    g = {}
    wo, bo = blk + "attn_output.weight", blk + "attn_output.bias"
    dmerged, g[wo], db = linear_backward(dy, merged, p[wo], bo in p)
    if db is not None:
        g[bo] = db
    dout = dmerged.reshape(B, T, H, hd).transpose(0, 2, 1, 3)                  # [B, H, T, hd]
    dq, dk, dv = attention_backward(dout, q, k, v, probs, cfg.scale)
    if cfg.positions == "rope":
        dq = rope_backward(dq, cos, sin, cfg.rope_pairing)
        dk = rope_backward(dk, cos, sin, cfg.rope_pairing)
    if cfg.qk_norm:
        dq, g[blk + "attn_q_norm.weight"] = rmsnorm_backward(dq, p[blk + "attn_q_norm.weight"], qn_cache)
        dk, g[blk + "attn_k_norm.weight"] = rmsnorm_backward(dk, p[blk + "attn_k_norm.weight"], kn_cache)
    dq, dk, dv = dq.reshape(B, T, -1), dk.reshape(B, T, -1), dv.reshape(B, T, -1)
    if cfg.fused_qkv:
        dqkv = np.concatenate([dq, dk, dv], axis=-1)                             # [B, T, 3*d_model]
        w, b = blk + "attn_qkv.weight", blk + "attn_qkv.bias"
        dx, g[w], db = linear_backward(dqkv, x, p[w], b in p)
        if db is not None:
            g[b] = db
        return dx, g
    dx = None
    for which, d in (("q", dq), ("k", dk), ("v", dv)):
        w, b = blk + f"attn_{which}.weight", blk + f"attn_{which}.bias"
        dxi, g[w], db = linear_backward(d, x, p[w], b in p)
        if db is not None:
            g[b] = db
        dx = dxi if dx is None else dx + dxi
    return dx, g
