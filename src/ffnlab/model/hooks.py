"""Hook points: every named node of the forward passes through one call, `x = hook("ffn_up", x)`.

    up = hook("ffn_up", linear_forward(x, w.up))

The forward reads as its equations; a hook is the identity when nothing is attached (the
`identity` function below: one Python call, no copy), so observing and editing never fork the
code (TransformerLens's HookPoint idea). Node names are llama.cpp's graph names; inside block L
the full name is `{name}-{L}` (`ffn_out-5`), as `ffnlab trace` prints it.

op and srcs describe the node the way llama.cpp's eval callback prints it (the ggml op, its
inputs). model/nodes.py's table holds them for every node; a call passes them only where the
node is built another way in some families. Only observers read them (tracing/tracer.py
documents the source notation).

What can be attached (Hooks holds them, in two lists):
  editors    Editor: {pattern: fn}; fn(value, name, positions) -> array or None (unchanged).
             `value` is the node's array as the trace shows it (a batch axis of 1 dropped: rows
             are positions of the one sequence), `positions` the absolute positions of those
             rows. A returned array must have the value's shape and dtype; it replaces the node.
  observers  a Tracer (tracing/tracer.py): enter(layer) when a block starts, and
             observe(full name, op, array, srcs, layer) after the editors, so a trace shows the
             values the model actually computed with.
"""
import re

import numpy as np

from ..errors import UsageError
from .nodes import describe


def identity(name, x, op=None, srcs=None, bare=False):
    """The hook of a forward with nothing attached: the node's value, unchanged."""
    return x


class Hooks:
    """What is attached to a model's hook points. Falsy when nothing is."""

    def __init__(self, *consumers):
        self.editors, self.observers = [], []
        for c in consumers:
            self.attach(c)

    def attach(self, c):
        (self.editors if isinstance(c, Editor) else self.observers).append(c)

    def detach(self, c):
        (self.editors if isinstance(c, Editor) else self.observers).remove(c)

    def __bool__(self):
        return bool(self.editors or self.observers)

    def point(self, layer, positions):
        """The hook function of block `layer` (-1: outside the blocks) for rows at `positions` [T]."""
        if not self:
            return identity
        for o in self.observers:
            o.enter(layer)
        editors, observers = self.editors, self.observers

        prev = None                                # the node hooked last (a LoRA delta's ADD, model/nodes.py)

        def hook(name, x, op=None, srcs=None, bare=False):
            nonlocal prev
            full = f"{name}-{layer}" if layer >= 0 and not bare else name
            for e in editors:
                x = e.edit(full, x, positions)
            if observers:
                op, srcs = describe(name, prev, op, srcs)
                for o in observers:
                    o.observe(full, op, x, srcs, layer)
                prev = name
            return x
        return hook


def as_hooks(consumers):
    """A Hooks, one consumer (an Editor or a Tracer) or a sequence of them -> Hooks"""
    if isinstance(consumers, Hooks):
        return consumers
    if isinstance(consumers, (list, tuple)):
        return Hooks(*consumers)
    return Hooks(consumers)


class Editor:
    """{pattern: fn} attached by ffnlab.hooks(model, ...). A pattern is a node name as the trace
    prints it (`ffn_out-5`) or a regular expression matched in full against the names."""

    def __init__(self, fns: dict):
        self.fns = []
        for p, fn in fns.items():
            if not callable(fn):
                raise UsageError(f"the hook for {p!r} is not callable (got {type(fn).__name__})")
            try:
                self.fns.append((p, re.compile(p), fn))
            except re.error as e:
                raise UsageError(f"hook pattern {p!r} is not a regular expression ({e})") from None
        self._by_name = {}                         # full node name -> [fn] (resolved once per name)

    def check(self, names):
        """names: every node name of the model -> UsageError for a pattern that matches none."""
        for p, rx, _ in self.fns:
            if not any(n == p or rx.fullmatch(n) for n in names):
                near = sorted({re.sub(r"-\d+$", "-L", n) for n in names})
                raise UsageError(f"hook pattern {p!r} matches no node of the model "
                                 f"(node names: {', '.join(near)}; L is the layer)")

    def fns_for(self, name):
        fns = self._by_name.get(name)
        if fns is None:
            fns = self._by_name[name] = [fn for p, rx, fn in self.fns if name == p or rx.fullmatch(name)]
        return fns

    def edit(self, name, x, positions):
        fns = self.fns_for(name)
        if not fns:
            return x
        one = x.ndim >= 2 and x.shape[0] == 1              # drop a batch of 1, as the trace shows it
        value = x[0] if one else x
        changed = False
        for fn in fns:
            r = fn(value, name, positions)
            if r is None or r is value:
                continue
            if not isinstance(r, np.ndarray):
                raise UsageError(f"the hook on {name} returned a {type(r).__name__}; expected None or an array "
                                 f"of shape {tuple(value.shape)} {value.dtype}")
            if r.shape != value.shape or r.dtype != value.dtype:
                raise UsageError(f"the hook on {name} returned an array of shape {tuple(r.shape)} {r.dtype}; "
                                 f"expected {tuple(value.shape)} {value.dtype} (the node's own)")
            value, changed = r, True
        if not changed:
            return x
        return value[None] if one else value
