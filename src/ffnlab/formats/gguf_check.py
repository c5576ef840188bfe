"""GGUF structure, checked before gguf.GGUFReader parses the file and before any tensor is read.

    check_gguf(path)        # ModelFileError naming the file and the key or tensor, or None

GGUFReader trusts the file: an array whose count exceeds the file makes it read past the end one
element at a time (a 49-byte file hangs and grows without bound), invalid UTF-8 surfaces later as a
UnicodeDecodeError, and tensor offsets are taken as given. This walk reads the header with every
count bounded by the bytes that remain, then holds the tensor directory to llama.cpp's rules
(ggml/src/gguf.cpp, gguf_init_from_file_impl):
  - version 2 or 3; keys unique; general.alignment a power of two (default 32);
  - no arrays of arrays; keys and string values valid UTF-8 (array strings: where they are decoded);
  - tensor names unique and shorter than GGML_MAX_NAME (64); at most 4 dimensions, none negative,
    the element count without overflow; a known ggml type whose block size divides ne[0];
  - each tensor's offset equals the running sum of the previous tensors' sizes, each padded to the
    alignment (so no overlap, no gap, no misalignment, no wrap past 2^64);
  - the data of every tensor lies inside the file (llama.cpp's model loader: "tensor data is not
    within the file bounds"), and no more than one alignment of bytes follows the last one (stricter
    than llama.cpp: a last tensor whose type was edited to a smaller one would otherwise load).
One function per rule family; each raises ModelFileError with one line.
"""
import mmap
import os
import struct

import numpy as np

from ..errors import ModelFileError
from .gguf_arrays import string_spans

GGML_MAX_NAME = 64
GGML_MAX_DIMS = 4
DEFAULT_ALIGNMENT = 32
# GGUFValueType -> (struct format, bytes); STRING = 8 and ARRAY = 9 are handled apart
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
STRING, ARRAY = 8, 9


class _Reader:
    """Bounded little-endian reads from a memory map; running off the end names what was being read."""

    def __init__(self, buf, path):
        self.buf, self.pos, self.path, self.size = buf, 0, path, len(buf)

    def need(self, n, what):
        if n < 0 or self.pos + n > self.size:
            raise ModelFileError(f"{self.path}: truncated or corrupt at offset {self.pos}: {what} would take {n} "
                                 f"bytes, the file has {self.size - self.pos} left")

    def scalar(self, fmt, n, what):
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return v

    def u32(self, what):
        return self.scalar("<I", 4, what)

    def u64(self, what):
        return self.scalar("<Q", 8, what)

    def string(self, what):
        n = self.u64(f"the length of {what}")
        self.need(n, what)
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{self.path}: {what} is not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 4]!r})") from None


def check_gguf(path):
    path = os.fspath(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        magic = f.read(4)
        if magic != b"GGUF":
            raise ModelFileError(f"{path}: not a GGUF file (first bytes {magic!r}, expected b'GGUF')")
        if size < 24:
            raise ModelFileError(f"{path}: truncated: {size} bytes, a GGUF header alone has 24")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _Reader(buf, path)
            n_tensors, n_kv = _header(r)
            alignment = _metadata(r, n_kv)
            tensors = _tensor_directory(r, n_tensors)
    data_start = -(-r.pos // alignment) * alignment
    _tensor_layout(path, tensors, alignment, data_start, size)


def _header(r):
    r.pos = 4                                                  # the magic was checked before mapping
    version = r.u32("the version")
    if version not in (2, 3):
        raise ModelFileError(f"{r.path}: GGUF version {version} is not supported (2 and 3 are)")
    n_tensors, n_kv = r.u64("the tensor count"), r.u64("the metadata count")
    # every key/value takes at least 8 + 4 + 1 bytes and every tensor entry 8 + 4 + 8 + 4 + 8
    if n_kv * 13 > r.size or n_tensors * 32 > r.size:
        raise ModelFileError(f"{r.path}: corrupt header: {n_kv} metadata keys and {n_tensors} tensors cannot fit "
                             f"in {r.size} bytes")
    return n_tensors, n_kv


def _metadata(r, n_kv) -> int:
    """Walk the key/value section (bounded); -> general.alignment."""
    seen, alignment = set(), DEFAULT_ALIGNMENT
    for i in range(n_kv):
        key = r.string(f"metadata key #{i}")
        if key in seen:
            raise ModelFileError(f"{r.path}: metadata key '{key}' appears twice")
        seen.add(key)
        vtype = r.u32(f"the type of '{key}'")
        if vtype == ARRAY:
            etype = r.u32(f"the element type of '{key}'")
            count = r.u64(f"the element count of '{key}'")
            _array(r, key, etype, count)
        else:
            v = _value(r, key, vtype)
            if key == "general.alignment":
                if vtype != 4 or v == 0 or v & (v - 1):
                    raise ModelFileError(f"{r.path}: general.alignment must be a power of two (uint32), found {v!r}")
                alignment = v
    return alignment


def _value(r, key, vtype):
    if vtype == STRING:
        return r.string(f"the value of '{key}'")
    if vtype not in _SCALARS:
        raise ModelFileError(f"{r.path}: metadata key '{key}' has unknown value type {vtype}")
    fmt, n = _SCALARS[vtype]
    return r.scalar(fmt, n, f"the value of '{key}'")


def _array(r, key, etype, count):
    if etype == ARRAY:
        raise ModelFileError(f"{r.path}: metadata key '{key}' is an array of arrays (not allowed in GGUF)")
    if etype == STRING:
        # each string is at least its 8-byte length; the walk checks bounds only (a vocabulary has
        # 262k strings), their UTF-8 is checked where they are decoded (gguf_meta.field_value)
        r.need(count * 8, f"the {count} strings of '{key}'")
        _, _, end = string_spans(np.frombuffer(r.buf, np.uint8), r.pos, count)   # one compiled walk
        if end >= 0:
            r.pos = int(end)
            return
        raise ModelFileError(f"{r.path}: truncated or corrupt: the strings of '{key}' run past the end of the file")
    if etype not in _SCALARS:
        raise ModelFileError(f"{r.path}: metadata key '{key}' has unknown element type {etype}")
    n = count * _SCALARS[etype][1]
    r.need(n, f"the {count} elements of '{key}'")
    r.pos += n


def _tensor_directory(r, n_tensors) -> list:
    """-> [(name, ne, ggml type, offset)] in file order, each entry's own fields checked."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    out, names = [], set()
    for i in range(n_tensors):
        name = r.string(f"the name of tensor #{i}")
        if len(name.encode()) >= GGML_MAX_NAME:
            raise ModelFileError(f"{r.path}: tensor name '{name[:80]}' is {len(name.encode())} bytes "
                                 f"(llama.cpp allows {GGML_MAX_NAME - 1})")
        if name in names:
            raise ModelFileError(f"{r.path}: tensor {name} appears twice in the tensor directory")
        names.add(name)
        n_dims = r.u32(f"the dimension count of tensor {name}")
        if n_dims > GGML_MAX_DIMS:
            raise ModelFileError(f"{r.path}: tensor {name} has {n_dims} dimensions (at most {GGML_MAX_DIMS})")
        ne = tuple(r.scalar("<q", 8, f"the shape of tensor {name}") for _ in range(n_dims))
        if any(n < 0 for n in ne):
            raise ModelFileError(f"{r.path}: tensor {name} has a negative dimension {list(ne)}")
        n_el = 1
        for n in ne:
            n_el *= n
        if n_el >= 2**63:
            raise ModelFileError(f"{r.path}: tensor {name} has {n_el} elements (overflows int64)")
        tid = r.u32(f"the type of tensor {name}")
        try:
            ttype = GGMLQuantizationType(tid)
            block, type_size = GGML_QUANT_SIZES[ttype]
        except (ValueError, KeyError):
            raise ModelFileError(f"{r.path}: tensor {name} has unknown ggml type id {tid}") from None
        if ne and ne[0] % block:
            raise ModelFileError(f"{r.path}: tensor {name} ({ttype.name}) has ne[0] = {ne[0]}, not a multiple of "
                                 f"its block size {block}")
        offset = r.u64(f"the data offset of tensor {name}")
        out.append((name, ne, ttype, n_el // block * type_size, offset))
    return out


def _tensor_layout(path, tensors, alignment, data_start, size):
    """llama.cpp's rule: tensors lie in directory order, each at the padded end of the one before."""
    expected = 0
    for name, ne, ttype, n_bytes, offset in tensors:
        if offset != expected:
            raise ModelFileError(f"{path}: tensor {name} has data offset {offset}, expected {expected} (tensors "
                                 f"must follow one another, each padded to {alignment} bytes, as llama.cpp requires)")
        end = data_start + offset + n_bytes
        if end > size:
            raise ModelFileError(f"{path}: truncated: tensor {name} ({ttype.name}, {list(ne)}) ends at byte {end}, "
                                 f"file has {size}")
        expected += -(-n_bytes // alignment) * alignment
    # more than one alignment of bytes after the last tensor: some tensor declares fewer bytes than it
    # holds (its type or shape was changed), which llama.cpp would read as a different, shorter tensor
    if tensors and size - (data_start + expected) >= alignment:
        raise ModelFileError(f"{path}: {size - data_start - expected} bytes after the last tensor's data (a tensor "
                             f"whose declared type or shape is smaller than what the file holds?)")
