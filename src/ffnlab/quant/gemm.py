"""The prefill product: a float32 GEMM over dequantized strips of weights, BLAS's own way.

A prefill product is y[t, r] = sum_j x[t, j] w[r, j] for all T tokens at once. BLAS computes it
in register tiles: a few outputs of a few tokens held in registers while j runs, each weight
loaded once per tile and used for every token in it. BLAS first copies (packs) its input
matrices into the order its inner loop reads. Here the weights are dequantized straight into
that order, so the float32 weights are written once, into L2, and read from there:

  strips  [S, n, 16] float32: strip s holds rows 16s..16s+15 of the tile, weight position j's
          16 rows side by side (quant/packed.py's Packed.dequant_strips writes them)

  tile    16 rows x 6 tokens: 12 accumulators of 8 lanes (AVX2: 16 vector registers); per j, two
          loads of the strip, six broadcasts of x[t, j], twelve FMAs

Measured on one core of the AMD EPYC (Zen 3), [100, 640] x [640, 384] and like shapes
(bench/bench_gemm.py, process CPU time): 38-41 G multiply-adds/s, 0.90-0.95x OpenBLAS's sgemm
on the same float32 weights (peak: ~45). What it buys is the rest of the product: being numba
code, a whole product (dequantize each tile, multiply it) is one parallel region on numba's
threads, with no Python or BLAS call per tile (quant/packed.py's Packed.matmul; OpenBLAS called
from inside such a region ran 20% slower per call). Wider tiles (32 rows x 3 tokens) need 17
registers and spill (18 G/s).

With AVX-512 (quant/simd.py HAS_AVX512) the tile is 32 rows x 10 tokens in 512-bit registers
(`_gemm_z`: a strip's 16 rows are one register), over blocks of 256 positions that stay in L1;
on the 2-vCPU Intel Xeon (family 6 model 207) of bench/RESULTS.md, 2026-11, 71-78 G multiply-adds/s a core against 36-58
for the 256-bit tile (`_gemm_y`), which every other x86-64 CPU with AVX2 and FMA runs.

Arithmetic: float32, each product fused into its sum (FMA, one rounding), the sum over j in
order (both tiles; the 512-bit one stores a tile's sums after a block of j and reloads them).
BLAS's kernels sum the same way (its order of j varies by build); the error bound of a length-n
float32 dot product holds for both (tests/unit/test_quant_gemm.py checks it against float64). Tokens
past T in the last register tile read token T - 1 again and store nothing.
"""
import numpy as np
from numba import njit

from .simd import HAS_AVX2, HAS_AVX512, Y, Z, transpose10_z

STRIP = 16                       # rows per strip
TOKENS = 6                       # tokens per register tile (AVX2)
TOKENS_Z = 10                    # tokens per register tile (AVX-512)
KC_Z = 256                       # weight positions per block of the AVX-512 tile (two strips' block: 32 KB, in L1)


@njit(cache=True, nogil=True, fastmath=False)
def empty_lines(shape):
    """float32 np.empty(shape) whose data start on a 64-byte cache line (numba's own arrays start on
    32 bytes), for the strips and outputs the tiles read and write 16 floats at a time: see
    quant/simd.py's empty_aligned, its counterpart outside compiled code"""
    n = 1
    for s in shape:
        n *= s
    raw = np.empty(n + 16, np.float32)
    off = ((-raw.ctypes.data) % 64) // 4
    return raw[off:off + n].reshape(shape)


@njit(cache=True, nogil=True, fastmath=False)
def gemm_strips(P, x, y, col0, t_lo, t_hi, wide):
    """y[t, col0 + 16 s + c] = sum_j x[t, j] P[s, j, c] for tokens t_lo..t_hi (t_hi -1: all) and
    every strip s. P: [S, n, 16], x: [T, n], y: [T, >= col0 + 16 S], all float32 C-contiguous;
    t_lo a multiple of tile_tokens() (the 512-bit tile reads x in tiles of 10 tokens).
    wide: the 512-bit tiles (pass HAS_AVX512), else the 256-bit ones. An argument, not the global
    read here: numba's disk cache would keep the value a kernel was first compiled with, so
    FFNLAB_NO_AVX512=1 would run a stale choice."""
    if wide:
        _gemm_z(P, pack_tokens(x, TOKENS_Z), y, col0, t_lo, x.shape[0] if t_hi < 0 else t_hi, P.shape[1])
    else:
        _gemm_y(P, x, y, col0, t_lo, t_hi)


@njit(cache=True, nogil=True, fastmath=False)
def gemm_packed(P, x, xp, y, col0, t_lo, t_hi, wide):
    """gemm_strips for a caller that multiplies x by many tiles: xp = token_tiles(x, wide), each tile
    filled by pack_tile, made once"""
    if wide:
        _gemm_z(P, xp, y, col0, t_lo, t_hi, P.shape[1])
    else:
        _gemm_y(P, x, y, col0, t_lo, t_hi)


@njit(cache=True, nogil=True, fastmath=False)
def gemm_prefix(P, x, y, n_j, wide):
    """gemm_strips(P, x, y, 0, 0, -1, wide) where x[:, n_j:] is zeros (attention's probabilities
    past a run of queries' last key): the 512-bit tiles sum over positions 0..n_j only, the
    256-bit ones over all (the zeros add nothing)"""
    if wide:
        _gemm_z(P, pack_tokens(x, TOKENS_Z), y, 0, 0, x.shape[0], n_j)
    else:
        _gemm_y(P, x, y, 0, 0, -1)


@njit(cache=True, nogil=True, fastmath=False)
def token_tiles(x, wide):
    """an empty [ceil(T / 10), n, 10] for pack_tile to fill, once for all of a product's tiles
    (wide: the 512-bit tile reads x packed), else nothing (the 256-bit tile reads x itself)"""
    if wide:
        return np.empty((-(-x.shape[0] // TOKENS_Z), x.shape[1], TOKENS_Z), np.float32)
    return np.empty((0, 0, 0), np.float32)


def tile_tokens() -> int:
    """tokens per register tile on this CPU"""
    return TOKENS_Z if HAS_AVX512 else TOKENS


@njit(cache=True, nogil=True, fastmath=False)
def _gemm_y(P, x, y, col0, t_lo, t_hi):
    """gemm_strips in 256-bit registers: 16 rows x 6 tokens"""
    S, n = P.shape[0], P.shape[1]
    T, ldy = (x.shape[0] if t_hi < 0 else t_hi), y.shape[1]
    for s in range(S):
        c = col0 + STRIP * s
        for t0 in range(t_lo, T, TOKENS):
            # rows of x for the six tokens; past the last token, the last token again (not stored)
            o0 = t0 * n
            o1 = min(t0 + 1, T - 1) * n
            o2 = min(t0 + 2, T - 1) * n
            o3 = min(t0 + 3, T - 1) * n
            o4 = min(t0 + 4, T - 1) * n
            o5 = min(t0 + 5, T - 1) * n
            a00 = Y.zeros(); a01 = Y.zeros(); a10 = Y.zeros(); a11 = Y.zeros(); a20 = Y.zeros(); a21 = Y.zeros()
            a30 = Y.zeros(); a31 = Y.zeros(); a40 = Y.zeros(); a41 = Y.zeros(); a50 = Y.zeros(); a51 = Y.zeros()
            p = s * n * STRIP
            for j in range(n):
                w0 = Y.load(P, p)
                w1 = Y.load(P, p + 8)
                b = Y.splat_load(x, o0 + j)
                a00 = Y.fma(w0, b, a00); a01 = Y.fma(w1, b, a01)
                b = Y.splat_load(x, o1 + j)
                a10 = Y.fma(w0, b, a10); a11 = Y.fma(w1, b, a11)
                b = Y.splat_load(x, o2 + j)
                a20 = Y.fma(w0, b, a20); a21 = Y.fma(w1, b, a21)
                b = Y.splat_load(x, o3 + j)
                a30 = Y.fma(w0, b, a30); a31 = Y.fma(w1, b, a31)
                b = Y.splat_load(x, o4 + j)
                a40 = Y.fma(w0, b, a40); a41 = Y.fma(w1, b, a41)
                b = Y.splat_load(x, o5 + j)
                a50 = Y.fma(w0, b, a50); a51 = Y.fma(w1, b, a51)
                p += STRIP
            o = t0 * ldy + c
            Y.store(y, o, a00); Y.store(y, o + 8, a01)
            if t0 + 1 < T:
                Y.store(y, o + ldy, a10); Y.store(y, o + ldy + 8, a11)
            if t0 + 2 < T:
                Y.store(y, o + 2 * ldy, a20); Y.store(y, o + 2 * ldy + 8, a21)
            if t0 + 3 < T:
                Y.store(y, o + 3 * ldy, a30); Y.store(y, o + 3 * ldy + 8, a31)
            if t0 + 4 < T:
                Y.store(y, o + 4 * ldy, a40); Y.store(y, o + 4 * ldy + 8, a41)
            if t0 + 5 < T:
                Y.store(y, o + 5 * ldy, a50); Y.store(y, o + 5 * ldy + 8, a51)


@njit(cache=True, nogil=True, fastmath=False)
def pack_tokens(x, width):
    """x [T, n] -> [ceil(T / width), n, width]: tile i holds tokens i*width.. side by side at each
    position j (past the last token, the last token again), so a register tile's broadcasts of
    x[t, j] are consecutive floats behind one pointer"""
    xp = np.empty((-(-x.shape[0] // width), x.shape[1], width), np.float32)
    for i in range(xp.shape[0]):
        pack_tile(x, xp, i)
    return xp


@njit(cache=True, nogil=True, fastmath=False)
def pack_tile(x, xp, i):
    """token tile i of pack_tokens(x, xp.shape[2]) into xp[i]. For ten tokens, 16 positions at a
    time: ten vector loads, a transpose in registers (simd.transpose10_z) and 16 stores of 16
    floats, each store's last six lanes overwritten by the next (the tile's last position is
    copied one float at a time, so nothing is written past it). One float at a time (ten loads
    from ten rows, ten scattered stores a position) Gemma 3's [100, 2048] took 0.29 ms on the
    Intel Xeon VM, this way 0.10 ms."""
    T, n = x.shape
    width = xp.shape[2]
    j = 0
    if width == TOKENS_Z and n >= 16:
        r0, r1, r2 = min(i * 10, T - 1) * n, min(i * 10 + 1, T - 1) * n, min(i * 10 + 2, T - 1) * n
        r3, r4, r5 = min(i * 10 + 3, T - 1) * n, min(i * 10 + 4, T - 1) * n, min(i * 10 + 5, T - 1) * n
        r6, r7, r8 = min(i * 10 + 6, T - 1) * n, min(i * 10 + 7, T - 1) * n, min(i * 10 + 8, T - 1) * n
        r9 = min(i * 10 + 9, T - 1) * n
        base = i * n * 10
        for j0 in range(0, n - 15, 16):
            o = transpose10_z(Z.load(x, r0 + j0), Z.load(x, r1 + j0), Z.load(x, r2 + j0), Z.load(x, r3 + j0),
                              Z.load(x, r4 + j0), Z.load(x, r5 + j0), Z.load(x, r6 + j0), Z.load(x, r7 + j0),
                              Z.load(x, r8 + j0), Z.load(x, r9 + j0))
            b = base + j0 * 10
            Z.store(xp, b, o[0]); Z.store(xp, b + 10, o[1]); Z.store(xp, b + 20, o[2]); Z.store(xp, b + 30, o[3])
            Z.store(xp, b + 40, o[4]); Z.store(xp, b + 50, o[5]); Z.store(xp, b + 60, o[6])
            Z.store(xp, b + 70, o[7]); Z.store(xp, b + 80, o[8]); Z.store(xp, b + 90, o[9])
            Z.store(xp, b + 100, o[10]); Z.store(xp, b + 110, o[11]); Z.store(xp, b + 120, o[12])
            Z.store(xp, b + 130, o[13]); Z.store(xp, b + 140, o[14])
            j = j0 + 15                                   # the block's last position: stored whole
            if j0 + 16 < n:                               # when the tile goes on past it
                Z.store(xp, b + 150, o[15])
                j = j0 + 16
    for jj in range(j, n):                                # the rest (and the tile's last position)
        for t in range(width):
            xp[i, jj, t] = x[min(i * width + t, T - 1), jj]


@njit(cache=True, nogil=True, fastmath=False)
def _gemm_z(P, xp, y, col0, t_lo, t_hi, n_j):
    """gemm_strips in 512-bit registers, over x packed by pack_tokens(x, TOKENS_Z) (t_hi: the
    number of tokens, not -1), summing over positions 0..n_j (P.shape[1]: all). A strip's 16 rows
    are one register, and a tile is two strips (32 rows) x 10 tokens: 20 accumulators; per j, two loads of weights and ten broadcasts of
    x[t, j], which lie side by side (one pointer for x: with x as [T, n], ten row pointers left too
    few registers, two reloads from the stack and ten increments a position, 5-8% slower). j runs
    in blocks of KC_Z, so a block of the two strips (32 KB) stays in L1 while every token tile
    reads it (block_z). An odd last strip runs alone (its partner is itself, stored once)."""
    S, n = P.shape[0], P.shape[1]
    for s in range(0, S, 2):
        pair = s + 1 < S
        p0, p1 = s * n * STRIP, (s + 1 if pair else s) * n * STRIP
        for k0 in range(0, n_j, KC_Z):
            block_z(P, p0, p1, xp, y, col0 + STRIP * s, k0, min(n_j, k0 + KC_Z), t_lo, t_hi, pair)


@njit(cache=True, nogil=True, fastmath=False, inline="always")
def block_z(P, p0, p1, xp, y, c, k0, k1, t_lo, T, pair):
    """y[t, c:c + 32] (+)= sum over j in k0..k1 of x[t, j] (P.flat[p0 + 16 j:+16], P.flat[p1 + 16 j:+16])
    for tokens t_lo..T: one block of two strips against every register tile of tokens. The
    first block (k0 == 0) starts from zero, later ones from the sums stored in y, so each sum
    runs over j in order (the same float32 result as one pass). The strips' rows can come from
    anywhere in P: a whole dequantized matrix ([S, n, 16], as _gemm_z) or one block of it
    dequantized just before (quant/packed.py's products, with p0 and p1 offset by -16 k0)."""
    ldy = y.shape[1]
    for t0 in range(t_lo, T, TOKENS_Z):
        xb = (t0 // TOKENS_Z) * xp.shape[1] * TOKENS_Z
        o = t0 * ldy + c
        a00, a01 = _sums(y, o, k0, pair)
        a10, a11 = _sums(y, o + min(1, T - 1 - t0) * ldy, k0, pair)
        a20, a21 = _sums(y, o + min(2, T - 1 - t0) * ldy, k0, pair)
        a30, a31 = _sums(y, o + min(3, T - 1 - t0) * ldy, k0, pair)
        a40, a41 = _sums(y, o + min(4, T - 1 - t0) * ldy, k0, pair)
        a50, a51 = _sums(y, o + min(5, T - 1 - t0) * ldy, k0, pair)
        a60, a61 = _sums(y, o + min(6, T - 1 - t0) * ldy, k0, pair)
        a70, a71 = _sums(y, o + min(7, T - 1 - t0) * ldy, k0, pair)
        a80, a81 = _sums(y, o + min(8, T - 1 - t0) * ldy, k0, pair)
        a90, a91 = _sums(y, o + min(9, T - 1 - t0) * ldy, k0, pair)
        for j in range(k0, k1):
            w0 = Z.load(P, p0 + j * STRIP)
            w1 = Z.load(P, p1 + j * STRIP)
            xj = xb + j * TOKENS_Z
            a00, a01 = _fma_pair(w0, w1, xp, xj, a00, a01)
            a10, a11 = _fma_pair(w0, w1, xp, xj + 1, a10, a11)
            a20, a21 = _fma_pair(w0, w1, xp, xj + 2, a20, a21)
            a30, a31 = _fma_pair(w0, w1, xp, xj + 3, a30, a31)
            a40, a41 = _fma_pair(w0, w1, xp, xj + 4, a40, a41)
            a50, a51 = _fma_pair(w0, w1, xp, xj + 5, a50, a51)
            a60, a61 = _fma_pair(w0, w1, xp, xj + 6, a60, a61)
            a70, a71 = _fma_pair(w0, w1, xp, xj + 7, a70, a71)
            a80, a81 = _fma_pair(w0, w1, xp, xj + 8, a80, a81)
            a90, a91 = _fma_pair(w0, w1, xp, xj + 9, a90, a91)
        _store_pair(y, o, a00, a01, pair)
        if t0 + 1 < T:
            _store_pair(y, o + ldy, a10, a11, pair)
        if t0 + 2 < T:
            _store_pair(y, o + 2 * ldy, a20, a21, pair)
        if t0 + 3 < T:
            _store_pair(y, o + 3 * ldy, a30, a31, pair)
        if t0 + 4 < T:
            _store_pair(y, o + 4 * ldy, a40, a41, pair)
        if t0 + 5 < T:
            _store_pair(y, o + 5 * ldy, a50, a51, pair)
        if t0 + 6 < T:
            _store_pair(y, o + 6 * ldy, a60, a61, pair)
        if t0 + 7 < T:
            _store_pair(y, o + 7 * ldy, a70, a71, pair)
        if t0 + 8 < T:
            _store_pair(y, o + 8 * ldy, a80, a81, pair)
        if t0 + 9 < T:
            _store_pair(y, o + 9 * ldy, a90, a91, pair)


@njit(cache=True, nogil=True, fastmath=False, inline="always")
def _sums(y, o, k0, pair):
    """a tile row's two accumulators: zeros for the first block of j, else the sums stored in y"""
    if k0 == 0:
        return Z.zeros(), Z.zeros()
    return Z.load(y, o), (Z.load(y, o + STRIP) if pair else Z.zeros())


@njit(cache=True, nogil=True, fastmath=False, inline="always")
def _fma_pair(w0, w1, x, i, a0, a1):
    """a0 + w0 x.flat[i], a1 + w1 x.flat[i] (x.flat[i] broadcast to every lane)"""
    b = Z.splat_load(x, i)
    return Z.fma(w0, b, a0), Z.fma(w1, b, a1)


@njit(cache=True, nogil=True, fastmath=False, inline="always")
def _store_pair(y, o, a0, a1, pair):
    Z.store(y, o, a0)
    if pair:
        Z.store(y, o + STRIP, a1)


def strips_to_rows(P) -> np.ndarray:
    """[S, n, 16] strips -> [16 S, n] rows (a copy)"""
    return P.transpose(0, 2, 1).reshape(-1, P.shape[1])


def product(P, x, y, col0):
    """y[:, col0:col0 + 16 S] = x @ the strips' rows^T: the compiled tile where the CPU has AVX2
    and FMA, else BLAS over the strips laid out as [n, rows]. y must be C-contiguous."""
    if HAS_AVX2:
        gemm_strips(P, x, y, col0, 0, -1, HAS_AVX512)
    else:
        S, n = P.shape[0], P.shape[1]
        np.matmul(x, P.transpose(1, 0, 2).reshape(n, S * STRIP), out=y[:, col0:col0 + S * STRIP])
