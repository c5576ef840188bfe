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
from .packing import packed


class KVCache:
    """Keys and values of the positions seen so far, per layer: [B, Hkv, n_ctx, hd] each.

    Head-major, so each head's keys are one contiguous [S, hd] block that BLAS multiplies
    directly. Keys are stored after RoPE, so a new token only rotates its own key."""

    def __init__(self, cfg, batch=1, dtype=np.float32, n_ctx=None):
        n_ctx = n_ctx or cfg.n_ctx
        shape = (batch, cfg.n_kv_head, n_ctx, cfg.head_dim)
        self.k = [np.zeros(shape, dtype) for _ in range(cfg.n_layer)]
        self.v = [np.zeros(shape, dtype) for _ in range(cfg.n_layer)]
        self.n_ctx = n_ctx
        self.n = 0                      # positions filled (the next token's position)

    def clear(self):
        self.n = 0


def qkv_order(cfg):
    """The order llama.cpp evaluates the three projections in (eval-callback order): build_attn
    expands q, v, k for the plain KV cache, but q, k, v for Gemma 3's sliding-window cache."""
    return ("q", "k", "v") if cfg.sliding_window else ("q", "v", "k")


def attention_forward_layer(x, p, cfg, il, pos, allowed, kv=None, emit=None, rope=None, packs=None):
    """x: [B, T, d_model] (attn_norm output), pos: [T] absolute positions, allowed: [T, S] mask
    (None: nothing masked) -> out [B, T, d_model], cache for the backward.

    kv: a KVCache to append to (inference); its first kv.n positions are the past.
    rope: precomputed (cos, sin) for pos (the model computes them once per forward).
    packs: packed q/k/v buffers (model/packing.py) for one matmul instead of three.
    """
    B, T, _ = x.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    blk = f"blk.{il}."
    heads = {"q": H, "k": Hkv, "v": Hkv}
    node = {"q": "Qcur", "k": "Kcur", "v": "Vcur"}
    if cfg.positions == "rope":
        cos, sin = rope if rope is not None else rope_angles(pos, hd, cfg.layer_rope_theta(il), cfg.layer_rope_scale(il))
    else:
        cos = sin = None
    qkv_w = [blk + f"attn_{w}.weight" for w in "qkv"]
    buf = None if cfg.fused_qkv else packed(packs, p, il, "qkv", qkv_w)
    if cfg.fused_qkv:
        qkv = _fused_qkv(x, p, blk, emit)                                          # [B, T, q_dim + 2*kv_dim]
        parts = _split_qkv(qkv, cfg)
    elif buf is not None:
        qkv = linear_forward(x, buf)                                               # one matmul: [B, T, q_dim + 2*kv_dim]
        parts = _split_qkv(qkv, cfg)
    t = {}          # per projection: (pre-norm [B,T,h,hd], norm cache, post-rope [B,T,h,hd])
    for which in qkv_order(cfg):
        name = node[which]
        if cfg.fused_qkv:
            a = parts[which].reshape(B, T, heads[which], hd)
            if emit: emit(name, "VIEW", a, ("wqkv_b" if blk + "attn_qkv.bias" in p else "wqkv",))
        else:
            a = _proj(x, p, blk, which, name, emit, parts[which] if buf is not None else None)
            a = a.reshape(B, T, heads[which], hd)                                     # [B, T, h, hd]
            if emit: emit(name, "RESHAPE", a, (name,))
        pre, ncache = a, None
        if cfg.qk_norm and which != "v":
            # Gemma 3: RMS-norm each head's vector (over hd) before RoPE
            w = blk + f"attn_{which}_norm.weight"
            a, ncache = rmsnorm_forward(a, p[w], cfg.norm_eps)
            if emit:
                emit("norm", "RMS_NORM", ncache[0], (name,))
                emit(name + "_normed", "MUL", a, ("norm", w))
        if cos is not None and which != "v":
            a = rope_forward(a, cos, sin, cfg.rope_pairing)
            if emit: emit(name, "ROPE", a, (name + "_normed" if cfg.qk_norm else name, "inp_pos"))
        if which == "q" and cfg.arch == "gemma3":
            # llama.cpp's Gemma 3 graph scales q right after RoPE and runs the softmax with
            # scale 1, so its kq holds scaled scores: do the same so kq compares node for node
            a = a * np.asarray(cfg.scale, dtype=a.dtype)
            if emit: emit("Qcur_scaled", "SCALE", a, ("Qcur",))
        t[which] = (pre, ncache, a)
    q, k, v = t["q"][2], t["k"][2], t["v"][2]
    scale = 1.0 if cfg.arch == "gemma3" else cfg.scale       # Gemma 3: q was scaled already
    k_all, v_all = k, v
    if kv is not None:
        n0 = kv.n
        kv.k[il][:B, :, n0:n0 + T] = k.transpose(0, 2, 1, 3)                   # [B, T, Hkv, hd] -> head-major
        kv.v[il][:B, :, n0:n0 + T] = v.transpose(0, 2, 1, 3)
        k_all = kv.k[il][:B, :, :n0 + T].transpose(0, 2, 1, 3)                  # [B, S, Hkv, hd] view
        v_all = kv.v[il][:B, :, :n0 + T].transpose(0, 2, 1, 3)
    out, (kq, probs) = attention_forward(q, k_all, v_all, scale, allowed)       # out [B, H, T, hd]
    if emit:
        # sources under llama.cpp's names (views of its KV cache and of q); S keys, not padded
        S, qn = k_all.shape[1], ("Qcur_scaled" if cfg.arch == "gemma3" else "Qcur") + f"-{il}"
        emit("kq", "MUL_MAT", kq, ((f"cache_k_l{il} (view) (permuted)", (Hkv, S, hd)),
                                   (f"{qn} (view) (permuted)", (H, T, hd))))
        emit("kq_soft_max", "SOFT_MAX", probs, ("kq", "attn_inp_kq_mask"))
        emit("kqv", "MUL_MAT", out, ((f"cache_v_l{il} (view) (permuted)", (Hkv, hd, S)), "kq_soft_max"))
    merged = out.transpose(0, 2, 1, 3).reshape(B, T, H * hd)                     # [B, H, T, hd] -> [B, T, H*hd]
    if emit: emit("kqv_out", "CONT", merged, ((f"kqv-{il} (permuted)", (T, H, hd)),))
    wo, bo = blk + "attn_output.weight", blk + "attn_output.bias"
    y = linear_forward(merged, p[wo])                                             # [B, T, H*hd] -> [B, T, d_model]
    # llama.cpp names the output projection attn_out only in its llama graph (other graphs
    # leave it node_N); ffnlab names it attn_out everywhere so every block reads the same
    if bo in p:
        if emit: emit("attn_out_w", "MUL_MAT", y, (wo, "kqv_out"))
        y += p[bo]
        if emit: emit("attn_out", "ADD", y, ("attn_out_w", bo))
    elif emit:
        emit("attn_out", "MUL_MAT", y, (wo, "kqv_out"))
    cache = (x, t["q"][0], t["k"][0], t["q"][1], t["k"][1], q, k, v, cos, sin, probs, merged, scale)
    return y, cache


def _split_qkv(qkv, cfg):
    """[..., q_dim + 2*kv_dim] -> {"q": [..., q_dim], "k": [..., kv_dim], "v": [..., kv_dim]} (views)"""
    q_end, k_end = cfg.q_dim, cfg.q_dim + cfg.kv_dim
    return {"q": qkv[..., :q_end], "k": qkv[..., q_end:k_end], "v": qkv[..., k_end:]}


def _fused_qkv(x, p, blk, emit):
    """GPT-2: one matmul for q, k and v (llama.cpp: wqkv, then wqkv_b after the bias)."""
    w, b = blk + "attn_qkv.weight", blk + "attn_qkv.bias"
    qkv = linear_forward(x, p[w])                                                 # [B, T, d_model] -> [B, T, 3*d_model]
    if emit: emit("wqkv", "MUL_MAT", qkv, (w, "attn_norm"))
    if b in p:
        qkv += p[b]
        if emit: emit("wqkv_b", "ADD", qkv, ("wqkv", b))
    return qkv


def _proj(x, p, blk, which, node, emit, y=None):
    """One of the q/k/v projections (y: its slice of the packed product, when there is one)."""
    w, b = blk + f"attn_{which}.weight", blk + f"attn_{which}.bias"
    y = linear_forward(x, p[w]) if y is None else y
    if emit: emit(node, "MUL_MAT", y, (w, "attn_norm"))
    if b in p:
        y += p[b]
        if emit: emit(node, "ADD", y, (node, b))
    return y


def attention_backward_layer(dy, p, cfg, il, cache):
    """dy: [B, T, d_model] -> dx [B, T, d_model], grads {tensor name: array}"""
    x, q_pre, k_pre, qn_cache, kn_cache, q, k, v, cos, sin, probs, merged, scale = cache
    B, T, _ = x.shape
    H, hd = cfg.n_head, cfg.head_dim
    blk = f"blk.{il}."
    g = {}
    wo, bo = blk + "attn_output.weight", blk + "attn_output.bias"
    dmerged, g[wo], db = linear_backward(dy, merged, p[wo], bo in p)
    if db is not None:
        g[bo] = db
    dout = dmerged.reshape(B, T, H, hd).transpose(0, 2, 1, 3)                  # [B, H, T, hd]
    dq, dk, dv = attention_backward(dout, q, k, v, probs, scale)
    if scale != cfg.scale:                       # q was pre-scaled (Gemma 3): chain through it
        dq = dq * cfg.scale
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
