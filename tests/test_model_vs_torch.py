"""Whole block and whole model, forward and backward, against tests/torch_reference.py.

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
from ffnlab.config import ModelConfig
from ffnlab.model import Model
from ffnlab.model.block import block_backward, block_forward
from ffnlab.model.hooks import Hooks
from ffnlab.model.params import param_shapes
from ffnlab.model.transformer import backward, forward
from ffnlab.ops import causal_mask, cross_entropy_backward, cross_entropy_forward
from ffnlab.tracing import Tracer
from test_ops import FP32
from tolerances import f32_atol

GRAD_FP32 = 1e-4
GRAD_FP64 = 1e-9

CONFIGS = {
    "gpt2": ModelConfig(arch="gpt2", n_layer=2, d_model=32, n_head=4, d_ff=128, ffn="gelu_tanh", ffn_bias=True,
                        attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="learned",
                        vocab_size=61, n_ctx=24, tie_embeddings=True),
    "llama": ModelConfig(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=88, ffn="swiglu",
                         norm="rmsnorm", norm_eps=1e-6, positions="rope", rope_pairing="normal", rope_theta=10000.0,
                         vocab_size=61, n_ctx=24, tie_embeddings=False),
    "gemma3": ModelConfig(arch="gemma3", n_layer=3, d_model=24, n_head=4, n_kv_head=1, head_dim=16, d_ff=64,
                          ffn="geglu", norm="rmsnorm", norm_eps=1e-6, post_attn_norm=True, post_ffn_norm=True,
                          qk_norm=True, positions="rope", rope_pairing="neox", rope_theta=1e6, rope_theta_local=1e4,
                          sliding_window=3, sliding_window_pattern=3, attn_scale=0.0625, embed_scale=True,
                          vocab_size=61, n_ctx=24, tie_embeddings=True),
    "qwen2": ModelConfig(arch="qwen2", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=72, ffn="swiglu",
                         attn_bias=True, norm="rmsnorm", positions="rope", rope_pairing="neox", rope_scale=2.0,
                         final_logit_softcap=5.0, vocab_size=61, n_ctx=24, tie_embeddings=False),
    # Gemma 2: attention logit softcap (small enough to bend these scores), alternating sliding
    # windows, query_pre_attn_scalar != head_dim, pre and post norms, final softcap
    "gemma2": ModelConfig(arch="gemma2", n_layer=2, d_model=24, n_head=4, n_kv_head=2, head_dim=8, d_ff=64,
                          ffn="geglu", norm="rmsnorm", norm_eps=1e-6, post_attn_norm=True, post_ffn_norm=True,
                          positions="rope", rope_pairing="neox", sliding_window=3, sliding_window_pattern=2,
                          attn_scale=0.2, attn_softcap=1.5, final_logit_softcap=8.0, embed_scale=True,
                          vocab_size=61, n_ctx=24, tie_embeddings=True),
    # GPT-NeoX/Pythia: parallel residual, partial rotary (8 of 16 dims), fused qkv, LayerNorm with bias, GELU
    "gptneox": ModelConfig(arch="gptneox", n_layer=2, d_model=32, n_head=2, d_ff=128, ffn="gelu", ffn_bias=True,
                           attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="rope",
                           rope_pairing="neox", rope_dim=8, parallel_residual=True, vocab_size=61, n_ctx=24,
                           tie_embeddings=False),
    # OLMo 2: no pre norms, post-attention and post-FFN norms, q/k norms over the whole projection
    "olmo2": ModelConfig(arch="olmo2", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=72, ffn="swiglu",
                         norm="rmsnorm", pre_norm=False, post_attn_norm=True, post_ffn_norm=True, qk_norm=True,
                         qk_norm_full=True, positions="rope", rope_pairing="neox", vocab_size=61, n_ctx=24,
                         tie_embeddings=False),
    # Mistral: every layer slides (window 3 < 24 positions), GQA, adjacent-pair RoPE
    "mistral": ModelConfig(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=72, ffn="swiglu",
                           norm="rmsnorm", positions="rope", rope_pairing="normal", sliding_window=3,
                           vocab_size=61, n_ctx=24, tie_embeddings=False),
    # Llama 3.x rope scaling: head_dim 8, base 1e4 -> wavelengths 6.3 (interpolated, between 16/4 and 16),
    # 63, 628, 6283 (divided by 8)
    "llama3": ModelConfig(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=72, ffn="swiglu",
                          norm="rmsnorm", positions="rope", rope_pairing="normal", rope_llama3=(8.0, 1.0, 4.0, 16.0),
                          vocab_size=61, n_ctx=24, tie_embeddings=False),
    # Qwen3: per-head q/k RMSNorm before RoPE, attention biases (attention_bias), head_dim * n_head != d_model,
    # a window of 3 from layer 1 on (max_window_layers 1)
    "qwen3": ModelConfig(arch="qwen3", n_layer=2, d_model=32, n_head=4, n_kv_head=2, head_dim=16, d_ff=72,
                         ffn="swiglu", attn_bias=True, attn_out_bias=True, norm="rmsnorm", qk_norm=True,
                         positions="rope", rope_pairing="neox", sliding_window=3, sliding_window_start=1,
                         vocab_size=61, n_ctx=24, tie_embeddings=True),
    # Phi-3: fused qkv split by head counts (GQA), q scaled after RoPE, one ffn_up node, window on every layer
    "phi3": ModelConfig(arch="phi3", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=72, ffn="swiglu",
                        fused_qkv=True, norm="rmsnorm", positions="rope", rope_pairing="neox", sliding_window=5,
                        vocab_size=61, n_ctx=24, tie_embeddings=False),
}


def random_params(cfg, dtype=np.float32, seed=0):
    """Weights large enough that every nonlinearity bends (std 0.02 init would leave attention
    uniform and GELU linear): matrices N(0, 1/fan_in), norms 1 + N(0, 0.2^2), biases N(0, 0.2^2)."""
    r = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".bias"):
            a = 0.2 * r.normal(size=shape)
        elif "norm" in name:
            a = 1.0 + 0.2 * r.normal(size=shape)
        elif name in ("token_embd.weight", "position_embd.weight"):
            a = 0.3 * r.normal(size=shape)               # a tied head reuses it: logits stay O(1..10)
        else:
            a = r.normal(size=shape) / np.sqrt(shape[1])
        p[name] = a.astype(dtype)
    return p


def layer_mask(cfg, il, T):
    pos = np.arange(T)
    return pos, causal_mask(pos, pos, cfg.sliding_window if cfg.is_sliding(il) else 0)


# --- checks (shared with test_mistakes.py) ----------------------------------------------------
def check_block(cfg, il=0, block=block_forward, T=7):
    """One block's forward in float32 against the torch block; the input must come back untouched."""
    p = random_params(cfg)
    x = np.random.default_rng(5).normal(size=(2, T, cfg.d_model)).astype(np.float32)
    x_before = x.copy()
    pos, allowed = layer_mask(cfg, il, T)
    y, _ = block(x, p, cfg, il, pos, allowed)
    assert np.array_equal(x, x_before), "block_forward modified its input x"
    ref = R.block_forward(torch.from_numpy(x), R.params_to_torch(p, torch.float32), cfg, il, pos)
    R.assert_close(y, ref, FP32, f"{cfg.arch} block {il} output")


def check_block_backward(cfg, il=0, dtype=np.float64, tol=GRAD_FP64, T=6):
    p = random_params(cfg, dtype)
    x = np.random.default_rng(6).normal(size=(2, T, cfg.d_model)).astype(dtype)
    pos, allowed = layer_mask(cfg, il, T)
    y, cache = block_forward(x, p, cfg, il, pos, allowed)
    dy = np.random.default_rng(7).normal(size=y.shape).astype(dtype)
    dx, grads = block_backward(dy, p, cfg, il, cache)
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
