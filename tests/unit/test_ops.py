"""Every NumPy kernel's forward against PyTorch in float32.

Each check_* function takes the kernel as an argument (the real one by default) and raises
AssertionError when it disagrees with PyTorch; test_mistakes.py runs the same checks on mutated
copies of the kernels to show they catch each classic mistake.

Tolerance: FP32 = 1e-5 relative to the tensor's largest entry (torch_reference.rel_err). Both
sides round each float32 operation (eps 6e-8), in different orders (BLAS blocking, erf/tanh
implementations), so agreement is a few 1e-7; 1e-5 leaves room for sums over a few hundred terms.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_reference as R
from ffnlab.ops import (causal_mask, cross_entropy_forward, embedding_forward, gelu_forward, gelu_tanh_forward,
                        relu_forward, rope_angles, rope_forward, silu_forward)
from ffnlab.ops.attention import attention_forward

from op_checks import (FP32, activation_input, attention_inputs, check_activation, check_attention, check_gelu,
                       check_gelu_tanh, check_layernorm, check_linear, check_rmsnorm, check_rope, check_softmax, rng, t)


# --- tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_torch(bias):
    check_linear(bias=bias)


def test_gelu_erf_matches_torch_gelu():
    check_gelu()


def test_gelu_tanh_matches_torch_tanh_approximation():
    check_gelu_tanh()


def test_relu_matches_torch():
    check_activation(relu_forward, F.relu, "relu")


def test_silu_matches_torch():
    check_activation(silu_forward, F.silu, "silu")


def test_activations_keep_float32():
    x = activation_input()
    for fn in (gelu_forward, gelu_tanh_forward, relu_forward, silu_forward):
        assert fn(x).dtype == np.float32, fn.__name__


@pytest.mark.parametrize("bias", [True, False])
def test_layernorm_matches_torch(bias):
    check_layernorm(bias=bias)


def test_rmsnorm_matches_torch():
    check_rmsnorm()


def test_softmax_matches_torch_including_huge_logits():
    check_softmax()


def test_causal_mask_is_lower_triangular():
    assert np.array_equal(causal_mask(np.arange(5), np.arange(5)), np.tril(np.ones((5, 5), bool)))


def test_causal_mask_sliding_window_keeps_last_window_keys():
    m = causal_mask(np.arange(6), np.arange(6), window=3)
    want = np.tril(np.ones((6, 6), bool)) & ~np.tril(np.ones((6, 6), bool), -3)
    assert np.array_equal(m, want)
    assert m.sum(axis=1).tolist() == [1, 2, 3, 3, 3, 3]


def test_attention_multi_head_matches_torch():
    check_attention(H=4, Hkv=4)


@pytest.mark.parametrize("H,Hkv", [(4, 2), (6, 2), (4, 1)])
def test_attention_grouped_query_matches_repeat_interleave(H, Hkv):
    check_attention(H=H, Hkv=Hkv)


def test_attention_with_cached_keys_matches_torch():
    check_attention(H=4, Hkv=2, T=3, S=8)              # 3 new queries after 5 cached positions


def test_attention_sliding_window_matches_torch():
    check_attention(H=4, Hkv=2, T=8, S=8, window=3)


def test_attention_matches_torch_sdpa_is_causal():
    q, k, v, scale, allowed = attention_inputs(H=4, Hkv=4)
    out, _ = attention_forward(q, k, v, scale, allowed)
    ref = F.scaled_dot_product_attention(t(q).transpose(1, 2), t(k).transpose(1, 2), t(v).transpose(1, 2),
                                         is_causal=True, scale=scale)
    R.assert_close(out, ref, FP32, "attention vs sdpa")


def test_attention_gqa_matches_torch_sdpa_enable_gqa():
    q, k, v, scale, allowed = attention_inputs(H=6, Hkv=2)
    out, _ = attention_forward(q, k, v, scale, allowed)
    ref = F.scaled_dot_product_attention(t(q).transpose(1, 2), t(k).transpose(1, 2), t(v).transpose(1, 2),
                                         is_causal=True, scale=scale, enable_gqa=True)
    R.assert_close(out, ref, FP32, "attention vs sdpa gqa")


def test_attention_returns_raw_scores_and_probs():
    q, k, v, scale, allowed = attention_inputs(H=4, Hkv=2)
    _, (kq, probs) = attention_forward(q, k, v, scale, allowed)
    kr = t(k).transpose(1, 2).repeat_interleave(2, dim=1)                      # [B, H, S, hd]
    R.assert_close(kq, t(q).transpose(1, 2) @ kr.transpose(-1, -2), FP32, "kq (unscaled, unmasked)")
    assert np.all(probs[:, :, ~allowed] == 0)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-6)


def test_rope_normal_matches_complex_adjacent_pairs():
    check_rope("normal")


def test_rope_neox_matches_hf_rotate_half():
    check_rope("neox")


@pytest.mark.parametrize("pairing", ["normal", "neox"])
def test_rope_scaling_divides_positions(pairing):
    x = rng(8).normal(size=(1, 5, 2, 8)).astype(np.float32)
    cos, sin = rope_angles(np.arange(5), 8, 500.0, scale=4.0)
    ref = (R.rope_normal if pairing == "normal" else R.rope_neox)(t(x), R.rope_angles(np.arange(5), 8, 500.0, 4.0))
    R.assert_close(rope_forward(x, cos, sin, pairing), ref, FP32, "scaled rope")


def test_rope_pairings_differ():
    # guards against one pairing silently aliasing the other
    x = rng(9).normal(size=(1, 4, 1, 8)).astype(np.float32)
    cos, sin = rope_angles(np.arange(4), 8, 10000.0)
    assert np.abs(rope_forward(x, cos, sin, "normal") - rope_forward(x, cos, sin, "neox")).max() > 0.1


def test_embedding_with_learned_positions_matches_torch():
    r = rng(10)
    wte = r.normal(size=(50, 16)).astype(np.float32)
    wpe = r.normal(size=(20, 16)).astype(np.float32)
    ids = np.array([3, 7, 3, 49, 0, 7])
    pos = np.arange(4, 10)
    ref = F.embedding(t(ids), t(wte)) + F.embedding(t(pos), t(wpe))
    R.assert_close(embedding_forward(ids, wte, wpe, pos), ref, FP32, "embedding + positions")
    R.assert_close(embedding_forward(ids, wte), F.embedding(t(ids), t(wte)), 0.0, "embedding")


def test_embedding_does_not_modify_the_table():
    wte = rng(11).normal(size=(10, 4)).astype(np.float32)
    before = wte.copy()
    embedding_forward(np.array([1, 2]), wte, np.ones((4, 4), np.float32), np.arange(2))
    assert np.array_equal(wte, before)


def test_cross_entropy_matches_torch():
    r = rng(12)
    logits = (r.normal(size=(10, 37)) * 4).astype(np.float32)
    logits[0] += 200.0                                       # large logits must not overflow
    targets = r.integers(0, 37, size=10)
    loss, probs = cross_entropy_forward(logits, targets)
    R.assert_close(loss, F.cross_entropy(t(logits), t(targets)), FP32, "cross-entropy loss")
    R.assert_close(probs, torch.softmax(t(logits), -1), FP32, "cross-entropy probs")
