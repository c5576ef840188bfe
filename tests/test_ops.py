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
                        layernorm_forward, linear_forward, relu_forward, rmsnorm_forward, rope_angles, rope_forward,
                        silu_forward, softmax_forward)
from ffnlab.ops.attention import attention_forward

FP32 = 1e-5


def rng(seed=0):
    return np.random.default_rng(seed)


def t(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# --- checks (shared with test_mistakes.py) ----------------------------------------------------
def check_linear(linear=linear_forward, bias=True):
    r = rng(1)
    x = r.normal(size=(2, 5, 24)).astype(np.float32)
    w = r.normal(size=(40, 24)).astype(np.float32)
    b = r.normal(size=(40,)).astype(np.float32) if bias else None
    R.assert_close(linear(x, w, b), F.linear(t(x), t(w), None if b is None else t(b)), FP32, "linear")


def activation_input():
    # dense coverage of [-6, 6] (where GELU/SiLU curve) plus the tails
    x = np.concatenate([np.linspace(-6, 6, 1201), [-20.0, -9.0, 9.0, 20.0]])
    return x.astype(np.float32).reshape(5, -1)


def check_activation(fn, torch_fn, what):
    x = activation_input()
    R.assert_close(fn(x), torch_fn(t(x)), FP32, what)


def check_gelu(gelu=gelu_forward):
    check_activation(gelu, F.gelu, "gelu (erf)")


def check_gelu_tanh(gelu_tanh=gelu_tanh_forward):
    check_activation(gelu_tanh, lambda x: F.gelu(x, approximate="tanh"), "gelu_tanh")


def norm_input():
    # [B, T, D] with a large offset per token: the regime where one-pass variance fails
    r = rng(2)
    return (r.normal(size=(2, 7, 48)) * 3.0 + r.normal(size=(2, 7, 1)) * 50).astype(np.float32)


def check_layernorm(layernorm=layernorm_forward, bias=True):
    r = rng(3)
    x = norm_input()
    w = (1 + 0.3 * r.normal(size=48)).astype(np.float32)
    b = r.normal(size=48).astype(np.float32) if bias else None
    y, _ = layernorm(x, w, b, 1e-5)
    R.assert_close(y, F.layer_norm(t(x), (48,), t(w), None if b is None else t(b), 1e-5), FP32, "layernorm")


def check_rmsnorm(rmsnorm=rmsnorm_forward):
    r = rng(4)
    x = norm_input()
    w = (1 + 0.3 * r.normal(size=48)).astype(np.float32)
    y, _ = rmsnorm(x, w, 1e-6)
    R.assert_close(y, F.rms_norm(t(x), (48,), t(w), 1e-6), FP32, "rmsnorm")


def softmax_input():
    r = rng(5)
    x = r.normal(size=(4, 6, 33)) * 5
    x[0] += 100.0           # exp(100) overflows float32 (max ~ 3.4e38 = e^88.7)
    x[1, :, 3] = 300.0      # one huge logit per row: probability ~1
    x[2, :, :10] = -np.inf  # masked entries
    return x.astype(np.float32)


def check_softmax(softmax=softmax_forward):
    x = softmax_input()
    R.assert_close(softmax(x), torch.softmax(t(x), dim=-1), FP32, "softmax")


def attention_inputs(B=2, T=6, S=6, H=4, Hkv=4, hd=8, seed=6):
    r = rng(seed)
    q = r.normal(size=(B, T, H, hd)).astype(np.float32)
    k = r.normal(size=(B, S, Hkv, hd)).astype(np.float32)
    v = r.normal(size=(B, S, Hkv, hd)).astype(np.float32)
    allowed = causal_mask(np.arange(S - T, S), np.arange(S))       # queries are the last T positions
    return q, k, v, 1.0 / np.sqrt(hd), allowed


def check_attention(attention=attention_forward, H=4, Hkv=4, T=6, S=6, window=0):
    q, k, v, scale, allowed = attention_inputs(T=T, S=S, H=H, Hkv=Hkv)
    if window:
        allowed = causal_mask(np.arange(S - T, S), np.arange(S), window)
    out, _ = attention(q, k, v, scale, allowed)
    R.assert_close(out, R.causal_attention(t(q), t(k), t(v), scale, t(allowed)), FP32, "attention")


def check_rope(pairing, rope=rope_forward):
    r = rng(7)
    x = r.normal(size=(2, 9, 3, 16)).astype(np.float32)          # [B, T, H, hd]
    pos = np.arange(3, 12)
    cos, sin = rope_angles(pos, 16, 10000.0)
    ref = R.rope_normal if pairing == "normal" else R.rope_neox
    R.assert_close(rope(x, cos, sin, pairing), ref(t(x), R.rope_angles(pos, 16, 10000.0)), FP32, f"rope {pairing}")


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
