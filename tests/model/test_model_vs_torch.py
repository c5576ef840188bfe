"""Whole block and whole model, forward and backward, against tests/reference/torch_reference.py.

Both implementations read one ModelConfig and one dict of GGUF-named parameters. Three
architectures cover every switch of the model: GPT-2 (LayerNorm, learned positions, fused qkv,
biases, GELU tanh, tied head), Llama (GQA, RoPE adjacent pairs, SwiGLU, RMSNorm, untied head) and
Gemma 3 (GeGLU, q/k norms, post norms, embed scale, head_dim * n_head != d_model, RoPE halves,
sliding-window layers with their own RoPE base). A Qwen2-like config adds q/k/v biases, RoPE
scaling and a logit softcap.

Tolerances: logits in float32 within tolerances.f32_atol (the longest reduction x eps x the largest
logit, for each side: the two float32 forwards differ only in summation order); gradients within 1e-4 relative in float32
(they sum over B*T positions and through every layer) and 1e-9 in float64 (same math, other order).
"""
import numpy as np
import pytest
import torch

import torch_reference as R
from ffnlab.model import Model
from ffnlab.model.block import block_backward, block_forward
from ffnlab.model.hooks import Hooks
from ffnlab.model.transformer import backward, forward
from ffnlab.model.weights import layer_weights
from ffnlab.ops import cross_entropy_backward, cross_entropy_forward
from ffnlab.tracing import Tracer
from tolerances import f32_atol
from block_checks import CONFIGS, check_block, layer_mask, random_params

GRAD_FP32 = 1e-4
GRAD_FP64 = 1e-9


def check_block_backward(cfg, il=0, dtype=np.float64, tol=GRAD_FP64, T=6):
    p = random_params(cfg, dtype)
    x = np.random.default_rng(6).normal(size=(2, T, cfg.d_model)).astype(dtype)
    pos, allowed = layer_mask(cfg, il, T)
    w = layer_weights(p, cfg, il)
    y, cache = block_forward(x, w, cfg, pos, allowed)
    dy = np.random.default_rng(7).normal(size=y.shape).astype(dtype)
    dx, grads = block_backward(dy, w, cfg, cache)
    tdt = torch.float64 if dtype == np.float64 else torch.float32
    tp = R.params_to_torch(p, tdt)
    tx = torch.tensor(x, requires_grad=True)
    (R.block_forward(tx, tp, cfg, il, pos) * torch.from_numpy(dy)).sum().backward()
    R.assert_close(dx, tx.grad, tol, f"{cfg.arch} block {il} dx")
    block_names = {k for k in p if k.startswith(f"blk.{il}.")}
    assert set(grads) == block_names
    for k in block_names:
        assert grads[k].dtype == dtype, k
        R.assert_close(grads[k], tp[k].grad, tol, f"{cfg.arch} d{k}")


def tokens(cfg, B=2, T=9, seed=8):
    r = np.random.default_rng(seed)
    return r.integers(0, cfg.vocab_size, size=(B, T)), r.integers(0, cfg.vocab_size, size=(B, T))


# --- block ------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_block_forward_matches_torch(arch):
    check_block(CONFIGS[arch])


def test_gemma3_global_block_matches_torch():
    cfg = CONFIGS["gemma3"]
    assert not cfg.is_sliding(2) and cfg.is_sliding(0)
    check_block(cfg, il=2)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_block_backward_matches_torch_float64(arch):
    check_block_backward(CONFIGS[arch])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma3", "gemma2", "gptneox", "olmo2", "mistral", "llama3",
                                  "qwen3", "phi3"])
def test_block_backward_matches_torch_float32(arch):
    check_block_backward(CONFIGS[arch], dtype=np.float32, tol=GRAD_FP32)


# --- whole model ------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_model_logits_match_torch_float32(arch):
    cfg = CONFIGS[arch]
    p = random_params(cfg)
    ids, _ = tokens(cfg)
    logits, _ = forward(p, cfg, ids)
    ref = R.forward(R.params_to_torch(p, torch.float32), cfg, ids).detach().numpy()
    assert logits.dtype == np.float32
    assert np.abs(ref).max() > 1.0                        # logits of a size where float32 error shows
    err = np.abs(logits - ref).max()
    assert err <= f32_atol(cfg, ref), f"{arch}: max |logits - torch| = {err:.2e}, bound {f32_atol(cfg, ref):.2e}"


def model_grads(cfg, p, ids, targets):
    logits, cache = forward(p, cfg, ids, train=True)
    B, T, V = logits.shape
    loss, probs = cross_entropy_forward(logits.reshape(B * T, V), targets.reshape(-1))
    grads = backward(cross_entropy_backward(probs, targets.reshape(-1)).reshape(B, T, V), p, cfg, cache)
    return loss, grads


@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("dtype,tol", [(np.float64, GRAD_FP64), (np.float32, GRAD_FP32)])
def test_model_grads_match_torch(arch, dtype, tol):
    cfg = CONFIGS[arch]
    p = random_params(cfg, dtype)
    ids, targets = tokens(cfg)
    loss, grads = model_grads(cfg, p, ids, targets)
    ref_loss, ref_grads = R.loss_and_grads(p, cfg, ids, targets, torch.float64 if dtype == np.float64 else torch.float32)
    assert abs(loss - ref_loss) <= tol * abs(ref_loss)
    assert set(grads) == set(p)
    for k in p:
        assert grads[k].shape == p[k].shape and grads[k].dtype == dtype, k
        R.assert_close(grads[k], ref_grads[k], tol, f"{arch} d{k}")


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "gemma2", "gptneox", "olmo2", "mistral", "llama3",
                                  "qwen3", "phi3"])
def test_kv_cache_decoding_matches_full_forward_in_torch(arch):
    cfg = CONFIGS[arch]
    model = Model(cfg, random_params(cfg))
    ids = tokens(cfg, B=1, T=8)[0][0]
    ref = R.forward(R.params_to_torch(model.params, torch.float32), cfg, ids[None]).detach().numpy()[0]
    kv = model.new_cache()
    steps = [model.forward(ids[:3], kv)] + [model.forward(ids[i:i + 1], kv) for i in range(3, 8)]
    got = np.concatenate(steps)                           # prompt of 3, then one token at a time
    assert kv.n == 8
    assert np.abs(got - ref).max() <= f32_atol(cfg, ref)


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_tracer_only_observes(arch):
    cfg = CONFIGS[arch]
    p = random_params(cfg)
    ids, _ = tokens(cfg)
    plain, _ = forward(p, cfg, ids)
    tracer = Tracer()
    traced, _ = forward(p, cfg, ids, hooks=Hooks(tracer))
    assert len(tracer.nodes) > 10 * cfg.n_layer           # it did observe
    assert np.array_equal(plain, traced)                   # bit-identical
    assert np.array_equal(tracer["result_output"], plain)
