"""The op checks against PyTorch: each check_* runs one ffnlab op (or a replacement passed in) on fixed
random inputs and asserts it equals torch's within FP32 (tests/unit/test_ops.py's docstring derives it).
Used by test_ops.py, test_mistakes.py (on seeded bugs) and the block and MoE tests."""
import numpy as np
import torch
import torch.nn.functional as F
import torch_reference as R
from ffnlab.ops import (causal_mask, gelu_forward, gelu_tanh_forward, layernorm_forward, linear_forward,
                        rmsnorm_forward, rope_angles, rope_forward, softmax_forward)
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
