"""The reference tests catch the classic transformer mistakes.

Each test builds a COPY of a real kernel module with one line of its source replaced by the
mistake (mutated() below; the real module is never touched), then runs the very check the real
tests use (op_checks.check_*, block_checks.check_block, in tests/reference/) on the real kernel, which must pass,
and on the copy, which must fail.
"""
import inspect
import types

import numpy as np
import pytest

import ffnlab.model.attention as model_attention
import ffnlab.model.block as model_block
import ffnlab.ops.activations as activations
import ffnlab.ops.attention as ops_attention
import ffnlab.ops.norms as norms
import ffnlab.ops.softmax as softmax
import ffnlab.ops.train_kernels as train_kernels
from block_checks import CONFIGS, check_block
from mutants import mutated_module
from op_checks import check_attention, check_gelu_tanh, check_layernorm, check_softmax


def mutated(module, *edits, **overrides):
    """A fresh copy of `module` with each (old, new) source edit applied, then `overrides` set.

    Each `old` must occur exactly once, so an edit can never silently miss after a refactor."""
    src = inspect.getsource(module)
    for old, new in edits:
        assert src.count(old) == 1, f"{module.__name__}: {old!r} occurs {src.count(old)} times"
        src = src.replace(old, new)
    copy = types.ModuleType(module.__name__ + "_mutated")
    copy.__package__ = module.__package__                 # relative imports resolve to the real package
    exec(compile(src, f"<mutated {module.__file__}>", "exec"), copy.__dict__)
    copy.__dict__.update(overrides)
    return copy


def numpy_probs(attention_module):
    """attention_module with its float32 probabilities from the NumPy twin, where the mutations
    below edit them (float32 otherwise runs ops/train_kernels.py's fused softmax, whose own
    mistakes tests/unit/test_train_kernels.py catches)"""
    attention_module.attention_probs = attention_module.attention_probs_numpy
    return attention_module


def block_with_attention(attention_module):
    """A block module whose attention sub-layer comes from attention_module."""
    return mutated(model_block, attention_forward_layer=attention_module.attention_forward_layer)


# --- 1. head split / merge -------------------------------------------------------------------
def test_catches_heads_split_by_reshape_instead_of_transpose():
    check_attention(H=4, Hkv=2)
    bad = mutated(ops_attention, (  # [B, T, H, hd] read as if it were already [B, H, T, hd]
        "return x.reshape(B, T, n_kv, H // n_kv, hd).transpose(0, 2, 3, 1, 4)",
        "return x.reshape(B, n_kv, H // n_kv, T, hd)"))
    with pytest.raises(AssertionError, match="relative error"):
        check_attention(bad.attention_forward, H=4, Hkv=2)


def test_catches_heads_merged_without_transpose():
    check_block(CONFIGS["llama"])
    bad = mutated(model_attention, (
        "out.transpose(0, 2, 1, 3).reshape(B, T, H * hd)",
        "out.reshape(B, T, H * hd)"))
    with pytest.raises(AssertionError, match="relative error"):
        check_block(CONFIGS["llama"], block=block_with_attention(bad).block_forward)


def test_catches_head_width_taken_as_d_model_over_n_head():
    # Gemma 3 has n_head * head_dim = 64 != d_model = 24; assuming head_dim = d_model // n_head
    # is invisible on GPT-2/Llama shapes, which is why the suite includes a Gemma-shaped config.
    cfg = CONFIGS["gemma3"]
    assert cfg.n_head * cfg.head_dim != cfg.d_model
    bad = block_with_attention(mutated(model_attention, (
        'a = a.reshape(B, T, heads[which], hd)',
        'a = a.reshape(B, T, heads[which], cfg.d_model // H)')))
    check_block(CONFIGS["llama"], block=bad.block_forward)       # d_model // n_head == head_dim there
    check_block(cfg)
    with pytest.raises(ValueError, match="reshape"):              # the split itself cannot work
        check_block(cfg, block=bad.block_forward)


# --- 2. causal mask --------------------------------------------------------------------------
def test_catches_mask_applied_after_softmax():
    check_attention()
    bad = mutated(ops_attention, (
        "        np.copyto(scores, -np.inf, where=~allowed)\n    return softmax_forward(scores)",
        "        pass\n    probs = softmax_forward(scores)\n    if allowed is not None:\n        np.copyto(probs, 0.0, where=~allowed)\n"
        "    return probs"))
    numpy_probs(bad)
    with pytest.raises(AssertionError, match="relative error"):
        check_attention(bad.attention_forward)


def test_catches_mask_with_zero_instead_of_neg_inf():
    bad = mutated(ops_attention, ("np.copyto(scores, -np.inf, where=~allowed)", "np.copyto(scores, 0.0, where=~allowed)"))
    numpy_probs(bad)
    with pytest.raises(AssertionError, match="relative error"):
        check_attention(bad.attention_forward)


# --- 3. scale --------------------------------------------------------------------------------
def test_catches_missing_one_over_sqrt_head_dim():
    bad = mutated(ops_attention, ("scores = kq * np.asarray(scale, dtype=kq.dtype)", "scores = kq.copy()"))
    numpy_probs(bad)
    with pytest.raises(AssertionError, match="relative error"):
        check_attention(bad.attention_forward)


# --- 4. LayerNorm axis -----------------------------------------------------------------------
def test_catches_layernorm_over_tokens_instead_of_features():
    check_layernorm()
    bad = mutated(norms, ("mean = x.mean(axis=-1, keepdims=True)", "mean = x.mean(axis=-2, keepdims=True)"),
                  ("var = (xc * xc).mean(axis=-1, keepdims=True)", "var = (xc * xc).mean(axis=-2, keepdims=True)"))
    with pytest.raises(AssertionError, match="relative error"):     # the NumPy twin, where the edit is (float32
        check_layernorm(bad.layernorm_forward_numpy)                # otherwise runs ops/train_kernels.py's kernel)


def test_catches_a_compiled_layernorm_over_the_wrong_count():
    """the kernel's mean divided by D - 1 (a sample variance's count): check_layernorm against torch sees it"""
    bad = mutated_module(train_kernels, ("F(np.float64(s) / np.float64(a.shape[0]))",
                                         "F(np.float64(s) / np.float64(a.shape[0] - 1))"))
    with pytest.raises(AssertionError, match="relative error"):
        check_layernorm(mutated(norms, layer_norm_rows=bad.layer_norm_rows).layernorm_forward)


# --- 5. in-place residual --------------------------------------------------------------------
def test_catches_residual_added_in_place_over_the_block_input():
    check_block(CONFIGS["gpt2"])
    bad = mutated(model_block, ("h = hook(res1, x + a)", "x += a; h = hook(res1, x)"))   # the caller's x is still needed
    with pytest.raises(AssertionError, match="modified its input"):
        check_block(CONFIGS["gpt2"], block=bad.block_forward)


# --- 6. GELU tanh coefficient ----------------------------------------------------------------
def test_catches_wrong_gelu_tanh_coefficient():
    check_gelu_tanh()
    bad = mutated(activations, ("GELU_TANH_COEF = 0.044715", "GELU_TANH_COEF = 0.04715"))
    with pytest.raises(AssertionError, match="relative error"):
        check_gelu_tanh(bad.gelu_tanh_forward)


# --- 7. softmax overflow ---------------------------------------------------------------------
def test_catches_softmax_without_max_subtraction():
    check_softmax()
    bad = mutated(softmax, ("e = x - m", "e = x.copy()"))
    with np.errstate(over="ignore", invalid="ignore"):
        with pytest.raises(AssertionError, match="non-finite"):
            check_softmax(bad.softmax_forward)


def test_mutations_leave_the_real_modules_alone():
    mutated(softmax, ("e = x - m", "e = x.copy()"))
    x = np.array([[1000.0, 0.0]], dtype=np.float32)
    assert np.array_equal(softmax.softmax_forward(x), [[1.0, 0.0]])
