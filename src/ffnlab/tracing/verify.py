"""Node-by-node comparison of ffnlab's forward pass with a reference engine.

Both sides run the same token ids. Nodes are aligned by (name, op, k-th occurrence): "Qcur-0"
is a MUL_MAT, a RESHAPE and a ROPE, and "norm-0" occurs once per norm in the block, in the same
order on both sides (tests/engines/test_trace_llamacpp.py checks that order).

The metric, per node, with a = ffnlab, r = reference:
  max_abs = max |a - r|
  rel     = max_abs / max |r|         (error relative to the node's largest magnitude)
  cosine  = <a, r> / (|a| |r|)
  pass    iff max_abs <= atol + rtol * max |r|
Relative to the node's scale rather than element by element: an element near zero would make
an elementwise ratio explode on rounding noise, while a real bug (wrong pairing, wrong scale,
wrong row) moves the whole node by a sizeable fraction of its scale.

Default tolerances follow each reference's arithmetic (measured figures: docs/glass-box.md):
  llama.cpp        rtol 0.2. The GGUF as is: for quantized weights llama.cpp rounds each matmul's
                   activations to 8 bits (Q8_0/Q8_1/Q8_K blocks), keeps K and V in an fp16 cache
                   and reads GELU from an fp16 table. Those roundings compound over the layers:
                   up to 11% of a node's max on SmolLM2 Q4_1 and 8.5% on Gemma 3 Q4_K_M.
  llama.cpp --f32  rtol 1e-2. llama.cpp on an F32 copy of the weights (dequantized by gguf-py, as
                   ffnlab's are) with an F32 KV cache: only summation order and the fp16 GELU
                   table remain (SmolLM2 6e-6, Gemma 3 1.3e-3, GPT-2 5e-4).
  hf               rtol 1e-4. transformers dequantizes the same GGUF to fp32; only summation
                   order differs (SmolLM2 7e-6).
  llama.cpp, a model loaded with arith="ggml"   rtol 1e-3. ffnlab computes as llama.cpp's CPU
                   backend does on this CPU's code path (model/arith.py, quant/ggml_path.py):
                   SmolLM2 Q4_1 and Gemma 3 Q4_K_M agree bit for bit (rel 0) on the AVX-512 path
                   (Xeon, llama-cpp-python 0.3.36, 2026-12-01) and on the AVX2 one; 1e-3 leaves room
                   for another build's float order (a compiler's FMA contraction), and a RoPE base off
                   by 1% or an RMSNorm eps of 1e-5 for 1e-6 moves its node by more
                   (tests/engines/test_ggml_vs_llamacpp.py). The report names both paths, and says why they
                   cannot agree where they differ (FFNLAB_GGML_PATH forced, another llama.cpp build).
atol (default 1e-6) only matters for nodes that are all zeros.
"""
from dataclasses import dataclass, field

import numpy as np

from ..quant import ggml_path
from .llamacpp import KQ_NODES
from .tracer import ggml_shape

REFERENCES = ("llama.cpp", "hf")
DEFAULT_ATOL = 1e-6


def default_rtol(against, f32=False, arith="f32"):
    if against == "hf":
        return 1e-4
    if f32:
        return 1e-2
    return 1e-3 if arith == "ggml" else 0.2


@dataclass
class Row:
    index: int                  # position in ffnlab's trace
    name: str
    op: str
    shape: tuple                # ffnlab's numpy shape
    srcs: list                  # ffnlab's source names
    max_abs: float | None = None
    max_ref: float | None = None
    rel: float | None = None
    cosine: float | None = None
    ok: bool | None = None      # None: not compared
    note: str = ""


@dataclass
class Report:
    against: str
    rtol: float
    atol: float
    rows: list = field(default_factory=list)
    ggml_path: str | None = None        # the ggml code path ffnlab reproduced (arith="ggml"; quant/ggml_path.py)
    llamacpp_build: tuple | None = None  # (its path, llama-cpp-python's version) when compared with llama.cpp

    @property
    def compared(self):
        return [r for r in self.rows if r.ok is not None]

    @property
    def first_bad(self):
        return next((r for r in self.rows if r.ok is False), None)

    @property
    def first_diff(self):
        """The first compared node that is not bit-equal to the reference. With arith="ggml" the
        nodes before it agree exactly, so a fault starts here even when it is still within rtol
        (an eps change moves its norm by ~1e-6 and only a later node past 1e-3)."""
        return next((r for r in self.rows if r.ok is not None and not r.max_abs == 0), None)

    @property
    def passed(self):
        return bool(self.compared) and self.first_bad is None

    def inputs_of(self, row):
        """[(source name, its latest Row before `row`, or None)]"""
        out = []
        for s in row.srcs:
            prev = next((r for r in reversed(self.rows[:row.index]) if r.name == s), None)
            out.append((s, prev))
        return out


def keyed(items):
    """[(name, op, value)] -> {(name, op, k): value}, k counting earlier (name, op) repeats."""
    seen, out = {}, {}
    for name, op, value in items:
        k = seen.get((name, op), 0)
        seen[(name, op)] = k + 1
        out[(name, op, k)] = value
    return out


def metrics(a, r):
    """-> max_abs, max |r|, max_abs / max |r|, cosine (all float64)"""
    a = np.asarray(a, dtype=np.float64)
    r = np.asarray(r, dtype=np.float64)
    d = np.abs(a - r)
    max_abs = float(d.max()) if d.size else 0.0
    max_ref = float(np.abs(r).max()) if r.size else 0.0
    rel = max_abs / max_ref if max_ref > 0 else (0.0 if max_abs == 0 else float("inf"))
    na, nr = np.linalg.norm(a), np.linalg.norm(r)
    cos = float(a.ravel() @ r.ravel() / (na * nr)) if na > 0 and nr > 0 else (1.0 if na == nr else 0.0)
    return max_abs, max_ref, rel, cos


def _align(ours, ref, name):
    """Bring the reference array to ours' shape. llama.cpp arrays are [ne3, ne2, ne1, ne0];
    its kq/kq_soft_max have n_kv >= S columns (the KV cache is padded to 256 cells): the
    columns past S are empty cells and are dropped."""
    want = tuple(reversed(ggml_shape(ours.shape)))
    if ref.shape != want and ref.ndim == 4 and name.split("-")[0] in KQ_NODES \
            and ref.shape[:3] == want[:3] and ref.shape[3] >= want[3]:
        ref = ref[..., :want[3]]
    if ref.size != ours.size:
        return None
    return ref.reshape(ours.shape)


def compare(nodes, reference, against, rtol=None, atol=None, f32=False, arith="f32"):
    """nodes: ffnlab trace Nodes (arrays kept); reference: {(name, op, k): array}.
    arith: the model's arithmetic ("f32" | "ggml"), which sets the default rtol."""
    rtol = default_rtol(against, f32, arith) if rtol is None else rtol
    atol = DEFAULT_ATOL if atol is None else atol
    report = Report(against, rtol, atol)
    ours = keyed([(n.name, n.op, n) for n in nodes])
    for i, (key, n) in enumerate(ours.items()):
        row = Row(i, n.name, n.op, n.shape, [s for s, _ in n.srcs])
        report.rows.append(row)
        ref = reference.get(key)
        if ref is None:
            row.note = "not in reference"
            continue
        r = _align(n.array, np.asarray(ref), n.name)
        if r is None:
            row.ok, row.note = False, f"shape {list(n.shape)} vs reference {list(np.shape(ref))}"
            continue
        row.max_abs, row.max_ref, row.rel, row.cosine = metrics(n.array, r)
        row.ok = bool(np.isfinite(row.max_abs)) and row.max_abs <= atol + rtol * row.max_ref
    return report


def reference_nodes(against, source, ids, f32=False, arch=None, n_ctx=None, lora=None):
    """Run the reference on ids -> {(name, op, k): array} for the named nodes it computes.
    f32 (llama.cpp): run it on an F32 copy of the GGUF, with an F32 KV cache.
    arch (hf): the GGUF's architecture, which decides whether Q/K rows are permuted.
    n_ctx (hf): the file's context length (transformers does not read GPT-2's from the GGUF).
    lora (llama.cpp): (adapter GGUF, scale) applied to the model."""
    if against == "llama.cpp":
        import os
        import tempfile

        from .llamacpp import capture, f32_copy, is_auto_name, is_kv_node
        if f32:
            with tempfile.TemporaryDirectory(prefix="ffnlab-f32-") as d:
                nodes = capture(f32_copy(source, os.path.join(d, "f32.gguf")), ids, kv_f32=True, lora=lora)
        else:
            nodes = capture(source, ids, lora=lora)
        return keyed([(n.name, n.op, n.array) for n in nodes
                      if not is_auto_name(n.name) and not is_kv_node(n) and n.array is not None])
    from .hf import capture
    return {(name, op, 0): a for (name, op), a in capture(source, ids, gguf_arch=arch, n_ctx=n_ctx).items()}


def verify(model, ids, against, rtol=None, atol=None, f32=False, reference=None):
    """Run ffnlab and the reference on ids and compare every node both compute -> Report.
    reference: precomputed reference_nodes() output (tests reuse one reference run)."""
    from .api import trace
    if against not in REFERENCES:
        raise ValueError(f"against must be one of {REFERENCES}, got {against!r}")
    if reference is None:
        reference = reference_nodes(against, model.source, ids, f32, model.config.arch, model.config.n_ctx)
    with trace(model) as t:
        model.forward(np.asarray(ids))
    report = compare(t.nodes, reference, against, rtol, atol, f32, model.arith.name)
    report.against = against + (" (f32 weights, f32 KV cache)" if f32 and against == "llama.cpp" else "")
    if model.arith.name == "ggml":
        report.ggml_path = ggml_path.PATH
        if against == "llama.cpp":
            report.llamacpp_build = ggml_path.llamacpp_build()
    return report


def path_lines(report):
    """which ggml path ffnlab reproduced, which llama.cpp build it met, and why they cannot agree
    when they cannot"""
    if report.ggml_path is None:
        return []
    lines = [f"ggml mode reproduced llama.cpp's {report.ggml_path} code path (quant/ggml_path.py)"]
    if report.llamacpp_build is not None:
        theirs, version = report.llamacpp_build
        lines.append(f"compared with llama-cpp-python {version}, whose llama.cpp runs its {theirs} kernels "
                     "(flash attention off, f16 KV cache, no weight repacking)")
        hint = mismatch_hint(report)
        if hint is not None:
            lines.append("  they cannot agree bit for bit: " + hint)
    return lines


def mismatch_hint(report):
    """ggml_path.mismatch_hint for the report's two paths, or None"""
    if report.ggml_path is None or report.llamacpp_build is None:
        return None
    return ggml_path.mismatch_hint(report.ggml_path, report.llamacpp_build[0])


# --- printing ------------------------------------------------------------------------------
def _fmt(x, spec=".3e"):
    return "-" if x is None else format(x, spec)


def table_lines(report, all_rows=False):
    head = f"{'node':<24} {'op':<10} {'shape':<16} {'max|diff|':>10} {'max|ref|':>10} {'max rel':>10} {'cosine':>10}  status"
    lines = [head, "-" * len(head)]
    for r in report.rows:
        if r.ok is None and not all_rows:
            continue
        status = "-" if r.ok is None else ("ok" if r.ok else "FAIL")
        shape = "[" + ", ".join(map(str, r.shape)) + "]"
        lines.append(f"{r.name:<24} {r.op:<10} {shape:<16} {_fmt(r.max_abs):>10} {_fmt(r.max_ref):>10} "
                     f"{_fmt(r.rel):>10} {_fmt(r.cosine, '.6f'):>10}  {status}{'  ' + r.note if r.note else ''}")
    return lines


def summary_lines(report):
    n = len(report.compared)
    skipped = len(report.rows) - n
    worst = max((r for r in report.compared if r.rel is not None), key=lambda r: r.rel, default=None)
    lines = path_lines(report)
    lines.append(f"{n} nodes compared against {report.against} (rtol {report.rtol:g} of each node's max |ref|, "
                 f"atol {report.atol:g}); {skipped} ffnlab nodes have no counterpart there")
    if worst is not None:
        lines.append(f"largest relative error: {worst.name} ({worst.op}) {worst.rel:.3e}")
    bad, diff = report.first_bad, report.first_diff
    if diff is not None and (bad is None or diff.index < bad.index):
        lines.append(f"first node that is not bit-equal: {diff.name} ({diff.op}) rel {diff.rel:.3e}")
    elif diff is None and n:
        lines.append("every compared node is bit-equal to the reference")
    if bad is None:
        lines.append("PASS" if n else "FAIL: nothing to compare")
        return lines
    what = bad.note or f"max|diff| {bad.max_abs:.4g} = {bad.rel:.3e} of max|ref| {bad.max_ref:.4g}, cosine {bad.cosine:.6f}"
    lines.append(f"FAIL: first node out of tolerance: {bad.name} ({bad.op}) [{', '.join(map(str, bad.shape))}]: {what}")
    for s, prev in report.inputs_of(bad):
        if prev is None:
            lines.append(f"  input {s}: not a traced node (weight or graph input)")
        elif prev.ok is None:
            lines.append(f"  input {s} ({prev.op}): not compared ({prev.note})")
        else:
            lines.append(f"  input {s} ({prev.op}): rel {prev.rel:.3e}, cosine {prev.cosine:.6f} -> "
                         f"{'ok' if prev.ok else 'FAIL'}")
    if mismatch_hint(report) is not None:
        lines.append(f"(ffnlab's ggml path is {report.ggml_path}, this llama.cpp's {report.llamacpp_build[0]}: "
                     "see the hint above)")
    return lines


def report_dict(report):
    def row(r):
        return {"index": r.index, "name": r.name, "op": r.op, "shape": list(r.shape), "max_abs": r.max_abs,
                "max_ref": r.max_ref, "rel": r.rel, "cosine": r.cosine, "ok": r.ok, "note": r.note or None}
    bad, diff = report.first_bad, report.first_diff
    build = report.llamacpp_build
    return {"against": report.against, "rtol": report.rtol, "atol": report.atol, "passed": report.passed,
            "compared": len(report.compared), "ggml_path": report.ggml_path,
            "llamacpp_path": None if build is None else build[0],
            "first_diff": None if diff is None else row(diff),
            "first_bad": None if bad is None else {
                **row(bad), "inputs": [{"name": s, "row": None if p is None else row(p)}
                                       for s, p in report.inputs_of(bad)]},
            "nodes": [row(r) for r in report.rows]}
