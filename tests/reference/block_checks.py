"""The tiny block and model configurations, their random parameters and the block check against
torch_reference.py, shared by test_model_vs_torch.py, test_mistakes.py (on seeded bugs), test_hooks.py,
test_interventions.py and scripts/trace_hashes.py."""
import numpy as np
import torch
import torch_reference as R
from ffnlab.config import ModelConfig
from ffnlab.model.block import block_forward
from ffnlab.model.weights import layer_weights
from ffnlab.model.params import param_shapes
from ffnlab.ops import causal_mask
from op_checks import FP32


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
    y, _ = block(x, layer_weights(p, cfg, il), cfg, pos, allowed)
    assert np.array_equal(x, x_before), "block_forward modified its input x"
    ref = R.block_forward(torch.from_numpy(x), R.params_to_torch(p, torch.float32), cfg, il, pos)
    R.assert_close(y, ref, FP32, f"{cfg.arch} block {il} output")
