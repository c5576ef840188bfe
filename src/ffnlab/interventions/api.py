"""ffnlab.hooks(model, {pattern: fn}): edit named nodes while the block runs.

    def steer(value, name, positions):          # value: [T, d_model] rows at these positions
        return value + 4.0 * direction
    with ffnlab.hooks(model, {"l_out-5": steer}):
        model.generate("The Eiffel Tower is in", 20)

A pattern is a node name as `ffnlab trace` prints it (`ffn_out-5`) or a regular expression
matched in full against the names (`ffn_out-\\d+`). fn(value, name, positions) returns an array of
the value's shape and dtype, or None to leave it. The hooks run in forward, forward_last and
generate, with or without the KV cache (Model.forward_last leaves its one-token fast path while
any hook is attached, so a hooked sequence decodes as it would be recomputed in full). A trace
attached at the same time sees the edited values.
"""
import re
from contextlib import contextmanager

import numpy as np

from ..model.hooks import Editor
from ..tracing.api import attached
from ..tracing.tracer import Tracer


def node_names(model):
    """Every node name of the model's forward, in order (one token run with only a tracer attached)."""
    return list(node_shapes(model))


def node_shapes(model):
    """{node name: its shape for one token} (the last node of a name wins), in order of first appearance."""
    t = Tracer(keep=False)
    model.forward(np.zeros(1, np.int64), hooks=t, last_only=True)
    return {n.name: n.shape for n in t.nodes}


@contextmanager
def hooks(model, fns):
    """Attach {pattern: fn} to model's hook points for the block (see the module docstring)."""
    editor = Editor(fns)
    editor.check(node_names(model))
    with attached(model, editor):
        yield editor


def capture(model, ids, names, extra=()):
    """ids: [T] (or [B, T]) -> (logits [B, T, vocab], {name: array}): one forward keeping the named
    nodes (as the trace shows them: a batch of 1 dropped), with `extra` consumers attached too."""
    t = Tracer(filter="(?:" + "|".join(re.escape(n) for n in names) + ")$", keep=True)
    logits = model.forward(np.atleast_2d(ids), hooks=[*extra, t])
    missing = [n for n in names if n not in t]
    if missing:
        raise KeyError(f"no node named {missing[0]!r}")
    return logits, {n: t[n] for n in names}
