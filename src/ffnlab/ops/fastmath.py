"""float32 e^x that vectorizes, and the activations and softmax built on it.

NumPy 2.4 on an AVX2 CPU computes float32 exp and tanh one element at a time through libm:
7 ns per element here (sqrt: 0.4). SiLU, the softmax and GELU's tanh then take ~45 ms of a
100-token SmolLM2 prefill, more than the attention products. numba's np.exp calls the same libm.
exp32 below is Cephes' expf (S. L. Moshier, cephes/single/expf.c), written as straight-line
float32 arithmetic so LLVM turns a loop of it into 8-wide AVX2 code:

    n = floor(x log2(e) + 1/2),  r = x - n ln2 (ln2 in two parts: r is exact to ~1 ulp)
    e^r = 1 + r + r^2 P(r)       (degree-5 minimax polynomial on |r| <= ln2 / 2)
    e^x = e^r 2^n                (2^n built from its IEEE bits: ((n + 127) << 23))

Cephes gives its relative error as 1.7e-7 over [-MAXLOG, MAXLOG]; tests/unit/test_fastmath.py measures
the maximum over 4M points against float64. Below e^-86.6 (2.4e-38, where 2^n would leave the
normal range) the result is 0; above ln(FLT_MAX) it is inf; nan stays nan.

Built on it (1-D or [rows, n] C-contiguous float32; ops/activations.py and ops/softmax.py keep
NumPy's code for every other dtype, float64 included):
  sigmoid  1 / (1 + e^-x)
  gelu_tanh  0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3): the same
           function with no tanh and no cancellation where tanh(u) is near -1
  softmax  each row: e^(x - max) / sum (the max subtracted by ops/softmax.py), the sum in float64
And the RMSNorm's rows (ops/norms.py): one pass for the sum of squares, one for the products;
RoPE's rotations (ops/rope.py) in one pass; a gated FFN's act(gate) and act(gate) * up in one
pass over the [gate, up] product (model/ffn.py).
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .. import threads as _threads

F = np.float32
FLAGS = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")   # FMA where a multiply feeds
# an add; x / 0 = inf as in NumPy (numba's default checks every division, and the loops stop vectorizing)
LOG2E = F(1.44269504088896341)
LN2_HI, LN2_LO = F(0.693359375), F(-2.12194440e-4)               # ln 2 = LN2_HI + LN2_LO, LN2_HI exact in 9 bits
X_MAX = F(88.72283905206835)                                     # ln(FLT_MAX)
X_MIN = F(-86.64339)                                             # ln(2^-125): 2^(n-1) stays a normal float
P0, P1, P2 = F(1.9875691500e-4), F(1.3981999507e-3), F(8.3334519073e-3)
P3, P4, P5 = F(4.1665795894e-2), F(1.6666665459e-1), F(5.0000001201e-1)
ONE, HALF, TWO = F(1.0), F(0.5), F(2.0)
PARALLEL_MIN = 1 << 15               # values from which a row-wise kernel spreads its rows over the threads


@intrinsic
def _float_from_bits(typingctx, bits):
    """the float32 whose IEEE-754 bits are the int32 bits (a bitcast, as C's memcpy)"""
    if bits != types.int32:
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(**FLAGS)
def exp32(x):
    """e^x for a float32 x (Cephes' expf), branch-free so that loops over it vectorize"""
    v = min(max(x, X_MIN), X_MAX)
    n = np.floor(v * LOG2E + HALF)
    r = (v - n * LN2_HI) - n * LN2_LO
    p = ((((P0 * r + P1) * r + P2) * r + P3) * r + P4) * r + P5
    y = (p * (r * r) + r) + ONE
    y = y * _float_from_bits(np.int32((np.int32(n) + np.int32(126)) << np.int32(23))) * TWO   # 2^(n-1) * 2
    y = np.float32(np.inf) if x > X_MAX else y
    return F(0.0) if x < X_MIN else y


@njit(**FLAGS)
def exp_into(x, out):
    """x, out: 1-D float32 -> out = e^x"""
    for i in range(x.shape[0]):
        out[i] = exp32(x[i])


@njit(**FLAGS)
def sigmoid_into(x, out):
    """x, out: 1-D float32 -> out = 1 / (1 + e^-x), NumPy's order: e^-x, + 1, reciprocal"""
    for i in range(x.shape[0]):
        out[i] = ONE / (exp32(-x[i]) + ONE)


@njit(**FLAGS)
def gelu_tanh_into(x, out, c, a):
    """x, out: 1-D float32 -> out = x sigmoid(2u), u = c x (1 + a x^2) (c = sqrt(2/pi), a = 0.044715:
    ops/activations.py passes its constants)"""
    for i in range(x.shape[0]):
        v = x[i]
        u = c * v * (ONE + a * v * v)
        out[i] = v / (exp32(-TWO * u) + ONE)


@njit(**FLAGS)
def exp_normalize_rows(e):
    """e: [rows, n] float32, each row already less its max (ops/softmax.py) -> in place, e^e / sum,
    the sum in float64 (exact enough for any row length)"""
    for i in range(e.shape[0]):
        row = e[i]
        s = 0.0
        for j in range(row.shape[0]):
            row[j] = exp32(row[j])
            s += row[j]
        d = np.float32(s)
        for j in range(row.shape[0]):
            row[j] = row[j] / d


@njit(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"}, error_model="numpy")
def _sum_squares(row):
    """sum of row^2 in float64, in any order (vector lanes): the one step that may be reassociated"""
    s = 0.0
    for d in range(row.shape[0]):
        v = np.float64(row[d])
        s += v * v
    return s


@njit(cache=True, nogil=True, error_model="numpy")
def _rms_norm_row(x, w, eps, x_hat, y, rstd, i):
    D = x.shape[1]
    r = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(x[i]) / D) + eps)
    rstd[i] = r
    for d in range(D):
        x_hat[i, d] = x[i, d] * r
    if w.shape[0]:
        for d in range(D):
            y[i, d] = x_hat[i, d] * w[d]


@njit(cache=True, nogil=True, error_model="numpy")
def _rms_norm_serial(x, w, eps, x_hat, y, rstd):
    for i in range(x.shape[0]):
        _rms_norm_row(x, w, eps, x_hat, y, rstd, i)


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _rms_norm_parallel(x, w, eps, x_hat, y, rstd):
    for i in prange(x.shape[0]):
        _rms_norm_row(x, w, eps, x_hat, y, rstd, i)


def rms_norm_rows(x, w, eps, x_hat, y, rstd):
    """x [rows, D] float32 -> x_hat = x rstd, y = x_hat w (w empty: no weight), rstd [rows]; each
    product rounded once, as NumPy's steps; the mean square rounded to float32 before + eps.
    Rows are independent: a prompt's rows are spread over numba's threads, or inside
    threads.one_pool() over parallel_for's (the same values)."""
    if not _spread(x):
        return _rms_norm_serial(x, w, eps, x_hat, y, rstd)
    _over_rows(x.shape[0], True, lambda lo, hi: _rms_norm_serial(x[lo:hi], w, eps, x_hat[lo:hi], y[lo:hi],
                                                                     rstd[lo:hi]),
               lambda: _rms_norm_parallel(x, w, eps, x_hat, y, rstd))


def _over_rows(n, spread, span, parallel):
    """span(lo, hi) computes rows lo:hi; parallel() all n rows in a numba parallel region. Not spread:
    span(0, n) here; inside threads.one_pool(): span over blocks of rows on parallel_for's threads;
    else parallel(). Each row is the same code every way, so the same values."""
    if not spread:
        span(0, n)
    elif _threads.on_one_pool():
        _threads.split_rows(span, n)
    else:
        parallel()


def _spread(x) -> bool:
    """worth a parallel region (~5 us to start): more than one row and ~32k values or more"""
    return x.shape[0] > 1 and x.size >= PARALLEL_MIN


@njit(cache=True, nogil=True, error_model="numpy")
def _rope_token(x, cos, sin, neox, out, b, t):
    H, hd = x.shape[2], x.shape[3]
    half = cos.shape[1]
    c, s = cos[t], sin[t]
    for h in range(H):
        v, o = x[b, t, h], out[b, t, h]
        _rotate(v, o, c, s, neox)
        for i in range(2 * half, hd):
            o[i] = v[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _rotate(v, o, c, s, neox):
    """o's first 2 len(c) values = v's pairs rotated by the angles (cos c, sin s): (i, i + half)
    or, not neox, (2i, 2i + 1); each product rounded once, then the sum (no FMA). o may be v."""
    half = c.shape[0]
    if neox:
        for i in range(half):
            x0, x1 = v[i], v[i + half]
            o[i] = x0 * c[i] - x1 * s[i]
            o[i + half] = x0 * s[i] + x1 * c[i]
    else:
        for i in range(half):
            x0, x1 = v[2 * i], v[2 * i + 1]
            o[2 * i] = x0 * c[i] - x1 * s[i]
            o[2 * i + 1] = x0 * s[i] + x1 * c[i]


@njit(cache=True, nogil=True, error_model="numpy")
def _rope_span(x, cos, sin, neox, out, lo, hi):
    for bt in range(lo, hi):
        _rope_token(x, cos, sin, neox, out, bt // x.shape[1], bt % x.shape[1])


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _rope_parallel(x, cos, sin, neox, out):
    for bt in prange(x.shape[0] * x.shape[1]):
        _rope_token(x, cos, sin, neox, out, bt // x.shape[1], bt % x.shape[1])


def rope_rows(x, cos, sin, neox, out):
    """x, out [B, T, H, hd] float32, cos / sin [T, n_rot / 2]: each head's pairs rotated by its
    position's angles, (x0 cos - x1 sin, x0 sin + x1 cos), each product rounded once as
    ops/rope.py's NumPy steps; the pairs are (2i, 2i + 1) or, neox, (i, i + n_rot / 2); past
    n_rot the values pass through. A prompt's tokens are spread over numba's threads, or inside
    threads.one_pool() over parallel_for's (the same values)."""
    n = x.shape[0] * x.shape[1]
    _over_rows(n, n > 1 and x.size >= PARALLEL_MIN, lambda lo, hi: _rope_span(x, cos, sin, neox, out, lo, hi),
               lambda: _rope_parallel(x, cos, sin, neox, out))


@njit(**FLAGS)
def _glu_row(g, g_off, u, u_off, gelu, c, a, act, h, i):
    n = act.shape[1]
    gr, ur, ar, hr = g[i, g_off:g_off + n], u[i, u_off:u_off + n], act[i], h[i]   # rows: 1.5x faster than 2-D indexing
    if gelu:
        for j in range(n):
            v = gr[j]
            y = v / (exp32(-TWO * (c * v * (ONE + a * v * v))) + ONE)
            ar[j] = y
            hr[j] = y * ur[j]
    else:
        for j in range(n):
            v = gr[j]
            y = (ONE / (exp32(-v) + ONE)) * v
            ar[j] = y
            hr[j] = y * ur[j]


@njit(**FLAGS)
def _glu_serial(g, g_off, u, u_off, gelu, c, a, act, h):
    for i in range(act.shape[0]):
        _glu_row(g, g_off, u, u_off, gelu, c, a, act, h, i)


@njit(parallel=True, **FLAGS)
def _glu_parallel(g, g_off, u, u_off, gelu, c, a, act, h):
    for i in prange(act.shape[0]):
        _glu_row(g, g_off, u, u_off, gelu, c, a, act, h, i)


def glu_rows(g, g_off, u, u_off, gelu, c, a, act, h):
    """a gated FFN's activation and product in one pass: act[i, j] = act(g[i, g_off + j]) and
    h[i, j] = act[i, j] u[i, u_off + j] (a [gate, up] product's two halves: g = u, the offsets
    0 and d_ff). act: GELU's x sigmoid(2u) as gelu_tanh_into (c, a its constants), or SiLU as
    ops/activations.py: the sigmoid, then times x. A prompt's rows are spread over numba's threads,
    or inside threads.one_pool() over parallel_for's (the same values)."""
    if not _spread(act):                                          # a token (decoding): the one serial call
        return _glu_serial(g, g_off, u, u_off, gelu, c, a, act, h)
    _over_rows(act.shape[0], True,
               lambda lo, hi: _glu_serial(g[lo:hi], g_off, u[lo:hi], u_off, gelu, c, a, act[lo:hi], h[lo:hi]),
               lambda: _glu_parallel(g, g_off, u, u_off, gelu, c, a, act, h))


@njit(cache=True, nogil=True, error_model="numpy")
def _qk_token(a, w, eps, norm, cos, sin, neox, scale, scaled, out, bt, t, tmp):
    """token bt's heads; tmp: [hd] scratch (normed here, rotated into out: in place, the rotation
    ran 2x slower), one per run of tokens (one per token, its allocation was ~1/4 of the time)"""
    H, hd = a.shape[1], a.shape[2]
    c, s = cos[t], sin[t]
    for h in range(H):
        v, o = a[bt, h], out[bt, h]
        for d in range(hd):
            tmp[d] = v[d]
        if norm:             # summed from the contiguous copy: the very _sum_squares rms_norm_rows runs
            r = np.float32(1.0) / np.sqrt(np.float32(_sum_squares(tmp) / hd) + eps)
            for d in range(hd):
                x_hat = tmp[d] * r
                tmp[d] = x_hat * w[d]
        _rotate(tmp, o, c, s, neox)
        for i in range(2 * c.shape[0], hd):
            o[i] = tmp[i]
        if scaled:
            for d in range(hd):
                o[d] = o[d] * scale


@njit(cache=True, nogil=True, error_model="numpy")
def _qk_serial(a, w, eps, norm, cos, sin, neox, scale, scaled, out, T):
    tmp = np.empty(a.shape[2], np.float32)
    for bt in range(a.shape[0]):
        _qk_token(a, w, eps, norm, cos, sin, neox, scale, scaled, out, bt, bt % T, tmp)


@njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _qk_parallel(a, w, eps, norm, cos, sin, neox, scale, scaled, out, T):
    n = a.shape[0]
    runs = min(n, 16)                                  # runs of tokens over the threads, a scratch vector each
    for r in prange(runs):
        tmp = np.empty(a.shape[2], np.float32)
        for bt in range(r * n // runs, (r + 1) * n // runs):
            _qk_token(a, w, eps, norm, cos, sin, neox, scale, scaled, out, bt, bt % T, tmp)


def qk_rows(a, w, eps, norm, cos, sin, neox, scale, scaled, out, T):
    """The attention's q or k heads as the unhooked float32 path needs them, one pass instead of
    three: a [B*T, H, hd] (any strides: a slice of the q/k/v product) -> out [B*T, H, hd] =
    each head RMS-normed with weight w (norm: Gemma 3, Qwen3), rotated by its position's angles
    (cos / sin [T, n_rot / 2], pairs as rope_rows), times scale (scaled: Gemma's q). Each step
    rounds as rms_norm_rows, rope_rows and NumPy's multiply do, in the same order, so the values
    are those of the three steps bit for bit (tests/unit/test_fastmath.py)."""
    f = _qk_parallel if a.shape[0] > 1 and a.size >= PARALLEL_MIN // 4 else _qk_serial   # ~1.4 ns a value serially
    f(a, w, eps, norm, cos, sin, neox, scale, scaled, out, T)
