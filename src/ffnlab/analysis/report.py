"""The three sizing reports as plain dicts (what --json prints): analyze, inspect, compare.

Stable keys (documented in docs/sizing.md):
  analyze: model, settings, params, flops_per_token, memory, bits_per_weight, alignment,
           swiglu_width, lora
  inspect: model, tensors, totals_by_type, params_in_file, ffn_view, metadata
  compare: one row per model (model, d_model, d_ff, ratio, ffn, mlp_params_per_layer, n_layer,
           mlp_params, mlp_share, params_total)
"""
import re

from .alignment import alignment_report
from .flops import flops_per_token
from .lora import lora_params
from .memory import kv_cache_bytes, layer_peak_bytes, mlp_activation_bytes, model_forward_bytes
from .params import param_counts
from .quant import bits_per_weight, block_layout, weights_bytes
from .swiglu_width import swiglu_width_report

DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16"}                    # compute dtypes
KV_DTYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1",
             "q5_0": "Q5_0", "q5_1": "Q5_1"}                              # llama.cpp --cache-type-k/-v
BPW_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K", "Q5_1", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K", "Q2_K")


def bytes_per_element(type_name) -> float:
    block, size = block_layout(type_name)
    return size / block


FFN_LABEL = {"gelu": "dense GELU (erf)", "gelu_tanh": "dense GELU (tanh)", "relu": "dense ReLU",
             "swiglu": "gated SwiGLU", "geglu": "gated GeGLU (tanh GELU)", "moe": "mixture of SwiGLU experts"}


def model_summary(src) -> dict:
    c = src.cfg
    return {
        "name": src.label, "kind": src.kind, "path": src.path, "source": src.source, "arch": c.arch,
        "file_type": src.file_type, "d_model": c.d_model, "d_ff": c.d_ff, "ratio": c.d_ff / c.d_model,
        "ffn": c.ffn, "ffn_label": FFN_LABEL[c.ffn], "gated": c.gated, "ffn_bias": c.ffn_bias,
        "attn_bias": c.attn_bias, "attn_out_bias": c.attn_out_bias, "fused_qkv": c.fused_qkv,
        "norm": c.norm, "norm_eps": c.norm_eps, "qk_norm": c.qk_norm, "post_attn_norm": c.post_attn_norm,
        "post_ffn_norm": c.post_ffn_norm, "n_head": c.n_head, "n_kv_head": c.n_kv_head,
        "head_dim": c.head_dim, "n_layer": c.n_layer, "vocab_size": c.vocab_size, "n_ctx": c.n_ctx,
        "positions": c.positions, "rope_theta": c.rope_theta, "sliding_window": c.sliding_window,
        "sliding_window_pattern": c.sliding_window_pattern, "tie_embeddings": c.tie_embeddings,
        "n_expert": c.n_expert, "n_expert_used": c.n_expert_used, "expert_norm": c.expert_norm,
        "d_ff_shexp": c.d_ff_shexp, "pre_norm": c.pre_norm, "parallel_residual": c.parallel_residual,
        "rope_dim": c.n_rot, "attn_softcap": c.attn_softcap, "final_logit_softcap": c.final_logit_softcap,
        "attn_scale": c.attn_scale, "embedding_multiplier": c.embedding_multiplier,
        "residual_multiplier": c.residual_multiplier, "logits_scaling": c.logits_scaling,
        "no_rope_layer_step": c.no_rope_layer_step,
    }


def analyze(src, seq_len=2048, batch=1, dtype="f16", kv_dtype="f16", quants=(), tp=(1, 2, 4, 8),
            lora_rank=16, lora_targets=("q", "k", "v", "o", "gate", "up", "down"), multiple_of=256,
            ffn_dim_multiplier=None) -> dict:
    cfg = src.cfg
    params = param_counts(cfg, src.extra)
    act_b = bytes_per_element(DTYPES[dtype])
    kv_b = bytes_per_element(KV_DTYPES[kv_dtype])
    tensors = [(t.name, t.ne) for t in src.tensors]
    weights = {q: weights_bytes(tensors, q, cfg) for q in quants}
    weights_flat = {q: w["bytes"] for q, w in weights.items()}
    if src.is_file:
        by_type = {}
        for t in src.tensors:
            by_type[t.type] = by_type.get(t.type, 0) + 1
        file_bytes = sum(t.n_bytes for t in src.tensors)
        weights["file"] = {"bytes": file_bytes, "bits_per_weight": 8.0 * file_bytes / src.file_params,
                           "types": by_type, "file_type": src.file_type}
        weights_flat["file"] = file_bytes
    kv = kv_cache_bytes(cfg, batch, seq_len, kv_b)
    mlp_act = mlp_activation_bytes(cfg, batch, seq_len, act_b)
    return {
        "model": model_summary(src),
        "settings": {"seq_len": seq_len, "batch": batch, "dtype": dtype, "kv_dtype": kv_dtype,
                     "quants": list(quants), "tp": list(tp)},
        "params": params,
        "flops_per_token": flops_per_token(cfg, seq_len),
        "memory": {
            "weights_bytes": weights_flat,
            "weights": weights,
            "kv_cache_bytes": kv["full"],
            "kv_cache_swa_bytes": kv["swa"],
            "mlp_activation_bytes": {**mlp_act, "dtype": dtype},
            "layer_activation_bytes": {**layer_peak_bytes(cfg, batch, seq_len, seq_len, act_b), "dtype": dtype},
            "training_activation_bytes": model_forward_bytes(cfg, batch, seq_len, act_b, train=True)["peak"],
        },
        "bits_per_weight": {t: bits_per_weight(t) for t in BPW_TYPES},
        "alignment": alignment_report(cfg, tp),
        "swiglu_width": swiglu_width_report(cfg, multiple_of, ffn_dim_multiplier),
        "lora": lora_params(cfg, lora_rank, lora_targets, params["total"]),
    }


def compare_row(src) -> dict:
    c = src.cfg
    p = param_counts(c, src.extra)
    return {"model": src.label, "d_model": c.d_model, "d_ff": c.d_ff, "ratio": c.d_ff / c.d_model,
            "ffn": c.ffn, "mlp_params_per_layer": p["per_layer"]["mlp"], "n_layer": c.n_layer,
            "mlp_params": p["mlp"], "mlp_share": p["mlp_share"], "params_total": p["total"],
            "params_active": p["active"], "n_expert": c.n_expert, "n_expert_used": c.n_expert_used}


def _block(name):
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def inspect_report(src, all_blocks=False) -> dict:
    shown = [t for t in src.tensors if all_blocks or _block(t.name) in (None, 0)]
    totals = {}
    for t in src.tensors:
        s = totals.setdefault(t.type, {"tensors": 0, "elements": 0, "bytes": 0})
        s["tensors"] += 1
        s["elements"] += t.n_elements
        s["bytes"] += t.n_bytes
    return {
        "model": model_summary(src),
        "tensors": [{"name": t.name, "ggml_shape": list(t.ne), "shape": list(t.shape), "type": t.type,
                     "elements": t.n_elements, "bytes": t.n_bytes, "bits_per_weight": t.bits_per_weight}
                    for t in shown],
        "all_blocks": all_blocks,
        "totals_by_type": totals,
        "params_in_file": src.file_params,
        "params_from_config": param_counts(src.cfg, src.extra)["total"],
        "ffn_view": ffn_view(src),
        "metadata": src.metadata if src.is_file else {},
    }


FFN_TENSORS = ("ffn_norm.weight", "ffn_norm.bias", "ffn_gate.weight", "ffn_gate.bias", "ffn_up.weight",
               "ffn_up.bias", "ffn_down.weight", "ffn_down.bias", "post_ffw_norm.weight")


def ffn_view(src) -> dict:
    """Block 0's FFN in gguf-dump terms: ggml shapes (ne order, fastest axis first); null when absent."""
    by_name = {t.name: t for t in src.tensors}
    view = {"hidden_size": src.cfg.d_model, "intermediate_size": src.cfg.d_ff, "ffn": src.cfg.ffn}
    for n in FFN_TENSORS:
        t = by_name.get("blk.0." + n)
        key = n.replace(".", "_")
        view[key + "_shape"] = list(t.ne) if t else None
        view[key + "_type"] = t.type if t else None
    return view
