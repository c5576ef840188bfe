"""The bit tricks of the GGUF block layouts (types.py), one helper each, used by every packer,
dequantizer and kernel that reads the blocks.

Each is compiled into its caller (inline="always": numba inlines it before typing the caller, so
the caller's own loops vectorize as if the expression were written there, under the caller's
fastmath flags; the values are integers or table lookups, the same under any flags).

  half_float(row, o, table)  the 16-bit float at row[o:o+2] (a block's d, m or dmin)
  u32(row, o)                the little-endian 32-bit word at row[o:o+4] (Q5_0 / Q5_1's qh)
  fifth_bit(h, j)            Q5_0 / Q5_1 / Q5_K: bit j of the high bits h as a code's fifth bit, 16 or 0
  q6_code(ql, qh, k)         Q6_K: the unsigned 6-bit code of weight l + 32 k of a 128-weight half
  k_scale_min(row, o, j)     Q4_K / Q5_K: the j-th 6-bit scale and min (ggml's get_scale_min_k4)
  q3_scale(row, o, i)        Q3_K: the i-th 6-bit scale, minus 32
"""
import numpy as np
from numba import njit

UNPACK = dict(cache=True, nogil=True, fastmath=False, inline="always")


@njit(**UNPACK)
def half_float(row, o, table):
    """The 16-bit float stored little-endian at row[o:o+2], as float32 (table: blocks.py's)."""
    return table[np.int64(row[o]) | (np.int64(row[o + 1]) << 8)]


@njit(**UNPACK)
def u32(row, o):
    """The little-endian 32-bit word at row[o:o+4], as int64."""
    return np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16) | (np.int64(row[o + 3]) << 24)


@njit(**UNPACK)
def fifth_bit(h, j):
    """Bit j of h as the fifth bit of a 5-bit code (16 or 0). Q5_0 / Q5_1: h is the block's 32-bit
    qh, bit j weight j's; Q5_K: h is byte l of qh, bit s sub-block s's weight l."""
    return ((h >> j) & 1) << 4


@njit(**UNPACK)
def q6_code(ql, qh, k):
    """Q6_K: the unsigned 6-bit code (0..63, the weight is d sc (code - 32)) of weight l + 32 k
    (k = 0..3) of a 128-weight half. ql: the half's ql byte l + 32 (k % 2), qh: its qh byte l; the
    low 4 bits are ql's low (k < 2) or high (k >= 2) nibble, the high 2 bits are qh's bits 2k, 2k + 1."""
    return ((ql >> (4 * (k >> 1))) & 15) | (((qh >> (2 * k)) & 3) << 4)


@njit(**UNPACK)
def k_scale_min(row, o, j):
    """Q4_K / Q5_K: the j-th (of 8) 6-bit scale and min from the 12 bytes at row[o:] (ggml's
    get_scale_min_k4): j < 4 in the low 6 bits of bytes j and j + 4; else the low / high nibble of
    byte j + 4 and the top 2 bits of bytes j - 4 / j."""
    if j < 4:
        return row[o + j] & 63, row[o + j + 4] & 63
    sc = (row[o + j + 4] & 15) | ((row[o + j - 4] >> 6) << 4)
    m = (row[o + j + 4] >> 4) | ((row[o + j] >> 6) << 4)
    return sc, m


@njit(**UNPACK)
def q3_scale(row, o, i):
    """Q3_K's i-th 6-bit scale (of 16) from the 12 bytes at row[o:], minus 32: low 4 bits from
    byte i % 8 (low nibble for i < 8, high for i >= 8), high 2 bits from byte 8 + i % 4, pair i // 4."""
    lo = (row[o + i % 8] >> (4 * (i // 8))) & 15
    hi = (row[o + 8 + i % 4] >> (2 * (i // 4))) & 3
    return np.int32(lo | (hi << 4)) - 32
