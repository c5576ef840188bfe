"""One token's RMSNorm, RoPE and attention in ggml mode, each one compiled call (model/decode.py).

The same operations as ops/ggml_math.py's rms_norm, rope, f16_matmul (one token: the order of
ggml_vec_dot_f16) and soft_max, in the same order, for the shapes of a decoding step: there a
layer's norm, RoPE and attention are a few dozen NumPy calls on vectors of 64 numbers, each
costing more to dispatch than to compute. The f16 K/V cache is read through its bits and the
16-bit -> float32 table (exact); q and the probabilities are rounded to f16 with f16_round
(round to nearest even, as F16C). tests/unit/test_ggml_packed.py holds decode_step to forward().
"""
import numpy as np
from numba import njit

from ..quant.ggml_quants import f16_round
from .ggml_math import _soft_max_row, vec_dot_f16

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


@njit(**JIT)
def attend1(q, kbits, vbits, table, n, lo, scale, out, lanes):
    """q [H, hd] (roped, scaled where the graph scales q), kbits / vbits [Hkv, n_ctx, hd] uint16:
    the f16 cache with position n written, table: f16 bits -> float32; positions lo..n attended
    (0..lo-1 masked, as forward()'s rows keep them) -> out [H, hd]. lanes: the ggml path's
    (ggml_vec_dot_f16 for both products: one token is never tinyBLAS's)"""
    H, hd = q.shape
    Hkv = kbits.shape[0]
    S = n + 1
    pad_s = S + (-S % 64)                                  # KQV runs over n_kv cells: zeros past S (ggml_math.f16_matmul)
    qh = np.empty(hd, np.float32)
    kr = np.empty(hd, np.float32)
    kq = np.empty(S, np.float32)
    w = np.empty(S, np.float32)
    p = np.zeros(pad_s, np.float32)
    vcol = np.zeros(pad_s, np.float32)
    vt = np.empty((Hkv, hd, S), np.float32)                # V^T as floats, per kv head
    acc = np.empty(64, np.float32)                         # vec_dot_f16's scratch
    scratch = np.empty(3 * S, np.int32)                    # the softmax's
    for g in range(Hkv):
        for t in range(S):
            for j in range(hd):
                vt[g, j, t] = table[vbits[g, t, j]]
    sc = np.float32(scale)
    for h in range(H):
        g = h // (H // Hkv)
        for j in range(hd):
            qh[j] = f16_round(q[h, j])                     # mul_mat converts src1 to f16
        for t in range(S):
            for j in range(hd):
                kr[j] = table[kbits[g, t, j]]
            kq[t] = vec_dot_f16(kr, qh, lanes, acc)
        _scale_mask(kq, sc, lo, w)
        _soft_max_row(w, p[:S], lanes, scratch)
        for t in range(S):
            p[t] = f16_round(p[t])
        for j in range(hd):
            for t in range(S):
                vcol[t] = vt[g, j, t]
            out[h, j] = vec_dot_f16(vcol, p, lanes, acc)
