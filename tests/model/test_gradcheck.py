"""Every kernel's backward, in float64, against central finite differences and torch autograd.

Each test takes the scalar L = sum(forward(inputs) * dy) for a fixed random dy, so the backward
called with dy must return dL/d(input). Finite differences: (L(x+eps) - L(x-eps)) / 2eps with
eps = 1e-6; truncation error ~eps^2 and rounding ~1e-16/eps keep it near 1e-9, well below the
FD_TOL = 1e-6 bound on rel_err = max|analytic - numeric| / max|numeric|. Against autograd the
two sides compute the same float64 math in a different order: AUTOGRAD_TOL = 1e-10.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_reference as R
from ffnlab.ops import (ACTIVATIONS, attention_backward, causal_mask, cross_entropy_backward, cross_entropy_forward,
                        embedding_backward, embedding_forward, layernorm_backward, layernorm_forward, linear_backward,
                        linear_forward, rmsnorm_backward, rmsnorm_forward, rope_angles, rope_backward, rope_forward,
                        softmax_backward, softmax_forward)
from ffnlab.ops.attention import attention_forward

from finite_differences import FD_TOL, numerical_grad


AUTOGRAD_TOL = 1e-10


def check_grads(forward, inputs, analytic, torch_forward=None, what=""):
    """forward(*inputs) -> array; analytic: {index into inputs: grad}; torch_forward builds the same
    output from torch tensors. Checks each grad against finite differences and against autograd."""
    out = forward(*inputs)
    dy = np.random.default_rng(99).normal(size=np.shape(out))
    grads = analytic(dy)
    for i, g in grads.items():
        num = numerical_grad(lambda: float(np.sum(forward(*inputs) * dy)), inputs[i])
        R.assert_close(g, num, FD_TOL, f"{what} d input {i} vs finite differences")
    if torch_forward is not None:
        ts = [torch.tensor(a, requires_grad=i in grads) if isinstance(a, np.ndarray) and a.dtype == np.float64
              else a for i, a in enumerate(inputs)]
        (torch_forward(*ts) * torch.from_numpy(dy)).sum().backward()
        for i, g in grads.items():
            R.assert_close(g, ts[i].grad, AUTOGRAD_TOL, f"{what} d input {i} vs autograd")


def rnd(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).normal(size=shape)


def test_linear_backward():
    x, w, b = rnd(2, 3, 5), rnd(4, 5, seed=1), rnd(4, seed=2)

    def analytic(dy):
        dx, dw, db = linear_backward(dy, x, w)
        return {0: dx, 1: dw, 2: db}
    check_grads(linear_forward, [x, w, b], analytic, F.linear, "linear")


def test_linear_backward_without_bias_returns_none():
    x, w = rnd(3, 5), rnd(4, 5)
    dx, dw, db = linear_backward(rnd(3, 4), x, w, has_bias=False)
    assert db is None and dx.shape == x.shape and dw.shape == w.shape


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "relu", "silu"])
def test_activation_backward(name):
    fwd, bwd, _ = ACTIVATIONS[name]
    x = np.linspace(-5, 5, 41) + 0.0123                # never exactly 0 (ReLU's kink)
    ref = {"gelu": F.gelu, "gelu_tanh": lambda a: F.gelu(a, approximate="tanh"), "relu": F.relu, "silu": F.silu}[name]
    check_grads(fwd, [x], lambda dy: {0: bwd(dy, x)}, ref, name)


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_backward(bias):
    x, w = rnd(2, 3, 6) * 2 + 1, 1 + 0.5 * rnd(6, seed=1)
    b = rnd(6, seed=2) if bias else None

    def fwd(x, w, b=None):
        return layernorm_forward(x, w, b, 1e-5)[0]

    def analytic(dy):
        dx, dw, db = layernorm_backward(dy, w, layernorm_forward(x, w, b, 1e-5)[1], has_bias=bias)
        return {0: dx, 1: dw, 2: db} if bias else {0: dx, 1: dw}
    inputs = [x, w, b] if bias else [x, w]
    check_grads(fwd, inputs, analytic, lambda x, w, b=None: F.layer_norm(x, (6,), w, b, 1e-5), "layernorm")


def test_rmsnorm_backward():
    x, w = rnd(2, 3, 6), 1 + 0.5 * rnd(6, seed=1)

    def analytic(dy):
        dx, dw = rmsnorm_backward(dy, w, rmsnorm_forward(x, w, 1e-6)[1])
        return {0: dx, 1: dw}
    check_grads(lambda x, w: rmsnorm_forward(x, w, 1e-6)[0], [x, w], analytic,
                lambda x, w: F.rms_norm(x, (6,), w, 1e-6), "rmsnorm")


def test_softmax_backward():
    x = rnd(3, 7) * 3
    check_grads(softmax_forward, [x], lambda dy: {0: softmax_backward(dy, softmax_forward(x))},
                lambda a: torch.softmax(a, -1), "softmax")


@pytest.mark.parametrize("H,Hkv,T,S,window", [(4, 4, 4, 4, 0), (4, 2, 4, 4, 0), (6, 2, 3, 5, 0), (4, 1, 5, 5, 2)])
def test_attention_backward(H, Hkv, T, S, window):
    hd = 3
    q, k, v = rnd(1, T, H, hd, seed=1), rnd(1, S, Hkv, hd, seed=2), rnd(1, S, Hkv, hd, seed=3)
    allowed = causal_mask(np.arange(S - T, S), np.arange(S), window)
    scale = 0.7

    def fwd(q, k, v):
        return attention_forward(q, k, v, scale, allowed)[0]

    def analytic(dy):
        probs = attention_forward(q, k, v, scale, allowed)[1][1]
        dq, dk, dv = attention_backward(dy, q, k, v, probs, scale)
        return {0: dq, 1: dk, 2: dv}
    check_grads(fwd, [q, k, v], analytic,
                lambda q, k, v: R.causal_attention(q, k, v, scale, torch.from_numpy(allowed)), f"attention H{H}/{Hkv}")


def test_softcapped_attention_backward():
    """Gemma 2: scores c*tanh(scale*q.k / c) before the mask; the backward chains 1 - tanh^2."""
    from ffnlab.ops.attention import attention_mix, attention_probs, attention_scores
    H, Hkv, T, S, hd, scale, c = 4, 2, 4, 5, 3, 0.9, 1.5
    q, k, v = rnd(1, T, H, hd, seed=4) * 2, rnd(1, S, Hkv, hd, seed=5) * 2, rnd(1, S, Hkv, hd, seed=6)
    allowed = causal_mask(np.arange(S - T, S), np.arange(S), 3)

    def capped(q, k):
        return np.tanh(attention_scores(q, k) * scale / c)

    def fwd(q, k, v):
        return attention_mix(attention_probs(c * capped(q, k), 1.0, allowed), v)

    def analytic(dy):
        t = capped(q, k)
        probs = attention_probs(c * t, 1.0, allowed)
        assert np.abs(t).max() > 0.9                     # the cap bends these scores
        dq, dk, dv = attention_backward(dy, q, k, v, probs, scale, t)
        return {0: dq, 1: dk, 2: dv}
    check_grads(fwd, [q, k, v], analytic,
                lambda q, k, v: R.causal_attention(q, k, v, scale, torch.from_numpy(allowed), c), "softcapped attention")


@pytest.mark.parametrize("pairing", ["normal", "neox"])
def test_partial_rope_backward(pairing):
    """GPT-NeoX: the first n_rot = 4 of 10 dims rotate (angles for n_rot dims), the rest pass through."""
    x = rnd(1, 5, 2, 10)
    pos = np.arange(2, 7)
    cos, sin = rope_angles(pos, 4, 100.0)
    ref = R.rope_normal if pairing == "normal" else R.rope_neox
    y = rope_forward(x, cos, sin, pairing)
    assert np.array_equal(y[..., 4:], x[..., 4:]) and not np.allclose(y[..., :4], x[..., :4])
    check_grads(lambda x: rope_forward(x, cos, sin, pairing), [x],
                lambda dy: {0: rope_backward(dy, cos, sin, pairing)},
                lambda x: torch.cat([ref(x[..., :4], R.rope_angles(pos, 4, 100.0)), x[..., 4:]], -1),
                f"partial rope {pairing}")


@pytest.mark.parametrize("pairing", ["normal", "neox"])
def test_rope_backward(pairing):
    x = rnd(1, 5, 2, 8)
    pos = np.arange(2, 7)
    cos, sin = rope_angles(pos, 8, 100.0)
    ref = R.rope_normal if pairing == "normal" else R.rope_neox
    check_grads(lambda x: rope_forward(x, cos, sin, pairing), [x],
                lambda dy: {0: rope_backward(dy, cos, sin, pairing)},
                lambda x: ref(x, R.rope_angles(pos, 8, 100.0)), f"rope {pairing}")


def test_embedding_backward_accumulates_repeated_ids():
    wte, wpe = rnd(7, 4), rnd(9, 4, seed=1)
    ids, pos = np.array([2, 5, 2, 2, 0]), np.arange(3, 8)

    def analytic(dy):
        dwte, dwpe = embedding_backward(dy, ids, 7, pos, 9)
        return {0: dwte, 1: dwpe}
    check_grads(lambda wte, wpe: embedding_forward(ids, wte, wpe, pos), [wte, wpe], analytic,
                lambda wte, wpe: F.embedding(torch.from_numpy(ids), wte) + F.embedding(torch.from_numpy(pos), wpe),
                "embedding")


def test_cross_entropy_backward():
    logits, targets = rnd(4, 6) * 3, np.array([0, 5, 2, 2])
    x = [logits]
    num = numerical_grad(lambda: cross_entropy_forward(x[0], targets)[0], logits)
    analytic = cross_entropy_backward(cross_entropy_forward(logits, targets)[1], targets)
    R.assert_close(analytic, num, FD_TOL, "cross-entropy vs finite differences")
    tl = torch.tensor(logits, requires_grad=True)
    F.cross_entropy(tl, torch.from_numpy(targets)).backward()
    R.assert_close(analytic, tl.grad, AUTOGRAD_TOL, "cross-entropy vs autograd")
