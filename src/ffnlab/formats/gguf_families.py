"""GGUF export for Gemma 2, GPT-NeoX/Pythia and OLMo 2: what llama.cpp's converter writes for them.

  arch     keys (besides the common context/embedding/block/feed-forward/head counts)
  gemma2   head_count_kv, layer_norm_rms_epsilon, key_length, value_length, rope.freq_base,
           attention.sliding_window, attn_logit_softcapping, final_logit_softcapping
  gptneox  layer_norm_epsilon, rope.dimension_count (n_rot: partial rotary), rope.freq_base,
           use_parallel_residual
  olmo2    head_count_kv, layer_norm_rms_epsilon, rope.freq_base, rope.dimension_count

Tensors keep ffnlab's names and layouts, which are already llama.cpp's for these three: Gemma's
norms hold 1 + w (formats/hf_families.py adds the 1 on the way in, as the converter does), a
GPT-NeoX attn_qkv is [q; k; v] (the converter's reordering of HF's per-head rows), and all three
use llama.cpp's NEOX rope, the pairing ffnlab computes HF models with, so no Q/K row permutation.
What llama.cpp's graph for the architecture cannot compute is refused, naming the field
(family_mismatches): a GGUF that llama.cpp runs differently from ffnlab would be silently wrong.
"""
import math

import numpy as np

FAMILY_ARCHS = ("gemma2", "gptneox", "olmo2")

# the fields each llama.cpp graph hard-codes (src/models/{gemma2-iswa,gptneox,olmo2}.cpp)
_WANT = {
    "gemma2": dict(norm="rmsnorm", ffn="geglu", ffn_bias=False, attn_bias=False, attn_out_bias=False, fused_qkv=False,
                   pre_norm=True, post_attn_norm=True, post_ffn_norm=True, qk_norm=False, parallel_residual=False,
                   positions="rope", rope_dim=0, embed_scale=True, tie_embeddings=True, rope_theta_local=0.0,
                   rope_scale=1.0, rope_freq_factors=()),
    "gptneox": dict(norm="layernorm", ffn="gelu", ffn_bias=True, attn_bias=True, attn_out_bias=True, pre_norm=True,
                    post_attn_norm=False, post_ffn_norm=False, qk_norm=False, positions="rope", embed_scale=False,
                    attn_scale=0.0, attn_softcap=0.0, final_logit_softcap=0.0, sliding_window=0, rope_scale=1.0,
                    rope_freq_factors=()),
    "olmo2": dict(norm="rmsnorm", ffn="swiglu", ffn_bias=False, attn_bias=False, attn_out_bias=False, fused_qkv=False,
                  pre_norm=False, post_attn_norm=True, post_ffn_norm=True, qk_norm=True, qk_norm_full=True,
                  parallel_residual=False, positions="rope", rope_dim=0, embed_scale=False, attn_scale=0.0,
                  attn_softcap=0.0, final_logit_softcap=0.0, sliding_window=0, rope_scale=1.0, rope_freq_factors=()),
}


def family_mismatches(cfg) -> list:
    """What llama.cpp's graph for cfg.arch computes differently from cfg -> ["field=value (why)", ...]"""
    arch = cfg.arch
    why = [f"{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in _WANT[arch].items() if getattr(cfg, k) != v]
    if cfg.moe:
        why.append("a mixture of experts")
    if cfg.rope_pairing != "neox":
        why.append(f"rope_pairing={cfg.rope_pairing!r} ({arch} rotates NEOX pairs)")
    if arch == "gptneox" and cfg.n_kv_head != cfg.n_head:
        why.append("grouped-query attention (gptneox's qkv holds n_head keys and values)")
    if arch in ("gptneox", "olmo2") and cfg.q_dim != cfg.d_model:
        why.append(f"n_head*head_dim={cfg.q_dim} != d_model={cfg.d_model} ({arch}'s heads are d_model / n_head)")
    if arch == "gemma2":
        # llama.cpp reads no query_pre_attn_scalar: 1/sqrt(head_dim), or 1/sqrt(d_model/n_head) at 46 layers (27B)
        want = 1.0 / math.sqrt(cfg.d_model / cfg.n_head if cfg.n_layer == 46 else cfg.head_dim)
        if not math.isclose(cfg.scale, want, rel_tol=1e-6):
            why.append(f"attention scale {cfg.scale:.6g} (llama.cpp's gemma2 uses {want:.6g}: it reads no "
                       f"query_pre_attn_scalar)")
        if not cfg.attn_softcap or not cfg.final_logit_softcap:
            why.append("a zero softcap (llama.cpp's gemma2 always caps attention scores and logits)")
        if cfg.sliding_window and cfg.sliding_window_pattern != 2:
            why.append(f"sliding_window_pattern={cfg.sliding_window_pattern} (gemma2 alternates: 2)")
    return why


def write_family_keys(w, cfg, arch):
    """The {arch}.* keys llama.cpp reads for these architectures (common counts written by the caller)."""
    w.add_rope_freq_base(cfg.rope_theta)
    if arch == "gptneox":
        w.add_layer_norm_eps(cfg.norm_eps)
        w.add_rope_dimension_count(cfg.n_rot)
        return                                        # use_parallel_residual: families/gptneox.py gguf_keys
    w.add_head_count_kv(cfg.n_kv_head)
    w.add_layer_norm_rms_eps(cfg.norm_eps)
    if arch == "olmo2":
        w.add_rope_dimension_count(cfg.n_rot)
        return
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    # no window: one as long as the context never masks anything (llama.cpp's gemma2 always slides)
    w.add_sliding_window(cfg.sliding_window or cfg.n_ctx)
    w.add_attn_logit_softcapping(cfg.attn_softcap)
    w.add_final_logit_softcapping(cfg.final_logit_softcap)


def family_gguf_params(cfg, params, arch) -> dict:
    """ffnlab's tensors -> the tensors llama.cpp's graph loads for arch (names are GGUF's already)."""
    params = dict(params)
    if arch == "gptneox" and not cfg.fused_qkv:          # its graph reads one attn_qkv: [q; k; v]
        for il in range(cfg.n_layer):
            for kind in ("weight", "bias"):
                parts = [params.pop(f"blk.{il}.attn_{x}.{kind}") for x in "qkv"]
                params[f"blk.{il}.attn_qkv.{kind}"] = np.concatenate(parts)
    if arch in ("gptneox", "olmo2") and cfg.tie_embeddings:
        # both graphs require an output.weight: a tied head is written as a copy of the table
        params["output.weight"] = params["token_embd.weight"]
    return params
