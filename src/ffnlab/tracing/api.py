"""ffnlab.trace(model, ...): the Python way in.

    with ffnlab.trace(model, filter="ffn_") as t:
        model.forward(ids)
    t["ffn_swiglu-0"]            # [T, d_ff] numpy array
    t.node("Qcur-0", "ROPE")     # one of several nodes with the same name
    t.names()                    # node names in order of first appearance
"""
from contextlib import contextmanager

import numpy as np

from ..errors import FfnlabError
from .finite import NonFiniteError
from .tracer import Tracer


@contextmanager
def trace(model, filter=None, keep=True, check_finite=False, on_node=None):
    """Attach a Tracer to model's hook points for the duration of the block (with any
    editing hooks attached too, it sees the edited values).

    filter: regex matched at the start of node names (like llama-eval-callback's
    --tensor-filter); keep: copy the matching arrays; check_finite: raise NonFiniteError at
    the first node with NaN/Inf; on_node(node): called for every matching node."""
    t = Tracer(filter=filter, keep=keep, params=model.params, on_node=on_node, check_finite=check_finite)
    with attached(model, t):
        yield t


@contextmanager
def attached(model, consumer):
    """Attach a Tracer (or a model/hooks.py Editor) to model's hook points for the block."""
    model.hooks.attach(consumer)
    try:
        yield consumer
    finally:
        model.hooks.detach(consumer)


def check_logits(model, logits, ids):
    """Stop generation at NaN/Inf logits, naming where they started: the sequence so far is run
    again with the tracer's finite sentinel, which raises NonFiniteError at the first node holding
    one (as training does when its loss diverges). logits: [vocab]; ids: every token fed so far."""
    if np.isfinite(logits).all():
        return
    n_bad = int((~np.isfinite(logits)).sum())
    where = f"{model.source}: " if model.source else ""
    context = f"{where}the logits after token {len(ids)} hold {n_bad} NaN/Inf values; "
    bad = [n for n, p in model.params.items() if isinstance(p, np.ndarray) and not np.isfinite(p).all()]
    if bad:
        context += f"non-finite weights: {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}; "
    try:
        with np.errstate(all="ignore"), trace(model, filter="^$", keep=False, check_finite=True):
            model.forward(list(ids))
    except NonFiniteError as e:
        raise NonFiniteError(e.node, e.stats, e.inputs, context) from None
    raise FfnlabError(f"{context}a traced forward of the same tokens is finite at every node "
                      f"(the one-token path diverged from it)")
