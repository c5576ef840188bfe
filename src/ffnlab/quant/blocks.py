"""GGUF blocks: the size of a row of them, the 16-bit float tables their scales are read with, and
Blocks, the layout of a matrix as the file holds it.

A quantized row of n weights is n / block_weights blocks of block_bytes each (types.py: one record
per ggml type, with its fields), stored back to back; blocks never straddle rows, so a matrix is a
[rows, row_bytes] byte array and any subset of its rows is again a valid matrix of the same type.
"""
import numpy as np

from . import ggml_kernels, kernels
from .layout import R, Layout
from .types import BF16, KERNEL_TYPES, TYPES

__all__ = ["KERNEL_TYPES", "Blocks", "row_bytes", "table_for"]
TILE_BYTES = 1 << 20                 # a prefill tile of float32 weights (the file's blocks): fits in L2
HALF_BLOCK = 16                      # the fused kernels' lane count, passed at run time (kernels.py says why)


def row_bytes(qtype, n):
    """Bytes of one row of n weights; n must be a whole number of blocks."""
    r = TYPES[int(qtype)]
    if n % r.block_weights:
        raise ValueError(f"a row of {n} weights is not a whole number of {r.name} blocks ({r.block_weights} weights)")
    return n // r.block_weights * r.block_bytes


def _half_tables():
    """float32 value of every 16-bit pattern, as IEEE half and as bfloat16: one lookup converts a
    block scale (numba has no float16 arithmetic on the CPU)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    f16 = bits.view(np.float16).astype(np.float32)
    bf16 = (bits.astype(np.uint32) << 16).view(np.float32)
    return f16, bf16


F16_TABLE, BF16_TABLE = _half_tables()


def table_for(qtype):
    """The 16-bit lookup table a kernel of this type reads (BF16 weights: bfloat16, else half)."""
    return BF16_TABLE if int(qtype) == BF16 else F16_TABLE


class Blocks(Layout):
    """A [rows, n] matrix of ggml type qtype as the file holds it: data [rows, row_bytes] uint8,
    each row's blocks together (read-only: a view of the mapped file, or of its rows). The row
    kernels multiply it: kernels.py's in arith f32 (one row of x: matvec; more: a tile of rows
    dequantized at a time and multiplied by BLAS), ggml_kernels.py's in arith ggml. Its groups
    are runs of R rows, as the packed layouts'."""
    ARRAYS = ("data",)

    def __init__(self, qtype, data, table, n):
        self.qtype, self.data, self.table, self.rows, self.n = int(qtype), data, table, data.shape[0], n

    @property
    def n_groups(self) -> int:
        return -(-self.rows // R)

    def groups(self, g0, g1) -> "Blocks":
        return Blocks(self.qtype, self.data[g0 * R:g1 * R], self.table, self.n)

    def lookup(self, ids, out):
        """Rows ids [k] dequantized into out [k, n], reading only those rows' blocks."""
        rows = self.data[ids]                                        # [k, row_bytes]
        rows.flags.writeable = False
        kernels.dequant_rows(self.qtype, rows, self.table, out, HALF_BLOCK)

    def dequant_t(self, g0, g1, out):
        """Groups g0..g1 dequantized, transposed: out [n, (g1 - g0) R] (rows past `rows`: zeros)."""
        rows = self.data[g0 * R:g1 * R]
        t = np.empty((rows.shape[0], self.n), np.float32)
        kernels.dequant_rows(self.qtype, rows, self.table, t, HALF_BLOCK)
        out[:, :t.shape[0]] = t.T
        out[:, t.shape[0]:] = 0.0

    def dequantize(self) -> np.ndarray:
        out = np.empty((self.rows, self.n), np.float32)
        kernels.dequant_rows(self.qtype, self.data, self.table, out, HALF_BLOCK)
        return out

    def tiles(self):
        """(first row, its tile [rows, n] float32) for every ~TILE_BYTES of rows (at least 16), in one
        buffer: the tiles mul and Layout's mul_t multiply"""
        rows = max(16, TILE_BYTES // (4 * self.n))
        tile = np.empty((min(rows, self.rows), self.n), np.float32)
        for r0 in range(0, self.rows, rows):
            t = tile[:min(rows, self.rows - r0)]
            kernels.dequant_rows(self.qtype, self.data[r0:r0 + t.shape[0]], self.table, t, HALF_BLOCK)
            yield r0, t

    def mul_vec(self, x) -> np.ndarray:
        y = np.empty(self.rows, np.float32)
        kernels.matvec(self.qtype, self.data, self.table, np.ascontiguousarray(x, np.float32), y, HALF_BLOCK)
        return y

    def mul(self, x) -> np.ndarray:
        """x [N, n] -> [N, rows]: each tile of rows times x by BLAS, so the float32 matrix never exists whole"""
        yt = np.empty((self.rows, x.shape[0]), np.float32)           # [rows, N]: each tile's rows are contiguous
        for r0, t in self.tiles():
            np.matmul(t, x.T, out=yt[r0:r0 + t.shape[0]])            # [rows, n] @ [n, N]
        return np.ascontiguousarray(yt.T)

    def mul_q8(self, a) -> np.ndarray:
        """ggml's mul_mat over the file's blocks: ggml_kernels.py's row kernels"""
        N, kind = a.qs.shape[0], a.kind
        y = np.empty((N, self.rows), np.float32)
        batch = N > 1 if kind != "q8_k" else N >= ggml_kernels.TILED_MIN_BATCH
        if batch:                                                    # vectorized over the tokens, same order
            qxt = np.ascontiguousarray(a.qs.T, np.int32)             # [n, N]
            f = ggml_kernels.gemm32_batch if kind != "q8_k" else ggml_kernels.gemmk_batch
            args = () if kind != "q8_k" else (TYPES[self.qtype].block_bytes,)
            f(self.qtype, *args, self.data, self.table, qxt, np.ascontiguousarray(a.d.T), np.ascontiguousarray(a.e.T), y)
        elif kind != "q8_k":                                         # one token: the FMA kernel
            for t in range(N):
                ggml_kernels.gemv32(self.qtype, self.data, self.table, a.qs[t].astype(np.int32), a.d[t], a.e[t], y[t])
        else:
            ggml_kernels.gemm(self.qtype, self.data, self.table, a.qs, a.d, a.e, y)
        return y
