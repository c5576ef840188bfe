"""Compiled kernels of the training step: the fused forms of NumPy ops that PyTorch runs as one C++
loop each and NumPy as four to eight passes over memory (each a fresh temporary, each a page-fault
storm on training-size arrays, each single-threaded).

Each kernel sits behind the op it replaces, for float32 C-contiguous arrays; the op's NumPy code
(its *_numpy twin, beside it) stays the readable definition and runs for every other dtype
(float64 gradient checks included). tests/unit/test_train_kernels.py holds each kernel to its twin:

  bit for bit (EXACT: no fastmath, every float32 operation in the twin's order, sums as the twin's)
    LayerNorm forward (NumPy's pairwise sums)    ops/norms.layernorm_forward
    attention's scale + causal mask + softmax   ops/attention.attention_probs
    SiLU backward                               ops/activations.silu_backward
    exact GELU forward (scipy's erf of a float32: the float64 erf, rounded)   ops/activations.gelu_forward
    the cross-entropy backward                  ops/loss.cross_entropy_backward
    AdamW's update                              training/optim.AdamW.step
    the embedding's scatter-add                 ops/embedding.embedding_backward (rows in id order)
  within a float32 error bound derived in the test (the twin sums in NumPy's pairwise order or calls
  libm's tanh / exp; here the sums are float64 and the exponentials ops/fastmath.exp32)
    GELU (tanh form and exact) backward, softmax backward, LayerNorm and RMSNorm backward, cross-entropy forward

Threads: blocks of rows (or of values) are spread over ffnlab/threads.py's threads; every value is
computed by one thread in a fixed order, and the parameter gradients of the norms sum fixed blocks of 64 rows
and then the blocks in order, so the bits do not depend on the number of threads.
"""
import math

import numpy as np
from numba import njit

from .. import threads as _threads
from .fastmath import PARALLEL_MIN, exp32

EXACT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")       # each operation rounded as NumPy's
FAST = dict(cache=True, nogil=True, fastmath={"contract"}, error_model="numpy")  # FMA where a multiply feeds an add
SUMS = dict(cache=True, nogil=True, fastmath={"reassoc", "nsz", "contract"}, error_model="numpy")   # a float64 sum in
# vector lanes: the one step that may be reassociated (its order is fixed by the compiled code, not by the threads)
F = np.float32
ONE, TWO, THREE, HALF = F(1.0), F(2.0), F(3.0), F(0.5)
BLOCK = 64                    # rows per partial sum of a norm's weight gradient


def _split(fn, n, size):
    """fn(lo, hi) over blocks of range(n), on ffnlab/threads.py's threads (parallel_for: each thread
    takes the next block, two blocks a thread) once the work is ~32k values (size) or more; on this
    thread otherwise. The kernels are nogil. One pool for the whole step: numba's own parallel
    regions left its OpenMP threads spinning beside OpenBLAS's, and a two-thread step ran 1.2-1.4x
    slower with them than with serial kernels (2026-12-01, Intel Xeon, load average ~5)."""
    if min(_threads.threads(), n) < 2 or size < PARALLEL_MIN:
        fn(0, n)
        return
    _threads.split_rows(fn, n)


# --- elementwise: SiLU and GELU (tanh form) backward ----------------------------------------
@njit(inline="always", **EXACT)
def _silu_grad(v, dy):
    s = ONE / (exp32(-v) + ONE)                            # ops/fastmath.sigmoid_into's order
    return (((ONE - s) * v + ONE) * s) * dy                # s (1 + x (1 - s)) dy, as silu_backward_numpy


@njit(inline="always", **FAST)
def _gelu_tanh_grad(v, dy, c, a):
    u = c * v * (ONE + a * v * v)                          # gelu(x) = x sigmoid(2u) = 0.5 x (1 + tanh u)
    s = ONE / (exp32(-TWO * u) + ONE)
    du = c * (ONE + THREE * a * v * v)                      # u'
    return (s + v * (s * (ONE - s)) * (TWO * du)) * dy      # sigmoid(2u) + x sigmoid'(2u) 2u'


@njit(**EXACT)
def _silu_backward_span(dy, x, out):
    for i in range(x.shape[0]):
        out[i] = _silu_grad(x[i], dy[i])


def silu_backward_into(dy, x, out):
    """dy, x, out: 1-D float32 -> out = dy * d/dx (x sigmoid(x))"""
    _split(lambda lo, hi: _silu_backward_span(dy[lo:hi], x[lo:hi], out[lo:hi]), x.shape[0], x.shape[0])


@njit(**FAST)
def _gelu_tanh_backward_span(dy, x, out, c, a):
    for i in range(x.shape[0]):
        out[i] = _gelu_tanh_grad(x[i], dy[i], c, a)


def gelu_tanh_backward_into(dy, x, out, c, a):
    """dy, x, out: 1-D float32 -> out = dy * gelu_tanh'(x) (c = sqrt(2/pi), a = 0.044715)"""
    _split(lambda lo, hi: _gelu_tanh_backward_span(dy[lo:hi], x[lo:hi], out[lo:hi], c, a), x.shape[0], x.shape[0])


# --- exact GELU: x Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 -----------------------------------
@njit(inline="always", **EXACT)
def _cdf(v, inv_sqrt2):
    """Phi(v) in ops/activations._cdf_numpy's steps: v / sqrt 2 in float32, erf in float64 rounded to
    float32 (what scipy's erf does for a float32), + 1, * 0.5"""
    return (F(math.erf(np.float64(v * inv_sqrt2))) + ONE) * HALF


@njit(**EXACT)
def _gelu_span(x, out, inv_sqrt2):
    for i in range(x.shape[0]):
        out[i] = _cdf(x[i], inv_sqrt2) * x[i]


def gelu_into(x, out, inv_sqrt2):
    """x, out: 1-D float32 -> out = x Phi(x), gelu_forward_numpy's values"""
    _split(lambda lo, hi: _gelu_span(x[lo:hi], out[lo:hi], inv_sqrt2), x.shape[0], x.shape[0])


@njit(**EXACT)
def _gelu_backward_span(dy, x, out, inv_sqrt2, inv_sqrt2pi):
    for i in range(x.shape[0]):
        v = x[i]
        pdf = exp32((v * v) * -HALF) * inv_sqrt2pi                    # phi(x)
        out[i] = (pdf * v + _cdf(v, inv_sqrt2)) * dy[i]              # (Phi(x) + x phi(x)) dy


def gelu_backward_into(dy, x, out, inv_sqrt2, inv_sqrt2pi):
    """dy, x, out: 1-D float32 -> out = dy * d/dx (x Phi(x)) = dy (Phi(x) + x phi(x))"""
    _split(lambda lo, hi: _gelu_backward_span(dy[lo:hi], x[lo:hi], out[lo:hi], inv_sqrt2, inv_sqrt2pi),
           x.shape[0], x.shape[0])


# --- a gated FFN's backward: h = act(gate) * up ---------------------------------------------
@njit(**EXACT)
def _glu_silu_backward_span(dh, act, up, gate, dup, dgate):
    for i in range(dh.shape[0]):
        dup[i] = dh[i] * act[i]                                 # d(act * up)/d up
        dgate[i] = _silu_grad(gate[i], dh[i] * up[i])           # act's backward on dh * up


@njit(**FAST)
def _glu_gelu_tanh_backward_span(dh, act, up, gate, dup, dgate, c, a):
    for i in range(dh.shape[0]):
        dup[i] = dh[i] * act[i]
        dgate[i] = _gelu_tanh_grad(gate[i], dh[i] * up[i], c, a)


def glu_backward_into(dh, act, up, gate, dup, dgate, gelu, c, a):
    """dh, act, up, gate, dup, dgate: 1-D float32 -> dup = dh act, dgate = (dh up) act'(gate), one
    pass: the values of dh * act and of silu_backward / gelu_tanh_backward_into on dh * up (gelu:
    GELU's tanh form, constants c, a)"""
    n = dh.shape[0]
    if gelu:
        _split(lambda lo, hi: _glu_gelu_tanh_backward_span(dh[lo:hi], act[lo:hi], up[lo:hi], gate[lo:hi],
                                                           dup[lo:hi], dgate[lo:hi], c, a), n, n)
    else:
        _split(lambda lo, hi: _glu_silu_backward_span(dh[lo:hi], act[lo:hi], up[lo:hi], gate[lo:hi],
                                                      dup[lo:hi], dgate[lo:hi]), n, n)


# --- attention: scale, mask and softmax of the scores in one pass ---------------------------
@njit(**EXACT)
def _masked_softmax_row(kq, scale, allowed, masked, lo, hi, out, r, t):
    """row t of head r: v = kq * scale, -inf where not allowed; e^(v - max) / sum as ops/softmax.py
    (the sum in float64 in key order). Keys outside [lo[t], hi[t]) are all masked: they add
    exactly 0 to the sum, so they are set to 0 and skipped."""
    row, o = kq[r, t], out[r, t]
    a, b = lo[t], hi[t]
    for j in range(a):
        o[j] = F(0.0)
    for j in range(b, row.shape[0]):
        o[j] = F(0.0)
    x, y = row[a:b], o[a:b]
    al = allowed[t, a:b]
    m = F(-np.inf)
    for j in range(x.shape[0]):
        v = x[j] * scale
        v = v if (al[j] or not masked) else F(-np.inf)
        y[j] = v
        m = max(m, v)
    for j in range(x.shape[0]):
        y[j] = exp32(y[j] - m)                               # a masked key: exp32(-inf) = 0
    s = 0.0
    for j in range(x.shape[0]):
        s += y[j]
    d = F(s)
    for j in range(x.shape[0]):
        y[j] = y[j] / d


@njit(**EXACT)
def _masked_softmax_serial(kq, scale, allowed, masked, lo, hi, out, first, last):
    """rows first..last-1 of the R x T rows"""
    for rt in range(first, last):
        _masked_softmax_row(kq, scale, allowed, masked, lo, hi, out, rt // kq.shape[1], rt % kq.shape[1])


def masked_softmax_rows(kq, scale, allowed, out):
    """kq, out: [R, T, S] float32 (R = batch x heads), allowed: [T, S] bool or None ->
    out = softmax(kq * scale, -inf where not allowed) over S"""
    R, T, S = kq.shape
    if allowed is None:
        allowed = np.ones((T, S), np.bool_)
        lo, hi = np.zeros(T, np.int64), np.full(T, S, np.int64)
        masked = False
    else:
        allowed = np.ascontiguousarray(allowed, np.bool_)
        any_ = allowed.any(axis=1)
        lo = np.where(any_, allowed.argmax(axis=1), 0).astype(np.int64)                  # first allowed key
        hi = np.where(any_, S - allowed[:, ::-1].argmax(axis=1), S).astype(np.int64)     # past the last
        masked = True
    scale = F(scale)
    _split(lambda a, b: _masked_softmax_serial(kq, scale, allowed, masked, lo, hi, out, a, b), R * T, kq.size)


@njit(**SUMS)
def _dot64(a, b):
    """sum of a * b in float64 (vector lanes)"""
    s = 0.0
    for j in range(a.shape[0]):
        s += np.float64(a[j]) * np.float64(b[j])
    return s


@njit(**EXACT)
def _softmax_backward_row(dy, y, dx, scale, i):
    s = F(_dot64(dy[i], y[i]))
    a, b, o = dy[i], y[i], dx[i]
    for j in range(a.shape[0]):
        o[j] = ((a[j] - s) * b[j]) * scale                # times 1 is exact: the unscaled values


@njit(**EXACT)
def _softmax_backward_serial(dy, y, dx, scale):
    for i in range(dy.shape[0]):
        _softmax_backward_row(dy, y, dx, scale, i)


def softmax_backward_rows(dy, y, dx, scale=1.0):
    """dy, y, dx: [rows, N] float32 -> dx = y (dy - sum(dy y)) (the sum in float64), times scale
    (the attention backward's, so its scores' gradient takes one pass, not two: bit for bit the same
    as multiplying after)"""
    scale = F(scale)
    _split(lambda lo, hi: _softmax_backward_serial(dy[lo:hi], y[lo:hi], dx[lo:hi], scale), dy.shape[0], dy.size)


# --- LayerNorm forward ----------------------------------------------------------------------
PAIRWISE_BLOCK = 128          # NumPy's PW_BLOCKSIZE: runs of up to this many terms are summed 8-wide


@njit(**EXACT)
def _pairwise_run(a, lo, n):
    """a[lo:lo+n], n <= 128, summed in float32 as NumPy's add.reduce sums a contiguous run
    (numpy/_core/src/umath/loops_utils.h.src, pairwise_sum): under 8 terms one by one; else 8
    running sums combined as ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7)), then the tail"""
    if n < 8:
        res = F(0.0)
        for i in range(n):
            res += a[lo + i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


# A run longer than 128 is split in two at a multiple of 8 and each half summed the same way.
# NumPy recurses; numba's disk cache crashes on reloading a recursive function, so this walks the
# same tree with a stack of the runs still to sum.
PAIRWISE_MAX = 8192           # rows up to this many terms take the compiled sum, NumPy's code beyond
LEVELS = 7                    # halvings a run of up to PAIRWISE_MAX terms needs (7689 terms is the first to need 7)


@njit(**EXACT)
def _pairwise_sum(a, lo, n):
    """a[lo:lo+n] summed as NumPy's pairwise_sum, for n <= PAIRWISE_MAX"""
    todo = np.empty((2 * LEVELS + 1, 3), np.int64)     # runs (lo, n, 1 once its halves' sums are on `sums`)
    sums = np.empty(LEVELS + 1, np.float32)             # the sums of the runs done, left to right
    todo[0, 0], todo[0, 1], todo[0, 2] = lo, n, 0
    top, k = 1, 0
    while top:
        top -= 1
        lo, n, halves_done = todo[top, 0], todo[top, 1], todo[top, 2]
        if halves_done:
            k -= 1
            sums[k - 1] = sums[k - 1] + sums[k]        # the left half's sum + the right half's
        elif n <= PAIRWISE_BLOCK:
            sums[k] = _pairwise_run(a, lo, n)
            k += 1
        else:                                          # back to this run once both halves are summed, left first
            h = n // 2 - (n // 2) % 8
            todo[top, 2] = 1
            todo[top + 1, 0], todo[top + 1, 1], todo[top + 1, 2] = lo + h, n - h, 0
            todo[top + 2, 0], todo[top + 2, 1], todo[top + 2, 2] = lo, h, 0
            top += 3
    return sums[0]


@njit(**EXACT)
def _mean_numpy(a):
    """np.mean of a contiguous float32 row: 0 + the pairwise sum, divided by the count as NumPy's
    _methods._mean does it (true_divide by an intp: in float64, then rounded to float32)"""
    s = F(0.0) + _pairwise_sum(a, 0, a.shape[0])
    return F(np.float64(s) / np.float64(a.shape[0]))


@njit(**EXACT)
def _layer_norm_serial(x, w, b, has_b, eps, x_hat, y, rstd, first, last):
    """rows first..last-1 in layernorm_forward_numpy's steps: mean, xc = x - mean, var = mean(xc xc),
    rstd = 1 / sqrt(var + eps), x_hat = xc rstd, y = x_hat w (+ b)"""
    D = x.shape[1]
    sq = np.empty(D, np.float32)
    for i in range(first, last):
        row, xh, out = x[i], x_hat[i], y[i]
        mean = _mean_numpy(row)
        for d in range(D):
            xh[d] = row[d] - mean
            sq[d] = xh[d] * xh[d]
        r = ONE / np.sqrt(_mean_numpy(sq) + eps)
        rstd[i] = r
        for d in range(D):
            xh[d] = xh[d] * r
            out[d] = xh[d] * w[d]
            if has_b:
                out[d] = out[d] + b[d]


def layer_norm_rows(x, w, b, eps):
    """x: [N, D] float32 C-contiguous, w: [D], b: [D] or None -> y [N, D], x_hat [N, D], rstd [N]"""
    N, D = x.shape
    x_hat, y, rstd = np.empty((N, D), np.float32), np.empty((N, D), np.float32), np.empty(N, np.float32)
    b1 = b if b is not None else np.zeros(0, np.float32)
    _split(lambda lo, hi: _layer_norm_serial(x, w, b1, b is not None, F(eps), x_hat, y, rstd, lo, hi), N, x.size)
    return y, x_hat, rstd


# --- norms backward -------------------------------------------------------------------------
@njit(**SUMS)
def _sum64(a):
    s = 0.0
    for j in range(a.shape[0]):
        s += np.float64(a[j])
    return s


@njit(**EXACT)
def _norm_backward_block(dy, x_hat, rstd, w, has_w, center, dx, dw, db, k):
    """rows k*BLOCK.. of a LayerNorm (center) or RMSNorm backward: dx = rstd (g - [mean g] - x_hat mean(g x_hat)),
    g = dy w; this block's sums of dy x_hat and dy into dw[k], db[k] (float64)"""
    N, D = dy.shape
    g = np.empty(D, np.float32)
    for i in range(k * BLOCK, min(N, (k + 1) * BLOCK)):
        a, xh, o = dy[i], x_hat[i], dx[i]
        for d in range(D):
            g[d] = a[d] * w[d] if has_w else a[d]
            dw[k, d] += np.float64(a[d]) * np.float64(xh[d])
            db[k, d] += np.float64(a[d])
        c = F(_dot64(g, xh) / D)                            # mean(g x_hat)
        mg = F(_sum64(g) / D) if center else F(0.0)         # mean(g)
        r = rstd[i]
        for d in range(D):
            o[d] = ((g[d] - mg) - xh[d] * c) * r


@njit(**EXACT)
def _norm_backward_serial(dy, x_hat, rstd, w, has_w, center, dx, dw, db, first, last):
    for k in range(first, last):
        _norm_backward_block(dy, x_hat, rstd, w, has_w, center, dx, dw, db, k)


def norm_backward_rows(dy, x_hat, rstd, w, center):
    """dy, x_hat: [N, D] float32, rstd: [N], w: [D] float32 or None, center: LayerNorm (else RMSNorm)
    -> dx [N, D], dw [D] (sum over rows of dy x_hat), db [D] (sum of dy), float32"""
    N, D = dy.shape
    dx = np.empty((N, D), np.float32)
    blocks = (N + BLOCK - 1) // BLOCK
    dw = np.zeros((blocks, D))
    db = np.zeros((blocks, D))
    w1 = w if w is not None else np.ones(0, np.float32)
    _split(lambda a, b: _norm_backward_serial(dy, x_hat, rstd, w1, w is not None, center, dx, dw, db, a, b),
           blocks, dy.size)
    return dx, _ordered_sum(dw), _ordered_sum(db)


@njit(**EXACT)
def _ordered_sum(parts):
    """[blocks, D] float64 -> [D] float32, the blocks added in order"""
    out = np.zeros(parts.shape[1])
    for k in range(parts.shape[0]):
        for d in range(parts.shape[1]):
            out[d] += parts[k, d]
    return out.astype(np.float32)


# --- cross-entropy --------------------------------------------------------------------------
@njit(**EXACT)
def _cross_entropy_row(logits, targets, probs, losses, i):
    row, p = logits[i], probs[i]
    m = row[0]
    for j in range(row.shape[0]):
        m = max(m, row[j])
    for j in range(row.shape[0]):
        p[j] = exp32(row[j] - m)
    s = _sum64(p)
    d = F(s)
    for j in range(row.shape[0]):
        p[j] = p[j] / d
    losses[i] = np.log(s) + np.float64(m) - np.float64(row[targets[i]])   # logsumexp - logit of the target


@njit(**EXACT)
def _cross_entropy_serial(logits, targets, probs, losses):
    for i in range(logits.shape[0]):
        _cross_entropy_row(logits, targets, probs, losses, i)


def cross_entropy_rows(logits, targets):
    """logits: [N, V] float32, targets: [N] int64 -> mean loss (float32), probs [N, V] (float64 sums)"""
    probs = np.empty(logits.shape, np.float32)
    losses = np.empty(logits.shape[0])
    _split(lambda lo, hi: _cross_entropy_serial(logits[lo:hi], targets[lo:hi], probs[lo:hi], losses[lo:hi]),
           logits.shape[0], logits.size)
    return np.float32(_mean(losses)), probs


@njit(**EXACT)
def _mean(a):
    s = 0.0
    for i in range(a.shape[0]):
        s += a[i]
    return s / a.shape[0]


@njit(**EXACT)
def _cross_entropy_backward_rows(probs, targets, scale, out):
    for i in range(probs.shape[0]):
        p, o, t = probs[i], out[i], targets[i]
        for j in range(p.shape[0]):
            o[j] = (p[j] - ONE if j == t else p[j]) * scale


def cross_entropy_backward_rows(probs, targets, scale):
    """probs: [N, V] float32 -> (probs - onehot(targets)) * scale, as cross_entropy_backward_numpy's steps"""
    out = np.empty(probs.shape, np.float32)
    scale = F(scale)
    _split(lambda lo, hi: _cross_entropy_backward_rows(probs[lo:hi], targets[lo:hi], scale, out[lo:hi]),
           probs.shape[0], probs.size)
    return out


# --- embedding backward ---------------------------------------------------------------------
@njit(**EXACT)
def scatter_add_rows(table, ids, dx):
    """table[ids[i]] += dx[i] for i in order (np.add.at's order), table [V, D], dx [N, D] float32"""
    for i in range(ids.shape[0]):
        r, a = table[ids[i]], dx[i]
        for d in range(a.shape[0]):
            r[d] += a[d]


# --- AdamW ----------------------------------------------------------------------------------
@njit(**EXACT)
def _adamw_span(p, g, m, v, decay, c1, b2, c2, bc2_sqrt, eps, step_size):
    """training/optim.AdamW.step's NumPy steps, per value, in their order and float32 roundings"""
    for i in range(p.shape[0]):
        gi = g[i]
        mi = m[i] + (gi - m[i]) * c1                       # m = m + (1 - b1)(g - m)
        vi = v[i] * b2 + (gi * gi) * c2                     # v = b2 v + (1 - b2) g^2
        m[i] = mi
        v[i] = vi
        p[i] = p[i] * decay - (mi / (np.sqrt(vi) / bc2_sqrt + eps)) * step_size


ADAMW_SPAN = 1 << 16        # values of one tensor per item: the update's items are spans of every tensor


def adamw_update(tensors, c1, b2, c2, bc2_sqrt, eps, step_size):
    """tensors: [(p, g, m, v, decay)], p, g, m, v 1-D float32 (views of a parameter, its gradient and
    moments), updated in place; the scalars as training/optim.py rounds them to float32.
    Every tensor's spans go to the threads in one parallel_for (a call per tensor waited ~20 times a
    step for the other thread); each value is updated alone, so the split leaves the bits as they are."""
    args = (F(c1), F(b2), F(c2), F(bc2_sqrt), F(eps), F(step_size))
    spans = [(t, lo, min(lo + ADAMW_SPAN, t[0].shape[0])) for t in tensors for lo in range(0, t[0].shape[0], ADAMW_SPAN)]

    def one(i):
        (p, g, m, v, decay), lo, hi = spans[i]
        _adamw_span(p[lo:hi], g[lo:hi], m[lo:hi], v[lo:hi], F(decay), *args)
    if _threads.threads() < 2 or sum(t[0].shape[0] for t in tensors) < PARALLEL_MIN:
        for i in range(len(spans)):
            one(i)
    else:
        _threads.parallel_for(one, len(spans))
