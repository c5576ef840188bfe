"""The attention sub-layer: q/k/v projections, optional q/k norms, RoPE, causal attention, output projection.

Weight names are the GGUF tensor names of one block (attn_q, attn_k, attn_v or fused attn_qkv,
attn_q_norm, attn_k_norm, attn_output). Trace names follow llama.cpp's graph (Qcur, Kcur, Vcur,
kq, kq_soft_max, kqv, kqv_out, attn_out).
"""
from typing import NamedTuple

import numpy as np

from ..families import family
from ..ops.attention import attention_backward
from ..ops.linear import linear_backward, linear_backwards, linear_forward, linear_forwards, plain
from ..ops.norms import rmsnorm_backward
from ..ops.rope import rope_backward
from ..quant.simd import HAS_AVX512, empty_aligned
from .arith import F32, qk_in_one_pass
from .hooks import identity
from .weights import ATTN_TENSOR


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
    expands q, v, k for the plain KV cache, but q, k, v for the interleaved sliding-window cache
    (Gemma 2/3: some layers slide, some do not; a model whose every layer slides uses the plain one)."""
    return ("q", "k", "v") if cfg.sliding_window and cfg.sliding_window_pattern else ("q", "v", "k")


class AttnCache(NamedTuple):
    """What attention_backward_layer needs from the forward."""
    x: np.ndarray                   # [B, T, d_model] the input (attn_norm's output)
    q_pre: np.ndarray               # [B, T, H, hd] q before its norm (Gemma 3) and RoPE
    k_pre: np.ndarray               # [B, T, Hkv, hd]
    q_norm: tuple | None            # rmsnorm caches of the per-head q/k norms (qk_norm only)
    k_norm: tuple | None
    q: np.ndarray                   # [B, T, H, hd] as attended (after norm, RoPE and Gemma 3's scale)
    k: np.ndarray                   # [B, S, Hkv, hd] (S = T: training runs without a KV cache)
    v: np.ndarray
    cos: np.ndarray | None          # RoPE angles for these positions
    sin: np.ndarray | None
    probs: np.ndarray               # [B, H, T, S] softmax output
    merged: np.ndarray              # [B, T, H*hd] heads side by side, the input of attn_output
    scale: float                    # the factor q.k was multiplied by in the softmax (or before the cap)
    capped: np.ndarray | None = None  # [B, H, T, S] tanh(scale*q.k / c) when the scores are soft-capped


NODE = {"q": "Qcur", "k": "Kcur", "v": "Vcur"}
_NO_W = np.zeros(0, np.float32)


def q_scaled_node(cfg):
    """The name llama.cpp's graph gives q times the attention scale, or '' where the softmax scales."""
    return family(cfg.arch).graph.q_scaled


def scales_q(cfg):
    """llama.cpp's Gemma 2, Gemma 3 and Phi-3 graphs multiply q by the attention scale right after
    RoPE and run the softmax with scale 1, so their kq holds scaled scores. ffnlab does the same for
    these families (families/*.py: graph.q_scaled), so kq compares node for node; the math is the
    same either way."""
    return bool(q_scaled_node(cfg))


def attention_forward_layer(x, w, cfg, pos, allowed, kv=None, hook=identity, rope=None, arith=F32, last_only=False):
    """x: [B, T, d_model] (attn_norm output), w: the block's LayerWeights (model/weights.py),
    pos: [T] absolute positions, allowed: [T, S] mask (None: nothing masked) -> out [B, T, d_model], AttnCache.

    kv: a KVCache to append to (inference); its first kv.n positions are the past.
    hook: the block's hook point (model/hooks.py).
    rope: precomputed (cos, sin) for pos (the model computes them once per forward).
    arith: model/arith.py's F32 or GGML (the norms, RoPE, KQ, softmax and KQV it computes).
    last_only: attend from the last position only -> out [B, 1, d_model] (every position's k and v
        still go to the cache).
    """
    B, T, _ = x.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    il = w.il
    heads = {"q": H, "k": Hkv, "v": Hkv}
    if w.rope is not None:                                 # not SmolLM3's NoPE layers
        cos, sin = rope if rope is not None else arith.rope_angles(pos, cfg.n_rot, *w.rope)
    else:
        cos = sin = None
    # q, k, v from w.qkv's products, each made when its first part is wanted
    parts = _split(_fused_qkv(x, w, hook), "qkv", cfg) if cfg.fused_qkv else {}
    t = {}          # per projection: (pre-norm [B,T,h,hd], norm cache, as attended [B,T,h,hd])
    fast_qk = arith.qk_rows is not None and cos is not None and qk_in_one_pass(cfg, x.dtype)
    for which in qkv_order(cfg):
        name = NODE[which]
        if cfg.fused_qkv:
            a = hook(name, parts[which].reshape(B, T, heads[which], hd), "VIEW",
                     ("wqkv_b" if w.wqkv_b is not None else "wqkv",))
        else:
            a = _proj(x, w, cfg, which, name, hook, parts)
            a = a.reshape(B, T, heads[which], hd)                                       # [B, T, h, hd]
            if not (cfg.qk_norm_full and which != "v"):   # OLMoE norms q/k first; its reshape is unnamed
                a = hook(name, a, "RESHAPE", (name,))
        pre, ncache = a, None
        if fast_qk and which != "v":      # nothing observes the steps: norm, RoPE and scale in one pass
            t[which] = (pre, None, _qk_fast(a, w, cfg, which, cos, sin, arith.qk_rows))
            continue
        if cfg.qk_norm and which != "v":
            a, ncache = _head_norm(a, getattr(w, which + "_norm"), cfg, name, hook, arith)
        if cos is not None and which != "v":
            a = hook(name, arith.rope(a, cos, sin, cfg.rope_pairing), "ROPE",
                     (name + "_normed" if cfg.qk_norm else name, "inp_pos"))
        if which == "q" and scales_q(cfg):
            a = hook(q_scaled_node(cfg), a * np.asarray(cfg.scale, dtype=a.dtype), "SCALE", ("Qcur",))
        t[which] = (pre, ncache, a)
    q, k, v = t["q"][2], t["k"][2], t["v"][2]
    scale = 1.0 if scales_q(cfg) else cfg.scale              # Gemma: q was scaled already
    k_all, v_all = k, v
    if kv is not None:
        n0 = kv.n
        kv.k[il][:B, :, n0:n0 + T] = k.transpose(0, 2, 1, 3)                   # [B, T, Hkv, hd] -> head-major
        kv.v[il][:B, :, n0:n0 + T] = v.transpose(0, 2, 1, 3)
        k_all = kv.k[il][:B, :, :n0 + T].transpose(0, 2, 1, 3)                  # [B, S, Hkv, hd] view
        v_all = kv.v[il][:B, :, :n0 + T].transpose(0, 2, 1, 3)
    if last_only:
        q, T = q[:, -1:], 1
        allowed = allowed[-1:] if allowed is not None else None
    window = w.window
    if arith.attend_one is not None and B == 1 and x.shape[1] == 1:
        # one token with nothing to observe (decoding): one query row over the cache
        out = np.empty((H, hd), q.dtype)
        n = int(pos[-1])
        arith.attend_one(q[0, 0], kv.k[il][0], kv.v[il][0], n, max(0, n - window + 1) if window else 0,
                         q.dtype.type(scale), q.dtype.type(cfg.attn_softcap or 0.0), out)
        merged, probs, capped = out.reshape(1, 1, H * hd), None, None
    elif arith.attend_rows is not None and not cfg.attn_softcap and q.dtype == np.float32 and hd % 16 == 0:
        # inference with nothing to observe: one compiled pass, no [B, H, T, S] scores kept
        out = empty_aligned((B, T, H, hd))                    # read and written 16 floats at a time
        arith.attend_rows(np.ascontiguousarray(q), kv.k[il], kv.v[il], int(pos[-T]), window, np.float32(scale), out,
                          HAS_AVX512)
        merged, probs, capped = out.reshape(B, T, H * hd), None, None
    else:
        merged, probs, capped = _attend(q, k_all, v_all, scale, allowed, cfg, il, hook, arith)
    node = "attn_out_w" if w.wo_b is not None else "attn_out"
    y = linear_forward(merged, w.wo, hook=hook, node=node)                 # [B, T, H*hd] -> [B, T, d_model]
    # llama.cpp names the output projection attn_out only in its llama graph (other graphs
    # leave it node_N); ffnlab names it attn_out everywhere so every block reads the same
    if w.wo_b is not None:
        y = hook("attn_out_w", y)
        y = hook("attn_out", y + w.wo_b, "ADD", ("attn_out_w", "attn_output.bias"))   # the bias after the product
    else:
        y = hook("attn_out", y)
    return y, AttnCache(x, t["q"][0], t["k"][0], t["q"][1], t["k"][1], q, k, v, cos, sin, probs, merged, scale,
                        capped)


def _attend(q, k_all, v_all, scale, allowed, cfg, il, hook, arith):
    """kq, softmax and kqv as llama.cpp's nodes -> merged heads [B, T, H*hd], probs [B, H, T, S],
    the soft-capped tanh or None"""
    B, T, H, hd = q.shape
    Hkv = k_all.shape[2]
    # sources under llama.cpp's names (views of its KV cache and of q); S keys, not padded
    S, qn = k_all.shape[1], (q_scaled_node(cfg) if scales_q(cfg) else "Qcur") + f"-{il}"
    kq = hook("kq", arith.kq(q, k_all), "MUL_MAT",                       # [B, H, T, S] raw q.k
              ((f"cache_k_l{il} (view) (permuted)", (Hkv, S, hd)), (f"{qn} (view) (permuted)", (H, T, hd))))
    capped = None
    if cfg.attn_softcap:
        kq, capped = _softcap(kq, scale, cfg.attn_softcap, hook)
    probs = hook("kq_soft_max", arith.soft_max(kq, 1.0 if cfg.attn_softcap else scale, allowed))   # capped: scaled already
    out = hook("kqv", arith.kqv(probs, v_all), "MUL_MAT",                     # [B, H, T, hd]
               ((f"cache_v_l{il} (view) (permuted)", (Hkv, hd, S)), "kq_soft_max"))
    merged = hook("kqv_out", out.transpose(0, 2, 1, 3).reshape(B, T, H * hd), "CONT",   # [B, T, H*hd]
                  ((f"kqv-{il} (permuted)", (T, H, hd)),))
    return merged, probs, capped


def _softcap(kq, scale, c, hook):
    """Gemma 2's attention logit soft-capping: kq [B, H, T, S] raw scores -> c * tanh(scale * kq / c),
    and the tanh (its derivative 1 - tanh^2 is the backward). The cap bounds every score to (-c, c)
    before the mask, so no head can put all its weight on one key by a large margin. llama.cpp
    (build_attn_mha) scales by 1/c, takes the tanh and scales by c, as three nodes."""
    z = hook("kq_scaled_1", kq * np.asarray(scale / c, dtype=kq.dtype))
    t = hook("kq_tanh", np.tanh(z))
    return hook("kq_scaled_2", t * np.asarray(c, dtype=t.dtype)), t


def _head_norm(a, weight, cfg, name, hook, arith=F32):
    """Gemma 3, Qwen3: RMS-norm each head's vector (over hd) before RoPE; OLMoE (qk_norm_full):
    the whole projection, all heads at once -> normed [B, T, h, hd], cache"""
    shape = a.shape
    if cfg.qk_norm_full:
        a = a.reshape(*shape[:-2], -1)                                 # [B, T, h, hd] -> [B, T, h*hd]
    a, ncache = arith.rms_norm(a, weight, cfg.norm_eps)
    x_hat = hook("norm", ncache[0], "RMS_NORM", (name,))
    if x_hat is not ncache[0]:                 # a hook replaced the unscaled norm: scale what it gave
        a, ncache = x_hat * weight, (x_hat, ncache[1])
    return hook(name + "_normed", a).reshape(shape), ncache


def _qk_fast(a, lw, cfg, which, cos, sin, qk_rows):
    """q or k [B, T, h, hd] as attended, for inference with nothing hooked: ops/fastmath.py's
    qk_rows does the head norm (qk_norm), RoPE and Gemma's q scale in one pass, with the values
    of _head_norm, arith.rope and the scale step"""
    B, T, h, hd = a.shape
    w = getattr(lw, which + "_norm") if cfg.qk_norm else _NO_W
    if w.dtype != np.float32:
        w = w.astype(np.float32)
    out = np.empty((B * T, h, hd), np.float32)
    qk_rows(a.reshape(B * T, h, hd), w, np.float32(cfg.norm_eps), cfg.qk_norm, np.ascontiguousarray(cos, np.float32),
            np.ascontiguousarray(sin, np.float32), cfg.rope_pairing == "neox", np.float32(cfg.scale),
            which == "q" and scales_q(cfg), out, T)
    return out.reshape(B, T, h, hd)


def _split(y, parts, cfg):
    """y: [..., rows] the product of a stack of parts ("qkv", "qk", "q", ...) -> {part: [..., its rows]} (views)"""
    if len(parts) == 1:
        return {parts: y}
    dims, out, r = {"q": cfg.q_dim, "k": cfg.kv_dim, "v": cfg.kv_dim}, {}, 0
    for part in parts:
        out[part], r = y[..., r:r + dims[part]], r + dims[part]
    return out


def _fused_qkv(x, w, hook):
    """GPT-2: one matmul for q, k and v (llama.cpp: wqkv, then wqkv_b after the bias)."""
    qkv = hook("wqkv", linear_forward(x, w.wqkv, hook=hook, node="wqkv"))   # [B, T, 3*d]
    if w.wqkv_b is not None:
        qkv = hook("wqkv_b", qkv + w.wqkv_b)
    return qkv


def _proj(x, w, cfg, which, node, hook, done):
    """One of the q/k/v projections, from its product in w.qkv (done: the parts of the products made so far)."""
    if which not in done and len(w.qkv) > 1 and all(plain(m) for m, _ in w.qkv):   # float weights: all at once
        for (m, parts), y in zip(w.qkv, linear_forwards(x, [m for m, _ in w.qkv])):
            done.update(_split(y, parts, cfg))
    if which not in done:
        m, parts = next(pr for pr in w.qkv if which in pr[1])
        done.update(_split(linear_forward(x, m, hook=hook, node=node if len(parts) == 1 else None), parts, cfg))
    b = getattr(w, which + "_b")
    y = hook(node, done[which])
    if b is not None:
        y = hook(node, y + b, "ADD", (node, ATTN_TENSOR[which + "_b"]))   # the same name again, after the bias
    return y


def attention_backward_layer(dy, w, cfg, cache):
    """dy: [B, T, d_model] -> dx [B, T, d_model], grads {LayerWeights field: array}"""
    c = cache
    x, q, k, v, cos, sin, probs, scale = c.x, c.q, c.k, c.v, c.cos, c.sin, c.probs, c.scale
    B, T, _ = x.shape
    H, hd = cfg.n_head, cfg.head_dim
    g = {}
    dmerged, g["wo"], g["wo_b"] = linear_backward(dy, c.merged, w.wo, w.wo_b is not None)
    dout = dmerged.reshape(B, T, H, hd).transpose(0, 2, 1, 3)                  # [B, H, T, hd]
    dq, dk, dv = attention_backward(dout, q, k, v, probs, scale, c.capped)
    if scales_q(cfg):                            # q was pre-scaled (Gemma): chain through it
        dq = dq * cfg.scale
    if cos is not None:                          # this layer rotated q and k
        dq = rope_backward(dq, cos, sin, cfg.rope_pairing)
        dk = rope_backward(dk, cos, sin, cfg.rope_pairing)
    if cfg.qk_norm_full:                         # OLMoE: the norms saw [B, T, h*hd]
        dq, dk = dq.reshape(B, T, -1), dk.reshape(B, T, -1)
    if cfg.qk_norm:
        dq, g["q_norm"] = rmsnorm_backward(dq, w.q_norm, c.q_norm)
        dk, g["k_norm"] = rmsnorm_backward(dk, w.k_norm, c.k_norm)
    dq, dk, dv = dq.reshape(B, T, -1), dk.reshape(B, T, -1), dv.reshape(B, T, -1)
    if cfg.fused_qkv:
        dqkv = np.concatenate([dq, dk, dv], axis=-1)                             # [B, T, 3*d_model]
        dx, g["wqkv"], g["wqkv_b"] = linear_backward(dqkv, x, w.wqkv, w.wqkv_b is not None)
        return dx, _present(g)
    dx, ((g["q"], g["q_b"]), (g["k"], g["k_b"]), (g["v"], g["v_b"])) = linear_backwards(
        [dq, dk, dv], x, [w.q, w.k, w.v], [w.q_b is not None, w.k_b is not None, w.v_b is not None])
    return dx, _present(g)


def _present(g):
    """the gradients without the biases a layer lacks (a frozen weight keeps its None)"""
    return {f: a for f, a in g.items() if a is not None or not f.endswith("_b")}
