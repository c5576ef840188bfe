"""Compiled pieces of the one-token decoding step (model/decode.py).

Once the weights stream through the quantized kernels at ~10 G weights/s, SmolLM2's products
take ~15 ms of a token and the NumPy calls between them ~7 ms: RoPE, the cache writes, the
attention scores, softmax and the weighted sum are a dozen calls per layer on vectors of 64
numbers, each costing more to dispatch than to compute. Here each of those runs of small calls
is one compiled function. model/attention.py calls the same kernels for a one-token forward and
for a prompt with nothing hooked, so the step and forward() agree bit for bit; fastmath lets LLVM
reorder the sums inside a kernel, which moves results by float32 rounding against the NumPy ops
of a hooked forward (tests/engines/test_generation.py bounds that).
"""
import numpy as np
from numba import njit, prange

from ..ops.fastmath import _qk_serial, _sum_squares, exp32
from ..quant.gemm import STRIP, empty_lines, gemm_prefix, gemm_strips

# error_model "numpy": a division by zero gives inf or nan, as the NumPy path does (numba's default
# raises ZeroDivisionError, e.g. on a model whose weights hold infinities)
FAST = dict(cache=True, nogil=True, fastmath=True, error_model="numpy")


@njit(cache=True, nogil=True, fastmath=False, error_model="numpy")
def rms_norm1(x, w, eps):
    """x [D] / sqrt(mean(x^2) + eps) * w  (RMSNorm of one vector), rounded as the prompt's RMSNorm
    (ops/fastmath.py _rms_norm_row): the same float64 sum of squares (_sum_squares, the one step
    that may be reassociated), the mean square rounded to x's type before + eps, then each product
    rounded once. So the one-token step normalizes to the batched forward's bits, and a mean square
    past float32's range is inf there too (1/rms = 0, as in torch and ggml), not a finite float64."""
    f = x.dtype.type                                               # float32 (float64 models: float64)
    r = f(1.0) / np.sqrt(f(_sum_squares(x) / x.shape[0]) + f(eps))
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = x[i] * r * w[i]
    return out


ATTEND = dict(cache=True, nogil=True, fastmath={"reassoc", "contract", "nsz"}, error_model="numpy")
QUERY_PART = 10                  # query positions per work item (x the group's heads: Gemma 3's 4 -> 40 rows)


@njit(parallel=True, **ATTEND)
def attend_rows(q, K, V, p0, window, scale, out, wide):
    """A prompt's attention over a KV cache, every query at once (model/attention.py's f32 path with
    nothing hooked): q [B, T, H, hd] as attended (normed, rotated, Gemma's scale applied), K, V
    [B, Hkv, n_ctx, hd] holding the prompt's k and v already; the query at position p0 + t attends
    to keys lo..p0 + t (lo = p0 + t - window + 1 with a sliding window, else 0) -> out [B, T, H, hd].
    As ops/attention.py: scores (q . k) * scale, softmax less the row's max (e^ by exp32, the sum in
    float64), the probabilities' weighted sum of v; a masked key gets probability 0, as e^-inf.
    Both products are quant/gemm.py's register tiles (the scores q K^T over K laid out as strips
    of 16 keys, the sum P V over V as strips of 16 dimensions). Each KV head's strips are laid out
    once; then each (KV head, run of QUERY_PART positions) is one work item: the group's query heads
    at those positions are the rows of one product (Gemma 3: 4 heads x 10 positions, 40 rows, where
    one head's 20 positions ran 1.6x slower), its scores computed for the keys up to its last
    position only; the items alternate late and early runs (_zigzag), so the equal shares of
    items numba's threads take cost about the same. hd must be a multiple of 16
    (model/attention.py checks). wide: quant/gemm.py's 512-bit tiles (pass quant.simd.HAS_AVX512)."""
    B, T, H, hd = q.shape
    Hkv = K.shape[1]
    group = H // Hkv
    S = p0 + T
    Sp = -(-S // STRIP) * STRIP
    nk, nv = Sp // STRIP, hd // STRIP
    ks = empty_lines((B * Hkv, nk, hd, STRIP))                       # K as strips of 16 keys (zeros past S)
    vs = empty_lines((B * Hkv, nv, Sp, STRIP))                       # V^T as strips of 16 dimensions
    for item in prange(B * Hkv * (nk + nv)):                          # one strip an item: Gemma has one KV head
        bk, r = item // (nk + nv), item % (nk + nv)
        b, kv = bk // Hkv, bk % Hkv
        if r < nk:                                                    # keys 16r..16r+15
            for d in range(hd):
                for c in range(STRIP):
                    j = r * STRIP + c
                    ks[bk, r, d, c] = K[b, kv, j, d] if j < S else np.float32(0.0)
        else:                                                         # dimensions 16(r - nk)..
            d0 = (r - nk) * STRIP
            for j in range(Sp):
                for c in range(STRIP):
                    vs[bk, r - nk, j, c] = V[b, kv, j, d0 + c] if j < S else np.float32(0.0)
    parts = -(-T // QUERY_PART)
    for i in prange(B * Hkv * parts):
        bk, c = i // parts, _zigzag(i % parts, parts)
        b, h0 = bk // Hkv, (bk % Hkv) * group
        t0, t1 = c * QUERY_PART, min(T, (c + 1) * QUERY_PART)
        n_keys = -(-(p0 + t1) // STRIP) * STRIP                   # keys past the last position's: masked
        rows = (t1 - t0) * group                                  # row (t - t0) * group + g: head h0 + g at t
        if Hkv == 1:                                              # every head: the rows lie in q as they are
            qr = q[b, t0:t1].reshape((rows, hd))
            o = out[b, t0:t1].reshape((rows, hd))
        else:
            qr = np.empty((rows, hd), np.float32)
            for t in range(t0, t1):
                qr[(t - t0) * group:(t - t0 + 1) * group] = q[b, t, h0:h0 + group]
            o = empty_lines((rows, hd))
        p = empty_lines((rows, n_keys))
        gemm_strips(ks[bk, :n_keys // STRIP], qr, p, 0, 0, -1, wide)   # raw scores q . k
        probs = np.zeros((rows, Sp), np.float32)
        for r in range(rows):
            pos = p0 + t0 + r // group
            _softmax_row(p[r], probs[r], max(0, pos - window + 1) if window > 0 else 0, pos, scale)
        gemm_prefix(vs[bk], probs, o, n_keys, wide)              # the probabilities' sum of v, keys < n_keys
        if Hkv > 1:
            for t in range(t0, t1):
                out[b, t, h0:h0 + group] = o[(t - t0) * group:(t - t0 + 1) * group]


@njit(**ATTEND)
def _zigzag(i, n):
    """0, 1, 2, 3, .. -> n-1, 0, n-2, 1, ..: a run of positions with many keys, then one with few"""
    return n - 1 - i // 2 if i % 2 == 0 else i // 2


@njit(**ATTEND)
def _softmax_row(row, pr, lo, hi, scale):
    """pr[:n] = softmax of row[j] * scale over keys lo..hi (inclusive), 0 elsewhere; n = len(row),
    a multiple of 16. Every loop runs over the whole row, a masked key as -inf (e^-inf = 0), so
    each vectorizes with no remainder; e^ and the float64 sum are separate loops (together, the
    sum's doubles held e^ to 4 lanes). 2.3x faster than loops over lo..hi alone (Gemma 3's rows)."""
    n = row.shape[0]
    ninf = np.float32(-np.inf)
    top = ninf
    for j in range(n):
        v = row[j] * scale if lo <= j and j <= hi else ninf
        row[j] = v
        top = v if v > top else top
    for j in range(n):
        row[j] = exp32(row[j] - top)
    total = 0.0
    for j in range(n):
        total += row[j]
    norm = np.float32(total)
    for j in range(n):
        pr[j] = row[j] / norm


@njit(**FAST)
def attend_one(q, K, V, n, lo, scale, softcap, out):
    """One query position's attention over a KV cache: q [H, hd] as attended (normed, rotated,
    Gemma's scale applied), K, V [Hkv, n_ctx, hd] holding its own key and value at n; the query
    attends to positions lo..n -> out [H, hd]. scores = (q . k) * scale, soft-capped
    (c tanh(s / c)) when softcap > 0, softmax over the positions (e^ by exp32 for float32), then
    the weighted sum of v. The query heads that share a KV head go through its keys and values
    together, each key and value read once for the group (SmolLM2's 9 heads over 3 KV heads: 28 ->
    21 us at 130 positions, 188 -> 133 at 1,000; bench/RESULTS.md). model/attention.py runs it for a
    one-token forward with nothing hooked, and so does the one-token step (model/decode.py)."""
    H, hd = q.shape
    Hkv = K.shape[0]
    group = H // Hkv
    S = n + 1 - lo
    s = np.empty((group, S), q.dtype)
    total = np.empty(group, q.dtype)
    single = q.itemsize == 4
    for kv in range(Hkv):
        h0 = kv * group
        for t in range(S):                                    # scores: each key once for the group
            k = K[kv, lo + t]
            for g in range(group):
                qh = q[h0 + g]
                acc = q.dtype.type(0.0)
                for j in range(hd):
                    acc += qh[j] * k[j]
                acc *= scale
                if softcap > 0:
                    acc = np.tanh(acc / softcap) * softcap
                s[g, t] = acc
        for g in range(group):                                # softmax less the row's max
            row = s[g]
            top = row[0]
            for t in range(1, S):
                top = max(top, row[t])
            tot = q.dtype.type(0.0)
            if single:                                        # two loops: a branch inside kept it scalar
                for t in range(S):
                    e = exp32(np.float32(row[t] - top))
                    row[t] = e
                    tot += e
            else:
                for t in range(S):
                    e = np.exp(row[t] - top)
                    row[t] = e
                    tot += e
            total[g] = tot
            out[h0 + g, :] = 0.0
        for t in range(S):                                    # the probabilities' sum of v: each value once
            vt = V[kv, lo + t]
            for g in range(group):
                p = s[g, t] / total[g]
                o = out[h0 + g]
                for j in range(hd):
                    o[j] += p * vt[j]


_NO_W = np.zeros(0, np.float32)


@njit(cache=True, nogil=True, error_model="numpy")
def rope_step(qk, v, cos, sin, neox, q_scale, scaled, K, V, n, q):
    """One token's q and k as the forward's one-token path makes them, in one call: qk [1, H + Hkv,
    hd] (normed) rotated by position n's angles (cos / sin [1, n_rot / 2]), q times q_scale when
    scaled (Gemma), as ops/fastmath.py's qk_rows -> q [1, H, hd]; k and v [Hkv, hd] written to the
    cache K / V [Hkv, n_ctx, hd] at n. No fastmath: the values are qk_rows' wherever it is inlined
    (attend_one is not called from here: compiled into one function with this, its reassociated
    sums rounded otherwise, by up to 1.5e-7 past ~60 positions)."""
    Hkv, H = v.shape[0], q.shape[1]
    k = np.empty((1, Hkv, v.shape[1]), np.float32)
    _qk_serial(qk[:, :H], _NO_W, np.float32(0.0), False, cos, sin, neox, q_scale, scaled, q, 1)
    _qk_serial(qk[:, H:], _NO_W, np.float32(0.0), False, cos, sin, neox, q_scale, False, k, 1)
    for h in range(Hkv):
        K[h, n] = k[0, h]
        V[h, n] = v[h]
