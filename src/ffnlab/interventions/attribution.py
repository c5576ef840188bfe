"""Direct logit attribution of MLP units: how much each hidden unit writes the target's logit.

At the last position, the final norm is linearized at the run's own state (its 1/rms, or
LayerNorm's 1/std and centring, held fixed), so the target's logit is a dot product with the
residual stream:  logit(t) ~ d . x  with  d = head[t] * w_norm / rms(x_final)  (centred for LayerNorm).
Unit i of layer L writes act_i * down[:, i] into the stream (through Gemma's post-FFN norm,
linearized the same way), so its direct effect is

    attribution[L][i] = act_i * (down[:, i] . d_L),    d_L = d (* w_post / rms(ffn_out-L) for Gemma)

and the units' sum plus the down bias is the MLP output's own direct effect. Direct only: what the
unit's write does through later layers is not counted (patching and causal tracing measure that).
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
    head_row = as_float(p[lm_head_name(cfg)])[target].astype(np.float64)          # [d_model]
    d = _linear_norm_direction(model, head_row, acts[f"l_out-{L - 1}"][-1], "output_norm")
    layers = []
    for il in range(L):
        dl = d
        if cfg.post_ffn_norm:
            dl = _linear_norm_direction(model, d, acts[f"ffn_out-{il}"][-1], f"blk.{il}.post_ffw_norm")
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
