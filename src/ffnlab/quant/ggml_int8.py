"""ggml's 32-weight block products with ggml's own instructions: byte multiplies into exact int32
lane sums (vpdpbusd on a CPU with AVX-512 VNNI, else vpmaddubsw and vpmaddwd: quant/simd.py),
over a layout made once at load.

ggml's AVX2 vec_dot for Q4_0 / Q4_1 / Q5_0 / Q8_0 (ggml-cpu/arch/x86/quants.c) takes one row's
32-weight block and the activation's Q8_0 / Q8_1 block as 32 bytes each, multiplies them byte by
byte into 8 int32 lanes of 4 products (lane l: weights 4l..4l+3; for nibble types the low nibbles
are weights 0-15, lanes 0-3, the high nibbles weights 16-31, lanes 4-7), converts the lanes to
float and adds them with acc_l = fma(d_w d_x, lane_l, acc_l); hsum_float_8 ends the row.

Here the same integers are formed CHUNK rows at a time instead of 8 lanes of one row (CHUNK =
simd.ROWS: 16 in a 512-bit register, 8 in a 256-bit one): for each chunk, block and lane j,
the chunk's 4 codes of lane j lie side by side (4 CHUNK bytes), so one load and one vpdpbusd
against the lane's 4 activation codes broadcast (vpbroadcastd) give lane j of CHUNK rows, exact.
The float steps are ggml's, per row: the same FMA into the same lane accumulator in the same
block order, then ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) (+ the Q8_1 sum of m_w s_x); a register
of CHUNK rows does each row's step in its own lane, so CHUNK changes no bit. So the bits are
ggml's, and quant/ggml_packed.py's float kernels' (the fallback on a CPU without AVX2;
tests/unit/test_ggml_packed.py holds both to quant/ggml_kernels.gemm).

Layout (LanePacked), G groups of R = 64 rows, C = R / CHUNK chunks of CHUNK rows, nb = n/32 blocks:
  "nib" (Q4_0, Q4_1): qs [G, C, nb, 4, CHUNK, 4] uint8: [.., j, r, i] = byte 4j+i of row r's
        block as in the file (low nibble weight 4j+i, lane j; high nibble weight 16+4j+i, lane 4+j)
  "i8"  (Q8_0, Q5_0): qs [G, C, nb, 8, CHUNK, 4] int8: weight 4j+i (Q5_0: its 5-bit value - 16)
  d, m  [G, C, nb, CHUNK] float32: the blocks' halves (m: Q4_1 only)
Q4_0's (q - 8) x is summed as q x - 8 (sum of the lane's 4 x): the same integer, and q stays
unsigned for vpmaddubsw. Q5_0 and Q8_0 are signed: simd's dot_s8_biased forms w x.
"""
import numpy as np
from numba import njit, prange

from .layout import R, Layout
from .packed import AHEAD
from .simd import ROWS, V, prefetch
from .types import Q4_0, Q4_1, Q5_0, Q8_0, QT, TYPES
from .unpack import fifth_bit, half_float, u32

GG = dict(cache=True, nogil=True, fastmath=False)   # no fastmath: every float step is written out as ggml's
EXACT = dict(cache=True, nogil=True, fastmath=False)
CHUNK = ROWS                             # rows per vector: 16 int32 / float32 lanes of 512 bits, or 8 of 256
LANE = 4 * CHUNK                         # bytes of one lane's 4 codes for CHUNK rows
# ggml_packed.py's "block32" types -> (kind, zero): 4-bit codes kept as nibbles, Q5_0 and Q8_0 as int8
LANE_TYPES = {t: ("nib" if r.code_bits == 4 else "i8", r.zero if r.code_bits == 4 else 0)
              for t, r in TYPES.items() if r.ggml_layout == "block32"}
_NONE_F = np.zeros((0, 0, 0, 0), np.float32)


class LanePacked(Layout):
    """A [rows, n] matrix of a type in LANE_TYPES in the lane layout (module docstring). Rows past
    `rows` in the last group are zeros."""
    ARRAYS = ("qs", "d", "m")

    def __init__(self, kind, rows, n, qs, d, m, zero):
        self.kind, self.rows, self.n, self.qs, self.d, self.m, self.zero = kind, rows, n, qs, d, m, zero

    def lookup(self, ids, out):
        """Rows ids [k] dequantized into out [k, n] (gguf-py's values: an embedding lookup)."""
        _rows(self.qs, self.d, self.m, self.zero, ids, out)

    def dequant_t(self, g0, g1, out):
        """Groups g0..g1 dequantized (gguf-py's values), transposed: out [n, (g1 - g0) * R]."""
        _dequant_t(self.qs, self.d, self.m, self.zero, g0, g1, out)

    def mul_q8(self, a):
        """a: Q8Rows (Q8_0 / Q8_1) of x [N, n] -> [N, rows], ggml's bits (product below)"""
        return product(self, a)[:, :self.rows]


# ---- packing (once, at load) ------------------------------------------------------------------

def empty(qtype, rows, n) -> LanePacked:
    """A LanePacked of rows x n weights of ggml type qtype (in TYPES), to fill(); the last group's
    rows past `rows` are zeros (fill() writes the others)."""
    kind, zero = LANE_TYPES[qtype]
    G, nb = -(-rows // R), n // 32
    qs = np.empty((G, R // CHUNK, nb, 4 if kind == "nib" else 8, CHUNK, 4), np.uint8 if kind == "nib" else np.int8)
    d = np.empty((G, R // CHUNK, nb, CHUNK), np.float32)
    m = np.empty_like(d) if qtype == Q4_1 else _NONE_F
    for a in (qs, d) + ((m,) if m.shape[0] else ()):
        if rows % R:
            _zero_rows_past(a[-1], rows % R)
    return LanePacked(kind, rows, n, qs, d, m, zero)


def _zero_rows_past(group, keep):
    """group: one 64-row group, qs [C, nb, L, CHUNK, 4] or d / m [C, nb, CHUNK]: rows keep..63 set to 0"""
    c, r = divmod(keep, CHUNK)
    group[c + 1:] = 0
    group[(c, Ellipsis, slice(r, None)) + ((slice(None),) if group.ndim == 5 else ())] = 0


def fill(P, qtype, data, table):
    """Write the blocks data [rows, row_bytes] of type qtype into P (rows = P.rows)."""
    _pack(int(qtype), data, table, P.qs, P.d, P.m)


def pack(qtype, data, table, n) -> LanePacked:
    """data: [rows, row_bytes] uint8 blocks of a type in TYPES -> LanePacked"""
    P = empty(qtype, data.shape[0], n)
    fill(P, qtype, data, table)
    return P


@njit(parallel=True, **EXACT)
def _pack(qtype, data, table, qs, d, m):
    nb = d.shape[2]
    for row in prange(data.shape[0]):                                   # rows are independent
        g, c, r, src = row // R, (row % R) // CHUNK, row % CHUNK, data[row]
        for b in range(nb):
            if qtype == Q4_0 or qtype == Q4_1:
                size = QT[Q4_0].block_bytes if qtype == Q4_0 else QT[Q4_1].block_bytes
                o = b * size
                d[g, c, b, r] = half_float(src, o, table)
                if qtype == Q4_1:
                    m[g, c, b, r] = half_float(src, o + 2, table)
                for k in range(16):                                      # the file's bytes, 4 per lane
                    qs[g, c, b, k >> 2, r, k & 3] = src[o + size - 16 + k]
            elif qtype == Q8_0:
                o = b * QT[Q8_0].block_bytes
                d[g, c, b, r] = half_float(src, o, table)
                for k in range(32):
                    qs[g, c, b, k >> 2, r, k & 3] = np.int8((np.int32(src[o + 2 + k]) ^ 128) - 128)
            else:                                                        # Q5_0: 4 + 1 bits, minus 16
                o = b * QT[Q5_0].block_bytes
                d[g, c, b, r] = half_float(src, o, table)
                hb = u32(src, o + 2)
                for k in range(16):
                    v = np.int64(src[o + 6 + k])
                    lo, hi = k, 16 + k
                    qs[g, c, b, lo >> 2, r, lo & 3] = np.int8(((v & 15) | fifth_bit(hb, k)) - 16)
                    qs[g, c, b, hi >> 2, r, hi & 3] = np.int8(((v >> 4) | fifth_bit(hb, k + 16)) - 16)


# ---- dequantization (lookups, dequantize()) ---------------------------------------------------

@njit(**EXACT)
def _weight(qs, d, m, zero, g, c, b, r, k):
    """weight k of block b of row (g, c, r), as gguf-py computes it: d (q - zero) [+ m]; nib:
    byte k % 16 of the block, low nibble for k < 16"""
    if qs.shape[3] == 4:
        v = np.int32(qs[g, c, b, (k & 15) >> 2, r, k & 3])
        q = (v & 15) if k < 16 else (v >> 4)
        if m.shape[0]:
            return d[g, c, b, r] * np.float32(q) + m[g, c, b, r]
        return d[g, c, b, r] * np.float32(q - zero)
    return d[g, c, b, r] * np.float32(qs[g, c, b, k >> 2, r, k & 3])


@njit(**EXACT)
def _rows(qs, d, m, zero, ids, out):
    for i in range(ids.shape[0]):
        g, c, r = ids[i] // R, (ids[i] % R) // CHUNK, ids[i] % CHUNK
        for b in range(d.shape[2]):
            for k in range(32):
                out[i, b * 32 + k] = _weight(qs, d, m, zero, g, c, b, r, k)


@njit(**EXACT)
def _dequant_t(qs, d, m, zero, g0, g1, out):
    for g in range(g0, g1):
        for c in range(R // CHUNK):
            col = (g - g0) * R + c * CHUNK
            for b in range(d.shape[2]):
                for k in range(32):
                    for r in range(CHUNK):
                        out[b * 32 + k, col + r] = _weight(qs, d, m, zero, g, c, b, r, k)


# ---- products ---------------------------------------------------------------------------------

# One function per type, each a straight loop over the blocks: a branch in the loop (Q4_1's m or
# Q4_0's zero) kept LLVM from holding the eight accumulators in registers.

@njit(**GG)
def _zeros8():
    return V.zeros(), V.zeros(), V.zeros(), V.zeros(), V.zeros(), V.zeros(), V.zeros(), V.zeros()


@njit(**GG)
def _hsum8(a):
    """hsum_float_8 of CHUNK rows at once: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))"""
    return V.add(V.add(V.add(a[0], a[4]), V.add(a[2], a[6])), V.add(V.add(a[1], a[5]), V.add(a[3], a[7])))


@njit(**GG)
def _fma8(dd, lanes, a):
    """ggml's lane FMA for CHUNK rows: a_l = fma(d_w d_x, float(lane_l), a_l)"""
    return (V.fma(dd, V.to_f(lanes[0]), a[0]), V.fma(dd, V.to_f(lanes[1]), a[1]), V.fma(dd, V.to_f(lanes[2]), a[2]),
            V.fma(dd, V.to_f(lanes[3]), a[3]), V.fma(dd, V.to_f(lanes[4]), a[4]), V.fma(dd, V.to_f(lanes[5]), a[5]),
            V.fma(dd, V.to_f(lanes[6]), a[6]), V.fma(dd, V.to_f(lanes[7]), a[7]))


@njit(**GG)
def _nib_lanes(qs, o, xq, xo):
    """a "nib" block of CHUNK rows (qs.flat[o : o + 16 CHUNK]) x codes xq[xo : xo + 32] -> the 8
    lanes' int32 sums of CHUNK rows: lane j from byte group j's low nibbles, lane 4 + j from its
    high ones"""
    w0, w1, w2, w3 = V.load_b(qs, o), V.load_b(qs, o + LANE), V.load_b(qs, o + 2 * LANE), V.load_b(qs, o + 3 * LANE)
    return (V.dot_u8(V.low4(w0), V.splat4(xq, xo)), V.dot_u8(V.low4(w1), V.splat4(xq, xo + 4)),
            V.dot_u8(V.low4(w2), V.splat4(xq, xo + 8)), V.dot_u8(V.low4(w3), V.splat4(xq, xo + 12)),
            V.dot_u8(V.high4(w0), V.splat4(xq, xo + 16)), V.dot_u8(V.high4(w1), V.splat4(xq, xo + 20)),
            V.dot_u8(V.high4(w2), V.splat4(xq, xo + 24)), V.dot_u8(V.high4(w3), V.splat4(xq, xo + 28)))


@njit(**GG)
def _ahead(qs, o, n):
    """prefetch the n code bytes AHEAD past qs.flat[o:], a cache line at a time: a decode step
    streams every matrix from memory once, as quant/packed.py's matrix-vector kernels do"""
    for line in range(0, n, 64):
        prefetch(qs, o + AHEAD + line)


@njit(**GG)
def _q4_1_chunk(qs, d, m, chunk, xq, dx, sx, y, yo):
    """CHUNK rows (chunk: g * R / CHUNK + c) of a Q4_1 matrix x one token: xq [n] int8 codes, dx,
    sx [nb] (Q8_1's d and s) -> y.flat[yo : yo + CHUNK] = hsum_float_8(acc) + sum m_w s_x"""
    nb = d.shape[2]
    qo, do = chunk * nb * 4 * LANE, chunk * nb * CHUNK
    acc, summs = _zeros8(), V.zeros()
    for b in range(nb):
        _ahead(qs, qo + b * 4 * LANE, 4 * LANE)
        dd = V.mul(V.load(d, do + b * CHUNK), V.splat(dx[b]))         # d_w d_x: two halves, exact
        summs = V.fma(V.load(m, do + b * CHUNK), V.splat(sx[b]), summs)   # an exact product: fused or not
        acc = _fma8(dd, _nib_lanes(qs, qo + b * 4 * LANE, xq, b * 32), acc)
    V.store(y, yo, V.add(_hsum8(acc), summs))


@njit(**GG)
def _q4_0_chunk(qs, d, chunk, xq, dx, zx, y, yo):
    """CHUNK rows of a Q4_0 matrix x one token; zx [n/4] int32: -8 x each lane's sum of codes,
    since sum (q - 8) x = sum q x - 8 sum x (the same integer; q stays unsigned for vpmaddubsw)"""
    nb = d.shape[2]
    qo, do = chunk * nb * 4 * LANE, chunk * nb * CHUNK
    acc = _zeros8()
    for b in range(nb):
        _ahead(qs, qo + b * 4 * LANE, 4 * LANE)
        dd = V.mul(V.load(d, do + b * CHUNK), V.splat(dx[b]))
        o, xo, z = qo + b * 4 * LANE, b * 32, b * 8
        w0, w1, w2, w3 = V.load_b(qs, o), V.load_b(qs, o + LANE), V.load_b(qs, o + 2 * LANE), V.load_b(qs, o + 3 * LANE)
        lanes = (V.dot_u8_from(V.splat4(zx, z), V.low4(w0), V.splat4(xq, xo)),
                 V.dot_u8_from(V.splat4(zx, z + 1), V.low4(w1), V.splat4(xq, xo + 4)),
                 V.dot_u8_from(V.splat4(zx, z + 2), V.low4(w2), V.splat4(xq, xo + 8)),
                 V.dot_u8_from(V.splat4(zx, z + 3), V.low4(w3), V.splat4(xq, xo + 12)),
                 V.dot_u8_from(V.splat4(zx, z + 4), V.high4(w0), V.splat4(xq, xo + 16)),
                 V.dot_u8_from(V.splat4(zx, z + 5), V.high4(w1), V.splat4(xq, xo + 20)),
                 V.dot_u8_from(V.splat4(zx, z + 6), V.high4(w2), V.splat4(xq, xo + 24)),
                 V.dot_u8_from(V.splat4(zx, z + 7), V.high4(w3), V.splat4(xq, xo + 28)))
        acc = _fma8(dd, lanes, acc)
    V.store(y, yo, _hsum8(acc))


@njit(**GG)
def _i8_chunk(qs, d, chunk, xq, dx, cx, y, yo):
    """CHUNK rows of an "i8" matrix (Q8_0, Q5_0) x one token -> y.flat[yo : yo + CHUNK]; cx [n/4]
    int32: -128 x each lane's sum of codes (for dot_s8_biased)"""
    nb = d.shape[2]
    qo, do = chunk * nb * 8 * LANE, chunk * nb * CHUNK
    acc = _zeros8()
    for b in range(nb):
        _ahead(qs, qo + b * 8 * LANE, 8 * LANE)
        dd = V.mul(V.load(d, do + b * CHUNK), V.splat(dx[b]))
        o, xo, c = qo + b * 8 * LANE, b * 32, b * 8
        lanes = (V.dot_s8_biased(V.splat4(cx, c), V.load_b(qs, o), V.splat4(xq, xo)),
                 V.dot_s8_biased(V.splat4(cx, c + 1), V.load_b(qs, o + LANE), V.splat4(xq, xo + 4)),
                 V.dot_s8_biased(V.splat4(cx, c + 2), V.load_b(qs, o + 2 * LANE), V.splat4(xq, xo + 8)),
                 V.dot_s8_biased(V.splat4(cx, c + 3), V.load_b(qs, o + 3 * LANE), V.splat4(xq, xo + 12)),
                 V.dot_s8_biased(V.splat4(cx, c + 4), V.load_b(qs, o + 4 * LANE), V.splat4(xq, xo + 16)),
                 V.dot_s8_biased(V.splat4(cx, c + 5), V.load_b(qs, o + 5 * LANE), V.splat4(xq, xo + 20)),
                 V.dot_s8_biased(V.splat4(cx, c + 6), V.load_b(qs, o + 6 * LANE), V.splat4(xq, xo + 24)),
                 V.dot_s8_biased(V.splat4(cx, c + 7), V.load_b(qs, o + 7 * LANE), V.splat4(xq, xo + 28)))
        acc = _fma8(dd, lanes, acc)
    V.store(y, yo, _hsum8(acc))


@njit(parallel=True, **GG)
def gemm_nib(qs, d, m, xq, dx, sx, zx, y):
    """"nib" matrix x N tokens: xq [N, n] int8, dx, sx [N, n/32]; Q4_0: zx [N, n/4] int32 (-8 x the
    lanes' code sums), m empty; Q4_1: m, zx [N, 0] -> y [N, G*R]. A chunk's codes (nb * 16 CHUNK
    bytes) stay in L1 while every token passes."""
    chunks, N = qs.shape[0] * (R // CHUNK), xq.shape[0]
    for chunk in prange(chunks):
        for t in range(N):
            if m.shape[0]:
                _q4_1_chunk(qs, d, m, chunk, xq[t], dx[t], sx[t], y, t * y.shape[1] + chunk * CHUNK)
            else:
                _q4_0_chunk(qs, d, chunk, xq[t], dx[t], zx[t], y, t * y.shape[1] + chunk * CHUNK)


@njit(parallel=True, **GG)
def gemm_i8(qs, d, xq, dx, cx, y):
    """"i8" matrix x N tokens: xq [N, n] int8, dx [N, n/32], cx [N, n/4] (-128 x the lanes' code
    sums) -> y [N, G*R]"""
    chunks, N = qs.shape[0] * (R // CHUNK), xq.shape[0]
    for chunk in prange(chunks):
        for t in range(N):
            _i8_chunk(qs, d, chunk, xq[t], dx[t], cx[t], y, t * y.shape[1] + chunk * CHUNK)


def product(P, a):
    """P: LanePacked, a: Q8Rows of the activation [N, n] (Q8_0 / Q8_1) -> y [N, G*R] float32"""
    N = a.qs.shape[0]
    y = np.empty((N, P.qs.shape[0] * R), np.float32)
    if P.kind == "nib":
        if P.zero:                                                      # [N, n/4]: each lane's sum of codes
            zx = np.int32(-P.zero) * a.qs.reshape(N, -1, 4).sum(axis=2, dtype=np.int32)
        else:
            zx = np.zeros((N, 0), np.int32)
        gemm_nib(P.qs, P.d, P.m, a.qs, a.d, a.e, zx, y)
    else:
        gemm_i8(P.qs, P.d, a.qs, a.d, np.int32(-128) * a.qs.reshape(N, -1, 4).sum(axis=2, dtype=np.int32), y)
    return y
