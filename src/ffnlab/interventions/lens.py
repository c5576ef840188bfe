"""The logit lens (nostalgebraist 2020): read each layer's residual stream as if it were the last.

    lens_L = head(output_norm(l_out-L))        [T, vocab], through the model's own final norm and head

so the last layer's lens is the model's logits. --node ffn_out reads what each MLP writes (its
output alone through the final norm and head): which tokens a layer's MLP pushes toward.
"""
import numpy as np

from ..model.block import norm_forward
from ..model.params import lm_head_name
from ..ops.linear import linear_forward
from .api import capture, node_names
from .common import layer_nodes


def head_logits(model, y):
    """y: [..., d_model] final-norm outputs -> logits [..., vocab], as the model's forward makes them."""
    cfg = model.config
    logits = linear_forward(y, model.params[lm_head_name(cfg)])
    if cfg.final_logit_softcap:
        c = cfg.final_logit_softcap
        logits = np.tanh(logits / c) * c
    return logits


def final_logits(model, x):
    """x: [B, T, d_model] residual states -> logits [B, T, vocab] through output_norm and the head."""
    y, _ = norm_forward(x, model.params, model.config, "output_norm", "result_norm")
    return head_logits(model, y)


def logit_lens(model, ids, node="l_out", top=5):
    """ids: [T] -> {"node", "top_ids" [n_layer][T][K], "top_logits", "logits" (the model's own [T, vocab])}"""
    names = layer_nodes(model, node, node_names(model))
    logits, acts = capture(model, ids, names)
    top_ids, top_logits = [], []
    for n in names:
        z = final_logits(model, acts[n][None])[0]                          # [T, vocab]
        k = np.argsort(-z, axis=-1, kind="stable")[:, :top]                # [T, K]
        top_ids.append(k.tolist())
        top_logits.append(np.take_along_axis(z, k, axis=-1).tolist())
        last = z
    return {"node": node, "top_ids": top_ids, "top_logits": top_logits, "logits": logits[0], "last_lens": last}
