"""`ffnlab run --ablate / --scale / --steer`: interventions from the command line, as ffnlab.hooks.

  --ablate NODE:U1,U2,...      set units (last-axis entries) of NODE to 0: ffn_swiglu-5:123,456
  --scale NODE:UNIT:FACTOR     multiply one unit by FACTOR: ffn_swiglu-5:123:4
  --steer NODE:FILE.npy        add a vector of NODE's width to every row: l_out-10:paris.npy
NODE is a node name as `ffnlab trace` prints it, or a regular expression matched in full
(ffn_swiglu-\\d+ for every layer). Each flag may be repeated; edits on one node apply in order.
The flags are declared in cli/common.py (add_intervention_arguments), which `ffnlab run --help`
reads without importing this module's NumPy and model code.
"""
import os

import numpy as np

from ..errors import UsageError
from ..model.hooks import Editor
from .api import node_shapes


def _split(flag, spec, parts):
    bits = spec.rsplit(":", parts - 1)
    if len(bits) != parts or not all(bits):
        form = {"--ablate": "NODE:U1,U2", "--scale": "NODE:UNIT:FACTOR", "--steer": "NODE:FILE.npy"}[flag]
        raise UsageError(f"{flag} {spec!r}: expected {form}")
    return bits


def _width(flag, spec, node, shapes):
    import re
    try:
        matched = [s for n, s in shapes.items() if n == node or re.fullmatch(node, n)]
    except re.error as e:
        raise UsageError(f"{flag} {spec!r}: {node!r} is not a node name or regular expression ({e})") from None
    if not matched:
        raise UsageError(f"{flag} {spec!r}: no node named {node!r} (see `ffnlab trace` for the names)")
    widths = {s[-1] for s in matched}
    if len(widths) > 1:
        raise UsageError(f"{flag} {spec!r}: {node!r} matches nodes of different widths {sorted(widths)}")
    return widths.pop()


def _int(flag, spec, s, width):
    try:
        u = int(s)
    except ValueError:
        raise UsageError(f"{flag} {spec!r}: unit {s!r} is not an integer") from None
    if not 0 <= u < width:
        raise UsageError(f"{flag} {spec!r}: unit {u} is out of range (the node has {width} units, 0..{width - 1})")
    return u


def intervention_editor(model, ablate=(), scale=(), steer=()):
    """-> (Editor or None, [record]): the flags as one Editor, and what was done (for --json)."""
    if not (ablate or scale or steer):
        return None, []
    shapes = node_shapes(model)
    edits, record = [], []                                       # (node, fn)
    for spec in ablate:
        node, units = _split("--ablate", spec, 2)
        w = _width("--ablate", spec, node, shapes)
        idx = [_int("--ablate", spec, u, w) for u in units.split(",")]
        edits.append((node, lambda v, n, p, idx=idx: _set(v, idx, 0)))
        record.append({"kind": "ablate", "node": node, "units": idx})
    for spec in scale:
        node, unit, factor = _split("--scale", spec, 3)
        w = _width("--scale", spec, node, shapes)
        u = _int("--scale", spec, unit, w)
        try:
            f = float(factor)
        except ValueError:
            raise UsageError(f"--scale {spec!r}: factor {factor!r} is not a number") from None
        edits.append((node, lambda v, n, p, u=u, f=f: _set(v, [u], v[..., u:u + 1] * v.dtype.type(f))))
        record.append({"kind": "scale", "node": node, "unit": u, "factor": f})
    for spec in steer:
        node, path = _split("--steer", spec, 2)
        w = _width("--steer", spec, node, shapes)
        vec = _load_vector(spec, path, w)
        edits.append((node, lambda v, n, p, vec=vec: v + vec.astype(v.dtype)))
        record.append({"kind": "steer", "node": node, "file": path, "norm": float(np.linalg.norm(vec))})
    by_node = {}
    for node, fn in edits:
        by_node.setdefault(node, []).append(fn)
    return Editor({node: _chain(fns) for node, fns in by_node.items()}), record


def _set(v, idx, values):
    v = v.copy()
    v[..., idx] = values
    return v


def _chain(fns):
    def run(v, name, positions):
        for fn in fns:
            v = fn(v, name, positions)
        return v
    return run


def _load_vector(spec, path, width):
    if not os.path.isfile(path):
        raise UsageError(f"--steer {spec!r}: {path}: no such file")
    try:
        vec = np.load(path, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise UsageError(f"--steer {spec!r}: {path} is not a .npy array ({e})") from None
    if vec.ndim != 1 or vec.shape[0] != width or not np.issubdtype(vec.dtype, np.floating):
        raise UsageError(f"--steer {spec!r}: {path} holds a {vec.dtype} array of shape {vec.shape}; "
                         f"expected a float vector of the node's width ({width},)")
    if not np.isfinite(vec).all():
        raise UsageError(f"--steer {spec!r}: {path} holds NaN or Inf")
    return vec
