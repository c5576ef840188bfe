"""What every weight layout is, and what QuantTensor asks of it.

A GGUF matrix starts in the file's own layout (blocks.Blocks: each row's blocks together); a
loaded model packs it into one of the row-interleaved layouts (R = 64 rows to a group, made once
at load; types.py says which type goes where), whose products stream a group at a time, rows
past `rows` in the last group being zeros.

  layout       made by                 types (types.py)          products
  Blocks       blocks.Blocks           every type                mul, mul_vec, mul_t (f32); mul_q8 (ggml)
  Packed       packed.pack             layout "nib" / "i8"       mul, mul_vec (f32)
  Block32      ggml_packed.pack        ggml_layout "block32"     mul_q8 (ggml, no AVX2): Packed's arrays
  LanePacked   ggml_int8.pack          ggml_layout "block32"     mul_q8 (ggml, AVX2)
  KPacked      ggml_packed_k.pack_k    ggml_layout "k"           mul_q8 (ggml, no AVX2)
  LaneKPacked  ggml_int8_k.pack        ggml_layout "k"           mul_q8 (ggml, AVX2)

Every layout answers the same calls (this base class): the products of its arithmetic (mul: x W^T
for float32 x; mul_vec: one row; mul_q8: ggml's, for x in 8-bit blocks; mul_t: dy W, a frozen
weight's input gradient), its groups as views (stacked matrices, row slices), a tile of groups
dequantized (dequantize(), mul_t), some rows dequantized (lookup: w[ids]). Every dequantized
value is gguf-py's, bit for bit, in every layout (tests/unit/test_layouts.py runs them all).
"""
import copy
import threading
from abc import ABC, abstractmethod

import numpy as np

R = 64                                  # rows interleaved per group
PACKED_TILE_BYTES = 1 << 20             # a tile of dequantized groups: fits in L2 (4 MB tiles ran prefill 30% slower)
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

    # ---- the products: each layout has those of the arithmetic it is made for (the table above)

    def mul(self, x) -> np.ndarray:
        """arith f32: x [N, n] float32, C-contiguous -> x W^T [N, rows]"""
        raise NotImplementedError(f"{type(self).__name__} has no float32 product (arith ggml's layout)")

    def mul_vec(self, x) -> np.ndarray:
        """arith f32: x [n] float32 -> W x [rows]"""
        return self.mul(x[None])[0]

    def mul_q8(self, a) -> np.ndarray:
        """arith ggml: a, quant/ggml_quants.py's Q8Rows of x [N, n] in the weight's vec_dot type ->
        [N, rows] float32, ggml's bits"""
        raise NotImplementedError(f"{type(self).__name__} has no ggml product (arith f32's layout)")

    def mul_t(self, dy) -> np.ndarray:
        """dy [N, rows] float32 -> dy W [N, n], the input gradient of a frozen weight (LoRA): each
        tile of rows adds its share, so the float32 matrix never exists whole"""
        dx = np.zeros((dy.shape[0], self.n), np.float32)
        for r0, rows in self.tiles():
            dx += dy[:, r0:r0 + rows.shape[0]] @ rows           # [N, rows] @ [rows, n]
        return dx

    def dequantize(self) -> np.ndarray:
        """-> [rows, n] float32, gguf-py's values"""
        out = np.empty((self.rows, self.n), np.float32)
        for r0, rows in self.tiles():
            out[r0:r0 + rows.shape[0]] = rows
        return out

    def tile_groups(self) -> int:
        """Row groups per tile at most: ~PACKED_TILE_BYTES of float32 (a GEMM reads it from L2)"""
        return max(1, min(PACKED_TILE_BYTES // (4 * self.n * R), self.n_groups))

    def tiles(self):
        """every tile of rows in turn: yields (first row, [rows, n] float32), in a scratch buffer
        of this thread's (valid until the next tile)"""
        G, per = self.n_groups, self.tile_groups()
        for g0 in range(0, G, per):
            g1 = min(G, g0 + per)
            rows = self.dequant_rows(g0, g1, scratch)
            yield g0 * R, rows[:min(self.rows, g1 * R) - g0 * R]


_local = threading.local()


def scratch(size) -> np.ndarray:
    """A float32 buffer of at least size elements, this thread's own, kept between products (a
    fresh 4 MB buffer per product costs ~1,000 page faults)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        buf = _local.buf = np.empty(size, np.float32)
    return buf[:size]
