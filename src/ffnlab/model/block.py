"""A pre-norm transformer block, forward and backward.

  h   = x + [post_attn_norm](attn(attn_norm(x)))     (llama.cpp: ffn_inp)
  out = h + [post_ffn_norm](ffn(ffn_norm(h)))        (llama.cpp: l_out)

The residual adds always make new arrays: x is still needed by the backward (and by the
tracer), so adding into it in place would silently corrupt both.
"""
from ..ops.norms import layernorm_backward, layernorm_forward, rmsnorm_backward, rmsnorm_forward
from .attention import attention_backward_layer, attention_forward_layer
from .ffn import FFNWeights, ffn_backward, ffn_forward
from .packing import packed


def norm_forward(x, p, cfg, wname, node, emit=None, bare_norm=False, src="inp"):
    """The block's norm (LayerNorm or RMSNorm) with weight `wname`(.weight/.bias).

    Traced as llama.cpp's build_norm: `norm` (unscaled), `norm_w` (after the weight, only
    when a bias follows), then `node` for the result. bare_norm: the unscaled node has no
    layer suffix (llama.cpp's Gemma 3 graph builds its post-FFN norm with il = -1)."""
    w, b = p[wname + ".weight"], p.get(wname + ".bias")
    if cfg.norm == "layernorm":
        y, cache = layernorm_forward(x, w, b, cfg.norm_eps)
        op = "NORM"
    else:
        y, cache = rmsnorm_forward(x, w, cfg.norm_eps)
        op = "RMS_NORM"
    if emit:
        emit("norm", op, cache[0], (src,), bare=bare_norm)
        if b is not None:
            emit("norm_w", "MUL", cache[0] * w, ("norm", wname + ".weight"))
            emit(node, "ADD", y, ("norm_w", wname + ".bias"))
        else:
            emit(node, "MUL", y, ("=norm" if bare_norm else "norm", wname + ".weight"))
    return y, cache


def norm_backward(dy, p, cfg, wname, cache):
    """-> dx, {name: grad}"""
    w = p[wname + ".weight"]
    if cfg.norm == "layernorm":
        has_b = (wname + ".bias") in p
        dx, dw, db = layernorm_backward(dy, w, cache, has_b)
        g = {wname + ".weight": dw}
        if has_b:
            g[wname + ".bias"] = db
        return dx, g
    dx, dw = rmsnorm_backward(dy, w, cache)
    return dx, {wname + ".weight": dw}


def ffn_weights(p, il):
    """The layer's FFN tensors from the GGUF-named dict."""
    blk = f"blk.{il}."
    return FFNWeights(up=p[blk + "ffn_up.weight"], down=p[blk + "ffn_down.weight"],
                      gate=p.get(blk + "ffn_gate.weight"), up_b=p.get(blk + "ffn_up.bias"),
                      gate_b=p.get(blk + "ffn_gate.bias"), down_b=p.get(blk + "ffn_down.bias"))


FFN_TENSOR = {"up": "ffn_up.weight", "down": "ffn_down.weight", "gate": "ffn_gate.weight",
              "up_b": "ffn_up.bias", "gate_b": "ffn_gate.bias", "down_b": "ffn_down.bias"}


def block_forward(x, p, cfg, il, pos, allowed, kv=None, emit=None, rope=None, packs=None):
    """x: [B, T, d_model] -> [B, T, d_model], cache

    pos/allowed: absolute positions [T] and the [T, S] attention mask (None: all visible);
    rope: precomputed (cos, sin) for pos; packs: packed projections (model/packing.py)."""
    blk = f"blk.{il}."
    a_in, an_cache = norm_forward(x, p, cfg, blk + "attn_norm", "attn_norm", emit)
    a, attn_cache = attention_forward_layer(a_in, p, cfg, il, pos, allowed, kv, emit, rope, packs)
    pa_cache = None
    if cfg.post_attn_norm:
        a, pa_cache = norm_forward(a, p, cfg, blk + "post_attention_norm", "attn_post_norm", emit, src="attn_out")
    h = x + a                                                          # [B, T, d_model] residual
    # Gemma 3's graph calls this sum sa_out; llama, qwen2 and gpt2 call it ffn_inp
    if emit: emit("sa_out" if cfg.post_attn_norm else "ffn_inp", "ADD", h,
                  ("attn_post_norm" if cfg.post_attn_norm else "attn_out", "inp"))
    f_in, fn_cache = norm_forward(h, p, cfg, blk + "ffn_norm", "ffn_norm", emit,
                                  src="sa_out" if cfg.post_attn_norm else "ffn_inp")
    names = {k: blk + v for k, v in FFN_TENSOR.items()}
    gate_up = packed(packs, p, il, "gate_up", (names["gate"], names["up"])) if cfg.gated else None
    f, ffn_cache = ffn_forward(f_in, ffn_weights(p, il), cfg.ffn, emit, names, gate_up)
    pf_cache = None
    if cfg.post_ffn_norm:
        f, pf_cache = norm_forward(f, p, cfg, blk + "post_ffw_norm", "ffn_post_norm", emit,
                                   bare_norm=True, src="ffn_out")
    out = h + f                                                        # [B, T, d_model] residual
    if emit: emit("l_out", "ADD", out, ("ffn_post_norm" if cfg.post_ffn_norm else "ffn_out",
                                        "sa_out" if cfg.post_attn_norm else "ffn_inp"))
    return out, (an_cache, attn_cache, pa_cache, fn_cache, ffn_cache, pf_cache)


def block_backward(dout, p, cfg, il, cache):
    """dout: [B, T, d_model] -> dx [B, T, d_model], grads {tensor name: array}"""
    an_cache, attn_cache, pa_cache, fn_cache, ffn_cache, pf_cache = cache
    blk = f"blk.{il}."
    g = {}
    df = dout
    if cfg.post_ffn_norm:
        df, gi = norm_backward(df, p, cfg, blk + "post_ffw_norm", pf_cache)
        g.update(gi)
    df_in, gf = ffn_backward(df, ffn_weights(p, il), cfg.ffn, ffn_cache)
    g.update({blk + FFN_TENSOR[k]: v for k, v in gf.items()})
    dh_norm, gi = norm_backward(df_in, p, cfg, blk + "ffn_norm", fn_cache)
    g.update(gi)
    dh = dout + dh_norm                                                # residual: both paths reach h
    da = dh
    if cfg.post_attn_norm:
        da, gi = norm_backward(da, p, cfg, blk + "post_attention_norm", pa_cache)
        g.update(gi)
    da_in, ga = attention_backward_layer(da, p, cfg, il, attn_cache)
    g.update(ga)
    dx_norm, gi = norm_backward(da_in, p, cfg, blk + "attn_norm", an_cache)
    g.update(gi)
    return dh + dx_norm, g
