"""ggml's integer products over row-interleaved weights: quant/ggml_kernels.py's arithmetic, in
the layout of quant/packed.py (R = 64 rows side by side per group), made once at load.

pack() makes the layouts QuantTensor multiplies in arith "ggml" (their mul_q8, quant/layout.py). On a CPU with AVX2 (INT8) they
hand every type to quant/ggml_int8.py / ggml_int8_k.py (ggml's own byte multiplies, the same
bits); the float kernels below are the fallback elsewhere, and tests/unit/test_ggml_packed.py runs both.

Every float32 operation ggml makes is kept, in ggml's order, for each (row, token): the eight
lanes of four products per 32-weight block (Q4_0 / Q4_1 / Q5_0 / Q8_0 against Q8_0 / Q8_1
activations), the lane FMA acc_l = fma(d_w d_x, lane_l, acc_l), the Q8_1 sum of m_w s_x, the
hsum_float_8 pairing; for Q4_K / Q6_K the AVX2 vec_dot lanes (one or a few tokens) or the tiled
order (8+ tokens). What changes is only how the exact integer parts are computed: 64 rows at a
time (a panel of 128 for batches, four tokens per pass over its codes), in float32. A lane's products of a weight code (|q| <= 63, or 128 for Q8_0) and an
activation code (|x| <= 127) are integers, and so is every partial sum; while they stay below
2^24 in magnitude float32 holds them exactly, whatever the order or fusion of the adds. Where
a sum can pass 2^24 (Q4_K's 256-weight tiled sum, Q6_K's lanes) it is split into parts that
cannot, converted to int32 and added there. So the bits are the row-at-a-time kernels' bits
(tests/unit/test_ggml_packed.py holds them to quant/ggml_kernels.gemm), and the loops over the 64
rows vectorize like the f32 mode's (no horizontal sum per block, one broadcast per activation).

Layouts: Q4_0 / Q4_1 / Q8_0 are packed.Packed as the f32 mode makes it (its d and m are the
blocks' halves as float32, its codes the blocks' bytes: nothing to change); Q5_0 is an "i8"
Packed of its 5-bit weights (pack() says why); Q5_1 and Q2_K / Q3_K / Q5_K keep ggml_kernels'
row kernels. Q4_K and Q6_K
keep their integer sub-block scales apart from the superblock's halves (ggml_packed_k.py), since
ggml multiplies the integer scales into the integer sums before any float appears.

`contract` lets LLVM fuse a multiply and the add that consumes it into one FMA: the lane updates
are ggml's FMAs, and every other multiply-add here is of exact integers (fused or not, the same).
"""
import numpy as np
from numba import njit, prange

from . import ggml_int8, ggml_int8_k, packed
from .ggml_packed_k import pack_k
from .packed import R
from .simd import HAS_AVX2
from .types import Q5_0, QT, TYPES
from .unpack import fifth_bit, half_float, u32

GG = dict(cache=True, nogil=True, fastmath={"contract"})
EXACT = dict(cache=True, nogil=True, fastmath=False)
# types.py's ggml_layout: "block32" with AVX2 ggml_int8.LanePacked, else packed.Packed ("nib", "i8");
# "k" with AVX2 ggml_int8_k.LaneKPacked, else ggml_packed_k.KPacked
BLOCK32_TYPES = tuple(t for t, r in TYPES.items() if r.ggml_layout == "block32")
K_TYPES = tuple(t for t, r in TYPES.items() if r.ggml_layout == "k")
PACKED_TYPES = BLOCK32_TYPES + K_TYPES
INT8 = HAS_AVX2                                      # byte multiplies for every type (ggml_int8.py, ggml_int8_k.py)
# the types stacked() can stack: those whose layout empty() / fill() make (without AVX2, packed.py's:
# not Q5_0's, which pack() makes of its own)
STACKABLE = BLOCK32_TYPES if INT8 else tuple(t for t in BLOCK32_TYPES if TYPES[t].code_bits != 5)
SIXTEENTH = np.float32(0.0625)                       # a high nibble kept as (byte & 0xF0): x / 16 is exact


# ---- 32-weight blocks, one token --------------------------------------------------------------

@njit(**GG)
def _hsum_store(acc, summs, y, o):
    """hsum_float_8 per row: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), plus the Q8_1 sums"""
    for r in range(acc.shape[1]):
        a0, a1, a2, a3 = acc[0, r] + acc[4, r], acc[1, r] + acc[5, r], acc[2, r] + acc[6, r], acc[3, r] + acc[7, r]
        y[o + r] = ((a0 + a2) + (a1 + a3)) + summs[r]


@njit(**GG)
def _nib_gemv_group(qs, d, m, zero, g, xq, dx, sx, y):
    """Group g of a Packed "nib" matrix (Q4_0, Q4_1) x one token: xq [n] float32 activation codes,
    dx, sx [n/32] -> y[g*R : (g+1)*R]. Lanes 0-3 of a block are its low nibbles (weights 0-15),
    lanes 4-7 the high ones."""
    nb, width = qs.shape[1], qs.shape[3]
    acc = np.zeros((8, width), np.float32)
    summs = np.zeros(width, np.float32)
    dd = np.empty(width, np.float32)
    zf = np.float32(zero)
    for b in range(nb):
        xo = b * 32
        db = d[g, b]
        for r in range(width):
            dd[r] = db[r] * dx[b]
        if m.shape[0]:
            mb, s = m[g, b], sx[b]
            for r in range(width):
                summs[r] += mb[r] * s                                  # halves' product: exact, fused or not
        for j in range(4):
            k = 4 * j
            q0, q1, q2, q3 = qs[g, b, k], qs[g, b, k + 1], qs[g, b, k + 2], qs[g, b, k + 3]
            x0, x1, x2, x3 = xq[xo + k], xq[xo + k + 1], xq[xo + k + 2], xq[xo + k + 3]
            h0, h1 = xq[xo + 16 + k] * SIXTEENTH, xq[xo + 17 + k] * SIXTEENTH
            h2, h3 = xq[xo + 18 + k] * SIXTEENTH, xq[xo + 19 + k] * SIXTEENTH
            zlo = -zf * (x0 + x1 + x2 + x3)                            # sum (q - zero) x = sum q x - zero sum x
            zhi = -zf * (xq[xo + 16 + k] + xq[xo + 17 + k] + xq[xo + 18 + k] + xq[xo + 19 + k])
            # np.int32 keeps the integers 32-bit (numba widens them to 64 bits, AVX2 has no vector
            # int64 -> float conversion, and the loop would run scalar)
            alo, ahi = acc[j], acc[4 + j]
            for r in range(width):
                v0, v1, v2, v3 = np.int32(q0[r]), np.int32(q1[r]), np.int32(q2[r]), np.int32(q3[r])
                lo = (np.float32(np.int32(v0 & 15)) * x0 + np.float32(np.int32(v1 & 15)) * x1
                      + np.float32(np.int32(v2 & 15)) * x2 + np.float32(np.int32(v3 & 15)) * x3) + zlo
                hi = (np.float32(np.int32(v0 & 240)) * h0 + np.float32(np.int32(v1 & 240)) * h1
                      + np.float32(np.int32(v2 & 240)) * h2 + np.float32(np.int32(v3 & 240)) * h3) + zhi
                alo[r] = dd[r] * lo + alo[r]                           # ggml's lane FMA
                ahi[r] = dd[r] * hi + ahi[r]
    _hsum_store(acc, summs, y, g * width)


@njit(**GG)
def _i8_gemv_group(qs, d, g, xq, dx, y):
    """Group g of a Packed "i8" (Q8_0) matrix x one token -> y[g*R : (g+1)*R]"""
    nb, width = qs.shape[1], qs.shape[3]
    acc = np.zeros((8, width), np.float32)
    dd = np.empty(width, np.float32)
    for b in range(nb):
        xo = b * 32
        db = d[g, b]
        for r in range(width):
            dd[r] = db[r] * dx[b]
        for j in range(8):
            k = 4 * j
            q0, q1, q2, q3 = qs[g, b, k], qs[g, b, k + 1], qs[g, b, k + 2], qs[g, b, k + 3]
            x0, x1, x2, x3 = xq[xo + k], xq[xo + k + 1], xq[xo + k + 2], xq[xo + k + 3]
            a = acc[j]
            for r in range(width):
                lane = (np.float32(q0[r]) * x0 + np.float32(q1[r]) * x1
                        + np.float32(q2[r]) * x2 + np.float32(q3[r]) * x3)
                a[r] = dd[r] * lane + a[r]
    _hsum_store(acc, np.zeros(width, np.float32), y, g * width)


@njit(parallel=True, **GG)
def gemv_nib(qs, d, m, zero, xq, dx, sx, y):
    for g in prange(qs.shape[0]):
        _nib_gemv_group(qs, d, m, zero, g, xq, dx, sx, y)


@njit(parallel=True, **GG)
def gemv_i8(qs, d, xq, dx, y):
    for g in prange(qs.shape[0]):
        _i8_gemv_group(qs, d, g, xq, dx, y)


# ---- 32-weight blocks, several tokens ---------------------------------------------------------

PANEL_GROUPS = 2                                     # row groups per panel: 128 rows per vector loop
TOKEN_TILE = 4                                       # tokens whose lanes stay in L1 over all blocks
PAD = 16


@njit(**EXACT)
def _panel_codes(qs, d, m, zero, g0, g1, c, dp, mp):
    """Groups g0..g1 -> c [n/32, 32, W] float32 (each row's integer weights, offset applied),
    dp, mp [n/32, W] (the blocks' d and m): the panel's rows side by side, W = (g1 - g0) * R"""
    width = qs.shape[3]
    z = np.int32(zero)
    for g in range(g0, g1):
        o = (g - g0) * width
        for b in range(d.shape[1]):
            dp[b, o:o + width] = d[g, b]
            if m.shape[0]:
                mp[b, o:o + width] = m[g, b]
            cb = c[b]
            if qs.shape[2] == 32:                                      # i8
                for k in range(32):
                    q, dst = qs[g, b, k], cb[k, o:o + width]
                    for r in range(width):
                        dst[r] = np.float32(np.int32(q[r]))
            else:                                                      # nib: low nibble weight k, high k + 16
                for k in range(16):
                    q, lo, hi = qs[g, b, k], cb[k, o:o + width], cb[16 + k, o:o + width]
                    for r in range(width):
                        v = np.int32(q[r])
                        lo[r] = np.float32(np.int32((v & 15) - z))
                        hi[r] = np.float32(np.int32((v >> 4) - z))


@njit(**GG)
def _panel_gemm(c, dp, mp, W, xq, dx, sx, y, o, acc, dd, summs):
    """A panel (c, dp, mp from _panel_codes; W rows) x N tokens -> y[:, o:o+W]. Tokens go in tiles
    of TOKEN_TILE whose lane accumulators acc [T, 8, W] stay in L1 while every block passes; in a
    tile, four tokens per pass over a lane's codes (one load of a code serves four products).
    d_w d_x (exact: two halves) is formed once per block and token, as ggml's broadcast."""
    nb, N = dp.shape[0], xq.shape[0]
    for t0 in range(0, N, TOKEN_TILE):
        nt = min(TOKEN_TILE, N - t0)
        acc[:] = 0
        summs[:] = 0
        for b in range(nb):
            db, cb, xo = dp[b], c[b], b * 32
            for i in range(nt):
                e = dx[t0 + i, b]
                for r in range(W):
                    dd[i, r] = db[r] * e
            if mp.shape[0]:
                mb = mp[b]
                for i in range(nt):
                    s, st = sx[t0 + i, b], summs[i]
                    for r in range(W):
                        st[r] += mb[r] * s                             # halves' product: exact, fused or not
            i = 0
            while i + 4 <= nt:
                t = t0 + i
                d0, d1, d2, d3 = dd[i], dd[i + 1], dd[i + 2], dd[i + 3]
                for j in range(8):
                    k = xo + 4 * j
                    c0, c1, c2, c3 = cb[4 * j], cb[4 * j + 1], cb[4 * j + 2], cb[4 * j + 3]
                    a0, a1, a2, a3 = acc[i, j], acc[i + 1, j], acc[i + 2, j], acc[i + 3, j]
                    x00, x01, x02, x03 = xq[t, k], xq[t, k + 1], xq[t, k + 2], xq[t, k + 3]
                    x10, x11, x12, x13 = xq[t + 1, k], xq[t + 1, k + 1], xq[t + 1, k + 2], xq[t + 1, k + 3]
                    x20, x21, x22, x23 = xq[t + 2, k], xq[t + 2, k + 1], xq[t + 2, k + 2], xq[t + 2, k + 3]
                    x30, x31, x32, x33 = xq[t + 3, k], xq[t + 3, k + 1], xq[t + 3, k + 2], xq[t + 3, k + 3]
                    for r in range(W):
                        v0, v1, v2, v3 = c0[r], c1[r], c2[r], c3[r]          # the lane's integer sum, then
                        a0[r] = d0[r] * ((v0 * x00 + v1 * x01) + (v2 * x02 + v3 * x03)) + a0[r]   # ggml's FMA
                        a1[r] = d1[r] * ((v0 * x10 + v1 * x11) + (v2 * x12 + v3 * x13)) + a1[r]
                        a2[r] = d2[r] * ((v0 * x20 + v1 * x21) + (v2 * x22 + v3 * x23)) + a2[r]
                        a3[r] = d3[r] * ((v0 * x30 + v1 * x31) + (v2 * x32 + v3 * x33)) + a3[r]
                i += 4
            while i < nt:
                t, d0 = t0 + i, dd[i]
                for j in range(8):
                    k = xo + 4 * j
                    x00, x01, x02, x03 = xq[t, k], xq[t, k + 1], xq[t, k + 2], xq[t, k + 3]
                    c0, c1, c2, c3 = cb[4 * j], cb[4 * j + 1], cb[4 * j + 2], cb[4 * j + 3]
                    a0 = acc[i, j]
                    for r in range(W):
                        a0[r] = d0[r] * ((c0[r] * x00 + c1[r] * x01) + (c2[r] * x02 + c3[r] * x03)) + a0[r]
                i += 1
        for i in range(nt):
            _hsum_store(acc[i, :, :W], summs[i, :W], y[t0 + i], o)


@njit(parallel=True, **GG)
def gemm_block32(qs, d, m, zero, xq, dx, sx, y):
    """32-weight blocks x N tokens: xq [N, n] float32 codes, dx / sx [N, n/32] -> y [N, G*R]. Panels of
    PANEL_GROUPS groups: their codes are turned into floats once (in L2) and used by every token."""
    nb, width, G = d.shape[1], qs.shape[3], qs.shape[0]
    P = PANEL_GROUPS * width
    for p in prange(-(-G // PANEL_GROUPS)):
        g0, g1 = p * PANEL_GROUPS, min(G, (p + 1) * PANEL_GROUPS)
        c, dp = np.empty((nb, 32, P), np.float32), np.empty((nb, P), np.float32)
        mp = np.empty((nb if m.shape[0] else 0, P), np.float32)
        acc = np.empty((TOKEN_TILE, 8, P + PAD), np.float32)        # PAD: the tile's four tokens' lanes
        dd = np.empty((TOKEN_TILE, P), np.float32)                   # not 4 KiB apart (store/load aliasing)
        summs = np.empty((TOKEN_TILE, P), np.float32)
        _panel_codes(qs, d, m, zero, g0, g1, c, dp, mp)
        _panel_gemm(c, dp, mp, (g1 - g0) * width, xq, dx, sx, y, g0 * width, acc, dd, summs)


# ---- packing (once, at load) ------------------------------------------------------------------

class Block32(packed.Packed):
    """packed.Packed's arrays multiplied in ggml's arithmetic by the float kernels above (a CPU
    without AVX2): Q4_0, Q4_1 and Q8_0 as the f32 mode lays them out, Q5_0 as an "i8" Packed."""

    @classmethod
    def of(cls, P) -> "Block32":
        return cls(P.kind, P.rows, P.n, P.qs, P.qh, P.d, P.m, P.zero)

    def mul_q8(self, a):
        """a: Q8Rows (Q8_0 / Q8_1) of x [N, n] -> [N, rows], ggml's bits"""
        xq = a.qs.astype(np.float32)                                  # [N, n] codes: exact as floats
        N = xq.shape[0]
        y = np.empty((N, self.qs.shape[0] * R), np.float32)
        if N > 1:
            gemm_block32(self.qs, self.d, self.m, self.zero, xq, a.d, a.e, y)
        elif self.kind == "nib":
            gemv_nib(self.qs, self.d, self.m, self.zero, xq[0], a.d[0], a.e[0], y[0])
        else:
            gemv_i8(self.qs, self.d, xq[0], a.d[0], y[0])
        return y[:, :self.rows]


def pack(qtype, data, table, n, int8=INT8):
    """data: [rows, row_bytes] uint8 blocks of a type in PACKED_TYPES -> the layout its products read.
    With int8 (AVX2 hosts), the 32-weight types: ggml_int8.LanePacked. Without (the float
    kernels here): Q4_0, Q4_1, Q8_0 in packed.pack's (the f32 mode's) layout; Q5_0 "i8", its
    5-bit weights minus 16 as int8 codes (36 bytes per 32 weights against the file's 22): the
    fifth bits cost the kernel more than the bytes cost the memory stream, and a Q5_0 x Q8_0
    product is then Q8_0's. Q4_K, Q6_K: ggml_int8_k.LaneKPacked with int8, else KPacked."""
    if int8 and qtype in BLOCK32_TYPES:
        return ggml_int8.pack(qtype, data, table, n)
    if qtype in BLOCK32_TYPES and qtype != Q5_0:
        return Block32.of(packed.pack(qtype, data, table, n, half=False))   # float32 scales: the float kernels
    if qtype == Q5_0:
        G = -(-data.shape[0] // R)
        qs, d = np.zeros((G, n // 32, 32, R), np.int8), np.zeros((G, n // 32, R), np.float32)
        _pack_q5_0(data, table, qs, d)
        return Block32("i8", data.shape[0], n, qs, _NONE_U, d, _NONE_F, 0)
    return ggml_int8_k.pack(qtype, data, table, n) if int8 else pack_k(qtype, data, table, n)


def empty(qtype, rows, n):
    """An empty layout of pack()'s kind for a type in STACKABLE, to fill() (stacked matrices)"""
    return ggml_int8.empty(qtype, rows, n) if INT8 else Block32.of(packed.empty(qtype, rows, n, half=False))


def fill(P, qtype, data, table):
    """Write blocks data [rows, row_bytes] of type qtype into P from empty()"""
    (ggml_int8.fill if isinstance(P, ggml_int8.LanePacked) else packed.fill)(P, qtype, data, table)


_NONE_U = np.zeros((0, 0, 0), np.int32)
_NONE_F = np.zeros((0, 0, 0), np.float32)


@njit(**EXACT)
def _pack_q5_0(data, table, qs, d):
    for row in range(data.shape[0]):
        g, l, src = row // R, row % R, data[row]
        for b in range(qs.shape[1]):
            o = b * QT[Q5_0].block_bytes
            d[g, b, l] = half_float(src, o, table)
            hb = u32(src, o + 2)
            for j in range(16):
                v = np.int64(src[o + 6 + j])
                qs[g, b, j, l] = np.int8(((v & 15) | fifth_bit(hb, j)) - 16)
                qs[g, b, 16 + j, l] = np.int8(((v >> 4) | fifth_bit(hb, j + 16)) - 16)
