"""ops/train_kernels.py's compiled training kernels against the NumPy twins they replace.

Bit for bit where the kernel does the twin's float32 operations in the twin's order (attention's
masked softmax, SiLU backward, the cross-entropy backward, AdamW, the embedding's scatter-add).
Elsewhere the twin sums in NumPy's pairwise float32 order (or calls libm's tanh / exp) and the kernel
sums in float64 (with ops/fastmath.exp32), so the two differ by at most the twin's own rounding
error, bounded as in Higham's "Accuracy and Stability of Numerical Algorithms" (ch. 3-4): a float32
sum of n terms is off by at most n eps sum|terms| (eps = 2^-24, the unit roundoff; pairwise summation
does better, this bound holds for any order), and each further correctly rounded operation adds eps
of its result's magnitude. Every bound below is that count, written beside the test.
"""
import numpy as np
import pytest

from ffnlab.ops import train_kernels
from ffnlab.ops.activations import (GELU_TANH_COEF, SQRT_2_OVER_PI, gelu_tanh_backward, gelu_tanh_backward_numpy,
                                    silu_backward, silu_backward_numpy)
from ffnlab.ops.attention import attention_probs, attention_probs_numpy, causal_mask
from ffnlab.ops.embedding import embedding_backward
from ffnlab.ops.loss import (cross_entropy_backward, cross_entropy_backward_numpy, cross_entropy_forward,
                             cross_entropy_forward_numpy)
from ffnlab.ops import norms
from ffnlab.ops.norms import (layernorm_backward, layernorm_backward_numpy, layernorm_forward, rmsnorm_backward,
                              rmsnorm_backward_numpy, rmsnorm_forward)
from ffnlab.ops.softmax import softmax_backward, softmax_backward_numpy
from ffnlab.threads import blas_single, set_threads, threads
from ffnlab.training import optim
from mutants import mutated_module
from op_checks import check_attention

EPS = 2.0 ** -24                  # float32 unit roundoff
rng = np.random.default_rng(0)


def f32(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def within(got, want, bound, what):
    err = np.abs(got.astype(np.float64) - want.astype(np.float64))
    worst = float(np.max(err / np.maximum(bound, 1e-300)))
    assert worst <= 1.0, f"{what}: an error {worst:.2f} times its bound"


SHAPES = [(2, 3, 7, 7), (4, 6, 64, 64), (1, 2, 130, 130)]     # serial and parallel kernels, ragged row lengths


# --- bit for bit ------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", [None, 0, 5])
def test_attention_probs_bit_for_bit(shape, window):
    kq = f32(*shape, scale=4.0)
    kq[..., 0, :] *= 30.0                                   # rows whose exponentials underflow
    T = shape[-1]
    allowed = None if window is None else causal_mask(np.arange(T), np.arange(T), window)
    same_bits(attention_probs(kq, 0.125, allowed), attention_probs_numpy(kq, 0.125, allowed))


def test_silu_backward_bit_for_bit():
    for n in (17, 100_003):
        x, dy = f32(n, scale=4.0), f32(n)
        same_bits(silu_backward(dy, x), silu_backward_numpy(dy, x))


def test_cross_entropy_backward_bit_for_bit():
    for N, V in ((5, 11), (512, 256)):
        probs = rng.dirichlet(np.ones(V), N).astype(np.float32)
        t = rng.integers(0, V, N)
        same_bits(cross_entropy_backward(probs, t, 0.7), cross_entropy_backward_numpy(probs, t, 0.7))


def test_embedding_backward_bit_for_bit_with_repeated_ids():
    ids = rng.integers(0, 13, 700)                           # many repeats: the order of the additions shows
    dx = f32(700, 48)
    want = np.zeros((13, 48), np.float32)
    np.add.at(want, ids, dx)
    got, _ = embedding_backward(dx, ids, 13)
    same_bits(got, want)
    with pytest.raises(IndexError):
        embedding_backward(dx, np.full(700, 13), 13)


def adamw_run(monkeypatch, compiled, steps=4):
    g = np.random.default_rng(1)
    params = {n: g.standard_normal(s).astype(np.float32) for n, s in
              (("blk.0.ffn_up.weight", (300, 129)), ("blk.0.attn_norm.weight", (129,)), ("token_embd.weight", (40, 129)))}
    monkeypatch.setattr(optim, "_compiled", optim._compiled if compiled else (lambda *a: False))
    opt = optim.AdamW(params, weight_decay=0.1)
    for s in range(steps):
        grads = {n: (g.standard_normal(a.shape) * 10.0 ** g.integers(-6, 2)).astype(np.float32)
                 for n, a in params.items()}
        opt.step(params, grads, 1e-3 * (s + 1))
    return params, opt


@pytest.mark.parametrize("n_threads, span", [(1, train_kernels.ADAMW_SPAN), (2, train_kernels.ADAMW_SPAN), (2, 1000)])
def test_adamw_bit_for_bit(monkeypatch, n_threads, span):
    """one compiled pass over every tensor, on 1 or 2 threads, in spans that cut tensors (1000 values)
    or whole ones: the NumPy steps' bits"""
    monkeypatch.setattr(train_kernels, "ADAMW_SPAN", span)
    calls = []
    monkeypatch.setattr(train_kernels._threads, "parallel_for",
                        lambda fn, n, _f=train_kernels._threads.parallel_for: (calls.append(n), _f(fn, n)))
    n0 = threads()
    try:
        set_threads(n_threads)
        p1, o1 = adamw_run(monkeypatch, True)
    finally:
        set_threads(n0)
    p2, o2 = adamw_run(monkeypatch, False)
    # 2 threads: one parallel_for a step over every span (45,279 values: 46 spans of 1000 or 3 whole)
    assert calls == ([] if n_threads == 1 else [46 if span == 1000 else 3] * 4)
    for n in p1:
        same_bits(p1[n], p2[n])
        same_bits(o1.m[n], o2.m[n])
        same_bits(o1.v[n], o2.v[n])


def test_a_reordered_adamw_update_is_caught(monkeypatch):
    """the same algebra in another rounding order: the bit-for-bit test sees it"""
    bad = mutated_module(train_kernels, ("mi = m[i] + (gi - m[i]) * c1", "mi = m[i] * (ONE - c1) + gi * c1"))
    monkeypatch.setattr(optim, "adamw_update", bad.adamw_update)
    p1, _ = adamw_run(monkeypatch, True)
    monkeypatch.setattr(optim, "adamw_update", train_kernels.adamw_update)
    p2, _ = adamw_run(monkeypatch, False)
    assert any(not np.array_equal(p1[n], p2[n]) for n in p1)


# --- within float32 error analysis ------------------------------------------------------------
def test_gelu_tanh_backward_within_its_bound():
    """Both forms evaluate f'(x) = A + B with |A| <= 1 and |B| <= |x| inner'(x), inner' =
    sqrt(2/pi)(1 + 3 * 0.044715 x^2); every intermediate (t or sigmoid(2u), 1 - t^2, s(1 - s), the
    products) is at most M = 1 + |x| inner' in magnitude, and each form takes <= 10 rounded steps
    (tanh / exp32 included at <= 2 ulps each): each is within 10 eps M |dy| of the exact f', so they
    are within 20 eps M |dy| of each other."""
    x = np.concatenate([f32(200_001, scale=3.0), np.linspace(-12, 12, 4001, dtype=np.float32)])
    dy = f32(x.size)
    x64 = x.astype(np.float64)
    inner = SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_COEF * x64 ** 2)
    bound = 20 * EPS * (1 + np.abs(x64) * inner) * np.abs(dy)
    t = np.tanh(SQRT_2_OVER_PI * (x64 + GELU_TANH_COEF * x64 ** 3))
    exact = (0.5 * (1 + t) + 0.5 * x64 * (1 - t * t) * inner) * dy
    got = gelu_tanh_backward(dy, x)
    within(got, gelu_tanh_backward_numpy(dy, x), bound, "gelu_tanh backward vs NumPy")
    within(got, exact, bound / 2, "gelu_tanh backward vs float64")


def test_exact_gelu_forward_bit_for_bit():
    """x Phi(x) in one compiled pass: scipy's erf of a float32 is the float64 erf rounded, so the
    NumPy steps' bits, over a spread of values, a fine grid, the tails and the special values"""
    from ffnlab.ops.activations import gelu_forward, gelu_forward_numpy
    special = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-30, 3e38, -3e38, np.inf, -np.inf, np.nan], np.float32)
    x = np.concatenate([f32(300_001, scale=3.0), np.linspace(-12, 12, 200_001, dtype=np.float32), special])
    strided = x[:499_996].reshape(-1, 7)[:, :5]                                              # a strided view too
    same_bits(gelu_forward(strided), gelu_forward_numpy(strided))
    with np.errstate(invalid="ignore"):                                                     # -inf * Phi(-inf) = -inf * 0
        same_bits(gelu_forward(x), gelu_forward_numpy(x))


def test_exact_gelu_backward_within_its_bound():
    """f'(x) = Phi(x) + x phi(x): |Phi| <= 1 and |x phi(x)| <= phi(1) < 0.25, so every intermediate is
    at most M = 1.25 in magnitude (the product with dy aside); each form takes <= 8 rounded steps
    (erf at <= 1 ulp, exp or exp32 at <= 2): each is within 8 eps M |dy| of the exact f' dy, so they
    are within 16 eps M |dy| of each other."""
    from ffnlab.ops.activations import gelu_backward, gelu_backward_numpy
    from scipy.special import erf
    x = np.concatenate([f32(200_001, scale=3.0), np.linspace(-12, 12, 4001, dtype=np.float32)])
    dy = f32(x.size)
    x64 = x.astype(np.float64)
    bound = 16 * EPS * 1.25 * np.abs(dy)
    exact = (0.5 * (1 + erf(x64 / np.sqrt(2))) + x64 * np.exp(-x64 * x64 / 2) / np.sqrt(2 * np.pi)) * dy
    got = gelu_backward(dy, x)
    within(got, gelu_backward_numpy(dy, x), bound, "exact GELU backward vs NumPy")
    within(got, exact, bound / 2, "exact GELU backward vs float64")
    bad = mutated_module(train_kernels, ("out[i] = (pdf * v + _cdf(v, inv_sqrt2)) * dy[i]",
                                         "out[i] = (pdf + _cdf(v, inv_sqrt2)) * dy[i]"))
    wrong = np.empty_like(x)
    bad.gelu_backward_into(dy, x, wrong, *[np.float32(c) for c in (1 / np.sqrt(2), 1 / np.sqrt(2 * np.pi))])
    with pytest.raises(AssertionError, match="times its bound"):
        within(wrong, exact, bound / 2, "a GELU backward without the x of x phi(x)")


def test_a_wrong_gelu_derivative_is_caught():
    bad = mutated_module(train_kernels, ("du = c * (ONE + THREE * a * v * v)", "du = c * (ONE + TWO * a * v * v)"))
    x, dy = f32(1000, scale=2.0), f32(1000)
    got = np.empty_like(x)
    bad.gelu_tanh_backward_into(dy, x, got, np.float32(SQRT_2_OVER_PI), np.float32(GELU_TANH_COEF))
    with pytest.raises(AssertionError, match="times its bound"):
        x64 = x.astype(np.float64)
        bound = 20 * EPS * (1 + np.abs(x64) * SQRT_2_OVER_PI * (1 + 3 * GELU_TANH_COEF * x64 ** 2)) * np.abs(dy)
        within(got, gelu_tanh_backward_numpy(dy, x), bound, "mutated gelu_tanh backward")


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_backward_within_its_bound(shape):
    """dx_j = y_j (dy_j - s), s = sum_k dy_k y_k: NumPy's float32 s is within (N + 1) eps S1 of the
    exact (S1 = sum |dy_k y_k|, the products rounded too), the float64 one within eps |s|; the
    subtraction and the product add 2 eps (|dy_j| + |s|) |y_j|: |diff_j| <= |y_j| (N + 4) eps (S1 + |dy_j|)"""
    y = np.exp(f32(*shape, scale=3.0))
    y /= y.sum(-1, keepdims=True)
    dy = f32(*shape, scale=2.0)
    N = shape[-1]
    s1 = np.sum(np.abs(dy.astype(np.float64) * y), -1, keepdims=True)
    bound = np.abs(y) * (N + 4) * EPS * (s1 + np.abs(dy))
    within(softmax_backward(dy, y), softmax_backward_numpy(dy, y), bound, "softmax backward")


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("shape", [(3, 5, 16), (4, 256, 384), (130, 65)])
def test_norm_backward_within_its_bound(kind, shape):
    """dx = rstd (g - [mean g] - x_hat mean(g x_hat)), g = dy w. NumPy's means of D terms are within
    (D + 1) eps of mean|g| and mean|g x_hat|; three more roundings of at most that size each:
    |diff| <= 2 rstd (D + 4) eps (|g| + mean|g| + |x_hat| mean|g x_hat|). The weight gradients are
    sums over the N rows: |diff| <= 2 (N + 2) eps sum|dy x_hat| (and sum|dy| for the bias)."""
    D = shape[-1]
    x = f32(*shape, scale=2.0) + 0.5
    w, b = f32(D) + 1.0, f32(D)
    dy = f32(*shape)
    if kind == "layernorm":
        _, cache = layernorm_forward(x, w, b, 1e-5)
        got, want = layernorm_backward(dy, w, cache), layernorm_backward_numpy(dy, w, cache)
    else:
        _, cache = rmsnorm_forward(x, w, 1e-6)
        got, want = rmsnorm_backward(dy, w, cache), rmsnorm_backward_numpy(dy, w, cache)
    x_hat, rstd = (c.astype(np.float64) for c in cache)
    x_hat, rstd = x_hat.reshape(shape), rstd.reshape(*shape[:-1], 1)
    g = np.abs(dy * w.astype(np.float64))
    bound = 2 * rstd * (D + 4) * EPS * (g + g.mean(-1, keepdims=True)
                                        + np.abs(x_hat) * (g * np.abs(x_hat)).mean(-1, keepdims=True))
    within(got[0], want[0], bound, f"{kind} dx")
    lead = tuple(range(len(shape) - 1))
    N = int(np.prod(shape[:-1]))
    within(got[1], want[1], 2 * (N + 2) * EPS * np.sum(np.abs(dy * x_hat), lead), f"{kind} dw")
    if kind == "layernorm":
        within(got[2], want[2], 2 * (N + 2) * EPS * np.sum(np.abs(dy.astype(np.float64)), lead), "layernorm db")


def test_cross_entropy_forward_within_its_bound():
    """loss = mean_i (logsumexp_i - x_i,t). NumPy: shifted = x - m (1 rounding), libm exp (1 ulp),
    a sum of V terms ((V + 1) eps of it), the log, logp = shifted - lse, a mean of N terms: each
    row's logp_t is within (V + 6) eps (|shifted_t| + lse + 1) and the mean adds (N + 1) eps of
    mean|logp_t|. The probabilities exp(logp) are within that row error (relative), plus 4 ulps for
    exp32's 2 and the division."""
    N, V = 700, 256
    logits = f32(N, V, scale=3.0)
    t = rng.integers(0, V, N)
    loss, probs = cross_entropy_forward(logits, t)
    want_loss, want_probs = cross_entropy_forward_numpy(logits, t)
    x = logits.astype(np.float64)
    shifted = x - x.max(-1, keepdims=True)
    lse = np.log(np.exp(shifted).sum(-1, keepdims=True))
    row = (V + 6) * EPS * (np.abs(shifted) + lse + 1)
    logp_t = np.abs(shifted[np.arange(N), t] - lse[:, 0])
    within(np.array(loss), np.array(want_loss), np.mean(row[np.arange(N), t]) + (N + 1) * EPS * logp_t.mean(), "loss")
    within(probs, want_probs, probs * (row + 8 * EPS), "probs")
    with pytest.raises(IndexError):
        cross_entropy_forward(logits, np.full(N, V))


# --- threads ----------------------------------------------------------------------------------
def test_kernels_give_the_same_bits_on_one_and_two_threads():
    x = f32(4, 256, 384)
    w = f32(384) + 1.0
    _, cache = layernorm_forward(x, w, None, 1e-5)
    kq = f32(2, 6, 128, 128)
    allowed = causal_mask(np.arange(128), np.arange(128))
    dy = f32(4, 256, 384)
    n0 = threads()
    out = []
    try:
        for n in (1, 2):
            set_threads(n)
            out.append([*layernorm_backward(dy, w, cache)[:2], layernorm_forward(x, w, w, 1e-5)[0],
                        attention_probs(kq, 0.1, allowed),
                        gelu_tanh_backward(dy, x), softmax_backward(kq, kq)])
    finally:
        set_threads(n0)
    for a, b in zip(*out):
        same_bits(a, b)


@pytest.mark.parametrize("edits", [[("v = x[j] * scale", "v = x[j]")],                  # no 1/sqrt(head_dim)
                                   [("hi = np.where(any_, S - allowed[:, ::-1].argmax(axis=1), S)", "hi = np.full(T, S)"),
                                    ("        masked = True", "        masked = False")]])   # the mask ignored
def test_a_wrong_fused_softmax_is_caught(monkeypatch, edits):
    """op_checks.check_attention (against torch) sees a kernel that drops the scale or the mask"""
    import ffnlab.ops.attention as ops_attention
    check_attention()
    monkeypatch.setattr(ops_attention, "train_kernels",
                        mutated_module(train_kernels, *edits))
    with pytest.raises(AssertionError, match="relative error"):
        check_attention()


# --- products split over the threads (ops/matmul.py) -----------------------------------------
def test_split_products_give_numpys_bits():
    """each head's product (and each block of rows) is one single-threaded BLAS call: the bits of
    NumPy's product of that head (that block of rows) on one thread, and NumPy's whole product within
    float32's rounding (a product of fewer rows may round a row differently: OpenBLAS's Haswell
    kernels treat a tile's last rows apart)"""
    from ffnlab.ops.matmul import MIN_ROWS, batched_matmul, matmul_rows
    a, b = f32(2, 3, 256, 64), f32(2, 3, 256, 64).swapaxes(-1, -2)      # q and a transposed k, as attention_scores
    x, w, dy = f32(1024, 96), f32(384, 96), f32(1024, 384)                # a linear's input, weight, dy

    def blocks(l, r, n):                                                # matmul_rows's blocks of rows, one call each
        m = len(l)
        k = min(n, m // MIN_ROWS)
        return np.concatenate([l[m * i // k:m * (i + 1) // k] @ r for i in range(k)])
    n0 = threads()
    try:
        set_threads(1)
        whole = [a @ b, x @ w.T, dy.T @ x]
        want = [whole[0], blocks(x, w.T, 2), blocks(dy.T, x, 2)]
        set_threads(2)
        got = [batched_matmul(a, b), matmul_rows(x, w.T), matmul_rows(dy.T, x)]
    finally:
        set_threads(n0)
    for g, w_ in zip(got, want):
        same_bits(g, w_)
    eps = np.finfo(np.float32).eps
    for g, (l, r) in zip(got, [(a, b), (x, w.T), (dy.T, x)]):
        l64, r64 = l.astype(np.float64), r.astype(np.float64)
        K = l.shape[-1]
        bound = 1.01 * K * eps * (np.abs(l64) @ np.abs(r64))            # |fl(sum) - sum| <= K eps sum|a||b|
        assert np.all(np.abs(g - l64 @ r64) <= bound)


def test_products_in_one_go_have_each_products_bits(monkeypatch):
    """matmuls: several products in one parallel_for, each in the blocks matmul_rows gives it alone
    (a small one whole); linear_backwards over q, k, v gives linear_backward's dx sum and gradients"""
    from ffnlab.ops import linear, matmul
    x, dy = f32(1024, 96), [f32(1024, 96), f32(1024, 32), f32(1024, 32)]
    ws = [f32(96, 96), f32(32, 96), f32(32, 96)]
    small = (f32(8, 16), f32(16, 8))                                    # under MIN_WORK: one item
    calls = []
    monkeypatch.setattr(matmul._threads, "parallel_for",
                        lambda fn, n, _f=matmul._threads.parallel_for: (calls.append(n), _f(fn, n)))
    n0 = threads()
    try:
        set_threads(2)
        pairs = [(x, ws[0].T), (dy[1].T, x), small]
        got = matmul.matmuls(pairs)
        with blas_single():                # as in the training step: BLAS on one thread outside parallel_for too
            alone = [matmul.matmul_rows(a, b) for a, b in pairs]
            dx, grads = linear.linear_backwards(dy, x, ws, [True, False, True])
            one = [linear.linear_backward(d, x, w, b) for d, w, b in zip(dy, ws, [True, False, True])]
    finally:
        set_threads(n0)
    assert calls[0] == 2 + 1 + 1                   # two blocks of 512 rows; 32 rows (< 2 MIN_ROWS) and the small one whole
    for g, a in zip(got, alone):
        same_bits(g, a)
    same_bits(dx, (one[0][0] + one[1][0]) + one[2][0])
    for (dw, db), (_, dw1, db1) in zip(grads, one):
        same_bits(dw, dw1)
        assert (db is None) == (db1 is None) and (db is None or np.array_equal(db, db1))


# --- LayerNorm forward: NumPy's pairwise sums, bit for bit -------------------------------------
@pytest.mark.parametrize("D", [1, 7, 8, 9, 100, 127, 128, 129, 256, 383, 384, 768, 1000, 2048, 5000, 7689, 8191, 8192,
                               8193])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_forward_bit_for_bit(D, bias):
    """the pairwise sums' every branch (under 8 terms, one block of <= 128, up to seven levels of halves
    with tails: 7689 is the first width to need seven, 8191 the last; 8193 = PAIRWISE_MAX + 1: NumPy's code)"""
    x = f32(3, 41, D, scale=float(rng.uniform(0.01, 100))) + np.float32(rng.uniform(-50, 50))
    x[0, 0] = 0.0                                            # a constant row: var 0, rstd 1/sqrt(eps)
    w, b = f32(D) + 1.0, (f32(D) if bias else None)
    for eps in (1e-5, np.float32(1e-6)):
        y, (x_hat, rstd) = layernorm_forward(x, w, b, eps)
        y0, (x_hat0, rstd0) = norms.layernorm_forward_numpy(x, w, b, eps)
        for got, want in ((y, y0), (x_hat, x_hat0), (rstd, rstd0)):
            same_bits(got, want)


def test_layernorm_forward_keeps_numpy_for_a_float64_eps():
    """np.float64 eps promotes NumPy's variance to float64: the compiled float32 kernel would differ"""
    x, w = f32(4, 64), f32(64)
    _, (_, rstd) = layernorm_forward(x, w, None, np.float64(1e-5))
    assert rstd.dtype == np.float64


def test_a_layernorm_forward_with_a_plain_sum_is_caught():
    """the same mean summed left to right instead of pairwise: the bit-for-bit test sees it"""
    bad = mutated_module(train_kernels, ("    s = F(0.0) + _pairwise_sum(a, 0, a.shape[0])",
                                         "    s = F(0.0)\n    for v in a:\n        s += v"))
    x, w = f32(64, 384, scale=30.0) + 7.0, f32(384)
    y, _, _ = bad.layer_norm_rows(x, w, None, 1e-5)
    y0, _ = norms.layernorm_forward_numpy(x, w, None, 1e-5)
    assert not np.array_equal(y.view(np.uint32), y0.view(np.uint32))


# --- attention backward: the scale inside the softmax backward, results written token-major ---
@pytest.mark.parametrize("heads", [(4, 4), (6, 2)])          # one query head per KV head, and grouped
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_attention_backward_bit_for_bit_with_head_major_products(heads, dtype):
    """ops/attention.attention_backward against its products written out head-major with NumPy's
    matmul, the softmax backward and the scale as two steps: the same bits (and attention_mix's
    token-major output is the head-major product's values)"""
    from ffnlab.ops.attention import attention_backward, attention_forward, attention_mix
    H, Hkv = heads
    B, T, hd, scale = 2, 70, 16, 0.25
    G = H // Hkv
    q = f32(B, T, H, hd).astype(dtype)
    k, v = f32(B, T, Hkv, hd).astype(dtype), f32(B, T, Hkv, hd).astype(dtype)
    _, (_, probs) = attention_forward(q, k, v, scale, causal_mask(np.arange(T), np.arange(T)))
    dout = f32(B, H, T, hd).astype(dtype)
    qh, kh, vh = q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    # every product takes a KV head's G query heads' rows at once, as the code does: a product of another
    # height can round a row differently (OpenBLAS's Haswell kernels treat a tile's last rows apart)
    grouped = (lambda a: a.reshape(B, Hkv, G * T, a.shape[-1]))              # [B, H, T, n] -> [B, Hkv, G*T, n]
    heads = (lambda a: a.reshape(B, H, T, a.shape[-1]))
    pv = heads(grouped(probs) @ vh)
    np.testing.assert_array_equal(np.ascontiguousarray(attention_mix(probs, v)).view(np.uint8), pv.view(np.uint8))
    dprobs = heads(grouped(dout) @ vh.swapaxes(-1, -2))                      # [B, H, T, S]
    dscores = softmax_backward(dprobs, probs)
    dscores *= scale
    dq = heads(grouped(dscores) @ kh).transpose(0, 2, 1, 3)
    pairs = [(b, h) for b in range(B) for h in range(Hkv)]
    dk, dv = np.zeros_like(k), np.zeros_like(v)
    for b, h in pairs:                     # a KV head's gradient: its G query heads' rows in one product
        rows = slice(h * G, (h + 1) * G)
        dk[b, :, h] = dscores[b, rows].reshape(G * T, T).T @ qh[b, rows].reshape(G * T, hd)
        dv[b, :, h] = probs[b, rows].reshape(G * T, T).T @ dout[b, rows].reshape(G * T, hd)
    for got, want in zip(attention_backward(dout, q, k, v, probs, scale), (dq, dk, dv)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8))   # the bits


# --- a gated FFN: act(gate) * up forward in one pass, and its backward in one pass -----------------
@pytest.mark.parametrize("name", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n_threads", [1, 2])
def test_gated_ffn_forward_and_backward_passes_give_the_steps_bits(name, n_threads):
    """glu_halves on two arrays (the training step's separate gate and up products) and glu_backward
    each compute, per value, the very float32 operations of the steps they replace: act(gate) and
    act * up; dh * act and act's backward on dh * up. So the bits are the steps', at 1 thread and
    split over 2 (inside one_pool, as the training step), and sizes past PARALLEL_MIN split."""
    from ffnlab import threads as T
    from ffnlab.model.arith import glu_halves
    from ffnlab.ops.activations import ACTIVATIONS, glu_backward
    gate, up, dh = f32(3, 50, 700, scale=3.0), f32(3, 50, 700), f32(3, 50, 700)
    assert gate.size >= train_kernels.PARALLEL_MIN
    act_f, act_b = ACTIVATIONS[name].forward, ACTIVATIONS[name].backward
    n0 = threads()
    try:
        set_threads(n_threads)
        with T.one_pool():
            act, h = glu_halves(gate, up, name == "gelu_tanh")
            dup, dgate = glu_backward(dh, act, up, gate, name)
    finally:
        set_threads(n0)
    want_act = act_f(gate)
    same_bits(act, want_act)
    same_bits(h, want_act * up)
    same_bits(dup, dh * want_act)
    same_bits(dgate, act_b(dh * up, gate))
    s_up = up[:, :, ::2]                                          # not C-ordered: the steps themselves
    got = glu_backward(dh[:, :, ::2], act[:, :, ::2], s_up, gate[:, :, ::2], name)
    same_bits(got[1], act_b(dh[:, :, ::2] * s_up, gate[:, :, ::2]))
