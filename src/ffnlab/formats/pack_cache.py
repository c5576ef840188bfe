"""A GGUF's packed weights, laid out once and kept on disk, like numba's compiled kernels.

Packing (quant/packed.py) rewrites every quantized matrix into row-interleaved groups: ~112 MB
of new memory for SmolLM2. On a 2-vCPU Intel Xeon VM (2026-11, bench/RESULTS.md) most of that cost is first-touch page faults on fresh
memory, 135-270 ms of a 0.55 s load, against 64 ms for the same writes into memory already
touched. An entry here is that layout written to a file: a later load maps it (copy-on-write,
so nothing is written back) and the kernels read the page cache's pages directly, with no
packing and no faults to speak of (touching all 112 MB of a mapped file took 1.2 ms).

Keyed like the tokenizer cache: a BLAKE2 hash of the file's header (metadata and tensor
directory), its size, modification time and inode, the source of the code that makes the layout,
and the arithmetic. A file edited or replaced misses, so does a new ffnlab. Entries are written
to a temporary name and renamed; one that is unreadable, truncated or inconsistent (offsets
past the end, shapes that do not fit the tensors) is ignored and the weights are packed at load
as without a cache. Only arith "f32" layouts of quant/packed.py are kept (ggml's K-quant layouts
are packed at load).

  FFNLAB_CACHE_DIR          where entries go (the tokenizer cache's directory; "" = no cache)
  FFNLAB_PACK_CACHE_MB      the most the packed entries may take together (default 4096;
                            0 = none kept). The least recently used go first; an entry larger than
                            the limit, or one that would leave under 1 GiB free on the disk, is not kept.

File: b"FFNLABPK", the index's length (8 bytes, little-endian), the index (JSON), then from the
next 64-byte boundary each array's bytes at the (64-byte-aligned) offset the index gives.
"""
import hashlib
import json
import mmap
import os
import shutil
import tempfile

import numpy as np

from ..quant import QuantTensor, packed
from .tokenizer_cache import cache_dir

MAGIC = b"FFNLABPK"
ALIGN = 64
DEFAULT_LIMIT_MB = 4096
MIN_FREE = 1 << 30
FIELDS = ("qs", "qh", "d", "m")                     # packed.Packed's arrays, in this order
DTYPES = {"nib": ("uint8", "uint8"), "i8": ("int8", "uint8")}   # qs, qh; d and m: the unit's "scales"
SCALES = ("float32", "uint16")                       # packed.scale_dtype: float32, or half bits


def _limit() -> int:
    try:
        return max(0, int(float(os.environ.get("FFNLAB_PACK_CACHE_MB", DEFAULT_LIMIT_MB)) * (1 << 20)))
    except ValueError:
        return DEFAULT_LIMIT_MB << 20


def _entry(path, reader, arith) -> str | None:
    d = cache_dir()
    if d is None or arith != "f32" or _limit() == 0:
        return None
    from ..model import packing
    from ..quant import tensor
    st = os.stat(path)
    h = hashlib.blake2b(digest_size=20)
    h.update(memoryview(reader.data[:reader.data_offset]))          # the header: metadata + tensor directory
    h.update(f"{st.st_size} {st.st_mtime_ns} {st.st_ino} {arith}".encode())
    for mod in (packed, tensor, packing):                           # the code that decides the layout
        with open(mod.__file__, "rb") as f:
            h.update(f.read())
    with open(__file__, "rb") as f:
        h.update(f.read())
    return os.path.join(d, "packed", h.hexdigest() + ".ffpk")


# ---- reading back ------------------------------------------------------------------------------

def restore(path, reader, params, arith) -> bool:
    """Give the QuantTensors in params their packed layouts from this file's entry (stacks
    included, as QuantTensor.stacked makes them). -> True if an entry was used; False (params
    untouched) where there is none or it does not fit."""
    try:
        entry = _entry(path, reader, arith)
        if entry is None or not os.path.isfile(entry):
            return False
        with open(entry, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)  # private: our writes never reach the file
        units, plan = _read(buf, params)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    for names, u in plan:
        parts = [params[n] for n in names]
        if len(parts) > 1:
            QuantTensor.stacked(parts, fused=units[u])
        else:
            parts[0].packed = units[u]
    try:
        os.utime(entry)                                             # used: the last to be evicted
    except OSError:
        pass
    return True


def _read(buf, params):
    """-> (units [packed.Packed], plan [(tensor names, unit)]); raises ValueError where the entry
    does not describe these params"""
    if len(buf) < 16 or buf[:8] != MAGIC:
        raise ValueError("not a packed-weights entry")
    n = int.from_bytes(buf[8:16], "little")
    index = json.loads(bytes(buf[16:16 + n]).decode("utf-8"))
    base = _aligned(16 + n)
    units = [_unit(buf, base, u) for u in index["units"]]
    plan, seen, used = [], set(), set()
    for names, u in index["tensors"]:
        parts = [params.get(name) for name in names]
        if not names or seen & set(names) or not 0 <= u < len(units) or u in used \
                or any(not isinstance(w, QuantTensor) or w.packed is not None or w.arith != "f32"
                       or w.qtype != parts[0].qtype for w in parts):
            raise ValueError("tensors do not match")
        P, qtype = units[u], int(parts[0].qtype)
        G = [-(-w.shape[0] // packed.R) for w in parts]
        if P.rows != sum(w.shape[0] for w in parts) or P.qs.shape[0] != sum(G) or any(w.shape[1] != P.n for w in parts) \
                or any(w.shape[0] % packed.R for w in parts[:-1]) or not _same_kind(P, qtype):
            raise ValueError("shapes do not match")
        seen |= set(names)
        used.add(u)
        plan.append((names, u))
    missing = [n for n, w in params.items() if isinstance(w, QuantTensor) and int(w.qtype) in packed.PACKED_TYPES
               and w.arith == "f32" and w.packed is None and n not in seen]
    if missing:
        raise ValueError(f"no layout for {missing[0]}")
    return units, plan


def _same_kind(P, qtype) -> bool:
    """whether P is the layout packed.pack makes for this ggml type: its family, zero point, fifth
    bits and offsets, codes per scale"""
    if P.d.dtype != packed.scale_dtype(qtype):
        return False
    if qtype in packed.NIB_TYPES:
        zero, fifth, has_m = packed.NIB_TYPES[qtype]
        return P.kind == "nib" and P.zero == zero and bool(P.qh.size) == fifth and bool(P.m.size) == has_m
    return qtype in packed.I8_TYPES and P.kind == "i8" and P.qs.shape[2] == packed.I8_TYPES[qtype]


def _unit(buf, base, u):
    """One packed.Packed from its index entry, its arrays views of buf, every shape checked"""
    kind, rows, n, zero = u["kind"], int(u["rows"]), int(u["n"]), int(u["zero"])
    if kind not in DTYPES or rows <= 0 or n <= 0:
        raise ValueError("bad unit")
    arrays = []
    scales = u.get("scales")
    if scales not in SCALES:
        raise ValueError("unknown scale type")
    for (offset, shape), dtype in zip(u["arrays"], DTYPES[kind] + (scales, scales)):
        shape = tuple(int(s) for s in shape)
        size = int(np.prod(shape)) * np.dtype(dtype).itemsize
        offset = base + int(offset)
        if offset % ALIGN or offset < base or offset + size > len(buf) or any(s < 0 for s in shape):
            raise ValueError("array out of the file")
        arrays.append(np.frombuffer(buf, dtype, int(np.prod(shape)), offset).reshape(shape))
    qs, qh, d, m = arrays
    if not m.size:
        m = packed._NONE_F                                          # as packed.empty leaves it: one kernel signature
    G, B = -(-rows // packed.R), qs.shape[2] if qs.ndim == 4 else 0
    width = 16 if kind == "nib" else B
    blocks = n // (32 if kind == "nib" else max(B, 1))
    if qs.shape != (G, blocks, width, packed.R) or d.shape != (G, blocks, packed.R) or (kind == "i8" and B not in (16, 32)) \
            or n % (32 if kind == "nib" else B) or qh.shape not in ((0, 0, 0, 0), (G, blocks, 4, packed.R)) \
            or m.shape not in ((0, 0, 0), d.shape) or (kind == "i8" and (qh.size or m.size)):
        raise ValueError("shapes do not fit")
    return packed.Packed(kind, rows, n, qs, qh, d, m, zero)


# ---- writing -----------------------------------------------------------------------------------

def store(path, reader, params, arith) -> None:
    """Keep the packed layouts of params' QuantTensors for the next load of this file; skipped
    where the cache is off, too small, or cannot be written."""
    try:
        entry = _entry(path, reader, arith)
        if entry is None:
            return
        units, tensors = _units(params)
        if not units:
            return
        index, arrays, size = _layout(units, tensors)
        head = json.dumps(index).encode("utf-8")
        base = _aligned(16 + len(head))
        end = base + size
        d = os.path.dirname(entry)
        os.makedirs(d, exist_ok=True)
        if end > _limit() or shutil.disk_usage(d).free - end < MIN_FREE:
            return
        _evict(d, _limit() - end)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + len(head).to_bytes(8, "little") + head)
                for offset, a in arrays:
                    if a.size:
                        f.seek(base + offset)
                        f.write(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
                f.truncate(end)
            os.replace(tmp, entry)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return                    # an unwritable cache directory: the next load packs again


def _units(params):
    """-> (the distinct packed.Packed layouts, [(names, unit index)]): a stack's parts in row order"""
    units, tensors, ids = [], [], {}
    for name, w in params.items():
        if not isinstance(w, QuantTensor) or not isinstance(w.packed, packed.Packed) or w.arith != "f32":
            continue
        owner = w.stack.packed if w.stack is not None else w.packed
        if id(owner) not in ids:
            ids[id(owner)] = len(units)
            units.append(owner)
            tensors.append([])
        tensors[ids[id(owner)]].append((w.packed.qs.ctypes.data, name))
    return units, [([name for _, name in sorted(parts)], u) for u, parts in enumerate(tensors)]


def _layout(units, tensors):
    """-> (the index, [(offset from the data start, array)], data size)"""
    index = {"units": [], "tensors": tensors}
    arrays, off = [], 0
    for P in units:
        shapes = []
        for f in FIELDS:
            a = getattr(P, f)
            shapes.append([off, list(a.shape)])
            arrays.append((off, a))
            off = _aligned(off + a.nbytes)
        index["units"].append({"kind": P.kind, "rows": P.rows, "n": P.n, "zero": int(P.zero), "arrays": shapes,
                               "scales": P.d.dtype.name})
    return index, arrays, off


def _aligned(n):
    return -(-n // ALIGN) * ALIGN


def _evict(d, room):
    """Remove the least recently used entries until those left take at most room bytes."""
    entries = []
    for name in os.listdir(d):
        if name.endswith(".ffpk"):
            p = os.path.join(d, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
    entries.sort()
    total = sum(s for _, s, _ in entries)
    for _, size, p in entries:
        if total <= room:
            break
        try:
            os.unlink(p)
            total -= size
        except OSError:
            pass
