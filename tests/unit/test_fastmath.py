"""ops/fastmath.py against float64 NumPy: e^x over its whole range, and the float32 sigmoid, SiLU,
GELU (tanh form) and softmax built on it, which ops/activations.py and ops/softmax.py use.

Bounds: Cephes gives expf's relative error as 1.7e-7 (~1.4 float32 ulps); the activations add at
most a few correctly rounded float32 operations (each 2^-24 relative), so 4 ulps (2^-21 = 4.8e-7)
bounds every relative error here with room. The softmax divides by a float64 sum: each output
is exp32's error plus one rounding of the division."""
import numpy as np
import pytest

from ffnlab.ops import fastmath
from ffnlab.ops.activations import gelu_tanh_forward, sigmoid, silu_forward
from ffnlab.ops.softmax import softmax_forward

EPS = 2.0 ** -23
ULP4 = 4 * EPS


def _rel(got, want):
    return float(np.max(np.abs(got.astype(np.float64) - want) / np.maximum(np.abs(want), 1e-300)))


def test_exp32_over_its_range():
    x = np.linspace(-86.6, 88.72, 4_000_003).astype(np.float32)          # every binade a result can have
    x = np.concatenate([x, np.random.default_rng(0).uniform(-1, 1, 1_000_000).astype(np.float32)])
    got = np.empty_like(x)
    fastmath.exp_into(x, got)
    assert _rel(got, np.exp(x.astype(np.float64))) <= 1.7e-7 * 1.05   # Cephes' stated bound (+5%: FMA, rounding)


def test_exp32_edges():
    x = np.array([np.nan, -np.inf, np.inf, 0.0, -0.0, 88.73, 1000.0, -86.7, -1000.0, 1e-30, -1e-30], np.float32)
    got = np.empty_like(x)
    fastmath.exp_into(x, got)
    assert np.isnan(got[0])
    np.testing.assert_array_equal(got[1:], np.array([0, np.inf, 1, 1, np.inf, np.inf, 0, 0, 1, 1], np.float32))


@pytest.fixture
def acts():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0, 3, 200_000), rng.uniform(-100, 100, 10_000), [0.0, -0.0, 88.0, -88.0]])
    return x.astype(np.float32)


def test_sigmoid_and_silu(acts):
    x64 = acts.astype(np.float64)
    want = 1.0 / (1.0 + np.exp(-x64))
    got = sigmoid(acts)
    tiny = want < 1e-37                                  # e^-x past float32's normal range: 0 (abs error < 2.4e-38)
    assert got.dtype == np.float32 and _rel(got[~tiny], want[~tiny]) <= ULP4
    assert np.all(np.abs(got[tiny] - want[tiny]) < 2.5e-38)
    assert _rel(silu_forward(acts)[~tiny], (x64 * want)[~tiny]) <= ULP4
    view = np.stack([acts[:1000], acts[1000:2000]], axis=1)[:, 0]      # a strided view, as the gate half of [gate, up]
    np.testing.assert_array_equal(sigmoid(view), sigmoid(np.ascontiguousarray(view)))


def test_gelu_tanh(acts):
    x = acts.astype(np.float64)
    u = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)
    with np.errstate(over="ignore"):                     # e^-2u = inf for x << 0: want = x / inf = 0, the limit
        want = x / (1.0 + np.exp(-2.0 * u))             # = 0.5 x (1 + tanh u), without 1 + tanh's cancellation
    got = gelu_tanh_forward(acts)
    big = np.abs(want) > 1e-30                           # x sigmoid(2u) for very negative x: both ~0
    # u carries a few float32 roundings (|du| <= ~4 eps |u|), and ln sigmoid(2u) changes by up to 2 du:
    # where sigmoid(2u) is small (x < 0) that is a relative error of 8 eps |u|, as in NumPy's float32 tanh form
    bound = ULP4 + 8 * EPS * np.abs(u)
    assert np.all(np.abs(got[big] - want[big]) <= bound[big] * np.abs(want[big]))
    assert np.all(np.abs(got[~big]) < 1e-30)
    # float64 keeps NumPy's path, 0.5 x (1 + tanh u): libm's tanh is within an ulp of 1 near +-1, so the
    # absolute error is a few float64 eps times |x| (the cancellation in 1 + tanh makes it absolute)
    moderate = np.abs(x) < 5
    eps64 = np.finfo(np.float64).eps
    np.testing.assert_allclose(gelu_tanh_forward(x[moderate]), want[moderate], rtol=64 * eps64, atol=4 * eps64 * 5)


def test_softmax_rows():
    rng = np.random.default_rng(2)
    x = rng.normal(0, 5, (3, 7, 513)).astype(np.float32)
    x[0, 0, 100:] = -np.inf                              # a causal mask's row
    x64 = x.astype(np.float64)
    want = np.exp(x64 - x64.max(-1, keepdims=True))
    want /= want.sum(-1, keepdims=True)
    got = softmax_forward(x)
    ok = want > 1e-30
    # x - max rounds in float32 (|x - max| 2^-24 absolute), which e^. turns into that relative error
    bound = ULP4 + np.abs(x64 - x64.max(-1, keepdims=True)) * 2.0 ** -24
    assert np.all(np.abs(got[ok] - want[ok]) <= bound[ok] * want[ok]) and np.all(got[~ok] < 1e-30)
    assert np.all(got[0, 0, 100:] == 0)
    np.testing.assert_allclose(got.sum(-1), 1.0, rtol=4 * EPS * 513 ** 0.5)


def test_row_kernels_spread_over_threads_give_the_serial_values():
    """rms_norm_rows, rope_rows and glu_rows run a prompt's rows on numba's threads past
    PARALLEL_MIN values: each row's arithmetic is the serial kernel's, so the values are the same
    bits; and both agree with float64 (a row's norm: a few float32 roundings, relative 1e-6)"""
    rng = np.random.default_rng(7)
    rows, D = 64, 1024                                       # 64k values: the parallel variants
    assert rows * D >= fastmath.PARALLEL_MIN
    x = rng.standard_normal((rows, D)).astype(np.float32)
    w = rng.standard_normal(D).astype(np.float32)
    out = {}
    for name, f in (("serial", fastmath._rms_norm_serial), ("parallel", fastmath._rms_norm_parallel)):
        x_hat, y, rstd = np.empty_like(x), np.empty_like(x), np.empty(rows, np.float32)
        f(x, w, np.float32(1e-6), x_hat, y, rstd)
        out[name] = y
    assert np.array_equal(out["serial"], out["parallel"])
    x64 = x.astype(np.float64)
    ref = x64 / np.sqrt((x64 ** 2).mean(axis=1, keepdims=True) + 1e-6) * w
    assert np.abs(out["parallel"] - ref).max() <= 1e-5 * np.abs(ref).max()

    xr = rng.standard_normal((1, 40, 4, 64)).astype(np.float32)
    ang = rng.uniform(-3, 3, (40, 32))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    for neox in (False, True):
        a, b = np.empty_like(xr), np.empty_like(xr)
        fastmath._rope_span(xr, cos, sin, neox, a, 0, 40)
        fastmath._rope_parallel(xr, cos, sin, neox, b)
        assert np.array_equal(a, b)

    gu = rng.standard_normal((rows, 2 * D)).astype(np.float32)
    for gelu in (False, True):
        res = []
        for f in (fastmath._glu_serial, fastmath._glu_parallel):
            act, h = np.empty((rows, D), np.float32), np.empty((rows, D), np.float32)
            f(gu, 0, gu, D, gelu, np.float32(0.7978845608028654), np.float32(0.044715), act, h)
            res.append(h)
        assert np.array_equal(res[0], res[1])
        g, u = gu[:, :D].astype(np.float64), gu[:, D:].astype(np.float64)
        act64 = 0.5 * g * (1 + np.tanh(0.7978845608028654 * (g + 0.044715 * g ** 3))) if gelu else g / (1 + np.exp(-g))
        assert np.abs(res[1] - act64 * u).max() <= 1e-5 * np.abs(act64 * u).max()


def test_row_kernels_inside_one_pool_split_on_parallel_for_with_the_serial_values():
    """Inside threads.one_pool() (the training step), rms_norm_rows and rope_rows split their rows
    on parallel_for's threads, not numba's: blocks of rows, each row the serial kernel's code, so
    the same bits as the serial kernel; the rotation is split across sequences too (B * T rows)"""
    from ffnlab import threads
    rng = np.random.default_rng(8)
    x = rng.standard_normal((96, 512)).astype(np.float32)             # 48k values: past PARALLEL_MIN
    w = rng.standard_normal(512).astype(np.float32)
    xr = rng.standard_normal((3, 50, 4, 64)).astype(np.float32)      # 38k values, 150 (b, t) rows
    ang = rng.uniform(-3, 3, (50, 32))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    before = threads.threads()
    items = []
    real = threads.parallel_for

    def counting(fn, n):
        items.append(n)
        real(fn, n)
    try:
        threads.set_threads(2)
        threads.parallel_for = counting
        want = [np.empty_like(x), np.empty_like(x), np.empty(96, np.float32)]
        fastmath._rms_norm_serial(x, w, np.float32(1e-6), *want)
        for neox in (False, True):
            want.append(np.empty_like(xr))
            fastmath._rope_span(xr, cos, sin, neox, want[-1], 0, 150)
        with threads.one_pool():
            got = [np.empty_like(x), np.empty_like(x), np.empty(96, np.float32)]
            fastmath.rms_norm_rows(x, w, np.float32(1e-6), *got)
            for neox in (False, True):
                got.append(np.empty_like(xr))
                fastmath.rope_rows(xr, cos, sin, neox, got[-1])
    finally:
        threads.parallel_for = real
        threads.set_threads(before)
    assert items == [4, 4, 4]                                        # two blocks a thread, each call
    for a, b in zip(want, got):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("norm,neox,scaled", [(True, False, True), (True, True, False), (False, False, False), (False, True, True)])
def test_qk_rows_gives_the_three_steps_values(norm, neox, scaled):
    """fastmath.qk_rows (the unhooked inference path's q/k) against the steps it replaces:
    ops/norms.rmsnorm_forward, ops/rope.rope_forward, a float32 multiply; on a strided slice of a
    q/k/v product, serial (one token) and parallel (many); the same bits"""
    from ffnlab.ops.norms import rmsnorm_forward
    from ffnlab.ops.rope import rope_angles, rope_forward
    rng = np.random.default_rng(11)
    for T, B in ((1, 1), (37, 2)):
        H, hd, n_rot = 8, 64, 48         # a partial rotary (the tail passes through); 37 x 2 tokens: the parallel variant
        qkv = rng.standard_normal((B, T, 3 * H * hd)).astype(np.float32)
        a = qkv[..., H * hd:2 * H * hd].reshape(B, T, H, hd)    # k's slice: strided rows
        w = rng.standard_normal(hd).astype(np.float32)
        cos, sin = (c.astype(np.float32) for c in rope_angles(np.arange(5, 5 + T), n_rot, 10000.0))
        scale = np.float32(0.125)
        want = rmsnorm_forward(a, w, 1e-6)[0] if norm else a
        want = rope_forward(want, cos, sin, "neox" if neox else "normal")
        if scaled:
            want = want * scale
        out = np.empty((B * T, H, hd), np.float32)
        fastmath.qk_rows(a.reshape(B * T, H, hd), w if norm else np.zeros(0, np.float32), np.float32(1e-6), norm,
                         cos, sin, neox, scale, scaled, out, T)
        np.testing.assert_array_equal(out.reshape(B, T, H, hd), want)
