"""quant/gemm.py: the prefill GEMM over dequantized strips, against float64.

The bound is the standard one for a float32 dot product of length n summed in any order with
one rounding per step (Higham, Accuracy and Stability, 3.1): |fl(x.w) - x.w| <= gamma_n sum_j
|x_j w_j|, gamma_n = n u / (1 - n u), u = 2^-24. An FMA rounds once per step, so it holds as it
does for BLAS; nothing in it is fitted to this machine.
"""
import numpy as np
import pytest

from ffnlab.quant import gemm

U = 2.0 ** -24


def _bound(x, rows):
    n = x.shape[1]
    gamma = n * U / (1 - n * U)
    return gamma * (np.abs(x.astype(np.float64)) @ np.abs(rows.astype(np.float64)).T)


def _gemm_z(P, x, y, col0, t_lo, t_hi):
    gemm._gemm_z(P, gemm.pack_tokens(x, gemm.TOKENS_Z), y, col0, t_lo, x.shape[0] if t_hi < 0 else t_hi, P.shape[1])


def _this_cpu(P, x, y, col0, t_lo, t_hi):
    gemm.gemm_strips(P, x, y, col0, t_lo, t_hi, gemm.HAS_AVX512)


KERNELS = {"avx2": gemm._gemm_y, "avx512": _gemm_z, "this CPU's": _this_cpu}


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("T", [1, 5, 6, 7, 8, 9, 10, 11, 13, 100])
@pytest.mark.parametrize("S,n", [(1, 32), (3, 640), (8, 96), (2, 600)])
def test_gemm_strips_matches_float64_within_the_dot_product_bound(T, S, n, kernel):
    """both register tiles (each compiles on any x86-64 with AVX2: without AVX-512, LLVM splits
    the 512-bit one in halves), odd strip counts (the 512-bit tile pairs strips) and token counts
    around both tile widths (6 and 10) and lengths past the 512-bit tile's blocks of j (256)"""
    rng = np.random.default_rng(T * 1000 + S * 10 + n)
    P = rng.standard_normal((S, n, gemm.STRIP)).astype(np.float32)
    x = rng.standard_normal((T, n)).astype(np.float32)
    col0 = 16                                               # a column offset, as the tiles after the first have
    y = np.full((T, col0 + S * gemm.STRIP + 16), 7.0, np.float32)
    if kernel != "this CPU's" and not gemm.HAS_AVX2:
        pytest.skip("the register tiles need AVX2 and FMA")
    KERNELS[kernel](P, x, y, col0, 0, -1)
    rows = gemm.strips_to_rows(P)                           # [16 S, n]
    ref = x.astype(np.float64) @ rows.astype(np.float64).T
    got = y[:, col0:col0 + S * gemm.STRIP]
    assert np.all(np.abs(got - ref) <= _bound(x, rows))
    assert np.all(y[:, :col0] == 7.0) and np.all(y[:, col0 + S * gemm.STRIP:] == 7.0)   # nothing else written


def test_gemm_strips_token_range_writes_only_its_tokens():
    """t_lo..t_hi: the token parts Packed.matmul gives each thread (t_lo a multiple of the tile's
    tokens, as tensor.py's parts are; 30 is one for both tiles)"""
    rng = np.random.default_rng(5)
    P = rng.standard_normal((3, 64, gemm.STRIP)).astype(np.float32)
    x = rng.standard_normal((50, 64)).astype(np.float32)
    rows = gemm.strips_to_rows(P)
    ref = x.astype(np.float64) @ rows.astype(np.float64).T
    for kernel in KERNELS.values():
        y = np.full((50, 48), 7.0, np.float32)
        kernel(P, x, y, 0, 30, 44)
        assert np.all(np.abs(y[30:44] - ref[30:44]) <= _bound(x, rows)[30:44])
        assert np.all(y[:30] == 7.0) and np.all(y[44:] == 7.0)


def test_strips_to_rows_is_the_strip_layout():
    P = np.arange(2 * 3 * 16, dtype=np.float32).reshape(2, 3, 16)
    rows = gemm.strips_to_rows(P)
    assert rows.shape == (32, 3)
    for s in range(2):
        for j in range(3):
            for c in range(16):
                assert rows[16 * s + c, j] == P[s, j, c]


def test_product_without_avx2_is_the_same_product(monkeypatch):
    """the BLAS fallback (a CPU without AVX2 and FMA) computes the same x W^T within the bound"""
    rng = np.random.default_rng(3)
    P = rng.standard_normal((4, 200, gemm.STRIP)).astype(np.float32)
    x = rng.standard_normal((9, 200)).astype(np.float32)
    rows = gemm.strips_to_rows(P)
    ref = x.astype(np.float64) @ rows.astype(np.float64).T
    for avx2 in (True, False):
        monkeypatch.setattr(gemm, "HAS_AVX2", avx2)
        y = np.zeros((9, 64 + 32), np.float32)
        gemm.product(P, x, y, 32)
        assert np.all(np.abs(y[:, 32:] - ref) <= _bound(x, rows))
        assert np.all(y[:, :32] == 0)


@pytest.mark.parametrize("width", [gemm.TOKENS, gemm.TOKENS_Z])
def test_pack_tokens_lays_out_each_tile_of_tokens_by_position(width):
    """pack_tokens (ten tokens: a transpose in registers, 16 positions at a time, each store's
    spare lanes overwritten by the next) against the layout written out one float at a time, for
    counts of tokens and positions that leave partial tiles and partial blocks of 16"""
    rng = np.random.default_rng(7)
    for T in (1, 7, 10, 23, 100):
        for n in (5, 16, 17, 32, 47, 640):
            x = rng.standard_normal((T, n)).astype(np.float32)
            nt = -(-T // width)
            ref = np.empty((nt, n, width), np.float32)
            for i in range(nt):
                for t in range(width):
                    ref[i, :, t] = x[min(i * width + t, T - 1)]
            assert np.array_equal(gemm.pack_tokens(x, width), ref), (T, n)


def test_gemm_prefix_sums_only_the_positions_asked_for():
    """attention's probabilities are zeros past a run of queries' last key: gemm_prefix gives
    gemm_strips' values while the 512-bit tiles stop at n_j (x past n_j set to NaN here would
    poison any sum that read them; the 256-bit tiles read them all, so there they are zeros)"""
    rng = np.random.default_rng(11)
    P = rng.standard_normal((5, 300, 16)).astype(np.float32)
    for n_j in (1, 17, 256, 299, 300):
        x = rng.standard_normal((23, 300)).astype(np.float32)
        x[:, n_j:] = 0.0
        want = np.empty((23, 80), np.float32)
        gemm.gemm_strips(P, x, want, 0, 0, -1, gemm.HAS_AVX512)
        if gemm.HAS_AVX512:
            x[:, n_j:] = np.nan
        got = np.empty((23, 80), np.float32)
        gemm.gemm_prefix(P, x, got, n_j, gemm.HAS_AVX512)
        assert np.array_equal(got, want), n_j
