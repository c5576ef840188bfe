"""The logit lens (nostalgebraist 2020): read each layer's residual stream as if it were the last.

    lens_L = head(output_norm(l_out-L))        [T, vocab], through the model's own final norm and head

so the last layer's lens is the model's logits. --node ffn_out reads what each MLP writes (its
output alone through the final norm and head): which tokens a layer's MLP pushes toward.
"""
import numpy as np

from .api import capture, node_names
from .common import layer_nodes


def logit_lens(model, ids, node="l_out", top=5):
    """ids: [T] -> {"node", "top_ids" [n_layer][T][K], "top_logits", "logits" (the model's own [T, vocab])}"""
    names = layer_nodes(model, node, node_names(model))
    logits, acts = capture(model, ids, names)
    top_ids, top_logits = [], []
    for n in names:
        z = model.final_logits(acts[n])                                   # [T, d_model] -> [T, vocab]
        k = np.argsort(-z, axis=-1, kind="stable")[:, :top]                # [T, K]
        top_ids.append(k.tolist())
        top_logits.append(np.take_along_axis(z, k, axis=-1).tolist())
        last = z
    return {"node": node, "top_ids": top_ids, "top_logits": top_logits, "logits": logits[0], "last_lens": last}
