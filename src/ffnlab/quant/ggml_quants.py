"""ggml's activation quantizers: the 8-bit blocks llama.cpp's CPU backend turns an activation row
into before every product with a quantized weight (ggml_compute_forward_mul_mat converts src1 to
the weight type's vec_dot_type first).

  Q8_0  32 values: d = f16(amax / 127), q = round(x * (127 / amax))        (Q4_0, Q5_0, Q8_0 weights)
  Q8_1  32 values: as Q8_0, plus s = f16(d * sum q) with the unrounded d   (Q4_1, Q5_1 weights)
  Q8_K  256 values: max = the value of largest |x|, iscale = -127 / max,
        q = min(127, round(iscale * x)), d = 1 / iscale (float32), bsums = sums of 16 q's (K-quants)

Each follows the code path llama-cpp-python's x86 build runs (ggml-cpu/arch/x86/quants.c):
quantize_row_q8_0 / q8_1 multiply by id = 127 / amax (not 1 / d, as quantize_row_q8_0_ref in
ggml-quants.c does) and round with _mm256_round_ps(_MM_ROUND_NEAREST), which rounds halves to
even (np.rint), where the reference's roundf rounds them away from zero. quantize_row_q8_K is
quantize_row_q8_K_ref, whose nearest_int (the 1.5 * 2^23 trick) also rounds halves to even.
All arithmetic is float32, one IEEE operation at a time (no fastmath: the roundings are the point).
"""
import math

import numpy as np
from numba import njit, prange

JIT = dict(cache=True, nogil=True)
F32_127 = np.float32(127.0)


@njit(**JIT)
def f16_round(v):
    """float32 v -> the nearest IEEE half (ties to even) as float32, as F16C's vcvtps2ph does.
    A half has 11 significant bits, so in the binade [2^(e-1), 2^e) its step is 2^(e-11); below
    2^-14 (subnormal halves) the step stays 2^-24. Scaling by powers of two is exact in float64."""
    if v == 0.0 or not math.isfinite(v):
        return np.float32(v)
    e = max(math.frexp(float(v))[1], -13)
    r = math.ldexp(np.rint(math.ldexp(float(v), 11 - e)), e - 11)
    if abs(r) > 65504.0:
        return np.float32(math.copysign(math.inf, v))
    return np.float32(r)


@njit(**JIT)
def _q8_block(x, o, n, qs, scale_id):
    """x[o:o+n] * scale_id rounded half-to-even into qs[o:o+n] -> sum of the q's"""
    s = 0
    for j in range(n):
        q = np.int32(np.rint(x[o + j] * scale_id))
        qs[o + j] = q
        s += q
    return s


F16_MIN_NORMAL = np.float32(2.0 ** -14)
F16_ROUND_UP = np.float32(65520.0)                  # from here up a half is infinite (65504 is the largest)


@njit(**JIT)
def f16_round_array(x, out):
    """f16_round of every x [n] float32 into out [n], through the bits (vectorizable; f16_round's
    frexp / ldexp are calls): normal halves keep 11 significant bits, so the float32's 13 low
    mantissa bits are rounded off (ties to even; a carry moves into the exponent as it should);
    below 2^-14 a half's step is 2^-24, the ulp of 0.5 in float32, so (x + 0.5) - 0.5 rounds
    there (the sign kept for zeros); from 65520 up the half is infinite; NaN and inf pass."""
    xb, ob = x.view(np.uint32), out.view(np.uint32)
    for i in range(xb.shape[0]):
        u = xb[i]
        ob[i] = (u + np.uint32(0x0FFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000)
    for i in range(x.shape[0]):
        v = x[i]
        a = abs(v)
        if a < F16_MIN_NORMAL:
            h = np.float32(0.5) if v >= 0 else np.float32(-0.5)
            out[i] = np.float32(math.copysign((v + h) - h, v))       # -1e-9 -> -0, as the half
        elif not a < F16_ROUND_UP:                                   # also NaN
            out[i] = v if not math.isfinite(v) else (np.float32(np.inf) if v > 0 else np.float32(-np.inf))


@njit(**JIT)
def _block_amax(x, out):
    """out[b] = max |x[32b : 32b + 32]| for a row x [n] float32, through the bits: with the sign
    bit cleared, non-negative floats order as their bits do, and an integer max vectorizes
    (a float max does not without fastmath)"""
    xb, ob = x.view(np.uint32), out.view(np.uint32)
    for b in range(out.shape[0]):
        m = np.uint32(0)
        for j in range(32):
            m = max(m, xb[b * 32 + j] & np.uint32(0x7FFFFFFF))
        ob[b] = m


@njit(**JIT)
def _q8_0_row(x, qs, d):
    """one row x [n] float32 -> qs [n] int8, d [n/32] float32 (the f16 block scales)"""
    nb = x.shape[0] // 32
    am, db = np.empty(nb, np.float32), np.empty(nb, np.float32)
    _block_amax(x, am)
    for b in range(nb):
        amax = am[b]
        db[b] = amax / F32_127
        _q8_block(x, b * 32, 32, qs, F32_127 / amax if amax != 0 else np.float32(0.0))
    f16_round_array(db, d)


@njit(parallel=True, **JIT)
def quantize_q8_0(x, qs, d):
    """x: [N, n] float32 -> qs: [N, n] int8, d: [N, n/32] float32 (the f16 block scales)"""
    for t in prange(x.shape[0]):
        _q8_0_row(x[t], qs[t], d[t])


@njit(**JIT)
def _q8_1_row(x, qs, d, s):
    """one row x [n] float32 -> qs [n] int8, d, s [n/32] float32 (f16 d and f16 d * sum q)"""
    nb = x.shape[0] // 32
    am, db, ds = np.empty(nb, np.float32), np.empty(nb, np.float32), np.empty(nb, np.float32)
    _block_amax(x, am)
    for b in range(nb):
        amax = am[b]
        db[b] = amax / F32_127                                         # float32, rounded to f16 only when stored
        total = _q8_block(x, b * 32, 32, qs, F32_127 / amax if amax != 0 else np.float32(0.0))
        ds[b] = db[b] * np.float32(total)
    f16_round_array(db, d)
    f16_round_array(ds, s)


@njit(parallel=True, **JIT)
def quantize_q8_1(x, qs, d, s):
    """x: [N, n] float32 -> qs: [N, n] int8, d, s: [N, n/32] float32 (f16 d and f16 d * sum q)"""
    for t in prange(x.shape[0]):
        _q8_1_row(x[t], qs[t], d[t], s[t])


@njit(parallel=True, **JIT)
def quantize_q8_k(x, qs, d, bsums):
    """x: [N, n] float32 -> qs: [N, n] int8, d: [N, n/256] float32, bsums: [N, n/16] int32"""
    for t in prange(x.shape[0]):
        for b in range(x.shape[1] // 256):
            o = b * 256
            amax, vmax = np.float32(0.0), np.float32(0.0)
            for j in range(256):                                       # the first value of largest |x| wins
                if abs(x[t, o + j]) > amax:
                    amax, vmax = abs(x[t, o + j]), x[t, o + j]
            if amax == 0:
                d[t, b] = 0.0
                for j in range(256):
                    qs[t, o + j] = 0
                for g in range(16):
                    bsums[t, b * 16 + g] = 0
                continue
            iscale = np.float32(-127.0) / vmax
            for j in range(256):
                qs[t, o + j] = min(127, np.int32(np.rint(iscale * x[t, o + j])))
            for g in range(16):
                acc = 0
                for j in range(16):
                    acc += np.int32(qs[t, o + g * 16 + j])
                bsums[t, b * 16 + g] = acc
            d[t, b] = np.float32(1.0) / iscale


class Q8Rows:
    """A batch of activation rows quantized for one vec_dot type (the src1 of ggml's mul_mat)."""

    def __init__(self, kind, x):
        """kind: "q8_0" | "q8_1" | "q8_k", x: [N, n] float32"""
        x = np.ascontiguousarray(x, np.float32)
        N, n = x.shape
        self.kind = kind
        self.qs = np.empty((N, n), np.int8)
        if kind == "q8_k":
            self.d = np.empty((N, n // 256), np.float32)
            self.e = np.empty((N, n // 16), np.int32)               # bsums
            quantize_q8_k(x, self.qs, self.d, self.e)
        else:
            self.d = np.empty((N, n // 32), np.float32)
            # q8_1: s = d * sum(q) per block; q8_0 has none (zeros, so no product can read garbage)
            self.e = (np.empty if kind == "q8_1" else np.zeros)((N, n // 32), np.float32)
            # one row (a decode step) without a parallel region: starting one per product cost
            # more than the row's quantization on two threads
            if kind == "q8_1":
                (_q8_1_row(x[0], self.qs[0], self.d[0], self.e[0]) if N == 1 else
                 quantize_q8_1(x, self.qs, self.d, self.e))
            elif N == 1:
                _q8_0_row(x[0], self.qs[0], self.d[0])
            else:
                quantize_q8_0(x, self.qs, self.d)

    def dequantize(self):
        """-> [N, n] float32: what the blocks stand for (q * d), for tests and error analysis"""
        blk = 256 if self.kind == "q8_k" else 32
        N, n = self.qs.shape
        return (self.qs.reshape(N, n // blk, blk) * self.d[:, :, None]).reshape(N, n).astype(np.float32)
