"""The sparse kernels (features/kernels.py) and activations (features/sparsity.py) against their dense twins:
NumPy products of the dense activation matrix, and torch's topk / threshold definitions."""
import numpy as np
import pytest
import torch

from ffnlab.features import kernels
from ffnlab.features.sparsity import activate, by_latent
from features_torch import batchtopk, topk_relu

B, N, D = 24, 300, 17


@pytest.fixture
def pre():
    return np.random.default_rng(0).standard_normal((B, N)).astype(np.float32)


@pytest.mark.parametrize("act", ["topk", "batchtopk", "relu", "jumprelu"])
def test_activations_match_their_dense_definitions(pre, act):
    theta = np.full(N, 0.7, np.float32)
    s = activate(pre, act, k=7, threshold=theta, bandwidth=0.2)
    t = torch.tensor(pre)
    want = {"topk": lambda: topk_relu(t, 7), "batchtopk": lambda: batchtopk(t, 7), "relu": lambda: t.relu(),
            "jumprelu": lambda: t * (t > 0.7)}[act]().numpy()
    np.testing.assert_array_equal(s.dense(), want)
    np.testing.assert_array_equal(s.l0(), (want > 0).sum(1))
    if act == "jumprelu":                     # the support holds the window below theta too, at value 0
        window = (pre > 0.6) & (pre <= 0.7)
        assert window.any()
        assert set(zip(*np.nonzero(window))) <= set(zip(s.rows, s.idx))


def test_sparse_decode_equals_the_dense_product(pre):
    s = activate(pre, "topk", k=9)
    W = np.random.default_rng(1).standard_normal((N, D)).astype(np.float32)
    out = np.zeros((B, D), np.float32)
    kernels.sparse_decode(s.ptr, s.idx, s.val, W, out)
    # each output is a sum of 9 products: float32 error <= 9 * eps32 * sum |a w|
    np.testing.assert_allclose(out, s.dense().astype(np.float64) @ W, rtol=0, atol=9 * 1.2e-7 * (np.abs(s.dense()) @ np.abs(W)).max())


def test_dots_on_support_are_the_dense_product_at_the_support(pre):
    s = activate(pre, "relu")
    g = np.random.default_rng(2).standard_normal((B, D)).astype(np.float32)
    W = np.random.default_rng(3).standard_normal((N, D)).astype(np.float32)
    got = np.empty(s.val.size, np.float32)
    kernels.dots_on_support(s.ptr, s.idx, g, W, got)
    want = (g.astype(np.float64) @ W.T)[s.rows, s.idx]
    np.testing.assert_allclose(got, want, rtol=0, atol=D * 1.2e-7 * (np.abs(g) @ np.abs(W).T).max())


def test_latent_outer_is_the_transposed_product_and_thread_count_free(pre):
    s = activate(pre, "topk", k=5)
    x = np.random.default_rng(4).standard_normal((B, D)).astype(np.float32)
    out = np.zeros((N, D), np.float32)
    kernels.latent_outer(*by_latent(s, s.val), x, out)
    np.testing.assert_allclose(out, s.dense().T.astype(np.float64) @ x, rtol=0,
                               atol=B * 1.2e-7 * (np.abs(s.dense()).T @ np.abs(x)).max())
    import numba
    again = np.zeros_like(out)
    n = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        kernels.latent_outer(*by_latent(s, s.val), x, again)
    finally:
        numba.set_num_threads(n)
    np.testing.assert_array_equal(again, out)
