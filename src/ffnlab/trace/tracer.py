"""The tracer: observes every named intermediate tensor of a forward pass.

The model calls emit(name, op, array, srcs) at each node, with llama.cpp's graph names;
inside block L the name becomes `{name}-{L}` (as llama.cpp's cb() names it), outside it stays
bare. The tracer only observes: it copies what it keeps and never hands anything back, so
results are bit-identical with and without it.
"""
import re
from dataclasses import dataclass, field

import numpy as np


def ggml_shape(shape):
    """numpy shape (row-major) -> ggml ne[0..3] (ne[0] is the fastest axis), padded with 1s"""
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    return tuple(int(n) for n in ne[:4])


@dataclass
class Node:
    name: str                         # e.g. "ffn_up-0"
    op: str                           # ggml op as llama-eval-callback prints it, e.g. "MUL_MAT"
    shape: tuple                      # numpy shape, batch axis dropped when the batch is 1
    dtype: str
    srcs: list = field(default_factory=list)   # [(source name, its numpy shape or None)]
    array: np.ndarray | None = None   # a copy, when the node matched the filter
    layer: int = -1

    @property
    def ne(self):
        return ggml_shape(self.shape)


class Tracer:
    """with ffnlab.trace(model, filter=...) as t: model.forward(ids);  t["ffn_swiglu-0"]"""

    def __init__(self, filter=None, keep=True, params=None, on_node=None):
        self.filter = re.compile(filter) if isinstance(filter, str) else filter
        self.keep = keep                        # copy matching arrays (False: names/shapes only)
        self.params = params or {}              # tensor name -> array (for source shapes)
        self.on_node = on_node                  # callback(node) after each matching node
        self.nodes: list[Node] = []
        self._last = {}                         # name -> last Node with that name
        self._layer_input = None
        self._prev = None                       # the last node emitted, kept or not

    def matches(self, name):
        return self.filter is None or self.filter.search(name) is not None

    def emitter(self, layer):
        """The emit function for block `layer` (-1: outside the blocks)."""
        if layer >= 0:
            self._layer_input = self._prev
        return lambda name, op, array, srcs=(), bare=False: self._emit(name, op, array, srcs, layer, bare)

    def _resolve(self, src, layer):
        if src is None:
            return None
        if src.startswith("="):                   # a literal node name, no layer suffix
            n = self._last.get(src[1:])
            return (src[1:], n.shape if n is not None else None)
        if "." in src:                            # a tensor of the model file
            a = self.params.get(src)
            return (src, tuple(a.shape) if a is not None else None)
        if src == "inp":                          # the block's input (or, outside blocks, the last node)
            src = (self._layer_input if layer >= 0 else self._prev) or src
        elif layer >= 0 and f"{src}-{layer}" in self._last:
            src = f"{src}-{layer}"
        n = self._last.get(src)
        return (src, n.shape if n is not None else None)

    def _emit(self, name, op, array, srcs, layer, bare=False):
        full = f"{name}-{layer}" if layer >= 0 and not bare else name
        a = array[0] if array.ndim >= 2 and array.shape[0] == 1 else array   # drop a batch of 1
        node = Node(full, op, tuple(a.shape), str(a.dtype),
                    [r for r in (self._resolve(s, layer) for s in srcs) if r is not None], None, layer)
        self._prev = full
        if self.matches(full):
            if self.keep:
                node.array = np.array(a, copy=True)
            self.nodes.append(node)
            self._last[full] = node
            if self.on_node is not None:
                self.on_node(node)
        else:
            self._last[full] = node

    def __getitem__(self, name):
        n = self._last.get(name)
        if n is None or n.array is None:
            raise KeyError(f"no traced tensor named {name!r}")
        return n.array

    def __contains__(self, name):
        return name in self._last and self._last[name].array is not None

    def names(self):
        """Node names in order of first appearance."""
        seen, out = set(), []
        for n in self.nodes:
            if n.name not in seen:
                seen.add(n.name)
                out.append(n.name)
        return out
