"""Activation patching: which node, at which layer and position, carries what the clean prompt knows.

Two prompts of the same length: clean ("The Eiffel Tower is in the city of") and corrupt ("The
Colosseum is in the city of"), a target token (" Paris") and a foil (" Rome"). The metric is
logit(target) - logit(foil) at the last position. For node N, layer L and position p, the
corrupt prompt is run with N-L's row p replaced by its value in the clean run:

    effect[L][p] = (metric(patched) - metric(corrupt)) / (metric(clean) - metric(corrupt))

1 means that one row restores the clean behaviour, 0 that it does nothing. The T patched runs of
one layer go in one batch (row b patches position b).
"""
import numpy as np

from ..errors import UsageError
from ..model.hooks import Editor
from ..progress import Progress
from .api import capture, node_names
from .common import layer_nodes


def metric(logits, target, foil):
    """logits [..., vocab] -> logit(target) - logit(foil), float64"""
    return logits[..., target].astype(np.float64) - logits[..., foil].astype(np.float64)


def patch(model, clean, corrupt, target, foil, node="l_out"):
    """clean, corrupt: [T] ids -> {"node", "effect" [n_layer][T], "clean", "corrupt"}"""
    if len(clean) != len(corrupt):
        raise UsageError(f"--clean has {len(clean)} tokens and --corrupt {len(corrupt)}; patching needs the same "
                         f"count (position p of one is position p of the other)")
    names = layer_nodes(model, node, node_names(model))
    T = len(clean)
    clean_logits, acts = capture(model, clean, names)
    corrupt_logits = model.forward(np.asarray(corrupt)[None], hooks=())
    m_clean = float(metric(clean_logits[0, -1], target, foil))
    m_corrupt = float(metric(corrupt_logits[0, -1], target, foil))
    if m_clean == m_corrupt:
        raise UsageError("the clean and corrupt prompts give the same logit difference: there is nothing to restore")
    for n in names:
        if acts[n].shape[0] != T:
            raise UsageError(f"--node {node}: {n} has shape {acts[n].shape}, no leading position axis to patch")
    batch = np.tile(np.asarray(corrupt), (T, 1))                          # [T, T]: row b patches position b
    rows = np.arange(T)
    effect, bar = [], Progress(len(names), "patching")
    for n in names:
        bar.update(1, n)
        clean_rows = acts[n]                                                # [T, ...]

        def put(value, name, positions, clean_rows=clean_rows):
            value = value.copy()                                            # [B=T, T, ...]
            value[rows, rows] = clean_rows
            return value
        logits = model.forward(batch, hooks=Editor({n: put}), last_only=True)   # [T, 1, vocab]
        m = metric(logits[:, -1], target, foil)                             # [T]
        effect.append(((m - m_corrupt) / (m_clean - m_corrupt)).tolist())
    bar.close()
    return {"node": node, "effect": effect, "clean": m_clean, "corrupt": m_corrupt}
