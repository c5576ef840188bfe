"""model/decode_kernels.py's attend_rows (a prompt's attention over the KV cache, compiled) against
the same attention in float64 from ops/attention.py's definition: causal, sliding window, grouped
KV heads, a prefix already in the cache, a batch of two.

Bound: each output is a convex combination of v rows, sum_j p_j v_j with sum p_j = 1. A float32
score q.k of hd terms is off by at most gamma_hd sum_d |q_d k_d| (Higham 3.1), here <~ gamma_hd hd
(unit normals, scaled by 1/sqrt(hd) after); a score error e moves the probabilities by a relative
~2e, plus exp32's 2e-7 (tests/unit/test_fastmath.py); the S-term weighted sum adds gamma_S max|v|.
Allowed: 4 (gamma_hd hd + gamma_S + 1e-6) max|v|, a worst-case bound with a factor 2 to spare.
"""
import numpy as np
import pytest

from ffnlab.model.decode_kernels import attend_rows
from ffnlab.ops.attention import attention_forward, causal_mask
from ffnlab.quant.simd import HAS_AVX2, HAS_AVX512

U = 2.0 ** -24


def _gamma(n):
    return n * U / (1 - n * U)


@pytest.mark.parametrize("wide", [False, True])   # quant/gemm.py's 256- and 512-bit tiles: both run on any AVX2 CPU
@pytest.mark.parametrize("T", [9, 61])          # 61: positions in runs (attend_rows.QUERY_PART), the last one short
@pytest.mark.parametrize("H,Hkv,window,p0", [(4, 4, 0, 0), (8, 2, 0, 5), (4, 1, 6, 3), (6, 3, 1, 0), (2, 1, 0, 30), (2, 2, 20, 33)])
def test_attend_rows_matches_float64_attention(H, Hkv, window, p0, T, wide):
    if not HAS_AVX2:
        pytest.skip("the register tiles need AVX2 and FMA")
    rng = np.random.default_rng(H * 100 + Hkv * 10 + window + p0 + T)
    B, hd = 2, 64
    n_ctx = p0 + T + 7
    S = p0 + T
    q = rng.standard_normal((B, T, H, hd)).astype(np.float32)
    K = np.zeros((B, Hkv, n_ctx, hd), np.float32)
    V = np.zeros((B, Hkv, n_ctx, hd), np.float32)
    K[:, :, :S] = rng.standard_normal((B, Hkv, S, hd))
    V[:, :, :S] = rng.standard_normal((B, Hkv, S, hd))
    scale = 1.0 / np.sqrt(hd)
    out = np.empty((B, T, H, hd), np.float32)
    attend_rows(q, K, V, p0, window, np.float32(scale), out, wide)

    k64 = K[:, :, :S].transpose(0, 2, 1, 3).astype(np.float64)        # [B, S, Hkv, hd]
    v64 = V[:, :, :S].transpose(0, 2, 1, 3).astype(np.float64)
    allowed = causal_mask(np.arange(p0, p0 + T), np.arange(S), window)
    ref, _ = attention_forward(q.astype(np.float64), k64, v64, scale, allowed)   # [B, H, T, hd]
    ref = ref.transpose(0, 2, 1, 3)                                    # [B, T, H, hd]
    bound = 4 * (_gamma(hd) * hd + _gamma(S) + 1e-6) * np.abs(V).max()
    assert np.abs(out - ref).max() <= bound


def test_a_window_of_one_returns_the_own_value():
    """window 1: each position sees itself alone, so the output is its own v exactly (p = 1)"""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 4, 2, 32)).astype(np.float32)
    K = rng.standard_normal((1, 1, 8, 32)).astype(np.float32)
    V = rng.standard_normal((1, 1, 8, 32)).astype(np.float32)
    out = np.empty((1, 4, 2, 32), np.float32)
    attend_rows(q, K, V, 2, 1, np.float32(0.25), out, HAS_AVX512)
    for t in range(4):
        for h in range(2):
            np.testing.assert_array_equal(out[0, t, h], V[0, 0, 2 + t])


@pytest.mark.parametrize("H, Hkv", [(6, 2), (4, 1), (3, 3)])
@pytest.mark.parametrize("window, softcap", [(0, 0.0), (5, 0.0), (0, 30.0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attend_one_matches_float64_attention(H, Hkv, window, softcap, dtype):
    """decode_kernels.attend_one (one query row over the cache; a KV head's query heads read each
    key and value once, together) against the float64 definition: scores soft-capped when asked,
    the window's first position lo, grouped KV heads. The bound of this file's header, with
    float64's unit when the cache is float64."""
    from ffnlab.model.decode_kernels import attend_one
    hd, n, n_ctx = 32, 12, 16
    rng = np.random.default_rng(H * 10 + window)
    q = rng.standard_normal((H, hd)).astype(dtype)
    K = rng.standard_normal((Hkv, n_ctx, hd)).astype(dtype)
    V = rng.standard_normal((Hkv, n_ctx, hd)).astype(dtype)
    lo = max(0, n - window + 1) if window else 0
    scale = 1 / np.sqrt(hd)
    q64, K64, V64 = q.astype(np.float64), K.astype(np.float64), V.astype(np.float64)
    want = np.empty((H, hd))
    for h in range(H):
        kv = h // (H // Hkv)
        s = K64[kv, lo:n + 1] @ q64[h] * scale
        if softcap:
            s = np.tanh(s / softcap) * softcap
        p = np.exp(s - s.max())
        want[h] = (p / p.sum()) @ V64[kv, lo:n + 1]
    out = np.empty((H, hd), dtype)
    attend_one(q, K, V, n, lo, dtype(scale), dtype(softcap), out)
    u = U if dtype == np.float32 else 2.0 ** -53
    gamma = lambda m: m * u / (1 - m * u)                                             # noqa: E731
    tol = 4 * (gamma(hd) * hd + gamma(n + 1) + (1e-6 if dtype == np.float32 else 1e-14)) * np.abs(V64).max()
    assert np.abs(out - want).max() <= tol


@pytest.mark.parametrize("scale", [1.0, 1e-3, 30.0, 1e20, 2.4e36])
@pytest.mark.parametrize("D", [32, 576, 640])
def test_one_token_rms_norm_rounds_as_the_prompts(D, scale):
    """decode_kernels.rms_norm1 (the one-token step's RMSNorm) gives the batched forward's
    rmsnorm_forward bits: the same float64 sum of squares, the mean square rounded to float32 before
    + eps. At 2.4e36 the mean square is past float32's range in both, so 1/rms is 0 in both, as in
    torch and ggml; the step used to keep it in float64, normalize to O(1) and then overflow where
    the batched forward did not."""
    from ffnlab.model.decode_kernels import rms_norm1
    from ffnlab.ops.norms import rmsnorm_forward
    rng = np.random.default_rng(D)
    x = (rng.standard_normal(D) * scale).astype(np.float32)
    w = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    np.testing.assert_array_equal(rms_norm1(x, w, 1e-6), rmsnorm_forward(x[None], w, 1e-6)[0][0])
