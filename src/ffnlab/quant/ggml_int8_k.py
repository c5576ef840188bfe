"""Q4_K and Q6_K products with ggml's byte multiplies (quant/simd.py), over a lane layout made at
load: quant/ggml_int8.py's approach for the 256-weight K-quants.

ggml's AVX2 vec_dot (ggml-cpu/arch/x86/quants.c, ggml_vec_dot_q4_K_q8_K / q6_K_q8_K; one or a few
tokens) keeps 8 int32 lanes per superblock: lane i sums scale x q.x over weights 4i..4i+3 of each
32-weight sub-block (vpmaddubsw, then vpmaddwd against the sub-block's scale instead of ones);
Q4_K's mins go to 4 more lanes (min_2k bsum_2k + min_2k+1 bsum_2k+1), Q6_K's -32 offset is folded
into lane i as -32 (scale_2i bsum_2i + scale_2i+1 bsum_2i+1); then acc_i = fma(d_x d_w, lane_i,
acc_i) per superblock and hsum_float_8. Its tiled matmul (ggml-cpu/tiled; 8 tokens or more) needs
only the lanes' totals: s1 = sum of the 8 lanes, s2 = sum of the min lanes (exact integers, in
any order), res = fma(-dmin_w, s2, d_w s1), acc = fma(res, d_x, acc). Both are computed here for
CHUNK rows at a time (16 or 8: simd.ROWS), as ggml_int8.py does for the 32-weight types; the
integer lanes are exact (pairs of products within int16: 2 x 15 x 127, 2 x 63 x 127; lane totals
within int32) and the float steps are ggml's, so the bits are quant/ggml_kernels.py's _dot_q4_k /
_dot_q6_k / _dot_k_tiled (tests/unit/test_ggml_packed.py).

Layout (LaneKPacked), G groups of R = 64 rows, C = R / CHUNK chunks of CHUNK rows, ns = n/32
sub-blocks:
  Q4_K  qs [G, C, ns, 4, CHUNK, 4] uint8: [.., j, r, i] low nibble weight 4j+i of the sub-block,
        high nibble weight 16+4j+i; sc, mn [G, C, ns, CHUNK] uint8 (6-bit scale and min); d, dmin
        [G, C, n/256, CHUNK] float32 (the superblock's halves)
  Q6_K  qs [G, C, ns, 8, CHUNK, 4] uint8: weight 4j+i, unsigned (0..63); sc [G, C, n/16, CHUNK]
        int8 (one per 16 weights); d [G, C, n/256, CHUNK]; mn, dmin empty
"""
import numpy as np
from numba import njit, prange

from .ggml_int8 import CHUNK, LANE, _fma8, _hsum8, _zeros8
from .ggml_kernels import TILED_MIN_BATCH                 # batches of 8+ tokens go tiled
from .layout import R, Layout
from .simd import V
from .types import Q4_K, Q6_K, QT
from .unpack import half_float, k_scale_min, q6_code

GG = dict(cache=True, nogil=True, fastmath=False)
EXACT = dict(cache=True, nogil=True, fastmath=False)
_NONE_U = np.zeros((0, 0, 0, 0), np.uint8)
_NONE_F = np.zeros((0, 0, 0, 0), np.float32)


class LaneKPacked(Layout):
    """A [rows, n] Q4_K or Q6_K matrix in the lane layout (module docstring); rows past `rows` in
    the last group are zeros."""
    ARRAYS = ("qs", "sc", "mn", "d", "dmin")

    def __init__(self, qtype, rows, n, qs, sc, mn, d, dmin):
        self.kind, self.qtype, self.rows, self.n = "lane_k", qtype, rows, n
        self.qs, self.sc, self.mn, self.d, self.dmin = qs, sc, mn, d, dmin

    def lookup(self, ids, out):
        """Rows ids [k] dequantized into out [k, n] (gguf-py's values)."""
        _rows(self.qtype, self.qs, self.sc, self.mn, self.d, self.dmin, ids, out)

    def dequant_t(self, g0, g1, out):
        """Groups g0..g1 dequantized, transposed: out [n, (g1 - g0) * R] float32."""
        _dequant_t(self.qtype, self.qs, self.sc, self.mn, self.d, self.dmin, g0, g1, out)

    def mul_q8(self, a):
        """a: Q8Rows ("q8_k") of x [N, n] -> [N, rows], ggml's bits (product below)"""
        return product(self, a)[:, :self.rows]


def pack(qtype, data, table, n) -> LaneKPacked:
    """data: [rows, row_bytes] uint8 Q4_K / Q6_K blocks -> LaneKPacked (zeros past the last row)"""
    G, ns, nB = -(-data.shape[0] // R), n // 32, n // 256
    C = R // CHUNK
    d = np.zeros((G, C, nB, CHUNK), np.float32)
    if qtype == Q4_K:
        P = LaneKPacked(qtype, data.shape[0], n, np.zeros((G, C, ns, 4, CHUNK, 4), np.uint8),
                        np.zeros((G, C, ns, CHUNK), np.uint8), np.zeros((G, C, ns, CHUNK), np.uint8), d, np.zeros_like(d))
    else:
        P = LaneKPacked(qtype, data.shape[0], n, np.zeros((G, C, ns, 8, CHUNK, 4), np.uint8),
                        np.zeros((G, C, 2 * ns, CHUNK), np.int8), _NONE_U, d, _NONE_F)
    _pack(qtype, data, table, P.qs, P.sc, P.mn, P.d, P.dmin)
    return P


@njit(parallel=True, **EXACT)
def _pack(qtype, data, table, qs, sc, mn, d, dmin):
    for row in prange(data.shape[0]):
        g, c, r, src = row // R, (row % R) // CHUNK, row % CHUNK, data[row]
        for B in range(d.shape[2]):
            if qtype == Q4_K:
                o = B * QT[Q4_K].block_bytes
                d[g, c, B, r], dmin[g, c, B, r] = half_float(src, o, table), half_float(src, o + 2, table)
                for s in range(8):
                    a, m = k_scale_min(src, o + 4, s)
                    sc[g, c, 8 * B + s, r], mn[g, c, 8 * B + s, r] = a, m
                    q0, shift = o + 16 + (s // 2) * 32, 4 * (s % 2)
                    for k in range(16):
                        lo = (np.int32(src[q0 + k]) >> shift) & 15
                        hi = (np.int32(src[q0 + 16 + k]) >> shift) & 15
                        qs[g, c, 8 * B + s, k >> 2, r, k & 3] = np.uint8(lo | (hi << 4))
            else:                                                      # Q6_K: weight 128h + 32g4 + i
                o = B * QT[Q6_K].block_bytes
                d[g, c, B, r] = half_float(src, o + 208, table)
                for i in range(16):
                    sc[g, c, 16 * B + i, r] = np.int8((np.int32(src[o + 192 + i]) ^ 128) - 128)
                for h in range(2):
                    ql, qh, b = o + 64 * h, o + 128 + 32 * h, 8 * B + 4 * h
                    for i in range(32):
                        a, e, hh = np.int32(src[ql + i]), np.int32(src[ql + i + 32]), np.int32(src[qh + i])
                        j, k = i >> 2, i & 3
                        qs[g, c, b, j, r, k] = np.uint8(q6_code(a, hh, 0))
                        qs[g, c, b + 1, j, r, k] = np.uint8(q6_code(e, hh, 1))
                        qs[g, c, b + 2, j, r, k] = np.uint8(q6_code(a, hh, 2))
                        qs[g, c, b + 3, j, r, k] = np.uint8(q6_code(e, hh, 3))


# ---- dequantization (lookups, dequantize()) ---------------------------------------------------

@njit(**EXACT)
def _weight(qtype, qs, sc, mn, d, dmin, g, c, s, r, k):
    """weight k of sub-block s of row (g, c, r), as gguf-py: Q4_K (d sc) q - (dmin mn), Q6_K
    (d sc) (q - 32), float32 products"""
    B = s // 8
    if qtype == Q4_K:
        v = np.int32(qs[g, c, s, (k & 15) >> 2, r, k & 3])
        q = (v & 15) if k < 16 else (v >> 4)
        ds = d[g, c, B, r] * np.float32(sc[g, c, s, r])
        return ds * np.float32(q) - dmin[g, c, B, r] * np.float32(mn[g, c, s, r])
    ds = d[g, c, B, r] * np.float32(sc[g, c, 2 * s + k // 16, r])
    return ds * np.float32(np.int32(qs[g, c, s, k >> 2, r, k & 3]) - 32)


@njit(**EXACT)
def _rows(qtype, qs, sc, mn, d, dmin, ids, out):
    for i in range(ids.shape[0]):
        g, c, r = ids[i] // R, (ids[i] % R) // CHUNK, ids[i] % CHUNK
        for s in range(qs.shape[2]):
            for k in range(32):
                out[i, 32 * s + k] = _weight(qtype, qs, sc, mn, d, dmin, g, c, s, r, k)


@njit(**EXACT)
def _dequant_t(qtype, qs, sc, mn, d, dmin, g0, g1, out):
    for g in range(g0, g1):
        for c in range(R // CHUNK):
            col = (g - g0) * R + c * CHUNK
            for s in range(qs.shape[2]):
                for k in range(32):
                    for r in range(CHUNK):
                        out[32 * s + k, col + r] = _weight(qtype, qs, sc, mn, d, dmin, g, c, s, r, k)


# ---- integer lanes of one superblock, CHUNK rows x one token -----------------------------------

@njit(**GG)
def _q4k_lanes(qs, sc, chunk, B, x):
    """Q4_K superblock B of CHUNK rows (chunk) x codes x [n] -> lane i = sum_s scale_s (q.x over
    weights 4i..4i+3 of sub-block s), 8 vectors of int32 lanes"""
    ns = qs.shape[2]
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = V.zeros_b()
    for s in range(8 * B, 8 * B + 8):
        o, xo = (chunk * ns + s) * 4 * LANE, 32 * s
        scale = V.pairs16(V.widen(sc, (chunk * ns + s) * CHUNK))
        w0, w1, w2, w3 = V.load_b(qs, o), V.load_b(qs, o + LANE), V.load_b(qs, o + 2 * LANE), V.load_b(qs, o + 3 * LANE)
        l0 = V.add_i(l0, V.madd(V.maddubs(V.low4(w0), V.splat4(x, xo)), scale))
        l1 = V.add_i(l1, V.madd(V.maddubs(V.low4(w1), V.splat4(x, xo + 4)), scale))
        l2 = V.add_i(l2, V.madd(V.maddubs(V.low4(w2), V.splat4(x, xo + 8)), scale))
        l3 = V.add_i(l3, V.madd(V.maddubs(V.low4(w3), V.splat4(x, xo + 12)), scale))
        l4 = V.add_i(l4, V.madd(V.maddubs(V.high4(w0), V.splat4(x, xo + 16)), scale))
        l5 = V.add_i(l5, V.madd(V.maddubs(V.high4(w1), V.splat4(x, xo + 20)), scale))
        l6 = V.add_i(l6, V.madd(V.maddubs(V.high4(w2), V.splat4(x, xo + 24)), scale))
        l7 = V.add_i(l7, V.madd(V.maddubs(V.high4(w3), V.splat4(x, xo + 28)), scale))
    return l0, l1, l2, l3, l4, l5, l6, l7


@njit(**GG)
def _q4k_mins(mn, chunk, B, bs32):
    """Q4_K's min lanes of superblock B: lane k = min_2k bsum_2k + min_2k+1 bsum_2k+1, bs32 [n/32]
    the token's sums of 32 codes"""
    base, s = chunk * mn.shape[2], 8 * B
    return (V.add_i(V.mul_i(V.widen(mn, (base + s) * CHUNK), V.splat4(bs32, s)),
                    V.mul_i(V.widen(mn, (base + s + 1) * CHUNK), V.splat4(bs32, s + 1))),
            V.add_i(V.mul_i(V.widen(mn, (base + s + 2) * CHUNK), V.splat4(bs32, s + 2)),
                    V.mul_i(V.widen(mn, (base + s + 3) * CHUNK), V.splat4(bs32, s + 3))),
            V.add_i(V.mul_i(V.widen(mn, (base + s + 4) * CHUNK), V.splat4(bs32, s + 4)),
                    V.mul_i(V.widen(mn, (base + s + 5) * CHUNK), V.splat4(bs32, s + 5))),
            V.add_i(V.mul_i(V.widen(mn, (base + s + 6) * CHUNK), V.splat4(bs32, s + 6)),
                    V.mul_i(V.widen(mn, (base + s + 7) * CHUNK), V.splat4(bs32, s + 7))))


@njit(**GG)
def _q6k_offset(sc, chunk, B, i, bs16x32):
    """32 (scale_2i bsum_2i + scale_2i+1 bsum_2i+1) of superblock B (bs16x32: 32 x the token's
    sums of 16 codes)"""
    t = chunk * sc.shape[2] + 16 * B + 2 * i
    return V.add_i(V.mul_i(V.widen(sc, t * CHUNK), V.splat4(bs16x32, 16 * B + 2 * i)),
                   V.mul_i(V.widen(sc, (t + 1) * CHUNK), V.splat4(bs16x32, 16 * B + 2 * i + 1)))


@njit(**GG)
def _q6k_lanes(qs, sc, chunk, B, x, bs16x32):
    """Q6_K superblock B of CHUNK rows x codes x -> lane i = sum over the 32-weight groups of
    scale (q.x over weights 4i..4i+3; lanes 0-3 the group's first 16-scale, 4-7 its second),
    minus _q6k_offset(i)"""
    ns = qs.shape[2]
    l0 = l1 = l2 = l3 = l4 = l5 = l6 = l7 = V.zeros_b()
    for s in range(8 * B, 8 * B + 8):
        o, xo, t = (chunk * ns + s) * 8 * LANE, 32 * s, chunk * 2 * ns + 2 * s
        sa, sb = V.pairs16(V.widen(sc, t * CHUNK)), V.pairs16(V.widen(sc, (t + 1) * CHUNK))
        l0 = V.add_i(l0, V.madd(V.maddubs(V.load_b(qs, o), V.splat4(x, xo)), sa))
        l1 = V.add_i(l1, V.madd(V.maddubs(V.load_b(qs, o + 1 * LANE), V.splat4(x, xo + 4)), sa))
        l2 = V.add_i(l2, V.madd(V.maddubs(V.load_b(qs, o + 2 * LANE), V.splat4(x, xo + 8)), sa))
        l3 = V.add_i(l3, V.madd(V.maddubs(V.load_b(qs, o + 3 * LANE), V.splat4(x, xo + 12)), sa))
        l4 = V.add_i(l4, V.madd(V.maddubs(V.load_b(qs, o + 4 * LANE), V.splat4(x, xo + 16)), sb))
        l5 = V.add_i(l5, V.madd(V.maddubs(V.load_b(qs, o + 5 * LANE), V.splat4(x, xo + 20)), sb))
        l6 = V.add_i(l6, V.madd(V.maddubs(V.load_b(qs, o + 6 * LANE), V.splat4(x, xo + 24)), sb))
        l7 = V.add_i(l7, V.madd(V.maddubs(V.load_b(qs, o + 7 * LANE), V.splat4(x, xo + 28)), sb))
    return (V.sub_i(l0, _q6k_offset(sc, chunk, B, 0, bs16x32)), V.sub_i(l1, _q6k_offset(sc, chunk, B, 1, bs16x32)),
            V.sub_i(l2, _q6k_offset(sc, chunk, B, 2, bs16x32)), V.sub_i(l3, _q6k_offset(sc, chunk, B, 3, bs16x32)),
            V.sub_i(l4, _q6k_offset(sc, chunk, B, 4, bs16x32)), V.sub_i(l5, _q6k_offset(sc, chunk, B, 5, bs16x32)),
            V.sub_i(l6, _q6k_offset(sc, chunk, B, 6, bs16x32)), V.sub_i(l7, _q6k_offset(sc, chunk, B, 7, bs16x32)))


@njit(**GG)
def _total(v):
    """the sum of 8 int32 vectors (exact, any order)"""
    return V.add_i(V.add_i(V.add_i(v[0], v[1]), V.add_i(v[2], v[3])), V.add_i(V.add_i(v[4], v[5]), V.add_i(v[6], v[7])))


# ---- the float steps: vec_dot (few tokens) and tiled (8+) -------------------------------------

@njit(**GG)
def _q4k_vec(qs, sc, mn, d, dmin, chunk, x, dx, bs32, y, yo):
    nB = d.shape[2]
    acc = _zeros8()
    m0, m1, m2, m3 = V.zeros(), V.zeros(), V.zeros(), V.zeros()
    for B in range(nB):
        lanes, mins = _q4k_lanes(qs, sc, chunk, B, x), _q4k_mins(mn, chunk, B, bs32)
        dd = V.mul(V.splat(dx[B]), V.load(d, (chunk * nB + B) * CHUNK))         # d_x d_w
        dm = V.mul(V.splat(-dx[B]), V.load(dmin, (chunk * nB + B) * CHUNK))     # -d_x dmin_w
        acc = _fma8(dd, lanes, acc)
        m0, m1 = V.fma(dm, V.to_f(mins[0]), m0), V.fma(dm, V.to_f(mins[1]), m1)
        m2, m3 = V.fma(dm, V.to_f(mins[2]), m2), V.fma(dm, V.to_f(mins[3]), m3)
    V.store(y, yo, V.add(_hsum8(acc), V.add(V.add(m0, m2), V.add(m1, m3))))


@njit(**GG)
def _q6k_vec(qs, sc, d, chunk, x, dx, bs16x32, y, yo):
    nB = d.shape[2]
    acc = _zeros8()
    for B in range(nB):
        dd = V.mul(V.splat(dx[B]), V.load(d, (chunk * nB + B) * CHUNK))
        acc = _fma8(dd, _q6k_lanes(qs, sc, chunk, B, x, bs16x32), acc)
    V.store(y, yo, _hsum8(acc))


@njit(**GG)
def _k_tiled(qtype, qs, sc, mn, d, dmin, chunk, x, dx, bsums, y, yo):
    """res = V.fma(-dmin_w, s2, d_w s1) (Q6_K: d_w s1), acc = V.fma(res, d_x, acc) per superblock"""
    nB = d.shape[2]
    acc = V.zeros()
    minus = V.splat(-1.0)
    for B in range(nB):
        o = (chunk * nB + B) * CHUNK
        if qtype == Q4_K:
            s1, s2 = _total(_q4k_lanes(qs, sc, chunk, B, x)), _q4k_mins(mn, chunk, B, bsums)
            res = V.fma(V.mul(minus, V.load(dmin, o)), V.to_f(V.add_i(V.add_i(s2[0], s2[1]), V.add_i(s2[2], s2[3]))),
                      V.mul(V.load(d, o), V.to_f(s1)))
        else:
            res = V.mul(V.load(d, o), V.to_f(_total(_q6k_lanes(qs, sc, chunk, B, x, bsums))))
        acc = V.fma(res, V.splat(dx[B]), acc)
    V.store(y, yo, acc)


@njit(parallel=True, **GG)
def gemm_k(qtype, qs, sc, mn, d, dmin, xq, dx, bsums, y):
    """Q4_K / Q6_K x N tokens: xq [N, n] int8, dx [N, n/256]; bsums: Q4_K [N, n/32] sums of 32
    codes, Q6_K [N, n/16] 32 x the sums of 16 -> y [N, G*R]; vec_dot order below
    TILED_MIN_BATCH tokens, tiled from there"""
    chunks, N = qs.shape[0] * (R // CHUNK), xq.shape[0]
    for chunk in prange(chunks):
        for t in range(N):
            yo = t * y.shape[1] + chunk * CHUNK
            if N >= TILED_MIN_BATCH:
                _k_tiled(qtype, qs, sc, mn, d, dmin, chunk, xq[t], dx[t], bsums[t], y, yo)
            elif qtype == Q4_K:
                _q4k_vec(qs, sc, mn, d, dmin, chunk, xq[t], dx[t], bsums[t], y, yo)
            else:
                _q6k_vec(qs, sc, d, chunk, xq[t], dx[t], bsums[t], y, yo)


def product(P, a):
    """P: LaneKPacked, a: Q8Rows ("q8_k") of the activation [N, n] -> y [N, G*R] float32"""
    N = a.qs.shape[0]
    if P.qtype == Q4_K:
        bsums = a.e.reshape(N, -1, 2).sum(axis=2, dtype=np.int32)            # [N, n/32]
    else:
        bsums = np.ascontiguousarray(a.e, np.int32) * np.int32(32)          # [N, n/16]
    y = np.empty((N, P.qs.shape[0] * R), np.float32)
    gemm_k(P.qtype, P.qs, P.sc, P.mn, P.d, P.dmin, a.qs, a.d, bsums, y)
    return y
