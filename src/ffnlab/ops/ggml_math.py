"""The pointwise and reduction ops as llama.cpp's CPU backend computes them (ggml-cpu), on the code
path of this CPU (quant/ggml_path.py: "avx512", "avx2" or "scalar"; the kernels whose float order
depends on it take `lanes`, the float32 lanes of one vector: 16, 8, or 1 for a scalar build).

  v_expf      ggml_v_expf (vec.h): ARM's optimized-routines exp, a degree-5 polynomial after a
              range reduction by ln 2, FMAs throughout; within ~1.5 ulp of exp, not correctly
              rounded. AVX2: exp(b) - 1 and 2^n from its exponent bits; AVX-512: exp(b) and
              vscalefps; a scalar build (and a tail past whole vectors): libm's expf
  silu        ggml_v_silu (vec.h): x / (1 + v_expf(-x)); SwiGLU (ggml_vec_swiglu_f32) is silu(x) * g
  gelu        ggml_vec_gelu_f32 with GGML_GELU_FP16 (vec.h): |x| < 10 reads a 65536-entry table of
              f16(gelu_tanh(h)) at h = f16(x); x <= -10 gives 0, x >= 10 gives x. GeGLU: the same times g
  soft_max    ggml_compute_forward_soft_max_f32 (ops.cpp): w = x * scale + mask, max, y = v_expf(w - max)
              one vector at a time, each vector's float32 sum (hsum) added to a float64 total
              (ggml_vec_soft_max_f32), y *= (float)(1 / total)
  rms_norm    ggml_compute_forward_rms_norm_f32 (ops.cpp): float32 squares added one by one in
              float64, mean = (float)(sum / n), scale = 1.0f / sqrtf(mean + eps), y = x * scale (then * w)
  layer_norm  ggml_compute_forward_norm_f32: the mean from a float64 sum rounded to float32 and
              divided in float32; the variance as ggml_vec_cvar_f32 (per-vector float32 sums of the
              squared deviations added in float64)
  rope_angles ggml_rope_cache_init (ops.cpp): theta_scale = powf(base, -2/n_dims) in float32 and
              theta multiplied by it once per pair, in float32: the angle of pair i at position p is
              p * theta_scale^i with i float32 roundings (not the float64 angle), then libm's cosf /
              sinf (which are not always correctly rounded: 1 ulp off for some angles)
  rope        rotate_pairs (ops.cpp): x0 cos - x1 sin, x0 sin + x1 cos with the compiler's FMA
              contraction (the first product fused), which llama.cpp's build does
  f16_matmul  KQ and KQV: llamafile's tinyBLAS<lanes> for 2+ tokens where sgemm.cpp takes them,
              ggml_vec_dot_f16 (4 vectors per step, a float64 tail) otherwise
  to_f16      ggml_cpu_fp32_to_fp16 (F16C, round to nearest even): the K/V cache, and the float32
              operand of an f16 product (mul_mat's vec_dot_type for F16 is F16)
"""
import math

import numpy as np
from numba import njit, prange

from ..quant import ggml_path
from ..quant.ggml_quants import f16_round_array
from .activations import GELU_TANH_COEF, SQRT_2_OVER_PI

JIT = dict(cache=True, nogil=True, fastmath=False)   # no fastmath: the roundings are ggml's, also when
# a fastmath kernel calls these helpers first (tests/unit/test_numba_flags.py says why)


@njit(**JIT)
def _fma(a, b, c):
    """float32 fused multiply-add: the product of two float32 values is exact in float64"""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


# ggml_v_expf's constants, as the hex floats of vec.h
EXP_R = np.float32(float.fromhex("0x1.8p23"))         # adding it rounds to an integer
LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
LN2_HI = np.float32(float.fromhex("0x1.62e4p-1"))     # ln 2 in two parts, for an exact x - n ln 2
LN2_LO = np.float32(float.fromhex("0x1.7f7d1cp-20"))
C5, C4, C3, C2, C1 = (np.float32(float.fromhex(h)) for h in
                      ("0x1.0e4020p-7", "0x1.573e2ep-5", "0x1.555e66p-3", "0x1.fffdb6p-2", "0x1.ffffecp-1"))


@njit(**JIT)
def _expf1(x):
    """ggml_v_expf for one lane (vec.h, the __AVX2__ && __FMA__ version). 2^n is built there by
    shifting n into a float's exponent field; math.ldexp gives the same powers of two."""
    z = _fma(x, LOG2E, EXP_R)
    n = z - EXP_R                                                  # round(x / ln 2), as a float
    b = _fma(-n, LN2_LO, _fma(-n, LN2_HI, x))                      # x - n ln 2
    u = b * b
    j = _fma(_fma(_fma(C5, b, C4), u, _fma(C3, b, C2)), u, C1 * b)  # exp(b) - 1
    if not abs(n) > 126:
        k = np.float32(math.ldexp(1.0, int(n)))
        return _fma(j, k, k)
    # |n| > 126: 2^n split in two factors so that neither overflows nor underflows on its own
    s1 = np.float32(math.ldexp(1.0, -125 if n <= 0 else 127))
    if abs(n) > 192:                                               # -inf (a masked score) lands here: 0
        return s1 * s1
    s2 = np.float32(math.ldexp(1.0, int(n) + 125 if n <= 0 else int(n) - 127))
    return _fma(s2, j, s2) * s1


@njit(**JIT)
def _expf_vec(x, y, nb, kb):
    """y[i] = _expf1(x[i]) for a row, in loops LLVM vectorizes: no calls, no branches (2^n built
    from its bits, the |n| > 192 results selected), then the rare 126 < |n| <= 192 redone one by
    one. nb [len], kb [len] int32: scratch."""
    for i in range(x.shape[0]):
        xi = x[i]
        n = _fma(xi, LOG2E, EXP_R) - EXP_R
        b = _fma(-n, LN2_LO, _fma(-n, LN2_HI, xi))
        u = b * b
        y[i] = _fma(_fma(_fma(C5, b, C4), u, _fma(C3, b, C2)), u, C1 * b)
        nb[i] = n
        kb[i] = (np.int32(min(max(n, np.float32(-126.0)), np.float32(126.0))) + 127) << 23   # the bits of 2^n
    k = kb.view(np.float32)
    zero, inf = np.float32(0.0), np.float32(np.inf)
    for i in range(x.shape[0]):
        v = _fma(y[i], k[i], k[i])
        y[i] = zero if nb[i] < -192 else (inf if nb[i] > 192 else v)   # _expf1's s1 * s1: 2^-250 -> 0, 2^254 -> inf
    for i in range(x.shape[0]):
        a = abs(nb[i])
        if a > 126 and a <= 192:
            y[i] = _expf1(x[i])


@njit(**JIT)
def _expf512_vec(x, y, kb):
    """ggml_v_expf's __AVX512F__ && __AVX512DQ__ version (vec.h) of each x[i]: the same range
    reduction, but the polynomial keeps its 1 (j = exp(b), not exp(b) - 1) and 2^n is applied by
    vscalefps, one multiplication rounded once (also into the subnormals); |n| > 192 gives 0 or
    inf. j 2^n is exact in float64 for |n| <= 192, so its one rounding to float32 is vscalefps'.
    kb [len] int64: scratch for the float64 bits of 2^n."""
    one = np.float32(1.0)
    for i in range(x.shape[0]):
        xi = x[i]
        n = _fma(xi, LOG2E, EXP_R) - EXP_R
        b = _fma(-n, LN2_LO, _fma(-n, LN2_HI, xi))
        u = b * b
        y[i] = _fma(_fma(_fma(C5, b, C4), u, _fma(C3, b, C2)), u, _fma(C1, b, one))
        kb[i] = (np.int64(min(max(n, np.float32(-193.0)), np.float32(193.0))) + 1023) << 52
    k = kb.view(np.float64)
    for i in range(x.shape[0]):
        v = np.float32(np.float64(y[i]) * k[i])
        y[i] = np.float32(0.0) if k[i] < 2.0 ** -192 else (np.float32(np.inf) if k[i] > 2.0 ** 192 else v)


@njit(**JIT)
def _expf_row(x, y, lanes, scratch):
    """y = ggml_v_expf(x) as ggml's `lanes`-wide loops compute it: 16 -> the AVX-512 expf,
    8 -> the AVX2 one; 1 (a scalar build) -> libm's expf (numba's math.exp of a float32).
    scratch: int32 [>= 2 len(x)] (a row's allocations cost more than its exps)"""
    n = x.shape[0]
    if lanes == 16:
        _expf512_vec(x, y, scratch[:2 * n].view(np.int64))
    elif lanes == 8:
        _expf_vec(x, y, scratch[:n].view(np.float32), scratch[n:2 * n])
    else:
        for i in range(n):
            y[i] = math.exp(x[i])


@njit(parallel=True, **JIT)
def _expf_rows(x, y, lanes):
    for i in prange(x.shape[0]):
        _expf_row(x[i], y[i], lanes, np.empty(2 * x.shape[1], np.int32))


def v_expf(x, lanes=None):
    """float32 array -> ggml_v_expf of each element, on ggml path `lanes` (16, 8, 1; default:
    this machine's, quant/ggml_path.py)"""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    _expf_rows(x.reshape(-1, x.shape[-1] if x.ndim else 1), y.reshape(-1, x.shape[-1] if x.ndim else 1),
               ggml_path.LANES[ggml_path.PATH] if lanes is None else lanes)
    return y


@njit(parallel=True, **JIT)
def _silu_rows(x, y, lanes):
    for i in prange(x.shape[0]):
        _silu_row(x[i], y[i], lanes, np.empty(3 * x.shape[1], np.int32))


@njit(**JIT)
def _silu_row(x, y, lanes, scratch):
    """ggml_vec_silu_f32: x / (1 + v_expf(-x)) over whole vectors of `lanes`, the tail (and a
    scalar build) as ggml_silu_f32, x / (1 + expf(-x)) with libm's expf. scratch: int32 [3 n]"""
    one = np.float32(1.0)
    n = x.shape[0]
    body = n - n % lanes if lanes > 1 else 0
    neg = scratch[2 * n:3 * n].view(np.float32)
    for j in range(n):
        neg[j] = np.float32(0.0) - x[j]                          # _mm512_sub_ps(zero, x); AVX2 negates: exp(+-0) = 1 either way
    _expf_row(neg[:body], y[:body], lanes, scratch)
    for j in range(body, n):
        y[j] = math.exp(neg[j])
    for j in range(n):
        y[j] = x[j] / (one + y[j])


def silu(x):
    """x / (1 + v_expf(-x)), float32 (ggml_v_silu; SwiGLU multiplies it by up afterwards)"""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    rows, n, lanes = x.reshape(-1, x.shape[-1]), x.shape[-1], ggml_path.LANES[ggml_path.PATH]
    if rows.shape[0] == 1:              # a decode step: no parallel region (its start costs more than one row)
        _silu_row(rows[0], y.reshape(-1), lanes, np.empty(3 * n, np.int32))
    else:
        _silu_rows(rows, y.reshape(-1, n), lanes)
    return y


@njit(**JIT)
def _gelu_f32(h, out):
    """ggml_gelu_f32 (vec.h) of each half h, in float32 as llama.cpp's build compiles it: the
    compiler fuses 1 + (GELU_COEF_A x) x into one FMA; tanhf is libm's (numba's math.tanh)"""
    a, c = np.float32(GELU_TANH_COEF), np.float32(SQRT_2_OVER_PI)
    for i in range(h.shape[0]):
        x = h[i]
        v = _fma(a * x, x, np.float32(1.0))
        out[i] = (np.float32(0.5) * x) * (np.float32(1.0) + math.tanh((c * x) * v))


def _gelu_table():
    """ggml_table_gelu_f16 (ggml-cpu.c, ggml_cpu_init): f16(ggml_gelu_f32(h)) for every half h"""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    g = np.empty_like(h)
    with np.errstate(all="ignore"):
        _gelu_f32(h, g)
        return g.astype(np.float16).astype(np.float32)


GELU_TABLE = _gelu_table()


def gelu(x):
    """ggml_vec_gelu_f32 with GGML_GELU_FP16: the f16 table between -10 and 10"""
    x = np.asarray(x, np.float32)
    with np.errstate(over="ignore"):                             # |x| >= 65520 -> inf index: masked below
        t = GELU_TABLE[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10.0, np.float32(0.0), np.where(x >= 10.0, x, t)).astype(np.float32)


@njit(**JIT)
def _lane(v, i):
    """v[i], or 0 past the row's end (a padded, masked column: llama.cpp's rows are n_kv long)"""
    return v[i] if i < v.shape[0] else np.float32(0.0)


@njit(**JIT)
def _hsum8(v, o):
    """the 8 lanes v[o:o+8] summed as ggml's AVX2 code does (hsum_float_8, the softmax's and
    tinyBLAS's hsum(__m256)): ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))"""
    a0, a1 = _lane(v, o) + _lane(v, o + 4), _lane(v, o + 1) + _lane(v, o + 5)
    a2, a3 = _lane(v, o + 2) + _lane(v, o + 6), _lane(v, o + 3) + _lane(v, o + 7)
    return (a0 + a2) + (a1 + a3)


@njit(**JIT)
def _hsum16(v, o):
    """the 16 lanes v[o:o+16] summed as GCC's _mm512_reduce_add_ps: the upper 256 bits added to
    the lower (t_i = l_i + l_{8+i}), then t's 8 lanes as _hsum8 pairs them"""
    t0, t1 = _lane(v, o) + _lane(v, o + 8), _lane(v, o + 1) + _lane(v, o + 9)
    t2, t3 = _lane(v, o + 2) + _lane(v, o + 10), _lane(v, o + 3) + _lane(v, o + 11)
    t4, t5 = _lane(v, o + 4) + _lane(v, o + 12), _lane(v, o + 5) + _lane(v, o + 13)
    t6, t7 = _lane(v, o + 6) + _lane(v, o + 14), _lane(v, o + 7) + _lane(v, o + 15)
    return ((t0 + t4) + (t2 + t6)) + ((t1 + t5) + (t3 + t7))


@njit(**JIT)
def hsum(v, o, lanes):
    """one vector register's lanes v[o:o+lanes] summed as ggml's reduction for that width"""
    if lanes == 16:
        return _hsum16(v, o)
    if lanes == 8:
        return _hsum8(v, o)
    return _lane(v, o)


@njit(parallel=True, **JIT)
def _soft_max_rows(w, y, lanes):
    """w: [R, S] scaled and masked scores -> y: [R, S] (ggml_vec_soft_max_f32 + the final scale),
    in blocks of 64 rows sharing one scratch"""
    R = w.shape[0]
    for blk in prange((R + 63) // 64):
        scratch = np.empty(3 * w.shape[1], np.int32)
        for i in range(blk * 64, min(R, blk * 64 + 64)):
            _soft_max_row(w[i], y[i], lanes, scratch)


@njit(**JIT)
def _soft_max_row(row, y, lanes, scratch):
    """ggml_vec_soft_max_f32: y = v_expf(row - max) one vector of `lanes` at a time, each
    vector's sum (hsum) added to a float64 total; a scalar build adds each expf(row - max).
    scratch: int32 [>= 3 len(row)]"""
    n = row.shape[0]
    mx = np.float32(-np.inf)
    for j in range(n):
        mx = max(mx, row[j])
    shifted = scratch[2 * n:3 * n].view(np.float32)
    for j in range(n):
        shifted[j] = row[j] - mx
    _expf_row(shifted, y, lanes, scratch)
    total = 0.0
    for j0 in range(0, row.shape[0], lanes):
        total += np.float64(hsum(y, j0, lanes))
    inv = np.float32(1.0 / total)
    for j in range(row.shape[0]):
        y[j] *= inv


def soft_max(kq, scale, allowed):
    """kq: [..., T, S] raw scores, allowed: [T, S] bool or None -> probs [..., T, S] float32.
    The masked scores are -inf, so their exp is 0 wherever they fall in the vector groups: ggml's
    KV cache is padded with such columns to n_kv (a multiple of 256), so its rows split into
    whole vectors from 0 and no row has a scalar tail."""
    w = np.multiply(kq, np.float32(scale), dtype=np.float32)
    if allowed is not None:
        np.copyto(w, np.float32(-np.inf), where=~allowed)
    y = np.empty_like(w)
    _soft_max_rows(np.ascontiguousarray(w).reshape(-1, w.shape[-1]), y.reshape(-1, w.shape[-1]),
                   ggml_path.LANES[ggml_path.PATH])
    return y


@njit(**JIT)
def _sum_squares_row(x):
    """the float32 squares of x [n] added one by one in float64, as
    ggml_compute_forward_rms_norm_f32's `sum += (ggml_float)(x[i00] * x[i00])` (no SIMD there)"""
    s = 0.0
    for i in range(x.shape[0]):
        s += np.float64(x[i] * x[i])
    return s


@njit(parallel=True, **JIT)
def _sum_squares(x, out):
    """out[r] = _sum_squares_row(x[r])"""
    for r in prange(x.shape[0]):
        out[r] = _sum_squares_row(x[r])


@njit(**JIT)
def _sum_squares_serial(x, out):
    """_sum_squares without a parallel region (one row: a decode step)"""
    for r in range(x.shape[0]):
        out[r] = _sum_squares_row(x[r])


def rms_norm(x, w, eps):
    """x: [..., D], w: [D] or None -> y, cache (x_hat, scale) as ops/norms.py's rmsnorm_forward"""
    x = np.ascontiguousarray(x, np.float32)
    total = np.empty(x.shape[:-1] + (1,), np.float64)
    rows = x.reshape(-1, x.shape[-1])
    (_sum_squares_serial if rows.shape[0] == 1 else _sum_squares)(rows, total.reshape(-1))
    mean = (total / x.shape[-1]).astype(np.float32)                 # (float)(sum / n)
    scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
    x_hat = x * scale
    return (x_hat * w if w is not None else x_hat), (x_hat, scale)


@njit(parallel=True, **JIT)
def _norm_stats(x, lanes, mean, var):
    """ggml_compute_forward_norm_f32's statistics of each row x[r]: mean = (float)(the float64 sum
    of x, one by one) / n in float32 (ggml_vec_sum_f32); var = ggml_vec_cvar_f32: the deviations'
    float32 squares summed per vector of `lanes` (hsum) into a float64 total, the tail (and a
    scalar build) one by one, / n"""
    R, n = x.shape
    for r in prange(R):
        s = 0.0
        for i in range(n):
            s += np.float64(x[r, i])
        m = np.float32(s) / np.float32(n)
        sq = np.empty(n, np.float32)
        for i in range(n):
            d = x[r, i] - m
            sq[i] = d * d
        body = n - n % lanes if lanes > 1 else 0
        total = 0.0
        for j0 in range(0, body, lanes):
            total += np.float64(hsum(sq, j0, lanes))
        for i in range(body, n):
            total += np.float64(sq[i])
        mean[r], var[r] = m, np.float32(total / n)


def layer_norm(x, w, b, eps):
    """x: [..., D] -> y, cache (x_hat, scale), as layernorm_forward"""
    x = np.ascontiguousarray(x, np.float32)
    mean = np.empty(x.shape[:-1] + (1,), np.float32)
    var = np.empty_like(mean)
    _norm_stats(x.reshape(-1, x.shape[-1]), ggml_path.LANES[ggml_path.PATH], mean.reshape(-1), var.reshape(-1))
    scale = np.float32(1.0) / np.sqrt(var + np.float32(eps))
    x_hat = (x - mean) * scale
    y = x_hat * w
    if b is not None:
        y += b
    return y, (x_hat, scale)


@njit(**JIT)
def _rope_cache(pos, theta_scale, freq_scale, ff, cos, sin):
    for t in range(pos.shape[0]):
        theta = np.float32(pos[t])
        for i in range(cos.shape[1]):
            a = freq_scale * (theta / ff[i])                         # rope_yarn(theta / ff, ...), ext_factor 0
            cos[t, i] = math.cos(a)                                 # float32 in, float32 out: libm's cosf
            sin[t, i] = math.sin(a)
            theta = theta * theta_scale


def rope_angles(pos, head_dim, theta, scale=1.0, freq_factors=()):
    """pos: [T] -> cos, sin: [T, head_dim/2] float32, as ggml_rope_cache_init builds them
    (head_dim: the rotated dims, n_rot; freq_factors: rope_freqs.weight's divisors, () for none)"""
    theta_scale = np.float32(np.float32(theta) ** np.float32(-2.0 / head_dim))   # powf(base, -2.0f/n_dims)
    cos = np.empty((len(pos), head_dim // 2), np.float32)
    sin = np.empty_like(cos)
    ff = np.asarray(freq_factors, np.float32) if len(freq_factors) else np.ones(head_dim // 2, np.float32)
    _rope_cache(np.asarray(pos, np.float32), theta_scale, np.float32(1.0 / scale), ff, cos, sin)
    return cos, sin


@njit(parallel=True, **JIT)
def _rope_rows(x, cos, sin, neox, out):
    """x, out [L, T, H, hd], cos / sin [T, n_rot/2]: out's first n_rot dims rotated in pairs
    (neox: j and j + n_rot/2; else 2j and 2j + 1), in float64 with the one rounding of each
    second product to float32 that the fused first product leaves"""
    L, T, H, _ = x.shape
    half = cos.shape[1]
    for lt in prange(L * T):
        l, t = lt // T, lt % T
        for h in range(H):
            for j in range(half):
                i0, i1 = (j, j + half) if neox else (2 * j, 2 * j + 1)
                x0, x1 = np.float64(x[l, t, h, i0]), np.float64(x[l, t, h, i1])
                c, s = np.float64(cos[t, j]), np.float64(sin[t, j])
                out[l, t, h, i0] = np.float32(x0 * c - np.float64(np.float32(x1 * s)))   # fma(x0, cos, -(x1 sin))
                out[l, t, h, i1] = np.float32(x0 * s + np.float64(np.float32(x1 * c)))   # fma(x0, sin, x1 cos)


def rope(x, cos, sin, pairing="normal"):
    """x: [..., T, H, hd], cos/sin: [T, hd/2] -> rotated x, as rotate_pairs (ops.cpp) compiles:
    x0 cos - x1 sin and x0 sin + x1 cos, each with its first product fused into the add
    (a product of two float32 values is exact in float64). With fewer rotated dims than hd
    (partial rotary) the tail passes through."""
    x = np.ascontiguousarray(x, np.float32)
    out = x.copy()
    T, H, hd = x.shape[-3:]
    _rope_rows(x.reshape(-1, T, H, hd), np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32),
               pairing != "normal", out.reshape(-1, T, H, hd))
    return out


# the f16 products: acc = a * b + acc is their only multiply-add, and `contract` lets LLVM emit it
# as the FMA instruction tinyBLAS and ggml_vec_dot_f16 use (nothing else fused or reordered)
F16_DOT = dict(cache=True, nogil=True, fastmath={"contract"})


@njit(**F16_DOT)
def vec_dot_f16(a, b, lanes, acc):
    """ggml_vec_dot_f16 (vec.cpp) of a [K], b [K] (f16 values in float32), on the path of `lanes`:
    four accumulators of `lanes` floats over each step of 4 x lanes k's (accumulator j takes
    k = step + j lanes + lane, one FMA each), added (0+2, 1+3, then 0+1: GGML_F32xN_REDUCE)
    and reduced to one float (AVX2: (l0+l4)+(l1+l5) + (l2+l6)+(l3+l7), two hadds; AVX-512:
    _mm512_reduce_add_ps); the K mod (4 lanes) k's left over are added in float64, as is every
    product on a scalar build (lanes 1). The product of two halves is exact in float32.
    acc [>= 4 lanes] float32: scratch."""
    K = a.shape[0]
    step = 4 * lanes
    body = K - K % step if lanes > 1 else 0
    total = 0.0
    if body:
        acc[:step] = 0
        for k0 in range(0, body, step):
            for t in range(step):
                acc[t] = a[k0 + t] * b[k0 + t] + acc[t]
        for t in range(lanes):                                      # in place: reads only lanes >= t
            acc[t] = (acc[t] + acc[2 * lanes + t]) + (acc[lanes + t] + acc[3 * lanes + t])
        if lanes == 8:
            r = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
        else:
            r = _hsum16(acc, 0)
        total = np.float64(r)
    for k in range(body, K):
        total += np.float64(a[k]) * np.float64(b[k])
    return np.float32(total)


@njit(parallel=True, **F16_DOT)
def _f16_vec_dots(a, b, c, lanes):
    """c[g, n, m] = vec_dot_f16(a[g, m], b[g, n]): a [G, M, K], b [G, N, K] -> c [G, N, M]"""
    G, M, K = a.shape
    N = b.shape[1]
    for task in prange(G * N):
        g, n = task // N, task % N
        acc = np.empty(64, np.float32)
        for m in range(M):
            c[g, n, m] = vec_dot_f16(a[g, m], b[g, n], lanes, acc)


@njit(parallel=True, **F16_DOT)
def _f16_gemm_t(at, b, c, lanes):
    """llamafile's tinyBLAS<lanes, __m256 | __m512> (sgemm.cpp) vectorized over M: at [G, K, M]
    (a transposed), b [G, N, K] -> c [G, N, M]. Output (n, m) has `lanes` accumulators, lane l
    taking the products k = l mod lanes with one FMA each, in k order (the tile shapes change
    which outputs are computed together, not this order); then hsum of the lanes."""
    G, K, M = at.shape
    N = b.shape[1]
    for task in prange(G * N):
        g, n = task // N, task % N
        _f16_gemm_t_row(at[g], b[g, n], c[g, n], lanes)


@njit(**F16_DOT)
def _f16_gemm_t_row(at, bn, cn, lanes):
    """one (g, n): the lanes of all M outputs side by side, acc [lanes, M], and their hsum done
    row against row (vectorized over M), in hsum's pairing: AVX-512 first adds the upper 8
    lanes to the lower 8 (_mm512_reduce_add_ps), then hsum(__m256) adds lane i + 4 to lane i
    and sums (0 + 2) + (1 + 3)"""
    K, M = at.shape
    acc = np.zeros((lanes, M), np.float32)
    for k in range(K):
        l, bk = k % lanes, bn[k]
        for m in range(M):
            acc[l, m] = at[k, m] * bk + acc[l, m]
    if lanes == 16:
        for i in range(8):
            for m in range(M):
                acc[i, m] = acc[i, m] + acc[8 + i, m]
    for i in range(4):
        for m in range(M):
            acc[i, m] = acc[i, m] + acc[4 + i, m]
    for m in range(M):
        cn[m] = (acc[0, m] + acc[2, m]) + (acc[1, m] + acc[3, m])


def tinyblas_takes(path, M, N, K):
    """whether llamafile_sgemm computes an f16 x f16 product of M x K by N x K on `path`: not on a
    scalar build, not for one column (n < 2: prompt processing only), K a multiple of the lanes
    (tinyBLAS::matmul's k % KN) and M of 4 (its smallest tile row count)"""
    lanes = ggml_path.LANES[path]
    return lanes > 1 and N >= 2 and K % lanes == 0 and M % 4 == 0


def f16_matmul(a, b, tokens=2, cells=None):
    """a: [..., M, K] (the f16 operand: K or V^T), b: [..., N, K] (rounded to f16 here, as mul_mat
    converts src1 to the vec_dot_type F16) -> [..., N, M] float32, on this machine's ggml path.
    tokens: the product's src1 rows per head in ggml (tinyblas_takes' N). cells: the axis that
    runs over KV cells, "m" (KQ: K's rows) or "k" (KQV: V^T's columns), None for neither.
    llama.cpp's n_kv is a multiple of 256 and the cells past the attended ones have probability 0,
    so along "k" the operands are padded with zeros to a multiple of 64 (every path's step; a zero
    product adds nothing to a lane), and along "m" tinyBLAS sees a multiple of 256 rows."""
    path = ggml_path.PATH
    lanes = ggml_path.LANES[path]
    lead, (M, K), N = a.shape[:-2], a.shape[-2:], b.shape[-2]
    pad = -K % 64 if cells == "k" else 0
    a2 = np.zeros((int(np.prod(lead, dtype=np.int64)), M, K + pad), np.float32)
    b2 = np.zeros((a2.shape[0], N, K + pad), np.float32)
    a2[:, :, :K] = to_f16(a).reshape(-1, M, K)
    b2[:, :, :K] = to_f16(b).reshape(-1, N, K)
    c = np.empty((a2.shape[0], N, M), np.float32)
    if tinyblas_takes(path, M + (-M % 256 if cells == "m" else 0), tokens, K + pad):
        _f16_gemm_t(np.ascontiguousarray(a2.transpose(0, 2, 1)), b2, c, lanes)
    else:
        _f16_vec_dots(a2, b2, c, lanes)
    return c.reshape(*lead, N, M)


def to_f16(x):
    """float32 values rounded to the nearest half (ties to even, as F16C's vcvtps2ph), kept as
    float32: NumPy's astype(float16) and back, in compiled passes (~2.5x faster)"""
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty_like(x)
    f16_round_array(x.reshape(-1), out.reshape(-1))
    return out
