"""ggml arithmetic, part 1: the 8-bit activation quantizers and the integer dot products
(quant/ggml_quants.py, quant/ggml_kernels.py), held to ggml's own CPU code (libggml-cpu through
ctypes, tests/reference/ggml_cpu_ref.py) bit for bit, and to a float64 product of the same integers."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import ggml_cpu_ref as R
from ffnlab.quant import ggml_kernels
from ffnlab.quant.blocks import F16_TABLE
from ffnlab.quant.ggml_quants import Q8Rows, f16_round

from ggml_blocks import PAIRS, activations, random_blocks


def split_blocks(kind, raw):
    """ggml's block bytes -> (d, qs, extra) as Q8Rows holds them"""
    if kind == "q8_K":
        b = raw.reshape(-1, 292)
        return (b[:, :4].copy().view(np.float32).ravel(), b[:, 4:260].copy().view(np.int8).ravel(),
                b[:, 260:].copy().view(np.int16).ravel())
    b = raw.reshape(-1, 34 if kind == "q8_0" else 36)
    o = 2 if kind == "q8_0" else 4
    s = b[:, 2:4].copy().view(np.float16).astype(np.float32).ravel() if kind == "q8_1" else None
    return b[:, :2].copy().view(np.float16).astype(np.float32).ravel(), b[:, o:].copy().view(np.int8).ravel(), s


@pytest.mark.parametrize("kind", ["q8_0", "q8_1", "q8_K"])
def test_activation_quantizer_is_ggmls_bit_for_bit(kind):
    rng = np.random.default_rng(1)
    x = activations(rng, 3, 1024)
    x[0, :32] = np.arange(32) * 0.5                                   # a block of exact halves
    ours = Q8Rows(kind.lower(), x)
    for t in range(x.shape[0]):
        d, qs, extra = split_blocks(kind, R.quantize_row(kind, x[t]))
        np.testing.assert_array_equal(ours.d[t], d)
        np.testing.assert_array_equal(ours.qs[t], qs)
        if extra is not None:                                         # Q8_1's s, Q8_K's bsums
            np.testing.assert_array_equal(ours.e[t], extra)


def test_q8_0_rounds_halves_to_even():
    # amax = 127 makes the multiplier 1: x*id is exactly 0.5, 1.5, 2.5, -2.5; _mm256_round_ps
    # gives 0, 2, 2, -2 where the reference quantizer's roundf would give 1, 2, 3, -3
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [0.5, 1.5, 2.5, -2.5, 127.0]
    a = Q8Rows("q8_0", x)
    assert a.qs[0, :5].tolist() == [0, 2, 2, -2, 127]
    assert a.d[0, 0] == np.float32(np.float16(1.0))


def test_f16_round_matches_numpy_half_conversion():
    rng = np.random.default_rng(2)
    v = np.concatenate([rng.standard_normal(20000) * 10.0 ** rng.integers(-9, 6, 20000),
                        [65504, 65519.99, 65520, 1e-8, 2.0 ** -25, 3 * 2.0 ** -26, -0.0]]).astype(np.float32)
    ours = np.array([f16_round(np.float32(a)) for a in v], np.float32)
    with np.errstate(over="ignore"):                                  # 65520 rounds to inf, as it should
        ref = v.astype(np.float16).astype(np.float32)                 # numpy: IEEE ties-to-even
    np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("qtype", list(PAIRS), ids=lambda t: t.name)
def test_vec_dot_equals_float64_product_of_the_same_integers(qtype):
    rng = np.random.default_rng(3)
    n, rows, N = 512, 24, 3
    data = random_blocks(qtype, rows, n, rng)
    kind = PAIRS[qtype][0]
    a = Q8Rows(kind, activations(rng, N, n))
    y = np.empty((N, rows), np.float32)
    ggml_kernels.gemm(int(qtype), data, F16_TABLE, a.qs, a.d, a.e, y)
    W = gguf.quants.dequantize(data, qtype).reshape(rows, n).astype(np.float64)
    X = a.dequantize().astype(np.float64)
    ref = X @ W.T
    if kind == "q8_1":     # w = d q + m: ggml takes m times s = f16(d_x sum q_x), not m sum(d_x q_x)
        m = data.reshape(rows, n // 32, -1)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
        ref += (a.e - X.reshape(N, n // 32, 32).sum(-1)) @ m.T
    # float32 accumulation over n / 32 block terms: |error| <= (n/32 + 8) eps32 sum |terms|
    bound = (n / 32 + 8) * 2.0 ** -24 * (np.abs(X) @ np.abs(W).T) + 1e-30
    assert np.all(np.abs(y - ref) <= bound)


@pytest.mark.parametrize("qtype", list(PAIRS), ids=lambda t: t.name)
def test_vec_dot_matches_ggml(qtype):
    """Every type bit for bit: the lanes and hsum of quants.c's AVX2 code (which an AVX-512 build
    runs too: AVX-512 only forms the exact int32 sums differently)."""
    if not R.has_avx2():
        pytest.skip("the bit-for-bit reference is ggml's AVX2 code")
    rng = np.random.default_rng(4)
    n, rows = 1024, 16
    kind, name, _ = PAIRS[qtype]
    data = random_blocks(qtype, rows, n, rng)
    x = activations(rng, 2, n)
    a = Q8Rows(kind, x)
    y = np.empty((2, rows), np.float32)
    ggml_kernels.gemm(int(qtype), data, F16_TABLE, a.qs, a.d, a.e, y)
    ref = np.array([[R.vec_dot(name, n, data[r], R.quantize_row(kind.replace("k", "K"), x[t]))
                     for r in range(rows)] for t in range(2)], np.float32)
    np.testing.assert_array_equal(y, ref)


@pytest.mark.parametrize("qtype", list(PAIRS), ids=lambda t: t.name)
@pytest.mark.parametrize("tokens", [1, 3, 9])
def test_quanttensor_fast_kernels_equal_the_reference_order(qtype, tokens):
    """QuantTensor(arith="ggml") routes one token to gemv32 (hardware FMA through LLVM's contract
    flag), several to the batched kernels vectorized over the tokens (K-quants: the tiled order
    from 8 tokens); each must give the bits of the one-dot-at-a-time kernel (gemm, float64-emulated
    FMA), which test_vec_dot_matches_ggml holds to ggml."""
    from ffnlab.quant import QuantTensor
    from ffnlab.quant.ggml_kernels import TILED_MIN_BATCH
    rng = np.random.default_rng(5)
    n, rows = 512, 40
    data = random_blocks(qtype, rows, n, rng)
    x = activations(rng, tokens, n)
    w = QuantTensor(data, qtype, (rows, n), arith="ggml")
    a = Q8Rows(PAIRS[qtype][0], x)
    ref = np.empty((tokens, rows), np.float32)
    ggml_kernels.gemm(int(qtype), data, F16_TABLE, a.qs, a.d, a.e, ref)
    if PAIRS[qtype][0] == "q8_k" and tokens >= TILED_MIN_BATCH:
        return                                                         # tiled order: gemmk_batch vs _dot_k_tiled below
    np.testing.assert_array_equal(w.matmul(x), ref)


def test_tiled_batch_kernel_equals_its_reference_order():
    from ffnlab.quant.types import TYPES
    rng = np.random.default_rng(6)
    for qtype in (T.Q4_K, T.Q6_K, T.Q2_K, T.Q3_K, T.Q5_K):
        data = random_blocks(qtype, 24, 512, rng)
        a = Q8Rows("q8_k", activations(rng, 9, 512))
        ref, y = np.empty((9, 24), np.float32), np.empty((9, 24), np.float32)
        ggml_kernels.gemm(int(qtype), data, F16_TABLE, a.qs, a.d, a.e, ref)             # 9 tokens: _dot_k_tiled
        ggml_kernels.gemmk_batch(int(qtype), TYPES[qtype].block_bytes, data, F16_TABLE, np.ascontiguousarray(a.qs.T, np.int32),
                                 np.ascontiguousarray(a.d.T), np.ascontiguousarray(a.e.T), y)
        np.testing.assert_array_equal(y, ref)
