"""Compiled dequantization of one GGUF row: its blocks -> float32 weights.

One function per ggml type, each a straight transcription of the block layout in types.py,
written with the same float32 operations in the same order as gguf-py's dequantize_blocks (so
the values are the ones gguf.quants.dequantize gives, bit for bit; tests/unit/test_quant_kernels.py
checks it). `row` is a 1-D uint8 array (one row's blocks), `out` a float32 array of the row's
weights, `table` the 16-bit -> float32 table of blocks.py, `half` = 16 (a run-time value, so
that LLVM vectorizes the 16- and 32-lane loops instead of unrolling them into scalar code, as it
does for a constant trip count). The product kernels (kernels.py) use them, and fused versions
for the commonest types.
"""
import numpy as np
from numba import njit

from .types import Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, QT
from .unpack import fifth_bit, half_float, k_scale_min, q3_scale, q6_code, u32

JIT = dict(cache=True, nogil=True, fastmath=False)   # compiled once, cached on disk next to this file; exact
# values also when a fastmath kernel (quant/kernels.py _matvec_rows) is the first to call one


@njit(**JIT)
def _f32(row, table, out, half):
    v = row.view(np.float32)
    for i in range(out.shape[0]):
        out[i] = v[i]


@njit(**JIT)
def _f16(row, table, out, half):             # F16 and BF16: the table says which
    for i in range(out.shape[0]):
        out[i] = half_float(row, 2 * i, table)


@njit(**JIT)
def _q4_0(row, table, out, half):
    for b in range(out.shape[0] // 32):
        o, y = b * QT[Q4_0].block_bytes, b * 32
        d = half_float(row, o, table)
        for j in range(half):
            q = np.int32(row[o + 2 + j])
            out[y + j] = d * np.float32(np.int32(q & 15) - 8)
            out[y + half + j] = d * np.float32(np.int32(q >> 4) - 8)


@njit(**JIT)
def _q4_1(row, table, out, half):
    for b in range(out.shape[0] // 32):
        o, y = b * QT[Q4_1].block_bytes, b * 32
        d, m = half_float(row, o, table), half_float(row, o + 2, table)
        for j in range(half):
            q = np.int32(row[o + 4 + j])
            out[y + j] = d * np.float32(q & 15) + m
            out[y + half + j] = d * np.float32(q >> 4) + m


@njit(**JIT)
def _q5_0(row, table, out, half):
    for b in range(out.shape[0] // 32):
        o, y = b * QT[Q5_0].block_bytes, b * 32
        d = half_float(row, o, table)
        h = np.int32(u32(row, o + 2))      # as int32: bit 31 may turn the sign, the shifts below mask it
        for j in range(half):
            q = np.int32(row[o + 6 + j])
            out[y + j] = d * np.float32(np.int32((q & 15) | fifth_bit(h, j)) - 16)
            out[y + half + j] = d * np.float32(np.int32((q >> 4) | fifth_bit(h, j + 16)) - 16)


@njit(**JIT)
def _q5_1(row, table, out, half):
    for b in range(out.shape[0] // 32):
        o, y = b * QT[Q5_1].block_bytes, b * 32
        d, m = half_float(row, o, table), half_float(row, o + 2, table)
        h = np.int32(u32(row, o + 4))
        for j in range(half):
            q = np.int32(row[o + 8 + j])
            out[y + j] = d * np.float32((q & 15) | fifth_bit(h, j)) + m
            out[y + half + j] = d * np.float32((q >> 4) | fifth_bit(h, j + 16)) + m


@njit(**JIT)
def _q8_0(row, table, out, half):
    for b in range(out.shape[0] // 32):
        o, y = b * QT[Q8_0].block_bytes, b * 32
        d = half_float(row, o, table)
        for j in range(2 * half):
            out[y + j] = d * np.float32((np.int32(row[o + 2 + j]) ^ 128) - 128)   # the byte as int8


@njit(**JIT)
def _q2_k(row, table, out, half):
    for b in range(out.shape[0] // 256):
        o, y = b * QT[Q2_K].block_bytes, b * 256
        d, dmin = half_float(row, o + 80, table), half_float(row, o + 82, table)
        for g in range(16):                                             # 16 groups of 16 weights
            h, s = g // 8, (g // 2) % 4                                 # 128-weight half, 2-bit plane
            sc = row[o + g]                                             # 4-bit scale | 4-bit min << 4
            dl, ml = d * np.float32(sc & 15), dmin * np.float32(sc >> 4)
            qo = o + 16 + h * 32 + (g % 2) * 16
            for l in range(half):
                out[y + g * 16 + l] = dl * np.float32((np.int32(row[qo + l]) >> (2 * s)) & 3) - ml


@njit(**JIT)
def _q3_k(row, table, out, half):
    for b in range(out.shape[0] // 256):
        o, y = b * QT[Q3_K].block_bytes, b * 256
        d = half_float(row, o + 108, table)
        for g in range(16):                                             # 16 groups of 16 weights
            h, s = g // 8, (g // 2) % 4
            dl = d * np.float32(q3_scale(row, o + 96, g))
            qo, mo = o + 32 + h * 32 + (g % 2) * 16, o + (g % 2) * 16
            for l in range(half):
                q = (np.int32(row[qo + l]) >> (2 * s)) & 3
                hbit = (np.int32(row[mo + l]) >> (g // 2)) & 1                   # hmask: bit set -> no -4 offset
                out[y + g * 16 + l] = dl * np.float32(np.int32(q) - 4 * (1 - np.int32(hbit)))


@njit(**JIT)
def _q4_k(row, table, out, half):
    for b in range(out.shape[0] // 256):
        o, y = b * QT[Q4_K].block_bytes, b * 256
        d, dmin = half_float(row, o, table), half_float(row, o + 2, table)
        for s in range(8):                                              # 8 sub-blocks of 32
            sc, m = k_scale_min(row, o + 4, s)
            ds, ms = d * np.float32(sc), dmin * np.float32(m)
            qo, shift = o + 16 + (s // 2) * 32, 4 * (s % 2)
            for l in range(2 * half):
                out[y + s * 32 + l] = ds * np.float32((np.int32(row[qo + l]) >> shift) & 15) - ms


@njit(**JIT)
def _q5_k(row, table, out, half):
    for b in range(out.shape[0] // 256):
        o, y = b * QT[Q5_K].block_bytes, b * 256
        d, dmin = half_float(row, o, table), half_float(row, o + 2, table)
        for s in range(8):
            sc, m = k_scale_min(row, o + 4, s)
            ds, ms = d * np.float32(sc), dmin * np.float32(m)
            qo, shift = o + 48 + (s // 2) * 32, 4 * (s % 2)
            for l in range(2 * half):
                q = ((np.int32(row[qo + l]) >> shift) & 15) | fifth_bit(np.int32(row[o + 16 + l]), s)
                out[y + s * 32 + l] = ds * np.float32(q) - ms


@njit(**JIT)
def _q6_k(row, table, out, half):
    for b in range(out.shape[0] // 256):
        o, y = b * QT[Q6_K].block_bytes, b * 256
        d = half_float(row, o + 208, table)
        for h in range(2):                                              # two halves of 128 weights
            ql, qh, sc, y0 = o + 64 * h, o + 128 + 32 * h, o + 192 + 8 * h, y + 128 * h
            for g in range(2):                                          # lanes 0-15, 16-31
                # weights l, l+32, l+64, l+96 share ql[l], ql[l+32], qh[l]; int8 scales per 16
                d1 = d * np.float32((np.int32(row[sc + g]) ^ 128) - 128)
                d2 = d * np.float32((np.int32(row[sc + g + 2]) ^ 128) - 128)
                d3 = d * np.float32((np.int32(row[sc + g + 4]) ^ 128) - 128)
                d4 = d * np.float32((np.int32(row[sc + g + 6]) ^ 128) - 128)
                for k in range(half):
                    l = g * 16 + k
                    a, c, hh = np.int32(row[ql + l]), np.int32(row[ql + l + 32]), np.int32(row[qh + l])
                    out[y0 + l] = d1 * np.float32(q6_code(a, hh, 0) - 32)
                    out[y0 + l + 32] = d2 * np.float32(q6_code(c, hh, 1) - 32)
                    out[y0 + l + 64] = d3 * np.float32(q6_code(a, hh, 2) - 32)
                    out[y0 + l + 96] = d4 * np.float32(q6_code(c, hh, 3) - 32)
