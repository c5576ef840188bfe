"""A GGUF file's scalar metadata, read from its header alone (no tensors, no vocabulary parsed).

gguf.GGUFReader builds a NumPy view of every field, and the vocabulary's ~50k-260k strings make
that take seconds; a command that only needs to know, say, whether a file is a mixture of experts
before it loads the model reads the key/value header here instead: array values are skipped by
their lengths. Layout (GGUF v2/v3, little-endian): magic 'GGUF', u32 version, u64 tensor count,
u64 kv count, then per kv: u64-length key, u32 value type, value.
"""
import struct

# GGUF value types -> struct format of a scalar (8: string, 9: array)
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def scalar_metadata(path) -> dict:
    """-> {key: value} of the header's scalar and string fields (arrays left out); {} when the file
    is not a GGUF v2/v3 or its header is cut short (the full reader then says what is wrong)."""
    out = {}
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF" or struct.unpack("<I", f.read(4))[0] not in (2, 3):
                return {}
            _n_tensors, n_kv = struct.unpack("<QQ", f.read(16))

            def read(fmt):
                return struct.unpack("<" + fmt, f.read(struct.calcsize(fmt)))[0]

            def string():
                return f.read(read("Q")).decode("utf-8", "replace")

            def skip(vtype):
                if vtype in _SCALAR:
                    f.seek(struct.calcsize(_SCALAR[vtype]), 1)
                elif vtype == _STRING:
                    f.seek(read("Q"), 1)
                elif vtype == _ARRAY:
                    etype, n = read("I"), read("Q")
                    if etype in _SCALAR:
                        f.seek(n * struct.calcsize(_SCALAR[etype]), 1)
                    else:
                        for _ in range(n):
                            skip(etype)
                else:
                    raise ValueError(f"value type {vtype}")

            for _ in range(n_kv):
                key, vtype = string(), read("I")
                if vtype in _SCALAR:
                    out[key] = read(_SCALAR[vtype])
                elif vtype == _STRING:
                    out[key] = string()
                else:
                    skip(vtype)
    except (OSError, struct.error, ValueError, MemoryError):
        return {}
    return out
