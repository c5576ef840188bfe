"""Compiled dequantization of one GGUF row: its blocks -> float32 weights.

One function per ggml type, each a straight transcription of the block layout in blocks.py,
written with the same float32 operations in the same order as gguf-py's dequantize_blocks (so
the values are the ones gguf.quants.dequantize gives, bit for bit; tests/test_quant_kernels.py
checks it). `row` is a 1-D uint8 array (one row's blocks), `out` a float32 array of the row's
weights, `half` the 16-bit -> float32 table of blocks.py. dequant_row() dispatches on the
type id; the product kernels (kernels.py) call it, or a fused version for the common types.
"""
import numpy as np
from numba import njit

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, BF16 = 0, 1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 30

JIT = dict(cache=True, nogil=True)          # compiled once, cached on disk next to this file


@njit(**JIT)
def half(row, o, table):
    """The 16-bit float stored little-endian at row[o:o+2], as float32."""
    return table[np.int64(row[o]) | (np.int64(row[o + 1]) << 8)]


@njit(**JIT)
def u32(row, o):
    return np.int64(row[o]) | (np.int64(row[o + 1]) << 8) | (np.int64(row[o + 2]) << 16) | (np.int64(row[o + 3]) << 24)


@njit(**JIT)
def _f32(row, table, out):
    v = row.view(np.float32)
    for i in range(out.shape[0]):
        out[i] = v[i]


@njit(**JIT)
def _f16(row, table, out):                   # F16 and BF16: the table says which
    for i in range(out.shape[0]):
        out[i] = half(row, 2 * i, table)


@njit(**JIT)
def _q4_0(row, table, out):
    for b in range(out.shape[0] // 32):
        o, y = b * 18, b * 32
        d = half(row, o, table)
        for j in range(16):
            q = row[o + 2 + j]
            out[y + j] = d * np.float32(np.int32(q & 15) - 8)
            out[y + j + 16] = d * np.float32(np.int32(q >> 4) - 8)


@njit(**JIT)
def _q4_1(row, table, out):
    for b in range(out.shape[0] // 32):
        o, y = b * 20, b * 32
        d, m = half(row, o, table), half(row, o + 2, table)
        for j in range(16):
            q = row[o + 4 + j]
            out[y + j] = d * np.float32(q & 15) + m
            out[y + j + 16] = d * np.float32(q >> 4) + m


@njit(**JIT)
def _q5_0(row, table, out):
    for b in range(out.shape[0] // 32):
        o, y = b * 22, b * 32
        d = half(row, o, table)
        h = u32(row, o + 2)
        for j in range(16):
            q = row[o + 6 + j]
            out[y + j] = d * np.float32(np.int32((q & 15) | (((h >> j) & 1) << 4)) - 16)
            out[y + j + 16] = d * np.float32(np.int32((q >> 4) | (((h >> (j + 16)) & 1) << 4)) - 16)


@njit(**JIT)
def _q5_1(row, table, out):
    for b in range(out.shape[0] // 32):
        o, y = b * 24, b * 32
        d, m = half(row, o, table), half(row, o + 2, table)
        h = u32(row, o + 4)
        for j in range(16):
            q = row[o + 8 + j]
            out[y + j] = d * np.float32((q & 15) | (((h >> j) & 1) << 4)) + m
            out[y + j + 16] = d * np.float32((q >> 4) | (((h >> (j + 16)) & 1) << 4)) + m


@njit(**JIT)
def _q8_0(row, table, out):
    for b in range(out.shape[0] // 32):
        o, y = b * 34, b * 32
        d = half(row, o, table)
        for j in range(32):
            out[y + j] = d * np.float32((np.int32(row[o + 2 + j]) ^ 128) - 128)   # the byte as int8


@njit(**JIT)
def _q2_k(row, table, out):
    for b in range(out.shape[0] // 256):
        o, y = b * 84, b * 256
        d, dmin = half(row, o + 80, table), half(row, o + 82, table)
        for e in range(256):
            sc = row[o + e // 16]                                       # 4-bit scale | 4-bit min << 4
            q = (row[o + 16 + (e // 128) * 32 + e % 32] >> (2 * ((e // 32) % 4))) & 3
            out[y + e] = (d * np.float32(sc & 15)) * np.float32(q) - dmin * np.float32(sc >> 4)


@njit(**JIT)
def _k_scale(row, o, i):
    """Q3_K's i-th 6-bit scale (of 16) from the 12 bytes at row[o:]: low 4 bits from byte i % 8
    (low nibble for i < 8, high for i >= 8), high 2 bits from byte 8 + i % 4, pair i // 4."""
    lo = (row[o + i % 8] >> (4 * (i // 8))) & 15
    hi = (row[o + 8 + i % 4] >> (2 * (i // 4))) & 3
    return np.int32(lo | (hi << 4)) - 32


@njit(**JIT)
def _q3_k(row, table, out):
    for b in range(out.shape[0] // 256):
        o, y = b * 110, b * 256
        d = half(row, o + 108, table)
        for e in range(256):
            dl = d * np.float32(_k_scale(row, o + 96, e // 16))
            q = (row[o + 32 + (e // 128) * 32 + e % 32] >> (2 * ((e // 32) % 4))) & 3
            hbit = (row[o + e % 32] >> (e // 32)) & 1                  # hmask: bit set -> no -4 offset
            out[y + e] = dl * np.float32(np.int32(q) - 4 * (1 - np.int32(hbit)))


@njit(**JIT)
def _k_scale_min(row, o, j):
    """Q4_K / Q5_K: the j-th (of 8) 6-bit scale and min from the 12 bytes at row[o:]."""
    if j < 4:
        return row[o + j] & 63, row[o + j + 4] & 63
    sc = (row[o + j + 4] & 15) | ((row[o + j - 4] >> 6) << 4)
    m = (row[o + j + 4] >> 4) | ((row[o + j] >> 6) << 4)
    return sc, m


@njit(**JIT)
def _q4_k(row, table, out):
    for b in range(out.shape[0] // 256):
        o, y = b * 144, b * 256
        d, dmin = half(row, o, table), half(row, o + 2, table)
        for s in range(8):                                              # 8 sub-blocks of 32
            sc, m = _k_scale_min(row, o + 4, s)
            ds, ms = d * np.float32(sc), dmin * np.float32(m)
            qo, shift = o + 16 + (s // 2) * 32, 4 * (s % 2)
            for l in range(32):
                out[y + s * 32 + l] = ds * np.float32((row[qo + l] >> shift) & 15) - ms


@njit(**JIT)
def _q5_k(row, table, out):
    for b in range(out.shape[0] // 256):
        o, y = b * 176, b * 256
        d, dmin = half(row, o, table), half(row, o + 2, table)
        for s in range(8):
            sc, m = _k_scale_min(row, o + 4, s)
            ds, ms = d * np.float32(sc), dmin * np.float32(m)
            qo, shift = o + 48 + (s // 2) * 32, 4 * (s % 2)
            for l in range(32):
                q = ((row[qo + l] >> shift) & 15) | (((row[o + 16 + l] >> s) & 1) << 4)
                out[y + s * 32 + l] = ds * np.float32(q) - ms


@njit(**JIT)
def _q6_k(row, table, out):
    for b in range(out.shape[0] // 256):
        o, y = b * 210, b * 256
        d = half(row, o + 208, table)
        for e in range(256):
            h, s, l = e // 128, (e % 128) // 32, e % 32                 # half, quarter, lane
            lo = (row[o + h * 64 + (s % 2) * 32 + l] >> (4 * (s // 2))) & 15
            hi = (row[o + 128 + h * 32 + l] >> (2 * s)) & 3
            sc = (np.int32(row[o + 192 + e // 16]) ^ 128) - 128        # int8 scale
            out[y + e] = (d * np.float32(sc)) * np.float32(np.int32(lo | (hi << 4)) - 32)


@njit(**JIT)
def dequant_row(qtype, row, table, out):
    """row: [row_bytes] uint8 -> out: [n] float32 (n = len(out)) for ggml type id qtype."""
    if qtype == Q4_1:
        _q4_1(row, table, out)
    elif qtype == Q8_0:
        _q8_0(row, table, out)
    elif qtype == Q4_0:
        _q4_0(row, table, out)
    elif qtype == Q4_K:
        _q4_k(row, table, out)
    elif qtype == Q6_K:
        _q6_k(row, table, out)
    elif qtype == Q5_K:
        _q5_k(row, table, out)
    elif qtype == Q5_0:
        _q5_0(row, table, out)
    elif qtype == Q5_1:
        _q5_1(row, table, out)
    elif qtype == Q3_K:
        _q3_k(row, table, out)
    elif qtype == Q2_K:
        _q2_k(row, table, out)
    elif qtype == F16 or qtype == BF16:
        _f16(row, table, out)
    elif qtype == F32:
        _f32(row, table, out)
    else:
        raise ValueError("no kernel for this ggml type")
