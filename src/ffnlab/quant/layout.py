"""What every row-interleaved weight layout is: R = 64 rows to a group, made once at load.

A loaded model's quantized matrices are packed into one of these (types.py says which type goes
where); the products stream a group at a time, and rows past `rows` in the last group are zeros.

  layout       made by                 types (types.py)          multiplied by
  Packed       packed.pack             layout "nib" / "i8"       arith f32: Packed.matvec / matmul;
                                                                 arith ggml, no AVX2: ggml_packed.product
  LanePacked   ggml_int8.pack          ggml_layout "block32"     arith ggml (AVX2): ggml_packed.product
  KPacked      ggml_packed_k.pack_k    ggml_layout "k"           arith ggml, no AVX2: ggml_packed.product
  LaneKPacked  ggml_int8_k.pack        ggml_layout "k"           arith ggml (AVX2): ggml_packed.product

Besides its products, QuantTensor asks every layout the same things (this base class): its
groups as views (stacked matrices, row slices), a tile of groups dequantized (dequantize(),
rmatmul()), some rows dequantized (w[ids]). Every dequantized value is gguf-py's, bit for bit,
in every layout (tests/unit/test_layouts.py runs them all).
"""
import copy
from abc import ABC, abstractmethod

import numpy as np

R = 64                                  # rows interleaved per group


class Layout(ABC):
    """A [rows, n] matrix in groups of R rows. A layout names its arrays in ARRAYS, each [G, ...]
    (an empty array: a part the type does not have); lookup and dequant_t are its own kernels'."""
    ARRAYS = ()
    rows: int                           # the matrix's rows
    n: int                              # weights per row

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, a).nbytes for a in self.ARRAYS)

    @property
    def n_groups(self) -> int:
        return getattr(self, self.ARRAYS[0]).shape[0]

    def groups(self, g0, g1) -> "Layout":
        """Groups g0..g1 as a layout of the same kind (views, no copy)."""
        part = copy.copy(self)
        part.rows = min(self.rows, g1 * R) - g0 * R
        for name in self.ARRAYS:
            a = getattr(self, name)
            setattr(part, name, a[g0:g1] if a.shape[0] else a)
        return part

    @abstractmethod
    def lookup(self, ids, out):
        """Rows ids [k] dequantized into out [k, n] float32 (an embedding lookup)."""

    @abstractmethod
    def dequant_t(self, g0, g1, out):
        """Groups g0..g1 dequantized, transposed: out [n, (g1 - g0) R] float32."""

    def dequant_rows(self, g0, g1, scratch) -> np.ndarray:
        """Groups g0..g1 dequantized -> [(g1 - g0) R, n] float32, in the buffer scratch(size)
        gives (size float32 values, reused between calls)."""
        buf = scratch(self.n * (g1 - g0) * R).reshape(self.n, -1)
        self.dequant_t(g0, g1, buf)
        return buf.T
