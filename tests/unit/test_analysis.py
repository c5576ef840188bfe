"""The analyser's counts against the from-scratch model that actually runs.

params:  analysis/params.py's formulas  == the elements of init_params(cfg)
FLOPs:   analysis/flops.py               == 2*in*out summed over every matmul the forward performs
memory:  analysis/memory.py              within 10% of tracemalloc's peak around the same forward
"""
import tracemalloc

import numpy as np
import pytest

import ffnlab.model.attention as attention_mod
import ffnlab.model.ffn as ffn_mod
import ffnlab.model.transformer as transformer_mod
from ffnlab.analysis.flops import flops_per_token
from ffnlab.analysis.memory import kv_cache_bytes, layer_peak_bytes, mlp_activation_bytes, model_forward_bytes
from ffnlab.analysis.params import param_counts
from ffnlab.analysis.presets import preset_config
from ffnlab.config import ModelConfig
from ffnlab.model.arith import F32
from ffnlab.model.block import block_forward
from ffnlab.model.weights import layer_weights
from ffnlab.model.params import count_params, init_params
from ffnlab.ops.attention import causal_mask

SMALL = {
    "gpt2": dict(arch="gpt2", n_layer=3, d_model=64, n_head=4, d_ff=256, ffn="gelu_tanh", norm="layernorm",
                 positions="learned", fused_qkv=True, ffn_bias=True, attn_bias=True, attn_out_bias=True,
                 vocab_size=300, n_ctx=128),
    "llama_gqa": dict(arch="llama", n_layer=3, d_model=64, n_head=8, n_kv_head=2, d_ff=176, ffn="swiglu",
                      vocab_size=300, n_ctx=128, tie_embeddings=False),
    "qwen2": dict(arch="qwen2", n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=160, ffn="swiglu",
                  attn_bias=True, rope_pairing="neox", vocab_size=300, n_ctx=128),
    "gemma3": dict(arch="gemma3", n_layer=4, d_model=64, n_head=4, n_kv_head=1, head_dim=32, d_ff=192, ffn="geglu",
                   qk_norm=True, post_attn_norm=True, post_ffn_norm=True, sliding_window=8,
                   sliding_window_pattern=2, embed_scale=True, rope_pairing="neox", vocab_size=300, n_ctx=128),
    "dense_relu_bias": dict(arch="llama", n_layer=2, d_model=48, n_head=3, d_ff=200, ffn="relu", ffn_bias=True,
                            vocab_size=100, n_ctx=64),
    "dense_gelu": dict(arch="llama", n_layer=2, d_model=48, n_head=2, d_ff=320, ffn="gelu", vocab_size=100, n_ctx=64),
    "gptneox": dict(arch="gptneox", n_layer=2, d_model=64, n_head=4, d_ff=256, ffn="gelu", ffn_bias=True,
                    attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", rope_pairing="neox",
                    rope_dim=4, parallel_residual=True, vocab_size=300, n_ctx=128, tie_embeddings=False),
    "olmo2": dict(arch="olmo2", n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=160, ffn="swiglu", pre_norm=False,
                  post_attn_norm=True, post_ffn_norm=True, qk_norm=True, qk_norm_full=True, rope_pairing="neox",
                  vocab_size=300, n_ctx=128, tie_embeddings=False),
}


def small(name):
    return ModelConfig(**SMALL[name])


# --- parameters -----------------------------------------------------------------------------------

def test_gpt2_small_total_is_the_published_124439808():
    cfg, _ = preset_config("gpt2")
    p = param_counts(cfg)
    assert p["total"] == 124_439_808
    assert p["embedding"] == 50257 * 768 and p["position"] == 1024 * 768 and p["lm_head"] == 0


@pytest.mark.parametrize("name", sorted(SMALL))
def test_param_count_equals_the_from_scratch_model(name):
    cfg = small(name)
    params = init_params(cfg, seed=0)
    p = param_counts(cfg)
    assert p["total"] == count_params(params)
    # and component by component, grouping the model's real tensors by name
    mlp = sum(a.size for n, a in params.items() if ".ffn_" in n and "norm" not in n)
    norm = sum(a.size for n, a in params.items() if "norm" in n)
    attn = sum(a.size for n, a in params.items() if ".attn_" in n and "norm" not in n)
    assert (p["mlp"], p["norm"], p["attention"]) == (mlp, norm, attn)
    assert p["lm_head"] == params.get("output.weight", np.empty(0)).size


def test_llama2_70b_mlp_is_56_4_billion_not_5_6():
    cfg, _ = preset_config("llama2-70b")
    p = param_counts(cfg)
    assert p["per_layer"]["mlp"] == 3 * 8192 * 28672 == 704_643_072
    assert p["mlp"] == 80 * 704_643_072 == 56_371_445_760


def test_mlp_share_of_total_and_of_non_embedding():
    cfg, _ = preset_config("llama3-8b")
    p = param_counts(cfg)
    assert p["non_embedding"] == p["total"] - 2 * 128256 * 4096                 # token table and untied head
    assert p["mlp_share"] == pytest.approx(5_637_144_576 / 8_030_261_248)
    assert p["mlp_share_non_embedding"] == pytest.approx(5_637_144_576 / p["non_embedding"])


# --- FLOPs ----------------------------------------------------------------------------------------

class MatmulCounter:
    """Counts 2*in*out*rows for every linear_forward and 2*(q.k + p.v) for every attention product."""

    def __init__(self, monkeypatch):
        self.flops = {"linear": 0, "ffn": 0, "attention": 0}
        real_linear = attention_mod.linear_forward
        real_scores, real_mix = F32.kq, F32.kqv

        def counted(bucket):
            def linear(x, w, b=None, **named):              # named: the hook and node a product feeds
                self.flops[bucket] += 2 * (x.size // x.shape[-1]) * w.shape[0] * w.shape[1]
                return real_linear(x, w, b, **named)
            return linear

        def scores(q, k):                                   # q [B, T, H, hd], k [B, S, Hkv, hd]
            B, T, H, hd = q.shape
            self.flops["attention"] += 2 * B * H * T * k.shape[1] * hd
            return real_scores(q, k)

        def mix(probs, v):                                  # probs [B, H, T, S], v [B, S, Hkv, hd]
            B, H, T, S = probs.shape
            self.flops["attention"] += 2 * B * H * T * S * v.shape[-1]
            return real_mix(probs, v)

        def counted_all(bucket, real):                      # several weights' products in one go
            def linear_forwards(x, ws):
                self.flops[bucket] += sum(2 * (x.size // x.shape[-1]) * w.shape[0] * w.shape[1] for w in ws)
                return real(x, ws)
            return linear_forwards

        monkeypatch.setattr(attention_mod, "linear_forward", counted("linear"))
        monkeypatch.setattr(transformer_mod, "linear_forward", counted("linear"))
        monkeypatch.setattr(ffn_mod, "linear_forward", counted("ffn"))
        monkeypatch.setattr(attention_mod, "linear_forwards", counted_all("linear", attention_mod.linear_forwards))
        monkeypatch.setattr(ffn_mod, "linear_forwards", counted_all("ffn", ffn_mod.linear_forwards))
        self.arith = F32._replace(kq=scores, kqv=mix)       # the f32 arithmetic, its two products counted


@pytest.mark.parametrize("name", sorted(SMALL))
def test_flops_equal_the_matmuls_the_forward_performs(name, monkeypatch):
    cfg = small(name)
    params = init_params(cfg, seed=0)
    B, T = 2, 24
    counter = MatmulCounter(monkeypatch)
    transformer_mod.forward(params, cfg, np.zeros((B, T), dtype=np.int64), arith=counter.arith)
    f = flops_per_token(cfg, seq_len=T)
    assert f["mlp"] * B * T == counter.flops["ffn"]
    assert f["attention_scores"] * B * T == counter.flops["attention"]
    assert (f["attention_projections"] + f["lm_head"]) * B * T == counter.flops["linear"]
    assert f["forward"] * B * T == sum(counter.flops.values())


def test_mlp_flops_formula_gated_6_dense_4():
    llama, _ = preset_config("llama3-8b")
    gpt2, _ = preset_config("gpt2")
    assert flops_per_token(llama, 1)["per_layer"]["ffn_gate"] * 3 == 6 * 4096 * 14336
    assert flops_per_token(llama, 1)["mlp"] == 32 * 6 * 4096 * 14336
    assert flops_per_token(gpt2, 1)["mlp"] == 12 * 4 * 768 * 3072


# --- memory ---------------------------------------------------------------------------------------

def _traced_peak(fn):
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gemma3", "dense_relu_bias"])
def test_one_layer_peak_within_10pct_of_measured(name):
    cfg = small(name)
    params = init_params(cfg, seed=0)
    B, T = 2, 96
    x = np.random.default_rng(0).standard_normal((B, T, cfg.d_model)).astype(np.float32)
    pos = np.arange(T)
    allowed = causal_mask(pos, pos)
    run = lambda: block_forward(x, layer_weights(params, cfg, 0), cfg, pos, allowed)   # noqa: E731
    run()               # once first: a first call also holds what its kernels load and cache once
    measured = _traced_peak(run)
    estimate = layer_peak_bytes(cfg, B, T, T, 4)["peak"]
    assert estimate == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("name", ["gpt2", "llama_gqa", "gemma3", "dense_gelu"])
def test_training_forward_activations_within_10pct_of_measured(name):
    cfg = small(name)
    params = init_params(cfg, seed=0)
    B, T = 2, 64
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (B, T))
    measured = _traced_peak(lambda: transformer_mod.forward(params, cfg, ids, train=True))
    estimate = model_forward_bytes(cfg, B, T, 4, train=True)["peak"]
    assert estimate == pytest.approx(measured, rel=0.10)


def test_llama3_8b_mlp_activations_in_fp16_and_fp32():
    cfg, _ = preset_config("llama3-8b")
    fp16 = mlp_activation_bytes(cfg, batch=1, seq_len=2048, bytes_per_elem=2)
    assert fp16["gate"] == fp16["up"] == 2048 * 14336 * 2 == 58_720_256            # 58.7 MB each
    assert fp16["together"] == 117_440_512                                        # 117 MB
    assert mlp_activation_bytes(cfg, 1, 8192, 2)["together"] == 469_762_048         # 470 MB at T=8192
    assert mlp_activation_bytes(cfg, 1, 2048, 4)["gate"] == 117_440_512             # the "117 MB each" is fp32


def test_kv_cache_counts_k_and_v_per_layer_and_sliding_layers():
    cfg, _ = preset_config("llama3-8b")
    kv = kv_cache_bytes(cfg, batch=1, context=8192, kv_bytes_per_elem=2)
    assert kv["full"] == kv["swa"] == 2 * 32 * 8192 * (8 * 128) * 2                # 1 GiB
    g, _ = preset_config("gemma3-270m")                                           # 15 of 18 layers slide (512)
    kv = kv_cache_bytes(g, batch=1, context=4096, kv_bytes_per_elem=2)
    per_pos = 2 * 256 * 2
    assert kv["full"] == 18 * 4096 * per_pos and kv["swa"] == (3 * 4096 + 15 * 512) * per_pos
