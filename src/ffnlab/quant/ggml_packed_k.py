"""ggml's K-quant products over row-interleaved weights (quant/ggml_packed.py's approach for
Q4_K and Q6_K): the layout, made at load, and the kernels, ggml's vec_dot lanes for fewer than
8 tokens and its tiled order for more, each exact integer part computed for 64 rows at once in
float32 (or int32 where a sum can pass 2^24). The fallback of quant/ggml_int8_k.py on CPUs
without AVX2."""
import numpy as np
from numba import njit, prange

from .ggml_kernels import TILED_MIN_BATCH
from .layout import R, Layout
from .types import Q4_K, Q6_K, QT
from .unpack import half_float, k_scale_min, q6_code

GG = dict(cache=True, nogil=True, fastmath={"contract"})   # ggml_packed.py says why
EXACT = dict(cache=True, nogil=True, fastmath=False)
SIXTEENTH = np.float32(0.0625)
_NONE_F = np.zeros((0, 0, 0), np.float32)


class KPacked(Layout):
    """Q4_K / Q6_K in R-row groups, the integer sub-block scales kept apart from the halves.
    Q4_K: qs [G, n/32, 16, R] uint8 (byte k: weight k of a 32-weight sub-block low, k + 16 high),
          sc, mn [G, n/32, R] uint8 (6-bit scale and min), d, dmin [G, n/256, R] float32.
    Q6_K: qs [G, n/32, 32, R] uint8 (the 6-bit weights, unsigned), sc [G, n/16, R] int8,
          d [G, n/256, R] float32, dmin empty. Rows past `rows` in the last group are zeros."""
    ARRAYS = ("qs", "sc", "mn", "d", "dmin")

    def __init__(self, qtype, rows, n, qs, sc, mn, d, dmin):
        self.kind, self.qtype, self.rows, self.n = "k", qtype, rows, n
        self.qs, self.sc, self.mn, self.d, self.dmin = qs, sc, mn, d, dmin

    def dequant_t(self, g0, g1, out):
        """Groups g0..g1 dequantized (gguf-py's values), transposed: out [n, (g1 - g0) * R] float32."""
        _k_dequant_t(self.qtype, self.qs, self.sc, self.mn, self.d, self.dmin, g0, g1, out)

    def lookup(self, ids, out):
        """Rows ids [k] dequantized into out [k, n] (gguf-py's values; an embedding lookup)."""
        _k_rows(self.qtype, self.qs, self.sc, self.mn, self.d, self.dmin, ids, out)

    def mul_q8(self, a):
        """a: Q8Rows ("q8_k") of x [N, n] -> [N, rows], ggml's bits: the tiled order for a batch of
        TILED_MIN_BATCH tokens or more, the AVX2 vec_dot lanes below it (module docstring)"""
        xq = a.qs.astype(np.float32)                                  # [N, n] codes: exact as floats
        N = xq.shape[0]
        y = np.empty((N, self.qs.shape[0] * R), np.float32)
        mn = self.mn if self.mn.shape[0] else np.zeros((0, 0, 0), np.uint8)
        (gemm_k_tiled if N >= TILED_MIN_BATCH else gemv_k)(self.qtype, self.qs, self.sc, mn, self.d, self.dmin, xq,
                                                            a.d, a.e, y)
        return y[:, :self.rows]


def pack_k(qtype, data, table, n) -> KPacked:
    G = -(-data.shape[0] // R)
    if qtype == Q4_K:
        P = KPacked(qtype, data.shape[0], n, np.zeros((G, n // 32, 16, R), np.uint8), np.zeros((G, n // 32, R), np.uint8),
                    np.zeros((G, n // 32, R), np.uint8), np.zeros((G, n // 256, R), np.float32),
                    np.zeros((G, n // 256, R), np.float32))
    else:
        P = KPacked(qtype, data.shape[0], n, np.zeros((G, n // 32, 32, R), np.uint8), np.zeros((G, n // 16, R), np.int8),
                    np.zeros((0, 0, 0), np.uint8), np.zeros((G, n // 256, R), np.float32), _NONE_F)
    _pack_k(qtype, data, table, P.qs, P.sc, P.mn, P.d, P.dmin)
    return P


@njit(**EXACT)
def _pack_k(qtype, data, table, qs, sc, mn, d, dmin):
    for row in range(data.shape[0]):
        g, l, src = row // R, row % R, data[row]
        for B in range(d.shape[1]):
            if qtype == Q4_K:
                o = B * QT[Q4_K].block_bytes
                d[g, B, l], dmin[g, B, l] = half_float(src, o, table), half_float(src, o + 2, table)
                for s in range(8):
                    a, m = k_scale_min(src, o + 4, s)
                    sc[g, 8 * B + s, l], mn[g, 8 * B + s, l] = a, m
                    q0, shift = o + 16 + (s // 2) * 32, 4 * (s % 2)
                    for k in range(16):
                        lo = (np.int32(src[q0 + k]) >> shift) & 15
                        hi = (np.int32(src[q0 + 16 + k]) >> shift) & 15
                        qs[g, 8 * B + s, k, l] = np.uint8(lo | (hi << 4))
            else:                                                      # Q6_K: weight 128h + 32g4 + i
                o = B * QT[Q6_K].block_bytes
                d[g, B, l] = half_float(src, o + 208, table)
                for i in range(16):
                    sc[g, 16 * B + i, l] = np.int8((np.int32(src[o + 192 + i]) ^ 128) - 128)
                for h in range(2):
                    ql, qh = o + 64 * h, o + 128 + 32 * h
                    for i in range(32):
                        a, c, hh = np.int32(src[ql + i]), np.int32(src[ql + i + 32]), np.int32(src[qh + i])
                        b = 8 * B + 4 * h
                        qs[g, b, i, l] = np.uint8(q6_code(a, hh, 0))
                        qs[g, b + 1, i, l] = np.uint8(q6_code(c, hh, 1))
                        qs[g, b + 2, i, l] = np.uint8(q6_code(a, hh, 2))
                        qs[g, b + 3, i, l] = np.uint8(q6_code(c, hh, 3))


@njit(**EXACT)
def _k_dequant_t(qtype, qs, sc, mn, d, dmin, g0, g1, out):
    """As gguf-py: Q4_K w = (d sc) q - (dmin mn); Q6_K w = (d sc) (q - 32), float32 products"""
    width = qs.shape[3]
    for g in range(g0, g1):
        c = (g - g0) * width
        for b in range(qs.shape[1]):
            B = b // 8
            for r in range(width):
                if qtype == Q4_K:
                    ds = d[g, B, r] * np.float32(sc[g, b, r])
                    dm = dmin[g, B, r] * np.float32(mn[g, b, r])
                    for k in range(16):
                        v = np.int32(qs[g, b, k, r])
                        out[b * 32 + k, c + r] = ds * np.float32(v & 15) - dm
                        out[b * 32 + 16 + k, c + r] = ds * np.float32(v >> 4) - dm
                else:
                    for k in range(32):
                        ds = d[g, B, r] * np.float32(sc[g, 2 * b + k // 16, r])
                        out[b * 32 + k, c + r] = ds * np.float32(np.int32(qs[g, b, k, r]) - 32)


@njit(**EXACT)
def _k_rows(qtype, qs, sc, mn, d, dmin, ids, out):
    for i in range(ids.shape[0]):
        g, r = ids[i] // R, ids[i] % R
        for b in range(qs.shape[1]):
            B = b // 8
            if qtype == Q4_K:
                ds = d[g, B, r] * np.float32(sc[g, b, r])
                dm = dmin[g, B, r] * np.float32(mn[g, b, r])
                for k in range(16):
                    v = np.int32(qs[g, b, k, r])
                    out[i, b * 32 + k] = ds * np.float32(v & 15) - dm
                    out[i, b * 32 + 16 + k] = ds * np.float32(v >> 4) - dm
            else:
                for k in range(32):
                    ds = d[g, B, r] * np.float32(sc[g, 2 * b + k // 16, r])
                    out[i, b * 32 + k] = ds * np.float32(np.int32(qs[g, b, k, r]) - 32)


@njit(**GG)
def _q4k_vec_group(qs, sc, mn, d, dmin, g, xq, dx, bsums, y, o):
    """Group g of a Q4_K KPacked x one token, as ggml_vec_dot_q4_K_q8_K's AVX2 code (ggml_kernels'
    _dot_q4_k): lane i (of 8) sums scale_s q.x over weights 4i..4i+3 of every sub-block s; the
    mins go to 4 lanes; per superblock acc = fma(d_x d_w, lane, acc). The integer lanes stay
    below 8 * 63 * 4 * 15 * 127 < 2^24: exact in float32."""
    width = qs.shape[3]
    acc = np.zeros((8, width), np.float32)
    macc = np.zeros((4, width), np.float32)
    lanes = np.empty((8, width), np.float32)
    mins = np.empty((4, width), np.float32)
    dd = np.empty(width, np.float32)
    for B in range(d.shape[1]):
        lanes[:] = 0
        mins[:] = 0
        for s in range(8):
            b, xo = 8 * B + s, 256 * B + 32 * s
            scb, mnb = sc[g, b], mn[g, b]
            bs = np.float32(bsums[16 * B + 2 * s] + bsums[16 * B + 2 * s + 1])
            mrow = mins[s // 2]
            for r in range(width):
                mrow[r] += np.float32(mnb[r]) * bs
            for j in range(4):
                k = 4 * j
                q0, q1, q2, q3 = qs[g, b, k], qs[g, b, k + 1], qs[g, b, k + 2], qs[g, b, k + 3]
                x0, x1, x2, x3 = xq[xo + k], xq[xo + k + 1], xq[xo + k + 2], xq[xo + k + 3]
                h0, h1 = xq[xo + 16 + k] * SIXTEENTH, xq[xo + 17 + k] * SIXTEENTH
                h2, h3 = xq[xo + 18 + k] * SIXTEENTH, xq[xo + 19 + k] * SIXTEENTH
                llo, lhi = lanes[j], lanes[4 + j]
                for r in range(width):
                    v0, v1, v2, v3 = np.int32(q0[r]), np.int32(q1[r]), np.int32(q2[r]), np.int32(q3[r])
                    f = np.float32(np.int32(scb[r]))
                    llo[r] += f * (np.float32(np.int32(v0 & 15)) * x0 + np.float32(np.int32(v1 & 15)) * x1
                                   + np.float32(np.int32(v2 & 15)) * x2 + np.float32(np.int32(v3 & 15)) * x3)
                    lhi[r] += f * (np.float32(np.int32(v0 & 240)) * h0 + np.float32(np.int32(v1 & 240)) * h1
                                   + np.float32(np.int32(v2 & 240)) * h2 + np.float32(np.int32(v3 & 240)) * h3)
        db, dm = d[g, B], dmin[g, B]
        for r in range(width):
            dd[r] = dx[B] * db[r]
        for i in range(8):
            a, ln = acc[i], lanes[i]
            for r in range(width):
                a[r] = dd[r] * ln[r] + a[r]                           # ggml's FMA
        for r in range(width):
            dd[r] = -dx[B] * dm[r]
        for i in range(4):
            a, mi = macc[i], mins[i]
            for r in range(width):
                a[r] = dd[r] * mi[r] + a[r]
    for r in range(width):
        m = (macc[0, r] + macc[2, r]) + (macc[1, r] + macc[3, r])
        a0, a1, a2, a3 = acc[0, r] + acc[4, r], acc[1, r] + acc[5, r], acc[2, r] + acc[6, r], acc[3, r] + acc[7, r]
        y[o + r] = ((a0 + a2) + (a1 + a3)) + m


@njit(**GG)
def _q6k_vec_group(qs, sc, d, g, xq, dx, bsums, y, o):
    """Group g of a Q6_K KPacked x one token, as ggml_vec_dot_q6_K_q8_K's AVX2 code (ggml_kernels'
    _dot_q6_k): lane i sums scale q.x (unsigned q) over weights 4i..4i+3 of each 32-weight group,
    minus 32 (scale_2i bsum_2i + scale_2i+1 bsum_2i+1). Each half superblock's part of a lane is
    below 4 * 128 * 4 * 63 * 127 < 2^24 (exact in float32); the halves and the offset are added
    in int32."""
    width = qs.shape[3]
    acc = np.zeros((8, width), np.float32)
    half = np.empty((2, 8, width), np.float32)
    dd = np.empty(width, np.float32)
    for B in range(d.shape[1]):
        half[:] = 0
        for h in range(2):
            for g4 in range(4):
                b, xo = 8 * B + 4 * h + g4, 256 * B + 128 * h + 32 * g4
                for i in range(8):
                    k = 4 * i
                    scv = sc[g, 16 * B + 8 * h + 2 * g4 + i // 4]
                    q0, q1, q2, q3 = qs[g, b, k], qs[g, b, k + 1], qs[g, b, k + 2], qs[g, b, k + 3]
                    x0, x1, x2, x3 = xq[xo + k], xq[xo + k + 1], xq[xo + k + 2], xq[xo + k + 3]
                    ln = half[h, i]
                    for r in range(width):
                        ln[r] += np.float32(np.int32(scv[r])) * (
                            np.float32(np.int32(q0[r])) * x0 + np.float32(np.int32(q1[r])) * x1
                            + np.float32(np.int32(q2[r])) * x2 + np.float32(np.int32(q3[r])) * x3)
        db = d[g, B]
        for r in range(width):
            dd[r] = dx[B] * db[r]
        for i in range(8):
            s0, s1 = sc[g, 16 * B + 2 * i], sc[g, 16 * B + 2 * i + 1]
            b0, b1 = np.int32(bsums[16 * B + 2 * i]), np.int32(bsums[16 * B + 2 * i + 1])
            a, l0, l1 = acc[i], half[0, i], half[1, i]
            for r in range(width):
                lane = np.int32(np.int32(l0[r]) + np.int32(l1[r])
                                - np.int32(32) * (np.int32(s0[r]) * b0 + np.int32(s1[r]) * b1))
                a[r] = dd[r] * np.float32(lane) + a[r]
    for r in range(width):
        a0, a1, a2, a3 = acc[0, r] + acc[4, r], acc[1, r] + acc[5, r], acc[2, r] + acc[6, r], acc[3, r] + acc[7, r]
        y[o + r] = ((a0 + a2) + (a1 + a3))


@njit(parallel=True, **GG)
def gemv_k(qtype, qs, sc, mn, d, dmin, xq, dx, bsums, y):
    """K-quant x N tokens (N < TILED_MIN_BATCH), one vec_dot per (row, token): xq [N, n] float32,
    dx [N, n/256], bsums [N, n/16] int32 -> y [N, G*R]"""
    for g in prange(qs.shape[0]):
        for t in range(xq.shape[0]):
            if qtype == Q4_K:
                _q4k_vec_group(qs, sc, mn, d, dmin, g, xq[t], dx[t], bsums[t], y[t], g * qs.shape[3])
            else:
                _q6k_vec_group(qs, sc, d, g, xq[t], dx[t], bsums[t], y[t], g * qs.shape[3])


@njit(**EXACT)
def _k_codes(qtype, qs, g, B, c):
    """Superblock B of group g -> c [256, R] float32: Q4_K's q (0..15), Q6_K's q - 32"""
    width = qs.shape[3]
    for s in range(8):
        b = 8 * B + s
        if qtype == Q4_K:
            for k in range(16):
                q = qs[g, b, k]
                for r in range(width):
                    c[32 * s + k, r] = np.float32(np.int32(q[r] & 15))
                    c[32 * s + 16 + k, r] = np.float32(np.int32(q[r] >> 4))
        else:
            for k in range(32):
                q = qs[g, b, k]
                for r in range(width):
                    c[32 * s + k, r] = np.float32(np.int32(q[r]) - 32)


@njit(**GG)
def _k_tiled_group(qtype, qs, sc, mn, d, dmin, g, xq, dx, bsums, y):
    """Group g of a K-quant x N tokens in ggml's tiled order (ggml_kernels' _dot_k_tiled): per
    superblock s1 = sum_j scale_j (q.x)_j, s2 = sum_j min_j bsum_j (exact integers),
    res = fma(-dmin_w, s2, d_w s1), acc = fma(res, d_x, acc). A 32-weight sub-block's scale_j
    (q.x)_j is below 2^24 in magnitude (Q4_K: 63 * 32 * 15 * 127, Q6_K: 2 * 128 * 16 * 32 * 127)
    and so are four of Q4_K's; the parts are added in int32."""
    width, N = qs.shape[3], xq.shape[0]
    c = np.empty((256, width), np.float32)
    p = np.empty(width, np.float32)
    part = np.empty(width, np.float32)
    s1 = np.empty(width, np.int32)
    s2 = np.empty(width, np.float32)
    res = np.empty(width, np.float32)
    acc = np.zeros((N, width), np.float32)
    for B in range(d.shape[1]):
        _k_codes(qtype, qs, g, B, c)
        db = d[g, B]
        for t in range(N):
            x = xq[t]
            s1[:] = 0
            s2[:] = 0
            part[:] = 0
            for s in range(8):
                xo = 256 * B + 32 * s
                p[:] = 0
                if qtype == Q4_K:
                    for e in range(0, 32, 4):
                        c0, c1, c2, c3 = c[32 * s + e], c[32 * s + e + 1], c[32 * s + e + 2], c[32 * s + e + 3]
                        x0, x1, x2, x3 = x[xo + e], x[xo + e + 1], x[xo + e + 2], x[xo + e + 3]
                        for r in range(width):
                            p[r] += c0[r] * x0 + c1[r] * x1 + c2[r] * x2 + c3[r] * x3
                    scb, mnb = sc[g, 8 * B + s], mn[g, 8 * B + s]
                    bs = np.float32(bsums[t, 16 * B + 2 * s] + bsums[t, 16 * B + 2 * s + 1])
                    for r in range(width):
                        part[r] += np.float32(np.int32(scb[r])) * p[r]
                        s2[r] += np.float32(np.int32(mnb[r])) * bs
                    if s % 4 == 3:                                     # four sub-blocks: still exact
                        for r in range(width):
                            s1[r] += np.int32(part[r])
                            part[r] = 0
                else:                                                  # two 16-weight groups per sub-block
                    sa, sb = sc[g, 16 * B + 2 * s], sc[g, 16 * B + 2 * s + 1]
                    for half in range(2):
                        scv = sa if half == 0 else sb
                        for e in range(16 * half, 16 * half + 16, 4):
                            c0, c1, c2, c3 = c[32 * s + e], c[32 * s + e + 1], c[32 * s + e + 2], c[32 * s + e + 3]
                            x0, x1, x2, x3 = x[xo + e], x[xo + e + 1], x[xo + e + 2], x[xo + e + 3]
                            for r in range(width):
                                part[r] = c0[r] * x0 + c1[r] * x1 + c2[r] * x2 + c3[r] * x3
                                p[r] += np.float32(np.int32(scv[r])) * part[r]
                    for r in range(width):
                        s1[r] += np.int32(p[r])
            for r in range(width):
                res[r] = db[r] * np.float32(s1[r])
            if qtype == Q4_K:                                          # a loop of its own: the only product
                dm = dmin[g, B]                                        # in reach of the add is -dmin s2
                for r in range(width):
                    res[r] = (-dm[r]) * s2[r] + res[r]                 # fma(-dmin, s2, d s1)
            a, xd = acc[t], dx[t, B]
            for r in range(width):
                a[r] = res[r] * xd + a[r]                              # fma(res, d_x, acc)
    for t in range(N):
        y[t, g * width:(g + 1) * width] = acc[t]


@njit(parallel=True, **GG)
def gemm_k_tiled(qtype, qs, sc, mn, d, dmin, xq, dx, bsums, y):
    for g in prange(qs.shape[0]):
        _k_tiled_group(qtype, qs, sc, mn, d, dmin, g, xq, dx, bsums, y)
