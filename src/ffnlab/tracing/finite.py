"""Finding the first node that holds a NaN or an Inf, and describing its inputs."""
import numpy as np

from ..errors import FfnlabError


def array_stats(a):
    """-> {shape, min, max, mean, rms, nan, inf}; min/max/mean/rms over the finite entries."""
    a = np.asarray(a)
    with np.errstate(all="ignore"):
        finite = np.isfinite(a)
        n_nan = int(np.isnan(a).sum())
        n_inf = int(a.size - finite.sum() - n_nan)
        f = a[finite] if n_nan or n_inf else a.ravel()
        f64 = f.astype(np.float64)
        return {"shape": list(a.shape),
                "min": float(f64.min()) if f.size else None,
                "max": float(f64.max()) if f.size else None,
                "mean": float(f64.mean()) if f.size else None,
                "rms": float(np.sqrt(np.mean(f64 * f64))) if f.size else None,
                "nan": n_nan, "inf": n_inf}


def format_stats(st):
    if st is None:
        return "(not traced)"
    shape = "[" + ", ".join(map(str, st["shape"])) + "]"
    if st["min"] is None:
        vals = "no finite entries"
    else:
        vals = f"min {st['min']:.6g}  max {st['max']:.6g}  mean {st['mean']:.6g}  rms {st['rms']:.6g}"
    return f"{shape}  {vals}  nan {st['nan']}  inf {st['inf']}"


class NonFiniteError(FfnlabError):
    """A node of the forward pass holds NaN or Inf. .node: the trace Node; .stats: its
    array_stats; .inputs: [(source name, array_stats or None)]."""

    def __init__(self, node, stats, inputs, context=""):
        self.node, self.stats, self.inputs = node, stats, inputs
        what = ", ".join(f"{stats[k]} {k}" for k in ("nan", "inf") if stats[k])
        super().__init__(f"{context}first non-finite node: {node.name} ({node.op}) holds {what}")

    def report(self):
        """Lines: the node, then each input's statistics."""
        lines = [str(self), f"  {self.node.name}: {format_stats(self.stats)}"]
        for name, st in self.inputs:
            lines.append(f"  input {name}: {format_stats(st)}")
        return lines
