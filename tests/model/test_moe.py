"""The mixture-of-experts FFN (model/ffn.py's moe kind) against an independent PyTorch MoE.

tests/reference/torch_reference.py's moe() computes every expert on every token and masks the outputs
with the top-k one-hot weights; ffnlab gathers each expert's tokens and multiplies them in one
product per expert. Same math, different order and different work.

Tolerances: forward in float32 within FP32 relative (tests/reference/op_checks.py); gradients within 1e-4 relative
in float32 (sums over tokens and experts) and 1e-9 in float64 (same math, another order);
finite differences in float64 within test_gradcheck's FD_TOL (eps 1e-6: truncation ~1e-12,
rounding ~1e-10; no router choice flips at that step for these random inputs, checked below).
"""
import re

import numpy as np
import pytest
import torch

import torch_reference as R
from ffnlab.config import ConfigError, ModelConfig
from ffnlab.model import Model
from ffnlab.model import ffn as ffn_mod
from ffnlab.model.ffn import MOE_TENSOR, ffn_backward, ffn_forward, moe_forward
from ffnlab.model.weights import moe_weights
from ffnlab.model.hooks import Hooks
from ffnlab.model.transformer import backward, forward
from ffnlab.ops import cross_entropy_backward, cross_entropy_forward
from ffnlab.tracing import Tracer
from finite_differences import FD_TOL, numerical_grad
from op_checks import FP32

GRAD_FP32 = 1e-4
GRAD_FP64 = 1e-9


from moe_models import moe_config, random_params


CASES = {"mixtral": dict(norm=True), "olmoe": dict(norm=False), "qwen2moe": dict(shared=True, norm=False),
         "top1": dict(norm=False, K=1), "all_experts": dict(norm=False, E=3, K=3)}


def layer(cfg, dtype, seed=0):
    p = random_params(cfg, dtype, seed)
    return p, moe_weights(p, 0, cfg)


def torch_moe(x, p, cfg, dtype):
    tp = R.params_to_torch(p, dtype)
    tx = torch.tensor(x, requires_grad=True)
    return tx, tp, R.moe(tx, tp, cfg, 0)


@pytest.mark.parametrize("case", list(CASES))
def test_moe_forward_matches_torch(case):
    cfg = moe_config(**CASES[case])
    p, w = layer(cfg, np.float32)
    x = np.random.default_rng(1).normal(size=(2, 7, cfg.d_model)).astype(np.float32)
    y, _ = ffn_forward(x, w, cfg.ffn)
    _, _, ref = torch_moe(x, p, cfg, torch.float32)
    assert y.dtype == np.float32 and y.shape == x.shape
    R.assert_close(y, ref, FP32, f"{case} moe output")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype,tol", [(np.float64, GRAD_FP64), (np.float32, GRAD_FP32)])
def test_moe_backward_matches_torch_autograd(case, dtype, tol):
    """Every gradient, the router's included (autograd through softmax, top-k values and the
    renormalisation; the top-k indices carry none)."""
    cfg = moe_config(**CASES[case])
    p, w = layer(cfg, dtype)
    x = np.random.default_rng(2).normal(size=(2, 5, cfg.d_model)).astype(dtype)
    y, cache = ffn_forward(x, w, cfg.ffn)
    dy = np.random.default_rng(3).normal(size=y.shape).astype(dtype)
    dx, grads = ffn_backward(dy, w, cfg.ffn, cache)
    tx, tp, ref = torch_moe(x, p, cfg, torch.float64 if dtype == np.float64 else torch.float32)
    (ref * torch.from_numpy(dy)).sum().backward()
    R.assert_close(dx, tx.grad, tol, f"{case} dx")
    names = {k: "blk.0." + MOE_TENSOR[k] for k in grads}
    assert set(names.values()) == {k for k in p if k.startswith("blk.0.ffn_") and "norm" not in k}
    for k, name in names.items():
        assert grads[k].dtype == dtype, k
        R.assert_close(grads[k], tp[name].grad, tol, f"{case} d{name}")


@pytest.mark.parametrize("case", ["mixtral", "qwen2moe", "olmoe"])
def test_moe_gradients_match_finite_differences(case):
    cfg = moe_config(**CASES[case], E=4, d_model=8, d_ff=5, d_ff_shexp=4 if CASES[case].get("shared") else 0)
    p, w = layer(cfg, np.float64, seed=4)
    x = np.random.default_rng(5).normal(size=(1, 3, cfg.d_model))
    y, cache = ffn_forward(x, w, cfg.ffn)
    dy = np.random.default_rng(6).normal(size=y.shape)
    dx, grads = ffn_backward(dy, w, cfg.ffn, cache)
    topk0 = cache.topk.copy()

    def loss():
        y2, c2 = ffn_forward(x, w, cfg.ffn)
        assert np.array_equal(c2.topk, topk0), "a finite-difference step changed the routing"
        return float((y2 * dy).sum())

    for name, analytic in [("x", dx)] + [(k, grads[k]) for k in grads]:
        target = x if name == "x" else getattr(w, name) if not name.endswith("_shexp") or name == "gate_inp_shexp" \
            else getattr(w.shexp, name.removesuffix("_shexp"))
        num = numerical_grad(loss, target)
        err = R.rel_err(analytic, num)
        assert err <= FD_TOL, f"{case} d{name}: relative error {err:.2e} against finite differences"


def test_experts_run_one_product_per_used_expert(monkeypatch):
    """Batched by expert: up, gate and down make one product per expert that received tokens,
    however many tokens there are (no per-token loop)."""
    cfg = moe_config(E=4, K=2)
    _, w = layer(cfg, np.float32)
    x = np.random.default_rng(7).normal(size=(1, 50, cfg.d_model)).astype(np.float32)
    calls = []
    real = ffn_mod.linear_forward
    monkeypatch.setattr(ffn_mod, "linear_forward", lambda a, b, *r: calls.append(a.shape) or real(a, b, *r))
    _, cache = moe_forward(x, w)
    used = len(np.unique(cache.topk))
    assert len(calls) == 1 + 3 * used                      # the router, then up/gate/down per used expert
    assert sum(s[0] for s in calls[1:]) == 3 * 50 * 2       # every (token, expert) pair exactly once per product


def test_top_k_larger_than_experts_is_refused():
    with pytest.raises(ConfigError, match=r"n_expert_used \(top-k\) must be between 1 and n_expert = 4, got 5"):
        moe_config(E=4, K=5)
    with pytest.raises(ConfigError, match="n_expert must be a positive integer"):
        moe_config(E=0, K=0)
    with pytest.raises(ConfigError, match="for ffn moe only"):
        ModelConfig(ffn="swiglu", n_expert=4, n_expert_used=2)


# --- whole model ------------------------------------------------------------------------------
MODEL_CASES = {"mixtral": CASES["mixtral"], "qwen2moe": dict(CASES["qwen2moe"], attn_bias=True),
               "qwen3moe": dict(norm=True, qk_norm=True, head_dim=6),
               "olmoe": dict(norm=False, qk_norm=True, qk_norm_full=True, attn_bias=True, attn_out_bias=True)}


@pytest.mark.parametrize("case", list(MODEL_CASES))
def test_moe_model_logits_and_gradients_match_torch(case):
    """Whole models of each family's block (Qwen3's per-head and OLMoE's whole-projection q/k
    norms included), logits and every gradient in float64."""
    cfg = moe_config(**MODEL_CASES[case])
    p = random_params(cfg, np.float64)
    r = np.random.default_rng(8)
    ids, targets = r.integers(0, cfg.vocab_size, (2, 6)), r.integers(0, cfg.vocab_size, (2, 6))
    logits, cache = forward(p, cfg, ids, train=True)
    ref = R.forward(R.params_to_torch(p, torch.float64), cfg, ids).detach().numpy()
    R.assert_close(logits, ref, GRAD_FP64, f"{case} logits")
    B, T, V = logits.shape
    _, probs = cross_entropy_forward(logits.reshape(B * T, V), targets.reshape(-1))
    grads = backward(cross_entropy_backward(probs, targets.reshape(-1)).reshape(B, T, V), p, cfg, cache)
    _, ref_grads = R.loss_and_grads(p, cfg, ids, targets)
    assert set(grads) == set(p)
    for k in p:
        R.assert_close(grads[k], ref_grads[k], GRAD_FP64, f"{case} d{k}")


def test_moe_one_token_decode_matches_full_forward():
    """The KV-cache decode path (model/decode.py) gives the batched forward's logits."""
    cfg = moe_config(shared=True)
    m = Model(cfg, random_params(cfg))
    ids = [3, 1, 4, 1, 5, 9]
    full = m.forward(ids)
    kv = m.new_cache()
    steps = [m.forward_last([t], kv) for t in ids]
    R.assert_close(np.stack(steps), full, FP32 * 10, "decode vs forward")


def test_moe_trace_names_every_node_under_llama_cpp_names():
    cfg = moe_config(shared=True, norm=True)
    m = Model(cfg, random_params(cfg))
    tr = Tracer()
    m.hooks = Hooks(tr)
    m.forward([1, 2, 3])
    names = [n.name for n in tr.nodes if n.name.endswith("-0")]
    moe_nodes = [n.removesuffix("-0") for n in names if n.startswith(("ffn_moe", "ffn_shexp", "ffn_out"))]
    assert moe_nodes == ["ffn_moe_logits", "ffn_moe_probs", "ffn_moe_argsort", "ffn_moe_topk", "ffn_moe_weights",
                         "ffn_moe_weights_sum", "ffn_moe_weights_sum_clamped", "ffn_moe_weights_norm",
                         "ffn_moe_gate", "ffn_moe_up", "ffn_moe_swiglu", "ffn_moe_down", "ffn_moe_weighted",
                         "ffn_moe_out", "ffn_shexp", "ffn_shexp_gate_inp", "ffn_shexp_gate", "ffn_shexp_out",
                         "ffn_out"]
    shapes = {n.name: n.shape for n in tr.nodes}
    assert shapes["ffn_moe_up-0"] == (3, 2, cfg.d_ff) and shapes["ffn_moe_weights-0"] == (3, 2, 1)


def test_editing_the_router_choice_reroutes_tokens():
    """ffn_moe_topk is a hook point like any other: forcing every token to experts 0 and 1 gives
    the output of a layer whose router always picks them."""
    cfg = moe_config(norm=True, E=4, K=2)
    p, w = layer(cfg, np.float64)
    x = np.random.default_rng(9).normal(size=(1, 4, cfg.d_model))

    def hook(name, a, op=None, srcs=None, bare=False):
        return np.tile(np.array([0, 1], np.int32), a.shape[:-1] + (1,)) if name.startswith("ffn_moe_topk") else a
    y, _ = moe_forward(x, w, hook)
    probs = R.to_numpy(torch.softmax(torch.from_numpy(x @ w.gate_inp.T), -1))[..., :2]
    wts = probs / probs.sum(-1, keepdims=True)
    want = sum(wts[..., e:e + 1] * ((lambda g, u: g / (1 + np.exp(-g)) * u)(x @ w.gate_exps[e].T, x @ w.up_exps[e].T) @ w.down_exps[e].T)
               for e in range(2))
    R.assert_close(y, want, GRAD_FP64, "forced routing")


# --- GGUF: bad files ---------------------------------------------------------------------------
def moe_gguf(path, cfg, params, **lie):
    """Export cfg + params to GGUF, with metadata fields in `lie` written as given (not as params hold)."""
    from ffnlab.formats.export_gguf import export_gguf
    from ffnlab.training.data import byte_tokenizer, tokenizer_meta
    meta = ModelConfig(**{**cfg.to_dict(), "vocab_size": 256})
    for k, v in lie.items():
        object.__setattr__(meta, k, v)                 # past ModelConfig's own checks: a lying file
    tok = byte_tokenizer()
    return export_gguf(meta, params, tok, tokenizer_meta(tok, "byte"), str(path))


def test_gguf_round_trip_keeps_the_experts(tmp_path):
    import ffnlab
    cfg = moe_config(shared=True, norm=False, arch="qwen2moe", attn_bias=True, vocab_size=256)
    p = random_params(cfg)
    m = ffnlab.load(moe_gguf(tmp_path / "m.gguf", cfg, p), progress=False)
    assert (m.config.n_expert, m.config.n_expert_used, m.config.d_ff, m.config.d_ff_shexp) == (6, 2, 24, 20)
    assert np.array_equal(m.params["blk.1.ffn_up_exps.weight"], p["blk.1.ffn_up_exps.weight"])
    R.assert_close(m.forward([1, 2, 3]), Model(cfg, p).forward([1, 2, 3]), FP32, "reloaded logits")


@pytest.mark.parametrize("lie,msg", [
    ({"n_expert": 4}, r"m.gguf: tensor blk.0.ffn_gate_inp.weight holds 6 experts \(ggml shape \{16, 6\}\) "
                      r"but llama.expert_count is 4"),
    ({"n_expert_used": 7}, r"m.gguf: llama.expert_used_count = 7 exceeds llama.expert_count = 6"),
])
def test_gguf_whose_expert_metadata_disagrees_is_one_line(tmp_path, lie, msg):
    import subprocess
    import sys
    cfg = moe_config(vocab_size=256)
    path = moe_gguf(tmp_path / "m.gguf", cfg, random_params(cfg), **lie)
    r = subprocess.run([sys.executable, "-m", "ffnlab.cli.main", "run", "-m", path, "-p", "hi", "-n", "1"],
                       capture_output=True, text=True)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert re.search(msg, lines[0]), lines[0]


def test_export_refuses_what_llama_cpps_graph_would_compute_differently():
    from ffnlab.errors import UsageError
    from ffnlab.formats.export_gguf import gguf_arch
    cfg = moe_config(norm=False)                    # a llama (Mixtral) graph always renormalises
    with pytest.raises(UsageError, match=r"expert_norm=False \(llama.cpp's llama graph always renormalises"):
        gguf_arch(cfg)
    assert gguf_arch(moe_config(norm=True)) == "llama"
