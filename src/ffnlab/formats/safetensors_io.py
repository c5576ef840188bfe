"""Reading safetensors files (HF shards, ffnlab checkpoints, trainer state) after checking them.

    index = safetensors_index(files)           # name -> TensorEntry(file, dtype, shape); headers only
    for entry, a in read_tensors(entries):     # then the tensors, as NumPy arrays, one file open at a time

The safetensors library checks each file's own structure (header JSON, offsets that tile the data,
sizes that match the dtype and shape). What it cannot know is checked here, before any tensor is
read: every file is a regular file (a FIFO named model.safetensors would block the reader forever),
no tensor is defined by two shards (otherwise the last one would silently win), and every dtype is
one NumPy can hold (F8_E4M3, say, cannot be read as a number here). Errors name the file and tensor.
"""
from dataclasses import dataclass

import numpy as np

from ..errors import ModelFileError
from .jsonfile import check_regular_file

NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
                "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


@dataclass(frozen=True)
class TensorEntry:
    file: str
    name: str
    dtype: str           # safetensors dtype name: F32, F16, BF16, F8_E4M3, ...
    shape: tuple


def safetensors_index(files, float_only=True) -> dict:
    """files -> {tensor name: TensorEntry}, reading only the headers."""
    from safetensors import safe_open

    index = {}
    for f in files:
        check_regular_file(f, "safetensors file")
        try:
            with safe_open(f, framework="numpy") as sf:
                entries = [(n, sf.get_slice(n)) for n in sf.keys()]
                entries = [TensorEntry(f, n, s.get_dtype(), tuple(s.get_shape())) for n, s in entries]
        except Exception as e:                  # SafetensorError, OSError, ...: the library's own checks
            raise ModelFileError(f"{f}: unreadable safetensors file ({str(e)[:200]})") from None
        for e in entries:
            if e.name in index:
                raise ModelFileError(f"{f}: tensor {e.name} is also defined in {index[e.name].file} "
                                     f"(a tensor must come from exactly one shard)")
            allowed = ("F64", "F32", "F16") if float_only else tuple(NUMPY_DTYPES)
            if e.dtype not in allowed:
                raise ModelFileError(f"{f}: tensor {e.name} has dtype {e.dtype}, which ffnlab cannot read "
                                     f"(supported: {', '.join(allowed)})")
            index[e.name] = e
    return index


def read_tensors(entries):
    """Yield (entry, NumPy array) for each entry, opening each file once."""
    from safetensors import safe_open

    by_file = {}
    for e in entries:
        by_file.setdefault(e.file, []).append(e)
    for f, es in by_file.items():
        try:
            with safe_open(f, framework="numpy") as sf:
                for e in es:
                    yield e, sf.get_tensor(e.name)
        except ModelFileError:
            raise
        except Exception as err:
            raise ModelFileError(f"{f}: unreadable safetensors file ({str(err)[:200]})") from None
