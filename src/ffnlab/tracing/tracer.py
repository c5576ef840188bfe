"""The tracer: observes every named intermediate tensor of a forward pass.

A Tracer is an observer on the model's hook points (model/hooks.py): each node
`x = hook(name, x)` reaches observe() with its full name (`{name}-{L}` inside block
L, as llama.cpp's cb() names it; bare outside the blocks), after any editing hooks. The tracer
only observes: it copies what it keeps and never hands anything back.

srcs name the node's inputs the way llama.cpp's eval callback prints src[0], src[1]:
  "attn_norm"            a node of this block (becomes "attn_norm-L"), else of the model
  "=norm"                a node name taken literally (no layer suffix)
  "blk.0.ffn_up.weight"  a tensor of the model file (a name with a dot); inside block L a
  "ffn_up.weight"        name without the blk. prefix is that block's (blk.L.ffn_up.weight)
  "inp"                  the block's input (the node emitted just before the block)
  "inp_tokens", "inp_pos", "attn_inp_kq_mask"   llama.cpp's graph inputs; their shapes
                         follow from the node's own array
  (name, shape)          a literal name with its numpy shape (KV-cache views and the like)
  "ffn_up_b|ffn_up"      the first of these nodes this block (else the model) has emitted

A hook call without op and srcs takes them from model/nodes.py's table.
"""
import re
from dataclasses import dataclass, field

import numpy as np

from .finite import NonFiniteError, array_stats


def ggml_shape(shape):
    """numpy shape (row-major) -> ggml ne[0..3] (ne[0] is the fastest axis), padded with 1s"""
    ne = list(reversed(shape)) + [1] * (4 - len(shape))
    return tuple(int(n) for n in ne[:4])


# llama.cpp's graph inputs -> their numpy shape, from the array of the node that reads them
GRAPH_INPUTS = {
    "inp_tokens": lambda a: (a.shape[0],),          # embd [T, D] reads T token ids
    "inp_pos": lambda a: (a.shape[0],),             # embd/pos_embd [T, D], ROPE [T, H, hd]
    "attn_inp_kq_mask": lambda a: a.shape[-2:],     # kq_soft_max [H, T, S] reads the [T, S] mask
}


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
    """with ffnlab.trace(model, filter=...) as t: model.forward(ids);  t["ffn_swiglu-0"]

    (the functional forward takes one as hooks=Hooks(tracer), model/hooks.py)

    filter: a regex matched at the start of the node name (like llama-eval-callback's
            --tensor-filter); only matching nodes are kept and passed to on_node.
    keep: copy the arrays of matching nodes (False: names, ops and shapes only).
    params: the model's tensors, for the shapes of weight sources.
    on_node(node): called after each matching node.
    check_finite: raise NonFiniteError at the first node (matching or not) holding NaN/Inf,
            with the statistics of its inputs.
    """

    def __init__(self, filter=None, keep=True, params=None, on_node=None, check_finite=False):
        self.filter = re.compile(filter) if isinstance(filter, str) else filter
        self.keep = keep
        self.params = params or {}                  # tensor name -> array (for source shapes)
        self.on_node = on_node
        self.check_finite = check_finite
        self.stats = {}                             # name -> array_stats, when check_finite
        self.nodes: list[Node] = []
        self._last = {}                             # name -> last Node with that name
        self._layer_input = None
        self._prev = None                           # the last node emitted, kept or not

    def matches(self, name):
        return self.filter is None or self.filter.match(name) is not None

    def enter(self, layer):
        """A hook point for block `layer` (-1: outside the blocks) starts: the last node seen
        is the block's input ("inp")."""
        if layer >= 0:
            self._layer_input = self._prev

    def _resolve(self, src, layer, a):
        if src is None:
            return None
        if isinstance(src, tuple):                  # (literal name, numpy shape)
            return (src[0], tuple(src[1]))
        if src in GRAPH_INPUTS:
            return (src, tuple(GRAPH_INPUTS[src](a)))
        if src.startswith("="):                     # a literal node name, no layer suffix
            n = self._last.get(src[1:])
            return (src[1:], n.shape if n is not None else None)
        if "." in src:                              # a tensor of the model file
            if layer >= 0 and not src.startswith("blk."):
                src = f"blk.{layer}.{src}"          # the block's own tensor
            w = self.params.get(src)
            return (src, tuple(w.shape) if w is not None else None)
        if "|" in src:                              # the first of these the block (or model) emitted
            alts = src.split("|")
            src = next((a for a in alts if f"{a}-{layer}" in self._last or a in self._last), alts[-1])
        if src == "inp":                            # the block's input (outside blocks: the last node)
            src = (self._layer_input if layer >= 0 else self._prev) or src
        elif layer >= 0 and f"{src}-{layer}" in self._last:
            src = f"{src}-{layer}"
        n = self._last.get(src)
        return (src, n.shape if n is not None else None)

    def observe(self, full, op, array, srcs, layer):
        """One node: its full name, ggml op, value (batch axis first) and sources."""
        a = array[0] if array.ndim >= 2 and array.shape[0] == 1 else array   # drop a batch of 1
        node = Node(full, op, tuple(a.shape), str(a.dtype),
                    [r for r in (self._resolve(s, layer, a) for s in srcs) if r is not None], None, layer)
        self._prev = full
        if self.check_finite:
            st = array_stats(a)
            if st["nan"] or st["inf"]:
                raise NonFiniteError(node, st, [(s, self._src_stats(s)) for s, _ in node.srcs])
            self.stats[full] = st
        self._last[full] = node
        if self.matches(full):
            if self.keep:
                node.array = np.array(a, copy=True)
            self.nodes.append(node)
            if self.on_node is not None:
                self.on_node(node)

    def _src_stats(self, name):
        if name in self.params:
            return array_stats(self.params[name])
        return self.stats.get(name)

    def node(self, name, op=None):
        """The last kept node called `name` (and, if given, with this op: "Qcur-0" is a
        MUL_MAT, a RESHAPE and a ROPE)."""
        for n in reversed(self.nodes):
            if n.name == name and (op is None or n.op == op):
                return n
        raise KeyError(f"no traced node named {name!r}" + (f" with op {op}" if op else ""))

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
