"""Row-interleaved blocks: the layout the decode kernels stream, made once at load.

A GGUF row keeps its blocks together, so a kernel that walks one row at a time must sum each
32-weight block across SIMD lanes before it can apply the block's scale: a horizontal sum per
block, and loops of 16 or 32 iterations that LLVM vectorizes poorly. Here R = 64 rows are
interleaved instead: for each block and each weight position k, the 64 rows' codes lie side
by side, so

    for k in block:  inner[0:64] += code[k, 0:64] * x[k]          (one long vectorized loop)
    acc[0:64] += d[0:64] * (inner - zero * sum(x_block)) + m[0:64] * sum(x_block)

has no horizontal sums at all and one broadcast of x per position for 64 rows. Measured on one
[11008, 4096] Q4_1 matrix (AMD EPYC, one thread): 8.1 G weights/s against 3.8 G for the
row-at-a-time kernels of kernels.py (bench/bench_quant_kernels.py).

Two families cover the types (types.py has their GGUF layouts, and each type's family):

  NIB  4-bit codes, two per byte as in Q4_0 (byte k: weight k low, weight k + 16 high), an
       optional fifth bit per weight (4 bytes per block: bit i of byte j for weight 8j + i), a
       scale d and optional offset m per 32 weights:   w = d * (q - zero) + m
       Q4_0 (zero 8), Q4_1 (m), Q5_0 (fifth bit, zero 16), Q5_1 (fifth bit, m),
       Q4_K and Q5_K (each 32-weight sub-block: d = d * scale, m = -(dmin * min)).
  I8   signed 8-bit codes with a scale per B weights:  w = d * q
       Q8_0 (B = 32), Q6_K (B = 16: d = d * scale, q = code - 32).

Every d and m is the float32 value gguf-py's dequantize forms, and dequantization here does the
same multiply and add, so the weights are the same values bit for bit; only the order of the
products' float32 sums changes. Where d and m are the file's halves (HALF_SCALES: Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0) they are kept as their 16 bits (uint16: numba has no float16 on the CPU) and
widened by the kernels (simd's scales: exact); the K-quants' are products of a half and a
small integer, exact in float32 only, and stay float32. Q2_K and Q3_K (8-bit codes would be 3-4x
their blocks), F16, BF16 and F32 keep kernels.py's row kernels.

Memory: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 take the file's own bytes (18, 20, 22, 24 and 34 per
32 weights); Q4_K and Q5_K 24 and 28 against 18 and 22, Q6_K 20 per 16 against 13.1. Half scales
took SmolLM2's packed weights from 111.5 to 96.4 MB, Gemma 3's from 270.4 to 255.9. The file's pages are given back after packing (QuantTensor.pack), so a
model's resident weights are this copy, not the copy plus the file.
"""
import functools

import numba
import numpy as np
from numba import njit, prange

from . import gemm, simd
from .simd import Y, Z
from .. import threads
from .gemm import KC_Z, STRIP, block_z, gemm_packed, pack_tile, strips_to_rows, token_tiles
from .layout import R, Layout, scratch
from .types import HALF_SCALES, Q4_0, Q4_1, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, QT, TYPES
from .unpack import fifth_bit, half_float, k_scale_min, q6_code, u32

AHEAD = 4096                            # bytes: how far ahead the matrix-vector kernels prefetch their codes
# the types of each family (types.py's layout), with what their kernels need: NIB (zero, fifth bit, m),
# I8 codes per scale; HALF_SCALES' d (and m) are the file's halves: kept as their 16 bits
NIB_TYPES = {t: (r.zero, r.code_bits == 5, r.has_mins) for t, r in TYPES.items() if r.layout == "nib"}
I8_TYPES = {t: r.sub_block for t, r in TYPES.items() if r.layout == "i8"}
PACKED_TYPES = tuple(NIB_TYPES) + tuple(I8_TYPES)
FAST = dict(cache=True, nogil=True, fastmath=True)
EXACT = dict(cache=True, nogil=True)    # no fastmath: dequantized values exactly as gguf-py's
_NONE_U = np.zeros((0, 0, 0, 0), np.uint8)
_NONE_F = np.zeros((0, 0, 0), np.float32)


class Packed(Layout):
    """A [rows, n] matrix in R-row groups. NIB: qs [G, n/32, 16, R] uint8, qh [G, n/32, 4, R] uint8
    (fifth bits) or empty, d / m [G, n/32, R] float32 (m empty when absent). I8: qs [G, n/B, B, R]
    int8, d [G, n/B, R]. Rows past `rows` in the last group are zeros."""
    ARRAYS = ("qs", "qh", "d", "m")

    def __init__(self, kind, rows, n, qs, qh, d, m, zero):
        self.kind, self.rows, self.n = kind, rows, n
        self.qs, self.qh, self.d, self.m, self.zero = qs, qh, d, m, zero

    def lookup(self, ids, out):
        """Rows ids [k] dequantized into out [k, n] (an embedding lookup: the exact weights, read
        from this layout, so the file's pages stay released)."""
        if self.kind == "nib":
            _rows_nib(self.qs, self.qh, self.d, self.m, self.zero, ids, out)
        else:
            _rows_i8(self.qs, self.d, ids, out)

    def mul_vec(self, x):
        """x: [n] float32 -> W x [rows]"""
        x = np.ascontiguousarray(x, np.float32)
        y = np.empty(self.qs.shape[0] * R, np.float32)                 # [G * R]: rows past self.rows are zeros
        if self.kind == "nib":
            matvec_nib(self.qs, self.qh, self.d, self.m, self.zero, x, y)
        else:
            matvec_i8(self.qs, self.d, x, y, simd.HAS_AVX512)
        return y[:self.rows]

    def mul(self, x):
        """x: [N, n] float32, C-contiguous -> x W^T [N, rows]. Tiles of groups dequantized into a
        cache-sized float32 buffer and multiplied there by quant/gemm.py's kernel (matmul below;
        without AVX2, gemm.product on each tile's strips over ffnlab's threads), so the float32
        matrix never exists whole."""
        G = self.n_groups
        per, chunks = tiling(G, self.tile_groups(), x.shape[0], threads.threads())
        width = gemm.tile_tokens()
        step = -(-x.shape[0] // (chunks * width)) * width           # tokens per part: whole register tiles
        y = simd.empty_aligned((x.shape[0], G * R))                 # whole groups: the last one's padding rows too
        if simd.HAS_AVX2:
            self.matmul(x, y, per, chunks, step)
        else:
            def item(i):                                            # one tile's share of tokens, on whichever thread is free
                g0, t0 = (i // chunks) * per, (i % chunks) * step
                gemm.product(self._strips(g0, min(G, g0 + per)), x[t0:t0 + step], y[t0:t0 + step], g0 * R)
            threads.parallel_for(item, -(-G // per) * chunks)               # BLAS in each thread (threads.parallel_for says why)
        return y if y.shape[1] == self.rows else np.ascontiguousarray(y[:, :self.rows])

    def _strips(self, g0, g1):
        """groups g0..g1 dequantized as quant/gemm.py's strips [4 (g1 - g0), n, 16], in this
        thread's scratch buffer (layout.scratch)"""
        S = (g1 - g0) * (R // STRIP)
        buf = scratch(S * self.n * STRIP).reshape(S, self.n, STRIP)
        self.dequant_strips(g0, g1, buf)
        return buf

    def matmul(self, x, y, per, chunks, step):
        """y[:, :G * R] = x W^T for x [T, n]: tiles of `per` groups, each dequantized into strips
        in a buffer of its thread's and multiplied by quant/gemm.py's kernel (with AVX-512, a
        block of 32 rows x 256 positions at a time: _block_product); each tile split into
        `chunks` parts of `step` tokens (tiling below), one work item each, over numba's
        threads (a parallel region costs ~3 us to start, a Python thread pool's hand-off ~120).
        Each thread draws the next item when it is done with one (an atomic counter), so a thread
        slowed by something else on the machine takes fewer items instead of holding up the product."""
        # a scratch row for every thread numba may start; the workers from ffnlab.threads, not from
        # numba.get_num_threads() (~10 us a call from Python: ~1 ms of a 100-token Gemma 3 prefill's
        # 78 products; inside the region it would keep the kernel out of numba's disk cache). A
        # worker more than numba's threads finds the items taken; one fewer leaves a thread idle.
        size = 2 * KC_Z * STRIP if simd.HAS_AVX512 else 4 * per * self.n * STRIP
        scratch = _scratch(numba.config.NUMBA_NUM_THREADS, size)
        workers = min(-(-self.qs.shape[0] // per) * chunks, threads.threads())
        _matmul(self.qs, self.qh, self.d, self.m, np.float32(self.zero), self.kind == "nib", x, y, per, chunks, step,
                scratch, workers, simd.HAS_AVX512)

    def dequant_rows(self, g0, g1, scratch):
        """Groups g0..g1 dequantized -> [(g1 - g0) R, n] (Layout's), by way of dequant_strips."""
        S = (g1 - g0) * (R // STRIP)
        buf = scratch(S * self.n * STRIP).reshape(S, self.n, STRIP)
        self.dequant_strips(g0, g1, buf)
        return strips_to_rows(buf)

    def dequant_t(self, g0, g1, out):
        """Groups g0..g1 dequantized, transposed: out [n, (g1 - g0) R] float32."""
        out[:] = self.dequant_rows(g0, g1, lambda size: np.empty(size, np.float32)).T

    def dequant_strips(self, g0, g1, out):
        """Groups g0..g1 dequantized as strips of 16 rows: out [4 (g1 - g0), n, 16] float32,
        out[s, j, c] = weight j of row g0 * R + 16 s + c (the order quant/gemm.py multiplies in)."""
        if self.kind == "nib":
            dequant_nib_strips(self.qs, self.qh, self.d, self.m, self.zero, g0, g1, out)
        else:
            dequant_i8_strips(self.qs, self.d, g0, g1, out, simd.HAS_AVX512)


@functools.lru_cache(maxsize=4096)
def tiling(n_groups, max_per, n_tokens, n_threads) -> tuple:
    """How a prefill product is cut into work items -> (groups per tile, token parts per tile).

    Each item dequantizes its tile and multiplies it by its part of the tokens; the threads take
    equal runs of items, so the product ends when the busiest thread does: 11 tiles on 2 threads
    is 6 against 5, 16 smaller ones 8 against 8. Costs in one group's multiply-adds for one
    token: an item of p groups and T/c tokens costs p (T/c + 11), since dequantizing costs
    ~0.28 ns a weight against ~0.025 ns a weight per token for the products (one core,
    quant/gemm.py); a thread's share is ceil(items / threads) items. Parts are at least two
    register tiles of tokens. Ties go to bigger tiles and fewer parts (fewer items)."""
    best, best_cost = (max_per, 1), None
    for per in range(max_per, 0, -1):
        tiles = -(-n_groups // per)
        for c in range(1, 5):
            if c > 1 and n_tokens < c * 2 * gemm.tile_tokens():
                break
            cost = -(-tiles * c // n_threads) * per * (n_tokens / c + 11.0)
            if best_cost is None or cost < best_cost * 0.99:
                best, best_cost = (per, c), cost
    return best


def pack(qtype, data, table, n, half=True) -> Packed:
    """data: [rows, row_bytes] uint8 blocks of ggml type qtype (one of PACKED_TYPES) -> Packed."""
    P = empty(qtype, data.shape[0], n, half)
    fill(P, qtype, data, table)
    return P


def scale_dtype(qtype, half=True):
    """d and m of qtype's layout: the file's half-precision bits as uint16 where they are halves
    (HALF_SCALES; the kernels widen them, exactly), float32 where they are products (the K-quants'
    d x scale). half=False: float32 for every type (ggml_packed's float kernels)."""
    return np.uint16 if half and qtype in HALF_SCALES else np.float32


def shapes(qtype, rows, n, half=True) -> list:
    """The arrays empty() makes for rows x n weights of ggml type qtype: [(shape, dtype)] in the
    order qs, qh, d, m (an absent qh or m has no entry)."""
    G, sd = -(-rows // R), scale_dtype(qtype, half)
    if qtype in NIB_TYPES:
        zero, fifth, has_m = NIB_TYPES[qtype]
        return [((G, n // 32, 16, R), np.uint8)] + ([((G, n // 32, 4, R), np.uint8)] if fifth else []) + \
            [((G, n // 32, R), sd)] + ([((G, n // 32, R), sd)] if has_m else [])
    B = I8_TYPES[qtype]
    return [((G, n // B, B, R), np.int8), ((G, n // B, R), sd)]


def empty(qtype, rows, n, half=True) -> Packed:
    """A Packed of rows x n weights of ggml type qtype, to fill(). fill() writes every row below
    rows, and the rows past them in the last group are zeros here (np.zeros of the whole would
    write ~110 MB of zeros for SmolLM2 that fill() then overwrites)."""
    arrays = [np.empty(shape, dtype) for shape, dtype in shapes(qtype, rows, n, half)]
    for a in arrays:
        if rows % R:
            a[-1, ..., rows % R:] = 0                     # [G, ..., R]: the last group's rows past `rows`
    if qtype in NIB_TYPES:
        zero, fifth, has_m = NIB_TYPES[qtype]
        qs, qh, d, m = arrays[0], arrays[1] if fifth else _NONE_U, arrays[1 + fifth], arrays[-1] if has_m else _NONE_F
        return Packed("nib", rows, n, qs, qh, d, m, zero)
    return Packed("i8", rows, n, arrays[0], _NONE_U, arrays[1], _NONE_F, 0)


def fill(P, qtype, data, table):
    """Write the blocks data [rows, row_bytes] of type qtype into P (rows = P.rows)."""
    if P.kind == "nib":
        _pack_nib(int(qtype), data, table, P.qs, P.qh, P.d, P.m)
    else:
        _pack_i8(int(qtype), data, table, P.qs, P.d)


# ---- packing (once, at load) ------------------------------------------------------------------

@njit(parallel=True, **EXACT)
def _pack_nib(qtype, data, table, qs, qh, d, m):
    nb = qs.shape[1]
    t = QT[qtype]
    size, d_at, m_at, qh_at, qs_at, scales_at = t.block_bytes, t.d_at, t.m_at, t.qh_at, t.qs_at, t.scales_at
    for row in prange(data.shape[0]):                     # rows are independent: both cores
        code = np.empty(32, np.int32)                     # one 32-weight block's codes
        g, l, src = row // R, row % R, data[row]
        for b in range(nb):
            if qtype == Q4_0 or qtype == Q4_1 or qtype == Q5_0 or qtype == Q5_1:
                o = b * size
                _put_half(d, g, b, l, src, o + d_at, table)
                if m_at >= 0:
                    _put_half(m, g, b, l, src, o + m_at, table)
                for k in range(16):
                    qs[g, b, k, l] = src[o + qs_at + k]
                if qh_at >= 0:
                    h = u32(src, o + qh_at)
                    for j in range(4):
                        qh[g, b, j, l] = np.uint8((h >> (8 * j)) & 255)
            else:                                         # Q4_K / Q5_K: sub-block s of super-block sb
                sb, s = b // 8, b % 8
                o = sb * size
                sc, mn = k_scale_min(src, o + scales_at, s)
                d[g, b, l] = half_float(src, o + d_at, table) * np.float32(sc)
                m[g, b, l] = -(half_float(src, o + m_at, table) * np.float32(mn))
                q0, shift = o + qs_at + (s // 2) * 32, 4 * (s % 2)
                bits = np.int64(0)
                for j in range(32):
                    code[j] = (np.int32(src[q0 + j]) >> shift) & 15
                    if qtype == Q5_K:
                        bits |= np.int64((np.int32(src[o + qh_at + j]) >> s) & 1) << j
                for k in range(16):
                    qs[g, b, k, l] = np.uint8(code[k] | (code[k + 16] << 4))
                if qtype == Q5_K:
                    for j in range(4):
                        qh[g, b, j, l] = np.uint8((bits >> (8 * j)) & 255)


@njit(**EXACT)
def _put_half(a, g, b, l, src, o, table):
    """a[g, b, l] = the half at src[o:o+2]: its 16 bits into a uint16 array, its value into a float32 one"""
    if a.itemsize == 2:
        a[g, b, l] = np.uint16(np.int32(src[o]) | (np.int32(src[o + 1]) << 8))
    else:
        a[g, b, l] = half_float(src, o, table)


@njit(parallel=True, **EXACT)
def _pack_i8(qtype, data, table, qs, d):
    nb, B = qs.shape[1], qs.shape[2]
    for row in prange(data.shape[0]):
        g, l, src = row // R, row % R, data[row]
        if qtype == Q8_0:
            for b in range(nb):
                o = b * QT[Q8_0].block_bytes
                _put_half(d, g, b, l, src, o, table)
                for k in range(32):
                    qs[g, b, k, l] = np.int8((np.int32(src[o + 2 + k]) ^ 128) - 128)
        else:                                             # Q6_K: 16 groups of 16 per 256-weight block
            for sb in range(nb // 16):
                o = sb * QT[Q6_K].block_bytes
                dd = half_float(src, o + 208, table)
                for i in range(16):                       # group i: scale byte i (see dequant._q6_k)
                    d[g, sb * 16 + i, l] = dd * np.float32((np.int32(src[o + 192 + i]) ^ 128) - 128)
                for h in range(2):
                    ql, qhb = o + 64 * h, o + 128 + 32 * h
                    for l32 in range(32):
                        a, c, hh = np.int32(src[ql + l32]), np.int32(src[ql + l32 + 32]), np.int32(src[qhb + l32])
                        gi, k = sb * 16 + 8 * h + l32 // 16, l32 % 16      # weight 128h + l32 (+32, +64, +96)
                        qs[g, gi, k, l] = np.int8(q6_code(a, hh, 0) - 32)
                        qs[g, gi + 2, k, l] = np.int8(q6_code(c, hh, 1) - 32)
                        qs[g, gi + 4, k, l] = np.int8(q6_code(a, hh, 2) - 32)
                        qs[g, gi + 6, k, l] = np.int8(q6_code(c, hh, 3) - 32)


# ---- products (decode) ------------------------------------------------------------------------

def _nib_group(five):
    """The matrix-vector product of one group for 4-bit codes (Q4_0, Q4_1, Q4_K; five: with a
    fifth bit, Q5_0, Q5_1, Q5_K), in vector registers: the 64 rows' inner sums of a block are 8
    registers of 8 lanes across its 16 positions (the loop over an inner[64] array stores and
    reloads it at every position, and checks aliasing each time: 1.2-1.6x slower, measured on one
    core; for the 5-bit codes the loop LLVM vectorized by itself ran 5.8 G weights/s on Gemma 3's
    [4096, 640] Q5_0 gate/up, a third of the 4-bit kernel's rate, bench/RESULTS.md). The same
    products (the high nibble shifted down instead of masked and x / 16: both exact); the sums may
    round differently in the last bit. The fifth bit of weight k is bit k % 8 of byte k // 8 of qh;
    (byte & 2^(k % 8)) is 0 or 2^(k % 8), converted and multiplied by x * 16 / 2^(k % 8) (exact
    powers of two): a shift by k % 8 would widen the lanes to 64 bits. `five` is a constant of
    the compiled loop (a closure's), so each of the two is as if written out alone."""
    @njit(**FAST)
    def group(qs, qh, d, m, zero, g, x, xsum, y):
        nb = qs.shape[1]
        acc = np.zeros(R, np.float32)
        has_m = m.shape[0] > 0
        for b in range(nb):
            i0 = Y.zeros(); i1 = Y.zeros(); i2 = Y.zeros(); i3 = Y.zeros()
            i4 = Y.zeros(); i5 = Y.zeros(); i6 = Y.zeros(); i7 = Y.zeros()
            xo = b * 32
            q = (g * nb + b) * 16 * R
            for k in range(16):
                simd.prefetch(qs, q + AHEAD)
                if five and k % 4 == 0:                               # the fifth bits: a quarter of the codes' bytes
                    simd.prefetch(qh, ((g * nb + b) * 4 + k // 4) * R + AHEAD // 4)
                xl = Y.splat_load(x, xo + k)
                xh = Y.splat_load(x, xo + 16 + k)
                xl5, xh5, bit, h = xl, xh, Y.zeros_b(), 0
                if five:
                    unit = np.float32(16.0) / np.float32(1 << (k & 7))
                    xl5 = Y.splat(x[xo + k] * unit)
                    xh5 = Y.splat(x[xo + 16 + k] * unit)
                    bit = Y.splat_i(1 << (k & 7))
                    h = ((g * nb + b) * 4 + (k >> 3)) * R             # fifth bits: byte k // 8 (low), 2 + k // 8 (high)
                i0 = _nibbles_fma(qs, qh, q, h, bit, xl, xh, xl5, xh5, i0, five)
                i1 = _nibbles_fma(qs, qh, q + 8, h + 8, bit, xl, xh, xl5, xh5, i1, five)
                i2 = _nibbles_fma(qs, qh, q + 16, h + 16, bit, xl, xh, xl5, xh5, i2, five)
                i3 = _nibbles_fma(qs, qh, q + 24, h + 24, bit, xl, xh, xl5, xh5, i3, five)
                i4 = _nibbles_fma(qs, qh, q + 32, h + 32, bit, xl, xh, xl5, xh5, i4, five)
                i5 = _nibbles_fma(qs, qh, q + 40, h + 40, bit, xl, xh, xl5, xh5, i5, five)
                i6 = _nibbles_fma(qs, qh, q + 48, h + 48, bit, xl, xh, xl5, xh5, i6, five)
                i7 = _nibbles_fma(qs, qh, q + 56, h + 56, bit, xl, xh, xl5, xh5, i7, five)
                q += R
            _acc_block(acc, d, m, zero, has_m, (g * nb + b) * R, xsum[b], i0, i1, i2, i3, i4, i5, i6, i7)
        y[g * R:(g + 1) * R] = acc
    return group


_nib4_group, _nib5_group = _nib_group(False), _nib_group(True)


@njit(**FAST)
def _nibbles_fma(qs, qh, q, h, bit, xl, xh, xl5, xh5, inner, five):
    """inner + low nibbles * xl + high nibbles * xh for the 8 code bytes at qs.flat[q] (8 rows);
    five: plus the fifth bits of the 8 rows at qh.flat[h] (low weights) and h + 2 R (high)"""
    v = Y.widen(qs, q)
    inner = Y.fma(Y.to_f(Y.high4(v)), xh, Y.fma(Y.to_f(Y.low4(v)), xl, inner))
    if five:
        inner = Y.fma(Y.to_f(Y.and_b(Y.widen(qh, h), bit)), xl5, inner)
        inner = Y.fma(Y.to_f(Y.and_b(Y.widen(qh, h + 2 * R), bit)), xh5, inner)
    return inner


@njit(**FAST)
def _acc_block(acc, d, m, zero, has_m, sb, xs, i0, i1, i2, i3, i4, i5, i6, i7):
    """acc += a block's share for the 64 rows from their inner sums: d * inner + m * xs, or
    d * (inner - zero * xs)"""
    if has_m:
        s = Y.splat(xs)
        _acc_m(acc, 0, d, m, sb, i0, s); _acc_m(acc, 8, d, m, sb, i1, s)
        _acc_m(acc, 16, d, m, sb, i2, s); _acc_m(acc, 24, d, m, sb, i3, s)
        _acc_m(acc, 32, d, m, sb, i4, s); _acc_m(acc, 40, d, m, sb, i5, s)
        _acc_m(acc, 48, d, m, sb, i6, s); _acc_m(acc, 56, d, m, sb, i7, s)
    else:
        zx = Y.splat(-zero * xs)
        _acc_z(acc, 0, d, sb, i0, zx); _acc_z(acc, 8, d, sb, i1, zx)
        _acc_z(acc, 16, d, sb, i2, zx); _acc_z(acc, 24, d, sb, i3, zx)
        _acc_z(acc, 32, d, sb, i4, zx); _acc_z(acc, 40, d, sb, i5, zx)
        _acc_z(acc, 48, d, sb, i6, zx); _acc_z(acc, 56, d, sb, i7, zx)


@njit(**FAST)
def _block_sums(x, nb):
    """per-block sums of x, once for all rows (outside the parallel function: there numba would
    turn each slice's .sum() into a parallel loop of its own, ~2 us of thread launch per block)"""
    xsum = np.empty(nb, np.float32)
    for b in range(nb):
        xsum[b] = x[b * 32:(b + 1) * 32].sum()
    return xsum


@njit(**FAST)
def _acc_m(acc, o, d, m, sb, inner, xs):
    """acc[o:o+8] += d * inner + m * xs"""
    Y.store(acc, o, Y.add(Y.load(acc, o), Y.fma(Y.scales(m, sb + o), xs,
                                                                Y.mul(Y.scales(d, sb + o), inner))))


@njit(**FAST)
def _acc_z(acc, o, d, sb, inner, zx):
    """acc[o:o+8] += d * (inner - zero * xs)"""
    Y.store(acc, o, Y.fma(Y.scales(d, sb + o), Y.add(inner, zx), Y.load(acc, o)))


@njit(parallel=True, **FAST)
def matvec_nib(qs, qh, d, m, zero, x, y):
    xsum = _block_sums(x, qs.shape[1])
    if qh.shape[0]:
        for g in prange(qs.shape[0]):
            _nib5_group(qs, qh, d, m, np.float32(zero), g, x, xsum, y)
    else:
        for g in prange(qs.shape[0]):
            _nib4_group(qs, qh, d, m, np.float32(zero), g, x, xsum, y)


@njit(**FAST)
def _i8_group(qs, d, g, x, y):
    """I8 codes (Q8_0, Q6_K): acc[r] += d[r] * sum_k q[k, r] x[k] per block, the 64 rows' inner sums
    in 8 vector registers across a block (as _nib4_group: 1.3x faster than an inner[64] array on
    Gemma 3's [262144, 640] Q8_0 LM head, two threads)"""
    nb, B = qs.shape[1], qs.shape[2]
    acc = np.zeros(R, np.float32)
    for b in range(nb):
        i0 = Y.zeros(); i1 = Y.zeros(); i2 = Y.zeros(); i3 = Y.zeros()
        i4 = Y.zeros(); i5 = Y.zeros(); i6 = Y.zeros(); i7 = Y.zeros()
        q = (g * nb + b) * B * R
        for k in range(B):
            simd.prefetch(qs, q + AHEAD)
            xk = Y.splat_load(x, b * B + k)
            i0 = Y.fma(Y.to_f(Y.widen(qs, q)), xk, i0)
            i1 = Y.fma(Y.to_f(Y.widen(qs, q + 8)), xk, i1)
            i2 = Y.fma(Y.to_f(Y.widen(qs, q + 16)), xk, i2)
            i3 = Y.fma(Y.to_f(Y.widen(qs, q + 24)), xk, i3)
            i4 = Y.fma(Y.to_f(Y.widen(qs, q + 32)), xk, i4)
            i5 = Y.fma(Y.to_f(Y.widen(qs, q + 40)), xk, i5)
            i6 = Y.fma(Y.to_f(Y.widen(qs, q + 48)), xk, i6)
            i7 = Y.fma(Y.to_f(Y.widen(qs, q + 56)), xk, i7)
            q += R
        sb = (g * nb + b) * R
        _acc_z(acc, 0, d, sb, i0, Y.zeros()); _acc_z(acc, 8, d, sb, i1, Y.zeros())
        _acc_z(acc, 16, d, sb, i2, Y.zeros()); _acc_z(acc, 24, d, sb, i3, Y.zeros())
        _acc_z(acc, 32, d, sb, i4, Y.zeros()); _acc_z(acc, 40, d, sb, i5, Y.zeros())
        _acc_z(acc, 48, d, sb, i6, Y.zeros()); _acc_z(acc, 56, d, sb, i7, Y.zeros())
    y[g * R:(g + 1) * R] = acc


@njit(**FAST)
def _i8_group_z(qs, d, g, x, y):
    """_i8_group in 512-bit registers: a row's 16 lanes per register, so 4 accumulators hold the
    64 rows and each position takes 4 widening loads, 4 conversions and 4 FMAs instead of 8 of
    each. Each row's sums run in the same order as _i8_group's: the same values bit for bit.
    Gemma 3's [262144, 640] Q8_0 LM head (178 MB) on the Intel Xeon VM, two threads: 12.2 ms
    (14.6 GB/s) with _i8_group, 10.7 here, 6.6 (27 GB/s) with the codes prefetched AHEAD bytes
    before they are read (2 KB ahead: 8.2 ms, 16 KB: 7.2); a plain read streams ~30 GB/s."""
    nb, B = qs.shape[1], qs.shape[2]
    a0 = Z.zeros(); a1 = Z.zeros(); a2 = Z.zeros(); a3 = Z.zeros()
    for b in range(nb):
        i0 = Z.zeros(); i1 = Z.zeros(); i2 = Z.zeros(); i3 = Z.zeros()
        q = (g * nb + b) * B * R
        for k in range(B):
            simd.prefetch(qs, q + AHEAD)
            xk = Z.splat_load(x, b * B + k)
            i0 = Z.fma(Z.to_f(Z.widen(qs, q)), xk, i0)
            i1 = Z.fma(Z.to_f(Z.widen(qs, q + 16)), xk, i1)
            i2 = Z.fma(Z.to_f(Z.widen(qs, q + 32)), xk, i2)
            i3 = Z.fma(Z.to_f(Z.widen(qs, q + 48)), xk, i3)
            q += R
        sb = (g * nb + b) * R
        a0 = Z.fma(Z.scales(d, sb), i0, a0)
        a1 = Z.fma(Z.scales(d, sb + 16), i1, a1)
        a2 = Z.fma(Z.scales(d, sb + 32), i2, a2)
        a3 = Z.fma(Z.scales(d, sb + 48), i3, a3)
    Z.store(y, g * R, a0); Z.store(y, g * R + 16, a1)
    Z.store(y, g * R + 32, a2); Z.store(y, g * R + 48, a3)


@njit(parallel=True, **FAST)
def matvec_i8(qs, d, x, y, wide):
    """wide: the 512-bit group kernel (pass simd.HAS_AVX512; an argument as gemm.gemm_strips says why)"""
    if wide:
        for g in prange(qs.shape[0]):
            _i8_group_z(qs, d, g, x, y)
    else:
        for g in prange(qs.shape[0]):
            _i8_group(qs, d, g, x, y)


# ---- dequantization (prefill tiles, dequantize()) ---------------------------------------------

def dequant_nib_strips(qs, qh, d, m, zero, g0, g1, out):
    """out[4 (g - g0) + r // 16, j, r % 16] = weight j of row g * R + r, for groups g0..g1.
    Eight rows at a time in vector lanes (quant/simd.py; plain LLVM vector operations, so any
    x86-64 compiles them): the codes widened to int32, the nibble and the fifth bit taken out,
    converted to float, then gguf-py's own steps, d * (q - zero) or d * q + m, each rounded once
    as there (a product, then a sum: no FMA), so the weights are the same values bit for bit.
    The fifth bit is (byte & 2^i) * (16 / 2^i), exactly 0 or 16."""
    _dequant_nib(qs, qh, d, m, np.float32(zero), qh.shape[0] > 0, m.shape[0] > 0, g0, g1, out, simd.HAS_AVX512)


_scratch_buf = np.empty((0, 0), np.float32)


def _scratch(n_threads, size) -> np.ndarray:
    """[n_threads, size] float32, kept between products (a fresh 1 MB buffer per tile costs
    ~250 page faults)"""
    global _scratch_buf
    if _scratch_buf.shape[0] < n_threads or _scratch_buf.shape[1] < size:
        size = -(-max(size, _scratch_buf.shape[1]) // 16) * 16           # rows of whole cache lines
        _scratch_buf = simd.empty_aligned((max(n_threads, _scratch_buf.shape[0]), size))
    return _scratch_buf


@njit(parallel=True, **EXACT)
def _matmul(qs, qh, d, m, zero, nib, x, y, per, chunks, step, scratch, workers, wide):
    """Packed.matmul's parallel region, for either family (nib: NIB, else I8)"""
    G, n, T = qs.shape[0], x.shape[1], x.shape[0]
    n_items = -(-G // per) * chunks
    xp = token_tiles(x, wide)                             # x as the register tile reads it, once for all tiles,
    for t in prange(xp.shape[0]):                         # packed on both threads (a parallel region of its own)
        pack_tile(x, xp, t)
    counter = np.zeros(1, np.int64)
    for _ in prange(workers):                             # one worker a thread, drawing items until none are left
        buf0 = scratch[numba.get_thread_id()]
        i = simd.fetch_add(counter, 0, 1)
        while i < n_items:
            g0, t0 = (i // chunks) * per, (i % chunks) * step
            g1, t1 = min(G, g0 + per), min(T, t0 + step)
            if wide:                                      # a block of two strips at a time, into L1 (_block_product)
                for g in range(g0, g1):
                    for h in range(0, R // STRIP, 2):
                        for k0 in range(0, n, KC_Z):
                            k1 = min(n, k0 + KC_Z)
                            _strip_z(qs, qh, d, m, zero, nib, g, h, k0, k1, buf0, 0)
                            _strip_z(qs, qh, d, m, zero, nib, g, h + 1, k0, k1, buf0, KC_Z * STRIP)
                            _block_product(buf0, xp, y, g * R + STRIP * h, k0, k1, t0, t1)
            else:
                S = (g1 - g0) * (R // STRIP)
                buf = buf0[:S * n * STRIP].reshape((S, n, STRIP))
                if nib:
                    _dequant_nib(qs, qh, d, m, zero, qh.shape[0] > 0, m.shape[0] > 0, g0, g1, buf, False)
                else:
                    dequant_i8_strips(qs, d, g0, g1, buf, False)
                gemm_packed(buf, x, xp, y, g0 * R, t0, t1, wide)
            i = simd.fetch_add(counter, 0, 1)


@njit(**EXACT)
def _strip_z(qs, qh, d, m, zero, nib, g, h, k0, k1, out, o):
    """positions k0..k1 of strip h of group g, of either family, into out.flat[o:] (16 lanes)"""
    if nib:
        _nib_strips_z(qs, qh, d, m, zero, qh.shape[0] > 0, m.shape[0] > 0, g, g + 1, h, h + 1, k0 // 32, k1 // 32,
                      out, o)
    else:
        _i8_strips_z(qs, d, g, g + 1, h, h + 1, k0 // qs.shape[2], k1 // qs.shape[2], out, o)


@njit(**EXACT)
def _block_product(buf, xp, y, c, k0, k1, t0, t1):
    """y[t0:t1, c:c + 32] (+)= x[t0:t1, k0:k1] times the two strips of weights at positions k0..k1
    just dequantized into buf (strip one at 0, strip two at KC_Z * 16 floats). The 512-bit
    products dequantize a block of 32 rows x KC_Z positions (32 KB, in L1) right before the
    register tiles read it, instead of a whole ~1 MB tile into L2 first (0.3-0.4 ns a weight,
    mostly stores to L2, against 0.13 for a 256 KB tile; one-thread products 1.04-1.21x faster,
    bench/RESULTS.md). Each weight is still dequantized once per item, and each sum still runs
    over j in order (gemm.block_z): the same float32 results bit for bit."""
    block_z(buf, -STRIP * k0, STRIP * (KC_Z - k0), xp, y, c, k0, k1, t0, t1, True)


@njit(**EXACT)
def _dequant_nib(qs, qh, d, m, zero, five, has_m, g0, g1, out, wide):
    """dequant_nib_strips: a strip's 16 rows in one 512-bit register (wide: simd.HAS_AVX512,
    passed in as gemm.gemm_strips says why), else in two 256-bit halves (the same values)"""
    if wide:
        _nib_strips_z(qs, qh, d, m, zero, five, has_m, g0, g1, 0, R // 16, 0, qs.shape[1], out, 0)
    else:
        _nib_strips_y(qs, qh, d, m, zero, five, has_m, g0, g1, 0, R // 16, 0, qs.shape[1], out, 0)


@njit(**EXACT)
def _rows_nib(qs, qh, d, m, zero, ids, out):
    nb, width = qs.shape[1], qs.shape[3]
    for i in range(ids.shape[0]):
        g, r = ids[i] // width, ids[i] % width
        for b in range(nb):
            for k in range(32):
                v = np.int32(qs[g, b, k % 16, r])
                code = (v & 15) if k < 16 else (v >> 4)
                if qh.shape[0]:
                    code |= fifth_bit(np.int32(qh[g, b, k >> 3, r]), k & 7)
                if m.shape[0]:
                    out[i, b * 32 + k] = simd.scale_at(d, (g * nb + b) * width + r) * np.float32(code) \
                        + simd.scale_at(m, (g * nb + b) * width + r)
                else:
                    out[i, b * 32 + k] = simd.scale_at(d, (g * nb + b) * width + r) * np.float32(code - zero)


@njit(**EXACT)
def _rows_i8(qs, d, ids, out):
    nb, B, width = qs.shape[1], qs.shape[2], qs.shape[3]
    for i in range(ids.shape[0]):
        g, r = ids[i] // width, ids[i] % width
        for b in range(nb):
            for k in range(B):
                out[i, b * B + k] = simd.scale_at(d, (g * nb + b) * width + r) * np.float32(qs[g, b, k, r])


@njit(**EXACT)
def dequant_i8_strips(qs, d, g0, g1, out, wide):
    """out[4 (g - g0) + r // 16, j, r % 16] = weight j of row g * R + r (as dequant_nib_strips):
    d * q, q sign-extended to int32 and converted (16 rows a register when wide, else 8)"""
    if wide:
        _i8_strips_z(qs, d, g0, g1, 0, R // 16, 0, qs.shape[1], out, 0)
    else:
        _i8_strips_y(qs, d, g0, g1, 0, R // 16, 0, qs.shape[1], out, 0)


def _strips(V):
    """The strip dequantizers in V's registers (simd.Z: a strip's 16 rows in one 512-bit register;
    simd.Y: in two 256-bit halves, side by side in each step), the same values: blocks b0..b1
    of strips h0..h1 of groups g0..g1, strip (g, h) at out.flat[o + ((g - g0) (h1 - h0) + h - h0) S]
    (S = 16 (b1 - b0) B floats), out.flat[. + 16 (B (b - b0) + k) + c] = weight B b + k of row
    g R + 16 h + c. Z's prefetch the codes AHEAD bytes on, once per pair of strips (quant/gemm.py
    reads them two at a time: the first strip's lines are the second's too). V is a constant of
    the compiled loops (a closure's), so each width's are as if written out for it alone."""
    L, ahead = V.L, V.L == 16

    @njit(**EXACT)
    def nib(qs, qh, d, m, zero, five, has_m, g0, g1, h0, h1, b0, b1, out, o):
        nb = qs.shape[1]
        minus_z = V.splat(-zero)
        m0 = m1 = V.zeros()
        for g in range(g0, g1):
            for h in range(h0, h1):
                at = o + ((g - g0) * (h1 - h0) + h - h0) * (b1 - b0) * 32 * 16
                for b in range(b0, b1):
                    i = (g * nb + b) * R + 16 * h                   # d / m of the strip's rows
                    d0, d1 = V.scales(d, i), V.scales(d, i + 16 - L)      # its halves' (Z: one, twice)
                    if has_m:
                        m0, m1 = V.scales(m, i), V.scales(m, i + 16 - L)
                    for k in range(16):
                        if ahead and h % 2 == 0:
                            simd.prefetch(qs, ((g * nb + b) * 16 + k) * R + AHEAD)
                            if five and k % 4 == 0:
                                simd.prefetch(qh, ((g * nb + b) * 4 + k // 4) * R + AHEAD // 4)
                        for u in range(0, 16, L):               # the strip's halves (Y) or all of it (Z)
                            du, mu = (d0, m0) if u == 0 else (d1, m1)
                            v = V.widen(qs, ((g * nb + b) * 16 + k) * R + 16 * h + u)   # weights k and k + 16
                            lo, hi = V.to_f(V.low4_i32(v)), V.to_f(V.high4_i32(v))
                            if five:
                                bit = 1 << (k & 7)
                                unit = V.splat(np.float32(16.0) / np.float32(bit))
                                ql = ((g * nb + b) * 4 + (k >> 3)) * R + 16 * h + u
                                lo = V.add(lo, V.mul(V.to_f(V.and_splat(V.widen(qh, ql), bit)), unit))
                                hi = V.add(hi, V.mul(V.to_f(V.and_splat(V.widen(qh, ql + 2 * R), bit)), unit))
                            if has_m:
                                lo, hi = V.add(V.mul(du, lo), mu), V.add(V.mul(du, hi), mu)
                            else:
                                lo, hi = V.mul(du, V.add(lo, minus_z)), V.mul(du, V.add(hi, minus_z))
                            w = at + ((b - b0) * 32 + k) * 16 + u
                            V.store(out, w, lo)
                            V.store(out, w + 256, hi)           # weight k + 16: 16 positions on

    @njit(**EXACT)
    def i8(qs, d, g0, g1, h0, h1, b0, b1, out, o):
        nb, B = qs.shape[1], qs.shape[2]
        for g in range(g0, g1):
            for h in range(h0, h1):
                at = o + ((g - g0) * (h1 - h0) + h - h0) * (b1 - b0) * B * 16
                for b in range(b0, b1):
                    i = (g * nb + b) * R + 16 * h
                    d0, d1 = V.scales(d, i), V.scales(d, i + 16 - L)
                    for k in range(B):
                        q = ((g * nb + b) * B + k) * R + 16 * h
                        if ahead and h % 2 == 0:
                            simd.prefetch(qs, q + AHEAD)
                        for u in range(0, 16, L):
                            du = d0 if u == 0 else d1
                            V.store(out, at + ((b - b0) * B + k) * 16 + u, V.mul(du, V.to_f(V.widen(qs, q + u))))
    return nib, i8


_nib_strips_z, _i8_strips_z = _strips(Z)
_nib_strips_y, _i8_strips_y = _strips(Y)
