"""The FFN family (model/ffn.py) against PyTorch: forward, every gradient, and the named intermediates.

  dense: down(act(up x + b_up)) + b_down     act in gelu | gelu_tanh | relu
  gated: down(act(gate x) * up x)            swiglu (SiLU) | geglu (GELU tanh), biases optional
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_reference as R
from ffnlab.config import ModelConfig
from ffnlab.model.ffn import FFN_KINDS, ffn_backward, ffn_forward
from ffnlab.model.weights import LayerWeights
from finite_differences import FD_TOL, numerical_grad
from op_checks import FP32

# (kind, bias): every dense activation with and without biases, both gated kinds, gated with biases
CASES = [("gelu", True), ("gelu", False), ("gelu_tanh", True), ("gelu_tanh", False), ("relu", True),
         ("relu", False), ("swiglu", False), ("geglu", False), ("swiglu", True), ("geglu", True)]
FIELDS = {"up": "ffn_up.weight", "down": "ffn_down.weight", "gate": "ffn_gate.weight",
          "up_b": "ffn_up.bias", "gate_b": "ffn_gate.bias", "down_b": "ffn_down.bias"}


def make_weights(kind, bias, d_model=16, d_ff=40, dtype=np.float32, seed=0):
    r = np.random.default_rng(seed)
    gated = FFN_KINDS[kind].gated
    w = dict(up=r.normal(size=(d_ff, d_model)) / np.sqrt(d_model), down=r.normal(size=(d_model, d_ff)) / np.sqrt(d_ff))
    if gated:
        w["gate"] = r.normal(size=(d_ff, d_model)) / np.sqrt(d_model)
    if bias:
        w["up_b"], w["down_b"] = 0.5 * r.normal(size=d_ff), 0.5 * r.normal(size=d_model)
        if gated:
            w["gate_b"] = 0.5 * r.normal(size=d_ff)
    return LayerWeights(**{k: v.astype(dtype) for k, v in w.items()})


def torch_ffn(x, w: LayerWeights, kind):
    """-> y, {name: leaf tensor} through torch_reference.ffn, which reads GGUF names."""
    tp = {"blk.0." + FIELDS[k]: torch.tensor(v, requires_grad=True) for k in FIELDS if (v := getattr(w, k)) is not None}
    tx = torch.tensor(x, requires_grad=True)
    return R.ffn(tx, tp, ModelConfig(ffn=kind), 0), tx, tp


def inputs(dtype=np.float32, T=7, d_model=16):
    return (np.random.default_rng(1).normal(size=(2, T, d_model)) * 1.5).astype(dtype)


@pytest.mark.parametrize("kind,bias", CASES)
def test_ffn_forward_and_grads_match_torch(kind, bias):
    w, x = make_weights(kind, bias), inputs()
    y, cache = ffn_forward(x, w, kind)
    ty, tx, tp = torch_ffn(x, w, kind)
    R.assert_close(y, ty, FP32, f"{kind} y")
    dy = np.random.default_rng(2).normal(size=y.shape).astype(np.float32)
    dx, grads = ffn_backward(dy, w, kind, cache)
    (ty * torch.from_numpy(dy)).sum().backward()
    R.assert_close(dx, tx.grad, FP32, f"{kind} dx")
    expected = {k for k in FIELDS if (v := getattr(w, k)) is not None}
    assert set(grads) == expected
    for k in expected:
        assert grads[k].dtype == np.float32, k
        R.assert_close(grads[k], tp["blk.0." + FIELDS[k]].grad, FP32, f"{kind} d{k}")


@pytest.mark.parametrize("kind,bias", CASES)
def test_ffn_grads_match_finite_differences(kind, bias):
    w, x = make_weights(kind, bias, d_model=4, d_ff=6, dtype=np.float64), inputs(np.float64, T=3, d_model=4)
    dy = np.random.default_rng(3).normal(size=x.shape)
    dx, grads = ffn_backward(dy, w, kind, ffn_forward(x, w, kind)[1])

    def loss():
        return float(np.sum(ffn_forward(x, w, kind)[0] * dy))
    R.assert_close(dx, numerical_grad(loss, x), FD_TOL, f"{kind} dx vs finite differences")
    for k, g in grads.items():
        R.assert_close(g, numerical_grad(loss, getattr(w, k)), FD_TOL, f"{kind} d{k} vs finite differences")


@pytest.mark.parametrize("kind", ["swiglu", "geglu"])
def test_gated_intermediates_are_gate_act_up_and_product(kind):
    w, x = make_weights(kind, True), inputs()
    _, (x_in, up, gate, act, h) = ffn_forward(x, w, kind)
    tx = torch.from_numpy(x)
    t_up = F.linear(tx, torch.from_numpy(w.up), torch.from_numpy(w.up_b))
    t_gate = F.linear(tx, torch.from_numpy(w.gate), torch.from_numpy(w.gate_b))
    t_act = R.ACT[FFN_KINDS[kind].act](t_gate)
    assert x_in is x
    R.assert_close(up, t_up, FP32, "up")
    R.assert_close(gate, t_gate, FP32, "gate")
    R.assert_close(act, t_act, FP32, "act(gate)")
    R.assert_close(h, t_act * t_up, FP32, "act(gate) * up")


@pytest.mark.parametrize("kind", ["gelu", "gelu_tanh", "relu"])
def test_dense_intermediates_are_up_and_act(kind):
    w, x = make_weights(kind, True), inputs()
    _, (_, up, gate, act, h) = ffn_forward(x, w, kind)
    t_up = F.linear(torch.from_numpy(x), torch.from_numpy(w.up), torch.from_numpy(w.up_b))
    assert gate is None and h is act
    R.assert_close(up, t_up, FP32, "up")
    R.assert_close(act, R.ACT[kind](t_up), FP32, "act(up)")


def traced(kind, bias):
    w, x = make_weights(kind, bias), inputs()
    seen = {}

    def observe(name, a, op=None, srcs=None, bare=False):
        seen.setdefault(name, (op, a.copy()))
        return a
    y, _ = ffn_forward(x, w, kind, observe)
    return w, x, y, seen


@pytest.mark.parametrize("kind,bias,names", [
    ("gelu_tanh", True, ["ffn_up", "ffn_up_b", "ffn_gelu", "ffn_down", "ffn_out"]),
    ("relu", False, ["ffn_up", "ffn_relu", "ffn_out"]),
    ("swiglu", False, ["ffn_gate", "ffn_up", "ffn_swiglu", "ffn_out"]),
    ("geglu", True, ["ffn_gate", "ffn_gate_b", "ffn_up", "ffn_up_b", "ffn_geglu", "ffn_down", "ffn_out"]),
])
def test_ffn_hooks_llama_cpp_node_names_in_order(kind, bias, names):
    *_, seen = traced(kind, bias)
    assert list(seen) == names


def test_traced_up_is_before_its_bias():
    w, x, y, seen = traced("gelu_tanh", True)
    tx = torch.from_numpy(x)
    R.assert_close(seen["ffn_up"][1], F.linear(tx, torch.from_numpy(w.up)), FP32, "ffn_up (no bias)")
    R.assert_close(seen["ffn_up_b"][1], F.linear(tx, torch.from_numpy(w.up), torch.from_numpy(w.up_b)), FP32, "ffn_up_b")
    assert np.array_equal(seen["ffn_out"][1], y)


def test_tracing_does_not_change_the_ffn_output():
    for kind, bias in CASES:
        w, x = make_weights(kind, bias), inputs()
        y0, _ = ffn_forward(x, w, kind)
        y1, _ = ffn_forward(x, w, kind, lambda name, a, *rest: a)
        assert np.array_equal(y0, y1), kind


@pytest.mark.parametrize("kind,bias", [c for c in CASES if FFN_KINDS[c[0]].gated])
def test_packed_gate_up_gives_the_two_products(kind, bias):
    # gate and up rows stacked in one buffer (model/packing.py) make one product whose halves are
    # the two products' rows; BLAS may sum a tile of the stack in another order, so agreement is
    # to float32 rounding of a d_model-long dot product; the one-token step takes the same path
    w, x = make_weights(kind, bias), inputs()
    apart = [ffn_forward(a, w, kind)[0] for a in (x, x[:1, :1])]
    w.gate_up = np.concatenate([w.gate, w.up])
    for a, want in zip((x, x[:1, :1]), apart):
        R.assert_close(ffn_forward(a, w, kind)[0], torch.from_numpy(want), FP32, f"{kind} packed gate_up")