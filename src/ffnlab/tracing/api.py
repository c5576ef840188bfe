"""ffnlab.trace(model, ...): the Python way in.

    with ffnlab.trace(model, filter="ffn_") as t:
        model.forward(ids)
    t["ffn_swiglu-0"]            # [T, d_ff] numpy array
    t.node("Qcur-0", "ROPE")     # one of several nodes with the same name
    t.names()                    # node names in order of first appearance
"""
from contextlib import contextmanager

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
