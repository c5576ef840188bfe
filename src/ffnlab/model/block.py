"""A transformer block, forward and backward.

  h   = x + [post_attn_norm](attn([attn_norm](x)))     (llama.cpp: ffn_inp, Gemma: sa_out)
  out = h + [post_ffn_norm](ffn([ffn_norm](h)))        (llama.cpp: l_out)
The bracketed norms are config flags: pre_norm (attn_norm, ffn_norm; off in OLMo 2, whose
sub-layers read the residual stream as it is) and the post norms (Gemma 2/3, OLMo 2).
GPT-NeoX's parallel residual (parallel_residual) has both sub-layers read the block input:

  out = (ffn(ffn_norm(x)) + x) + attn(attn_norm(x))   (llama.cpp: ffn_out, then l_out)

The residual adds always make new arrays: x is still needed by the backward (and by the
tracer), so adding into it in place would silently corrupt both.
"""
from typing import NamedTuple

import numpy as np

from ..families import family
from ..ops.norms import layernorm_backward, rmsnorm_backward
from .arith import F32
from .attention import attention_backward_layer, attention_forward_layer
from .ffn import ffn_backward, ffn_forward, ffn_out_node
from .hooks import identity
from .weights import TENSOR


def norm_forward(x, n, cfg, node, hook=identity, bare_norm=False, src="inp", bare_out=False, arith=F32):
    """The block's norm (LayerNorm or RMSNorm) with n: model/weights.py's Norm -> y, cache.

    Hooked as llama.cpp's build_norm: `norm` (unscaled), `norm_w` (after the weight, only when
    a bias follows), then `node` for the result. bare_norm: the unscaled node has no layer
    suffix (llama.cpp's Gemma 3 graph builds its post-FFN norm with il = -1); bare_out: nor has
    the result (Gemma 2 and OLMo 2 name it with il = -1 too)."""
    w, b, wname = n
    if cfg.norm == "layernorm":
        y, cache = arith.layer_norm(x, w, None, cfg.norm_eps)         # y = x_hat * w; the bias below
        op = "NORM"
    else:
        y, cache = arith.rms_norm(x, w, cfg.norm_eps)                 # y = x_hat * w
        op = "RMS_NORM"
    x_hat = hook("norm", cache[0], op, (src,), bare_norm)
    if x_hat is not cache[0]:                  # a hook replaced the unscaled norm: scale what it gave
        y, cache = x_hat * w, (x_hat,) + tuple(cache[1:])
    if b is not None:
        y = hook("norm_w", y, "MUL", ("norm", wname + ".weight"))
        y = hook(node, y + b, "ADD", ("norm_w", wname + ".bias"))
    else:
        y = hook(node, y, "MUL", ("=norm" if bare_norm else "norm", wname + ".weight"), bare_out)
    return y, cache


def norm_backward(dy, n, cfg, cache):
    """-> dx, {tensor name: grad}"""
    if cfg.norm == "layernorm":
        dx, dw, db = layernorm_backward(dy, n.weight, cache, n.bias is not None)
        return dx, {n.name + ".weight": dw, **({n.name + ".bias": db} if n.bias is not None else {})}
    dx, dw = rmsnorm_backward(dy, n.weight, cache)
    return dx, {n.name + ".weight": dw}



class BlockCache(NamedTuple):
    """What block_backward needs: each sub-layer's cache (None where the config has no such norm)."""
    attn_norm: tuple
    attn: object                    # attention.AttnCache
    post_attn_norm: tuple | None
    ffn_norm: tuple
    ffn: object                     # ffn.FFNCache
    post_ffn_norm: tuple | None


def _pre_norm(x, n, cfg, node, hook, src, arith=F32):
    """attn_norm / ffn_norm, or x itself when the family has no pre norms (OLMo 2) -> y, cache"""
    if n is None:
        return x, None
    return norm_forward(x, n, cfg, node, hook, src=src, arith=arith)


def _pre_norm_backward(dy, n, cfg, cache):
    return norm_backward(dy, n, cfg, cache) if n is not None else (dy, {})


def block_forward(x, w, cfg, pos, allowed, kv=None, hook=identity, rope=None, arith=F32, last_only=False):
    """x: [B, T, d_model], w: the block's LayerWeights (model/weights.py) -> [B, T, d_model], BlockCache

    pos/allowed: absolute positions [T] and the [T, S] attention mask (None: all visible);
    hook: the block's hook point (model/hooks.py); rope: precomputed (cos, sin) for pos.
    last_only: -> [B, 1, d_model], the last position's output only (the model's last block when
    only the last logits are wanted): every position's keys and values still go to the cache,
    the queries, the attention output and the FFN run for the last position alone."""
    names = family(cfg.arch).graph                     # where llama.cpp's graph names a node its own way
    res1 = "sa_out" if names.sa_out else "ffn_inp"
    a_in, an_cache = _pre_norm(x, w.attn_norm, cfg, "attn_norm", hook, "inp", arith)
    a, attn_cache = attention_forward_layer(a_in, w, cfg, pos, allowed, kv, hook, rope, arith, last_only)
    if last_only:
        x = x[:, -1:]
    pa_cache = None
    if cfg.post_attn_norm:
        a, pa_cache = norm_forward(a, w.post_attn_norm, cfg, "attn_post_norm", hook, src="attn_out", arith=arith)
    if cfg.residual_multiplier:                                        # Granite: a * r before the residual add
        a = hook(names.residual_scaled[0], _times(a, cfg.residual_multiplier))
    if cfg.parallel_residual:                                          # GPT-NeoX: the FFN reads x, not h
        h, res1 = x, "inp"
    else:
        h = hook(res1, x + a)                                          # [B, T, d_model]
    f_in, fn_cache = _pre_norm(h, w.ffn_norm, cfg, "ffn_norm", hook, res1, arith)
    f, ffn_cache = ffn_forward(f_in, w.ffn, cfg.ffn, hook, fused_gate_up=names.fused_gate_up, arith=arith)
    cache = (an_cache, attn_cache, pa_cache, fn_cache, ffn_cache)
    if cfg.parallel_residual:
        f = hook("ffn_out", f + x, "ADD", (ffn_out_node(cfg), "inp"))                       # [B, T, d_model]
        out = hook("l_out", f + a, "ADD", ("ffn_out", "attn_out"))
        return out, BlockCache(*cache, None)
    pf_cache = None
    if cfg.post_ffn_norm:
        f, pf_cache = norm_forward(f, w.post_ffn_norm, cfg, "ffn_post_norm", hook, bare_norm=True, src="ffn_out",
                                   bare_out=names.bare_ffn_post_norm, arith=arith)
    if cfg.residual_multiplier:                                        # Granite: f * r before the residual add
        f = hook(names.residual_scaled[1], _times(f, cfg.residual_multiplier))
    out = hook("l_out", h + f)                                         # [B, T, d_model]
    return out, BlockCache(*cache, pf_cache)


def _times(x, r):
    """x * r in x's dtype (Granite's residual multiplier)."""
    return x * np.asarray(r, dtype=x.dtype)


def block_backward(dout, w, cfg, cache):
    """dout: [B, T, d_model] -> dx [B, T, d_model], grads {tensor name: array}"""
    blk = f"blk.{w.il}."
    g = {}
    r = cfg.residual_multiplier or 1.0                # Granite: both sub-layer outputs were times r
    df = dout * r if cfg.residual_multiplier else dout
    if cfg.post_ffn_norm:
        df, gi = norm_backward(df, w.post_ffn_norm, cfg, cache.post_ffn_norm)
        g.update(gi)
    df_in, gf = ffn_backward(df, w.ffn, cfg.ffn, cache.ffn)
    g.update({blk + TENSOR[k]: v for k, v in gf.items()})
    dh_norm, gi = _pre_norm_backward(df_in, w.ffn_norm, cfg, cache.ffn_norm)
    g.update(gi)
    if cfg.parallel_residual:              # h is x itself: the FFN's path reaches x, not the attention
        dx, da = dout + dh_norm, dout
    else:
        dx = da = dout + dh_norm                                       # residual: both paths reach h
    if cfg.residual_multiplier:
        da = da * r
    if cfg.post_attn_norm:
        da, gi = norm_backward(da, w.post_attn_norm, cfg, cache.post_attn_norm)
        g.update(gi)
    da_in, ga = attention_backward_layer(da, w, cfg, cache.attn)
    g.update({blk + TENSOR[k]: v for k, v in ga.items()})
    dx_norm, gi = _pre_norm_backward(da_in, w.attn_norm, cfg, cache.attn_norm)
    g.update(gi)
    return dx + dx_norm, g
