"""Direct logit attribution of MLP units: how much each hidden unit writes the target's logit.

At the last position, the final norm is linearized at the run's own state (its 1/rms, or
LayerNorm's 1/std and centring, held fixed), so the target's logit is a dot product with the
residual stream:  logit(t) ~ d . x  with  d = head[t] * w_norm / rms(x_final)  (centred for LayerNorm).
Unit i of layer L writes act_i * down[:, i] into the stream (through Gemma's post-FFN norm,
linearized the same way), so its direct effect is

    attribution[L][i] = act_i * (down[:, i] . d_L),    d_L = d (* w_post / rms(ffn_out-L) for Gemma)

and the units' sum plus the down bias is the MLP output's own direct effect. Direct only: what the
unit's write does through later layers is not counted (patching and causal tracing measure that).

A transcoder spliced at layer L (attribute_latents) splits the same output into its latents: latent j fires
a_j on ffn_norm-L's value and writes a_j W_dec[j], so

    attribution[L][j] = a_j * (W_dec[j] . d_L)

and the latents' sum plus b_dec . d_L (plus a skip-transcoder's (W_skip x) . d_L) plus the error term
(ffn_out - y_hat) . d_L is ffn_out-L's direct effect, the MLP units' total above.
"""
import numpy as np

from ..model.ffn import FFN_KINDS
from ..model.params import lm_head_name
from ..ops.linear import linear_forward
from .api import capture
from .common import as_float


def _linear_norm_direction(model, d, x, wname):
    """d: a direction after a norm -> the direction before it, with the norm's scale frozen at x [d_model]."""
    cfg, p = model.config, model.params
    x = x.astype(np.float64)
    d = d * as_float(p[wname + ".weight"]).astype(np.float64)
    if cfg.norm == "layernorm":
        xc = x - x.mean()
        d = (d - d.mean()) / np.sqrt((xc * xc).mean() + cfg.norm_eps)   # d.(x - mean x) = (d - mean d).x
    else:
        d = d / np.sqrt((x * x).mean() + cfg.norm_eps)
    return d


def logit_direction(model, acts, target):
    """d [d_model] float64: the target's logit as d . x of the last state (the final norm frozen at it)"""
    cfg, p = model.config, model.params
    head_row = as_float(p[lm_head_name(cfg)])[target].astype(np.float64)          # [d_model]
    return _linear_norm_direction(model, head_row, acts[f"l_out-{cfg.n_layer - 1}"][-1], "output_norm")


def layer_direction(model, d, acts, il):
    """d_L [d_model]: what ffn_out-L's last row is dotted with (Gemma's post-FFN norm frozen at that row)"""
    if model.config.post_ffn_norm:
        return _linear_norm_direction(model, d, acts[f"ffn_out-{il}"][-1], f"blk.{il}.post_ffw_norm")
    return d


def attribute(model, ids, target, top=10):
    """ids: [T], target: token id -> {"layers": [{"layer", "units": [[unit, attribution, activation]...],
    "negative": [...], "total", "ffn_out"}], "logit", "rank", "top_id", "top_logit"}; units: the `top`
    largest attributions, largest first; negative: the `top` most negative ones, most negative first
    (a layer's total is their sum, so both sides are needed to read it); rank: the target's place
    among the model's predictions at the last position (0 = its top prediction, top_id)."""
    cfg, p = model.config, model.params
    L = cfg.n_layer
    act_node = FFN_KINDS[cfg.ffn].node
    names = [f"l_out-{L - 1}"] + [f"{act_node}-{il}" for il in range(L)] + [f"ffn_out-{il}" for il in range(L)]
    logits, acts = capture(model, ids, names)
    d = logit_direction(model, acts, target)
    layers = []
    for il in range(L):
        dl = layer_direction(model, d, acts, il)
        down = as_float(p[f"blk.{il}.ffn_down.weight"])                           # [d_model, d_ff]
        col = linear_forward(dl[None].astype(np.float64), down.T.astype(np.float64))[0]   # [d_ff] down[:, i] . d_L
        a = acts[f"{act_node}-{il}"][-1].astype(np.float64)                        # [d_ff]
        attr = a * col
        order = np.argsort(-attr, kind="stable")
        pos, neg = order[:top], order[::-1][:top]
        b = p.get(f"blk.{il}.ffn_down.bias")
        layers.append({"layer": il, "units": [[int(i), float(attr[i]), float(a[i])] for i in pos],
                       "negative": [[int(i), float(attr[i]), float(a[i])] for i in neg if attr[i] < 0],
                       "total": float(attr.sum() + (float(as_float(b) @ dl) if b is not None else 0.0)),
                       "ffn_out": float(acts[f"ffn_out-{il}"][-1].astype(np.float64) @ dl) if not cfg.post_ffn_norm
                       else None})
    z = logits[0, -1]                                                             # [vocab] the model's own
    return {"layers": layers, "logit": float(z[target]), "node": act_node,
            "rank": int((z > z[target]).sum()), "top_id": int(np.argmax(z)), "top_logit": float(z.max())}


def attribute_latents(model, ids, target, dictionaries, top=10):
    """dictionaries: [(name, params, DictConfig, in node, out node)], each writing ffn_out-L ->
    [{"layer", "features": name, "latents": [[latent, attribution, activation]...], "negative": [...],
    "b_dec", "skip", "error", "ffn_out", "total"}]: latents, the `top` largest attributions at the last
    position, largest first; negative, the `top` most negative; total, the latents' sum; b_dec, skip and
    error, the other terms of ffn_out-L's direct effect (ffn_out = total + b_dec + skip + error)."""
    from ..features.dictionary import encode
    L = model.config.n_layer
    layers = {int(out.rsplit("-", 1)[1]) for _, _, _, _, out in dictionaries}
    names = sorted({f"l_out-{L - 1}", *(f"ffn_out-{il}" for il in layers), *(i for _, _, _, i, _ in dictionaries)})
    _, acts = capture(model, ids, names)
    d = logit_direction(model, acts, target)
    out = []
    for name, p, cfg, in_node, out_node in dictionaries:
        il = int(out_node.rsplit("-", 1)[1])
        dl = layer_direction(model, d, acts, il)                                    # [d_model]
        x = np.ascontiguousarray(acts[in_node][-1:], np.float32)                  # [1, d_in]
        y = acts[out_node][-1].astype(np.float64)                                 # [d_out]
        a, _, _ = encode(p, cfg, x)                                               # the splice's own latents
        on = a.val > 0
        j, val = a.idx[on], a.val[on].astype(np.float64)                          # the firing latents
        W = p["W_dec"][j].astype(np.float64)                                       # [n firing, d_out]
        attr = val * (W @ dl)                                                      # [n firing]
        order = np.argsort(-attr, kind="stable")
        skip_row = (p["W_skip"].astype(np.float64) @ x[0].astype(np.float64)) if "W_skip" in p else 0.0
        y_hat = val @ W + p["b_dec"].astype(np.float64) + skip_row               # float64: the terms add up
        skip = float(skip_row @ dl) if "W_skip" in p else 0.0
        row = (lambda i: [int(j[i]), float(attr[i]), float(val[i])])
        out.append({"layer": il, "features": name, "node": out_node,
                    "latents": [row(i) for i in order[:top] if attr[i] > 0],
                    "negative": [row(i) for i in order[::-1][:top] if attr[i] < 0],
                    "firing": int(on.sum()), "total": float(attr.sum()),
                    "b_dec": float(p["b_dec"].astype(np.float64) @ dl), "skip": skip,
                    "error": float((y - y_hat) @ dl), "ffn_out": float(y @ dl)})
    return out
