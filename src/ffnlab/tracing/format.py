"""Printing trace nodes the way llama.cpp's llama-eval-callback prints them, so the two can be diffed.

llama.cpp (common/debug.cpp, common_debug_cb_eval) prints one line per graph node:

    LOG("%s: %24s = (%s) %10s(%s{%s}, %s}) = {%s}\n", __func__, t->name, type, ggml_op_desc(t),
        src0->name, ne(src0), src1 ? "src1->name{ne(src1)}" : "", ne(t))

quirks included: the doubled "}}" after src1, an empty "}" when there is no src1, only the
first two sources, shapes as ggml ne[0..3] (fastest axis first, padded with 1). With values it
then prints the first and last 3 entries along each dimension ("%12.4f") and the sum of all
elements accumulated in a float32, in element order.
"""
import numpy as np

from .tracer import ggml_shape

FUNC = "common_debug_cb_eval"          # __func__ in llama.cpp's printer
N_EDGE = 3                             # entries shown at each end of a dimension
GGML_TYPE = {"float32": "f32", "float16": "f16", "float64": "f64", "int32": "i32", "int64": "i64",
             "bfloat16": "bf16"}


def ne_string(shape):
    """numpy shape -> "576, 4, 1, 1" (ggml ne order)"""
    return ", ".join(str(n) for n in ggml_shape(shape))


def eval_callback_line(name, type_name, op, srcs, ne):
    """srcs: [(name, ne or None)], ne: ggml shapes -> llama.cpp's line (also used for its own nodes)."""
    def src(s):
        return f"{s[0]}{{{', '.join(map(str, s[1])) if s[1] is not None else '?'}}}"
    src0 = src(srcs[0]) if srcs else "{}"
    src1 = src(srcs[1]) if len(srcs) > 1 else ""
    return f"{FUNC}: {name:>24} = ({type_name}) {op:>10}({src0}, {src1}}}) = {{{', '.join(map(str, ne))}}}"


def ggml_line(node):
    """The llama-eval-callback line for an ffnlab trace node."""
    srcs = [(name, ggml_shape(shape) if shape is not None else None) for name, shape in node.srcs]
    return eval_callback_line(node.name, GGML_TYPE.get(node.dtype, node.dtype), node.op, srcs, ggml_shape(node.shape))


def logical_line(node):
    """Shapes in numpy order, as in ffnlab's tables: "ffn_up-0 [2, 3072] = (f32) MUL_MAT(...)"."""
    def dims(shape):
        return "[" + ", ".join(map(str, shape)) + "]" if shape is not None else "[?]"
    srcs = ", ".join(f"{name} {dims(shape)}" for name, shape in node.srcs)
    return f"{node.name} {dims(node.shape)} = ({GGML_TYPE.get(node.dtype, node.dtype)}) {node.op}({srcs})"


def ggml_sum(a):
    """The sum llama.cpp prints: a float32 accumulator over the elements in order."""
    flat = np.ascontiguousarray(a, dtype=np.float32).ravel()
    return float(np.cumsum(flat, dtype=np.float32)[-1]) if flat.size else 0.0


def _c_float(v):
    """printf("%12.4f") as glibc prints it, inf and nan included."""
    if np.isnan(v):
        return f"{'-nan' if np.signbit(v) else 'nan':>12}"
    return f"{v:12.4f}"


def values_block(a, n=N_EDGE):
    """llama.cpp's common_debug_print_tensor for array a -> text (ends with a newline)."""
    ne = ggml_shape(a.shape)
    x = np.asarray(a, dtype=np.float32).reshape(tuple(reversed(ne)))     # [ne3, ne2, ne1, ne0]
    total = ggml_sum(x)
    out = []
    for i3 in range(ne[3]):
        out.append("    [\n")
        for i2 in _indices(ne[2], n, out, "        ..., \n"):
            out.append("        [\n")
            for i1 in _indices(ne[1], n, out, "            ..., \n"):
                out.append("            [")
                for i0 in _indices(ne[0], n, out, "   ..., "):
                    out.append(_c_float(x[i3, i2, i1, i0]))
                    if i0 < ne[0] - 1:
                        out.append(", ")
                out.append("  ],\n")
            out.append("        ],\n")
        out.append("    ]\n")
        out.append(f"    sum = {total:f}\n")
    return "".join(out)


def _indices(size, n, out, ellipsis):
    """0..size-1, skipping the middle (and writing `ellipsis` there) when size > 2n."""
    i = 0
    while i < size:
        if i == n and size > 2 * n:
            out.append(ellipsis)
            i = size - n
        yield i
        i += 1


def abbreviated(a, n=N_EDGE):
    """The entries values_block shows, as nested lists in numpy order; "..." marks a skip."""
    def rec(x):
        if x.ndim == 0:
            return float(x)
        idx = list(range(x.shape[0]))
        if x.shape[0] > 2 * n:
            idx = idx[:n] + [None] + idx[-n:]
        return ["..." if i is None else rec(x[i]) for i in idx]
    return rec(np.asarray(a, dtype=np.float32))


def node_record(node, values=False):
    """A JSON-ready dict for one node."""
    r = {"name": node.name, "op": node.op, "type": GGML_TYPE.get(node.dtype, node.dtype),
         "shape": list(node.shape), "ne": list(ggml_shape(node.shape)),
         "srcs": [{"name": s, "shape": list(sh) if sh is not None else None,
                   "ne": list(ggml_shape(sh)) if sh is not None else None} for s, sh in node.srcs]}
    if node.array is not None:
        r["sum"] = ggml_sum(node.array)
        if values:
            r["values"] = abbreviated(node.array)
    return r
