"""Products with quantized weights: y = W x, the weights dequantized inside the product.

  matvec(type, data, table, x, y, 16)      decode: W [rows, n] as blocks, x [n] -> y [rows]
  dequant_rows(type, data, table, out, 16)  prefill: a tile of rows -> float32 [rows, n] for BLAS

Decoding a token reads every weight once, so its speed is how fast the blocks stream from memory;
the float32 weights are never written anywhere. Rows are split into blocks of ROWS_PER_TASK
over the threads (prange); Q4_0, Q4_1, Q5_0 and Q8_0 (SmolLM2's and most of
Gemma 3's weights) have fused loops that dequantize a block in registers and factor its scale
out of the block's sum; the other types dequantize a row into a buffer that stays in L1 and take
its dot product with x.

All sums are float32 (fastmath lets LLVM split them into SIMD lanes), so a product differs from
the float64 one by at most ~ n * eps32 * sum|w x|, the bound tests/unit/test_quant_kernels.py uses.
"""
import numpy as np
from numba import njit, prange

from .dequant import _f16, _f32, _q2_k, _q3_k, _q4_0, _q4_1, _q4_k, _q5_0, _q5_1, _q5_k, _q6_k, _q8_0
from .types import BF16, F16, F32, Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, QT, TYPES
from .unpack import fifth_bit, half_float, u32

ROWS_PER_TASK = 16                # rows per parallel task: enough work to hide the fork, small enough to balance
FAST = dict(cache=True, nogil=True, fastmath=True)

# The fused kernels take four rows at a time: x is loaded once for four rows, and the eight
# independent sums keep the FMA units busy. Their inner loops run over `half` = 16 lanes, passed
# as an argument rather than written as a constant: LLVM unrolls a constant 16-trip loop into
# scalar code, but vectorizes a loop whose trip count it does not know. A high nibble is taken
# as (q & 0xF0) / 16 (exact in float32), which keeps the integer work in 32-bit lanes.


def _rows4_nib(qtype):
    """The four-row kernel of a 32-weight 4-bit type (Q4_0, Q4_1, Q5_0), from its record: y[r:r+4],
    w = d (q - zero) or d q + m, so w.x = d (sum q x - zero sum x) or d sum q x + m sum x per block;
    Q5_0's fifth bit j is bit j of the block's 32-bit qh. The record's numbers are constants of
    the compiled loop (a closure's), so each type's loop is as if written out for it alone."""
    t = TYPES[qtype]
    size, qs_at, d_at, m_at, qh_at = t.block_bytes, t.qs_at, t.d_at - t.qs_at, t.m_at - t.qs_at, t.qh_at - t.qs_at
    zero, five, has_m = t.zero, t.code_bits == 5, t.has_mins

    @njit(**FAST)
    def rows4(data, r, table, x, xsum, y, half):
        q0, q1, q2, q3 = data[r], data[r + 1], data[r + 2], data[r + 3]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for b in range(xsum.shape[0]):
            o, xo = b * size + qs_at, b * 32
            h0 = h1 = h2 = h3 = np.int64(0)
            if five:
                h0, h1, h2, h3 = u32(q0, o + qh_at), u32(q1, o + qh_at), u32(q2, o + qh_at), u32(q3, o + qh_at)
            s0 = s1 = s2 = s3 = t0 = t1 = t2 = t3 = np.float32(0.0)
            for j in range(half):
                xl, xh = x[xo + j], x[xo + half + j]
                s0 += np.float32(_low(q0[o + j], h0, j, five)) * xl
                t0 += np.float32(_high(q0[o + j], h0, j, five)) * xh
                s1 += np.float32(_low(q1[o + j], h1, j, five)) * xl
                t1 += np.float32(_high(q1[o + j], h1, j, five)) * xh
                s2 += np.float32(_low(q2[o + j], h2, j, five)) * xl
                t2 += np.float32(_high(q2[o + j], h2, j, five)) * xh
                s3 += np.float32(_low(q3[o + j], h3, j, five)) * xl
                t3 += np.float32(_high(q3[o + j], h3, j, five)) * xh
            c = np.float32(0.0625)
            if has_m:
                xs = xsum[b]
                a0 += half_float(q0, o + d_at, table) * (s0 + t0 * c) + half_float(q0, o + m_at, table) * xs
                a1 += half_float(q1, o + d_at, table) * (s1 + t1 * c) + half_float(q1, o + m_at, table) * xs
                a2 += half_float(q2, o + d_at, table) * (s2 + t2 * c) + half_float(q2, o + m_at, table) * xs
                a3 += half_float(q3, o + d_at, table) * (s3 + t3 * c) + half_float(q3, o + m_at, table) * xs
            else:
                m = np.float32(zero) * xsum[b]
                a0 += half_float(q0, o + d_at, table) * (s0 + t0 * c - m)
                a1 += half_float(q1, o + d_at, table) * (s1 + t1 * c - m)
                a2 += half_float(q2, o + d_at, table) * (s2 + t2 * c - m)
                a3 += half_float(q3, o + d_at, table) * (s3 + t3 * c - m)
        y[r], y[r + 1], y[r + 2], y[r + 3] = a0, a1, a2, a3
    return rows4


@njit(inline="always", **FAST)
def _low(q, h, j, five):
    """weight j's code (of 16 low ones): the low nibble of byte j, with its fifth bit"""
    return (q & 15) | fifth_bit(h, j) if five else q & 15


@njit(inline="always", **FAST)
def _high(q, h, j, five):
    """weight j + 16's code times 16 (the high nibble kept in place: x 1/16 is exact), fifth bit too"""
    return (q & 240) | (fifth_bit(h, j + 16) << 4) if five else q & 240


_rows4_q4_0, _rows4_q4_1, _rows4_q5_0 = _rows4_nib(Q4_0), _rows4_nib(Q4_1), _rows4_nib(Q5_0)


@njit(**FAST)
def _rows4_q8_0(data, r, table, x, xsum, y, half):
    """y[r:r+4] for Q8_0: w = d q, q the signed byte"""
    q0, q1, q2, q3 = data[r], data[r + 1], data[r + 2], data[r + 3]
    a0 = a1 = a2 = a3 = np.float32(0.0)
    for b in range(xsum.shape[0]):
        o, xo = b * QT[Q8_0].block_bytes + QT[Q8_0].qs_at, b * 32
        s0 = s1 = s2 = s3 = np.float32(0.0)
        for j in range(2 * half):
            xj = x[xo + j]
            s0 += np.float32((np.int32(q0[o + j]) ^ 128) - 128) * xj
            s1 += np.float32((np.int32(q1[o + j]) ^ 128) - 128) * xj
            s2 += np.float32((np.int32(q2[o + j]) ^ 128) - 128) * xj
            s3 += np.float32((np.int32(q3[o + j]) ^ 128) - 128) * xj
        a0 += half_float(q0, o - 2, table) * s0
        a1 += half_float(q1, o - 2, table) * s1
        a2 += half_float(q2, o - 2, table) * s2
        a3 += half_float(q3, o - 2, table) * s3
    y[r], y[r + 1], y[r + 2], y[r + 3] = a0, a1, a2, a3


@njit(**FAST)
def _dot(a, x):
    acc = np.float32(0.0)
    for i in range(x.shape[0]):
        acc += a[i] * x[i]
    return acc


@njit(cache=True, nogil=True, fastmath=False)     # the exact values, whichever kernel compiles it first
def _dequant_rows(qtype, data, r, end, table, out, half):
    """Rows r..end of ggml type qtype -> out[0:end-r] float32.

    One branch per type, each with its own loop over the rows: numba compiles a specialized loop
    per type. (A branch per row, or one generic loop handed the type's function, is slower: the
    first inlines all thirteen dequantizers into one loop that LLVM no longer vectorizes, and
    numba cannot cache the second across processes, so every run would recompile for seconds.)"""
    if qtype == Q4_1:
        for i in range(r, end):
            _q4_1(data[i], table, out[i - r], half)
    elif qtype == Q8_0:
        for i in range(r, end):
            _q8_0(data[i], table, out[i - r], half)
    elif qtype == Q4_0:
        for i in range(r, end):
            _q4_0(data[i], table, out[i - r], half)
    elif qtype == Q5_0:
        for i in range(r, end):
            _q5_0(data[i], table, out[i - r], half)
    elif qtype == Q4_K:
        for i in range(r, end):
            _q4_k(data[i], table, out[i - r], half)
    elif qtype == Q6_K:
        for i in range(r, end):
            _q6_k(data[i], table, out[i - r], half)
    elif qtype == Q5_K:
        for i in range(r, end):
            _q5_k(data[i], table, out[i - r], half)
    elif qtype == Q5_1:
        for i in range(r, end):
            _q5_1(data[i], table, out[i - r], half)
    elif qtype == Q3_K:
        for i in range(r, end):
            _q3_k(data[i], table, out[i - r], half)
    elif qtype == Q2_K:
        for i in range(r, end):
            _q2_k(data[i], table, out[i - r], half)
    elif qtype == F16 or qtype == BF16:
        for i in range(r, end):
            _f16(data[i], table, out[i - r], half)
    elif qtype == F32:
        for i in range(r, end):
            _f32(data[i], table, out[i - r], half)


@njit(**FAST)
def _matvec_rows(qtype, data, r, end, table, x, xsum, y, half, buf):
    """y[r:end] = rows r..end of W times x: the fused four-row kernel of the type where there is
    one, then the rest dequantized into buf [ROWS_PER_TASK, n] and multiplied."""
    if qtype == Q4_1:
        while r + 4 <= end:
            _rows4_q4_1(data, r, table, x, xsum, y, half)
            r += 4
    elif qtype == Q8_0:
        while r + 4 <= end:
            _rows4_q8_0(data, r, table, x, xsum, y, half)
            r += 4
    elif qtype == Q4_0:
        while r + 4 <= end:
            _rows4_q4_0(data, r, table, x, xsum, y, half)
            r += 4
    elif qtype == Q5_0:
        while r + 4 <= end:
            _rows4_q5_0(data, r, table, x, xsum, y, half)
            r += 4
    if r < end:                                   # the types without a fused kernel, and rows left over
        _dequant_rows(qtype, data, r, end, table, buf, half)
        for i in range(r, end):
            y[i] = _dot(buf[i - r], x)


@njit(parallel=True, **FAST)
def matvec(qtype, data, table, x, y, half):
    """data: [rows, row_bytes] uint8 blocks of ggml type id qtype, x: [n] float32 -> y: [rows] float32"""
    rows, n = data.shape[0], x.shape[0]
    xsum = np.zeros(n // 32, np.float32)          # per-block sums of x, once for all rows
    for b in range(n // 32):
        xsum[b] = x[b * 32:(b + 1) * 32].sum()
    for t in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        buf = np.empty((ROWS_PER_TASK, n), np.float32)
        _matvec_rows(qtype, data, t * ROWS_PER_TASK, min(rows, (t + 1) * ROWS_PER_TASK), table, x, xsum, y, half, buf)


@njit(parallel=True, cache=True, nogil=True)      # no fastmath: the exact values
def dequant_rows(qtype, data, table, out, half):
    """data: [rows, row_bytes] uint8 -> out: [rows, n] float32 (a tile for a BLAS product)"""
    rows = data.shape[0]
    for t in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        r = t * ROWS_PER_TASK
        _dequant_rows(qtype, data, r, min(rows, r + ROWS_PER_TASK), table, out[r:], half)
