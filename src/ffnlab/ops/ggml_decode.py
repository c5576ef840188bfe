"""One token's RMSNorm, RoPE and attention in ggml mode, each one compiled call (model/decode.py).

The same operations as ops/ggml_math.py's rms_norm, rope, f16_matmul (one token: the order of
ggml_vec_dot_f16) and soft_max, in the same order, for the shapes of a decoding step: there a
layer's norm, RoPE and attention are a few dozen NumPy calls on vectors of 64 numbers, each
costing more to dispatch than to compute. The f16 K/V cache is read through its bits and the
16-bit -> float32 table (exact); q and the probabilities are rounded to f16 with f16_round_array
(round to nearest even, as F16C). tests/unit/test_ggml_packed.py holds decode_step to forward().
"""
import numpy as np
from numba import njit, prange

from ..quant.ggml_quants import f16_round_array
from .ggml_math import _soft_max_row

# no fastmath: ggml's roundings; error_model "numpy": a division by zero gives inf or nan, as in C
JIT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


@njit(**JIT)
def rms_norm1(x, w, eps):
    """ggml_math.rms_norm of one vector: float32 squares added one by one in float64, mean
    rounded to float32, scale = 1 / sqrtf(mean + eps), y = (x * scale) * w"""
    total = 0.0
    for i in range(x.shape[0]):
        total += np.float64(x[i] * x[i])
    mean = np.float32(total / x.shape[0])
    scale = np.float32(1.0) / np.float32(np.sqrt(mean + np.float32(eps)))
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = (x[i] * scale) * w[i]
    return out


@njit(**JIT)
def rope1(qk, cos, sin, neox):
    """ggml_math.rope for one position, in place on qk [h, hd] (the first 2 len(cos) dims):
    x0 cos - f32(x1 sin) and x0 sin + f32(x1 cos), each in float64 and rounded once to float32"""
    half = cos.shape[0]
    for i in range(qk.shape[0]):
        for j in range(half):
            i0, i1 = (j, j + half) if neox else (2 * j, 2 * j + 1)
            x0, x1 = np.float64(qk[i, i0]), np.float64(qk[i, i1])
            c, s = np.float64(cos[j]), np.float64(sin[j])
            a = np.float32(x1 * s)
            b = np.float32(x1 * c)
            qk[i, i0] = np.float32(x0 * c - np.float64(a))
            qk[i, i1] = np.float32(x0 * s + np.float64(b))


@njit(**JIT)
def _scale_mask(kq, scale, lo, w):
    """soft_max's w = kq * scale, -inf before lo (the sliding window's mask)"""
    for t in range(kq.shape[0]):
        w[t] = kq[t] * scale if t >= lo else np.float32(-np.inf)


@njit(parallel=True, **JIT)
def attend1(q, kbits, vbits, table, n, lo, scale, out, lanes):
    """q [H, hd] (roped, scaled where the graph scales q), kbits / vbits [Hkv, n_ctx, hd] uint16:
    the f16 cache with position n written, table: f16 bits -> float32; positions lo..n attended
    (0..lo-1 masked, as forward()'s rows keep them) -> out [H, hd]. lanes: the ggml path's.

    Both products are ggml_vec_dot_f16 (one token is never tinyBLAS's): KQ one dot over hd per
    key, KQV one over the keys per output dim, the probabilities rounded to f16 and the V rows
    padded with zeros to n_kv (a multiple of 64) as ggml_math.f16_matmul's. Each dot keeps
    vec_dot_f16's order exactly; the dots of a row run side by side (a head's keys for KQ, its
    hd outputs for KQV), so that each float of a vector is one dot's own running sum."""
    H, hd = q.shape
    Hkv = kbits.shape[0]
    S = n + 1
    step = 4 * lanes if lanes > 1 else 1
    kbody = hd - hd % step if lanes > 1 else 0             # vec_dot_f16's vector part of a KQ dot
    vbody = S + (-S % 64) if lanes > 1 else 0              # of a KQV dot: n_kv cells, zeros past S
    kt = np.empty((Hkv, hd, S), np.float32)                # the keys, transposed
    vf = np.empty((Hkv, S, hd), np.float32)                # the values
    for g in prange(Hkv):
        for t in range(S):
            for j in range(hd):
                kt[g, j, t] = table[kbits[g, t, j]]
                vf[g, t, j] = table[vbits[g, t, j]]
    sc = np.float32(scale)
    for h in prange(H):                                    # the heads apart: each one's own scratch
        g = h // (H // Hkv)
        qh = np.empty(hd, np.float32)
        kq = np.empty(S, np.float32)
        w = np.empty(S, np.float32)
        p = np.empty(S, np.float32)
        p16 = np.empty(S, np.float32)
        acc_k = np.empty((step, S), np.float32)            # vec_dot_f16's accumulators, a column a key
        acc_v = np.empty((step, hd), np.float32)           # a column an output dim
        scratch = np.empty(3 * S, np.int32)                # the softmax's
        f16_round_array(q[h], qh)                          # mul_mat converts src1 to f16
        _dots(kt[g], qh, kbody, lanes, acc_k, kq)
        _scale_mask(kq, sc, lo, w)
        _soft_max_row(w, p, lanes, scratch)
        f16_round_array(p, p16)
        _dots(vf[g], p16, vbody, lanes, acc_v, out[h])


@njit(**JIT)
def _dots(a, b, body, lanes, acc, y):
    """y[c] = vec_dot_f16(a[:, c], b) for every column c of a [K, C] (b [K]), K's first `body`
    rows in vec_dot_f16's vector order, the rest added in float64. acc [4 lanes, C] scratch.
    A body past K (KQV's zero padding to n_kv) adds products of +0 to accumulators that start
    at +0 and so are never -0: the rows past K are left out without changing a bit."""
    K, C = a.shape
    step = acc.shape[0]
    acc[:] = 0
    for k0 in range(0, body, step):
        for l in range(min(step, K - k0)):
            _axpy(a[k0 + l], b[k0 + l], acc[l])        # f16 x f16: exact, as ggml's FMA
    if body:
        _reduce(acc, lanes)                            # -> acc[0]
    for c in range(C):
        total = np.float64(acc[0, c]) if body else 0.0
        for k in range(body, K):
            total += np.float64(a[k, c]) * np.float64(b[k])
        y[c] = np.float32(total)


@njit(**JIT)
def _axpy(x, b, acc):
    """acc += x * b, one rounding per product and one per sum"""
    for i in range(x.shape[0]):
        acc[i] = x[i] * b + acc[i]


@njit(**JIT)
def _reduce(acc, lanes):
    """every column of the 4 accumulators acc[4 lanes, C] to one float in acc[0], as
    vec_dot_f16: lane i's four sums as (0+2) + (1+3), then the register's reduction (AVX-512:
    _mm512_reduce_add_ps, as ggml_math._hsum16; AVX2: vec_dot_f16's two hadds)"""
    L = lanes
    for i in range(L):
        _add2(acc[i], acc[2 * L + i], acc[L + i], acc[3 * L + i])
    if L == 16:
        for i in range(8):
            _add(acc[i], acc[8 + i])                   # t_i = l_i + l_{8+i}
        _add2(acc[0], acc[4], acc[2], acc[6])          # (t0 + t4) + (t2 + t6)
        _add2(acc[1], acc[5], acc[3], acc[7])          # (t1 + t5) + (t3 + t7)
    else:
        _add2(acc[0], acc[4], acc[1], acc[5])          # (l0 + l4) + (l1 + l5)
        _add2(acc[2], acc[6], acc[3], acc[7])          # (l2 + l6) + (l3 + l7)
        _add(acc[0], acc[2])
        return
    _add(acc[0], acc[1])


@njit(**JIT)
def _add(a, b):
    for i in range(a.shape[0]):
        a[i] = a[i] + b[i]


@njit(**JIT)
def _add2(a, b, c, d):
    """a = (a + b) + (c + d)"""
    for i in range(a.shape[0]):
        a[i] = (a[i] + b[i]) + (c[i] + d[i])
