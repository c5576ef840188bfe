"""Mixture-of-experts families in Hugging Face form: config.json fields and per-expert tensors.

  model_type   GGUF arch  experts (E, k)                        expert width            renormalise  shared expert
  mixtral      llama      num_local_experts, num_experts_per_tok intermediate_size       always       -
  qwen2_moe    qwen2moe   num_experts, num_experts_per_tok       moe_intermediate_size   norm_topk_prob shared_expert_intermediate_size
  qwen3_moe    qwen3moe   num_experts (5.x: num_local_experts)   moe_intermediate_size   norm_topk_prob -
  olmoe        olmoe      num_experts, num_experts_per_tok       intermediate_size       norm_topk_prob -

Attention: Mixtral is Llama's; Qwen2-MoE has q/k/v biases (qkv_bias, default true); Qwen3-MoE
RMS-norms each q/k head (q_norm, k_norm over head_dim); OLMoE RMS-norms the whole q and k
projections (q_norm over q_dim, k_norm over kv_dim) before the heads are split.

Every field of transformers 5's MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig and OlmoeConfig
is either read (formats/hf_config.py's common decoder fields and moe_fields below), listed in
IRRELEVANT with the reason it cannot change the logits, or refused (REFUSED: a value other than
the one ffnlab implements raises ConfigError naming the field). tests/engines/test_hf_moe.py holds the
lists against the config classes.

Tensors as the hub stores them, one per expert (model.layers.L.):
  mixtral      block_sparse_moe.gate -> ffn_gate_inp; block_sparse_moe.experts.E.w1 / w3 / w2 ->
               expert E of ffn_gate_exps / ffn_up_exps / ffn_down_exps
  the others   mlp.gate -> ffn_gate_inp; mlp.experts.E.gate_proj / up_proj / down_proj -> the same;
               Qwen2-MoE: mlp.shared_expert.{gate,up,down}_proj -> ffn_{gate,up,down}_shexp,
               mlp.shared_expert_gate [1, d_model] -> ffn_gate_inp_shexp [d_model]
"""
import re

from ..config import MAX_DIM, ConfigError

MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe")
GGUF_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "olmoe": "olmoe"}

# fields read (hf_config.py's common decoder fields, then moe_fields)
USED = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "hidden_act", "rms_norm_eps", "rope_parameters", "rope_theta", "rope_scaling", "vocab_size",
        "max_position_embeddings", "tie_word_embeddings", "attention_bias", "qkv_bias", "mlp_bias",
        "num_local_experts", "num_experts", "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size",
        "shared_expert_intermediate_size",
        "intermediate_size")      # the experts' width (Mixtral, OLMoE); Qwen-MoE: dense layers' (refused)

# fields that cannot change a forward pass's logits
IRRELEVANT = {
    "router_aux_loss_coef": "weight of the load-balancing loss (training only)",
    "output_router_logits": "whether HF returns the router logits (an output option)",
    "router_jitter_noise": "multiplicative noise on the router input in training mode only",
    "attention_dropout": "dropout, zero at inference",
    "initializer_range": "random init only",
    "use_cache": "KV cache on/off: the same logits",
    "bos_token_id": "tokenizer", "eos_token_id": "tokenizer", "pad_token_id": "tokenizer",
    "max_window_layers": "which layers slide when use_sliding_window is true (refused below)",
    "_name_or_path": "a label", "architectures": "a label", "transformers_version": "a label",
    "dtype": "the storage dtype (ffnlab computes in float32)",
    "output_attentions": "an output option", "output_hidden_states": "an output option",
    "return_dict": "an output option", "chunk_size_feed_forward": "memory chunking, same math",
    "is_encoder_decoder": "false for these decoders", "id2label": "classification heads only",
    "label2id": "classification heads only", "problem_type": "classification heads only",
}


def _no_sliding(d, path, model_type):
    """Mixtral/OLMoE/Qwen3-MoE apply sliding_window when it is set; Qwen2/3-MoE only with use_sliding_window."""
    if d.get("use_sliding_window"):
        raise ConfigError(f"{path}: field 'use_sliding_window' = true: sliding-window attention is not "
                          f"implemented for {model_type}")
    if model_type in ("mixtral", "olmoe") and d.get("sliding_window") is not None:
        raise ConfigError(f"{path}: field 'sliding_window' = {d['sliding_window']!r}: sliding-window attention is "
                          f"not implemented for {model_type} (null: full attention)")
    types = d.get("layer_types")
    if isinstance(types, list) and any(t != "full_attention" for t in types):
        raise ConfigError(f"{path}: field 'layer_types' has non-full-attention layers; ffnlab runs full attention")


def _every_layer_moe(d, path):
    """decoder_sparse_step / mlp_only_layers make some layers dense (intermediate_size wide);
    ffnlab's config has one FFN kind for every layer."""
    step = d.get("decoder_sparse_step", 1)
    if step != 1:
        raise ConfigError(f"{path}: field 'decoder_sparse_step' = {step!r}: ffnlab needs every layer to be MoE (1)")
    only = d.get("mlp_only_layers") or []
    if only:
        raise ConfigError(f"{path}: field 'mlp_only_layers' = {only!r:.60}: ffnlab needs every layer to be MoE")


# fields whose other values are refused, with the check; REFUSED names them for the field test
REFUSED = {
    "use_sliding_window": _no_sliding, "sliding_window": _no_sliding, "layer_types": _no_sliding,
    "decoder_sparse_step": _every_layer_moe, "mlp_only_layers": _every_layer_moe,
    "clip_qkv": None,            # OLMoE: clamps q/k/v; refused when not null (moe_fields)
}


def moe_fields(d, req, model_type, path) -> dict:
    """The MoE part of a ModelConfig (and the attention flags these families add) -> {field: value}.
    req: hf_config's typed field reader."""
    _no_sliding(d, path, model_type)
    _every_layer_moe(d, path)
    if d.get("clip_qkv") is not None:
        raise ConfigError(f"{path}: field 'clip_qkv' = {d['clip_qkv']!r}: clamping q/k/v is not implemented")
    act = req("hidden_act", str, "silu")
    if act not in ("silu", "swish"):
        raise ConfigError(f"{path}: field 'hidden_act' = {act!r}: the experts must be SwiGLU (silu)")
    n_key = "num_local_experts" if model_type == "mixtral" or "num_experts" not in d else "num_experts"
    kw = dict(ffn="moe", n_expert=req(n_key), n_expert_used=req("num_experts_per_tok"),
              arch=GGUF_ARCH[model_type], ffn_bias=False)
    if kw["n_expert_used"] > kw["n_expert"]:
        raise ConfigError(f"{path}: field 'num_experts_per_tok' = {kw['n_expert_used']} exceeds "
                          f"'{n_key}' = {kw['n_expert']} (top-k larger than the experts)")
    if model_type == "mixtral":
        kw["expert_norm"] = True                     # MixtralTopKRouter always renormalises
    else:
        kw["expert_norm"] = req("norm_topk_prob", bool, False)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        kw["d_ff"] = req("moe_intermediate_size")    # intermediate_size: dense layers, which are refused above
    if model_type == "qwen2_moe":
        kw["d_ff_shexp"] = req("shared_expert_intermediate_size", int, 0, lo=0, hi=MAX_DIM)
        kw["attn_bias"] = req("qkv_bias", bool, True)
        kw["attn_out_bias"] = False
    if model_type in ("qwen3_moe", "olmoe"):
        kw["qk_norm"] = True
        kw["qk_norm_full"] = model_type == "olmoe"
        kw["attn_bias"] = req("attention_bias", bool, False)
        kw["attn_out_bias"] = kw["attn_bias"]               # o_proj has bias=attention_bias too
    return kw


# --- tensors ----------------------------------------------------------------------------------
_EXPERT = re.compile(r"model\.layers\.(\d+)\.(?:block_sparse_moe|mlp)\.experts\.(\d+)\.(\w+)\.weight")
_EXPERT_PROJ = {"w1": "ffn_gate_exps", "w3": "ffn_up_exps", "w2": "ffn_down_exps",
                "gate_proj": "ffn_gate_exps", "up_proj": "ffn_up_exps", "down_proj": "ffn_down_exps"}
_MOE_BLOCK = {"block_sparse_moe.gate": "ffn_gate_inp", "mlp.gate": "ffn_gate_inp",
              "mlp.shared_expert.gate_proj": "ffn_gate_shexp", "mlp.shared_expert.up_proj": "ffn_up_shexp",
              "mlp.shared_expert.down_proj": "ffn_down_shexp", "mlp.shared_expert_gate": "ffn_gate_inp_shexp",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}


def moe_gguf_name(hf_name):
    """HF name -> (GGUF name, expert index or None), or None when it is not a MoE-family tensor."""
    m = _EXPERT.fullmatch(hf_name)
    if m and m.group(3) in _EXPERT_PROJ:
        return f"blk.{m.group(1)}.{_EXPERT_PROJ[m.group(3)]}.weight", int(m.group(2))
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.weight", hf_name)
    if m and m.group(2) in _MOE_BLOCK:
        return f"blk.{m.group(1)}.{_MOE_BLOCK[m.group(2)]}.weight", None
    return None


def hf_expert_name(model_type, il, e, which):
    """which in gate/up/down -> the hub's name of expert e's matrix in layer il"""
    if model_type == "mixtral":
        return f"model.layers.{il}.block_sparse_moe.experts.{e}.{ {'gate': 'w1', 'up': 'w3', 'down': 'w2'}[which]}.weight"
    return f"model.layers.{il}.mlp.experts.{e}.{which}_proj.weight"


def hf_moe_names(model_type, il) -> dict:
    """GGUF name (relative to blk.L.) -> HF name, for the tensors of one layer that are not per-expert."""
    router = "block_sparse_moe.gate" if model_type == "mixtral" else "mlp.gate"
    out = {v: k for k, v in _MOE_BLOCK.items() if not k.startswith(("block_sparse_moe", "mlp.gate"))}
    out["ffn_gate_inp"] = router
    return {f"{k}.weight": f"model.layers.{il}.{v}.weight" for k, v in out.items()}


def expert_entries(index, cfg, cfg_path) -> dict:
    """Pop the per-expert tensors out of a safetensors index -> {GGUF name: [entry of expert 0..E-1]},
    each checked against the [d_ff, d_model] / [d_model, d_ff] shape config.json implies and
    complete (every expert of every layer), before any tensor is read."""
    from ..errors import ModelFileError
    from ..model.params import param_shapes

    expected = param_shapes(cfg)
    out = {}
    for hf_name in [n for n in index if _EXPERT.fullmatch(n)]:
        e = index.pop(hf_name)
        named = moe_gguf_name(hf_name)
        if named is None or named[0] not in expected:
            raise ModelFileError(f"{e.file}: tensor {hf_name} has no place in the model {cfg_path} describes "
                                 f"({cfg.n_layer} layers of {cfg.n_expert} experts)")
        name, ix = named
        if ix >= cfg.n_expert:
            raise ModelFileError(f"{e.file}: tensor {hf_name} is expert {ix}, but {cfg_path} says "
                                 f"{cfg.n_expert} experts")
        if tuple(e.shape) != expected[name][1:]:
            raise ModelFileError(f"{e.file}: tensor {hf_name} has shape {list(e.shape)}, config.json implies "
                                 f"{list(expected[name][1:])}")
        out.setdefault(name, [None] * cfg.n_expert)[ix] = e
    for name, entries in out.items():
        if None in entries:
            raise ModelFileError(f"{cfg_path}: no weights for expert {entries.index(None)} of {name} "
                                 f"({cfg.n_expert} experts expected)")
    return out


def read_experts(experts, dtype) -> dict:
    """{GGUF name: per-expert entries} -> {GGUF name: [E, out, in] array}, filled expert by expert."""
    import numpy as np

    from .safetensors_io import read_tensors
    out = {}
    for name, entries in experts.items():
        a = out[name] = np.empty((len(entries),) + tuple(entries[0].shape), dtype)
        slot = {id(e): i for i, e in enumerate(entries)}
        for e, t in read_tensors(entries):
            a[slot[id(e)]] = t
    return out


# --- export -----------------------------------------------------------------------------------
HF_CLASS = {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
            "olmoe": "OlmoeForCausalLM"}


def hf_moe_type(cfg) -> str:
    """The transformers model_type that computes this MoE config exactly, or UsageError saying why none does."""
    from ..errors import UsageError
    model_type = {v: k for k, v in GGUF_ARCH.items()}.get(cfg.arch, "mixtral")
    why = []
    if model_type == "mixtral" and not cfg.expert_norm:
        why.append("expert_norm=False (Mixtral always renormalises the top-k weights; a k=1 Switch-style "
                   "model has no transformers class)")
    if bool(cfg.d_ff_shexp) != (model_type == "qwen2_moe"):
        why.append(f"d_ff_shexp={cfg.d_ff_shexp} (only Qwen2-MoE has a shared expert, and it needs one)")
    if cfg.qk_norm != (model_type in ("qwen3_moe", "olmoe")) or cfg.qk_norm_full != (model_type == "olmoe"):
        why.append(f"qk_norm={cfg.qk_norm}, qk_norm_full={cfg.qk_norm_full} (not {model_type}'s q/k norms)")
    if model_type == "mixtral" and (cfg.attn_bias or cfg.attn_out_bias):
        why.append("attention biases (Mixtral has none)")
    if model_type == "qwen2_moe" and cfg.attn_out_bias:
        why.append("attn_out_bias (Qwen2-MoE's o_proj has none)")
    if model_type in ("qwen3_moe", "olmoe") and cfg.attn_bias != cfg.attn_out_bias:
        why.append("attn_bias != attn_out_bias (attention_bias covers q, k, v and o)")
    for f in ("post_attn_norm", "post_ffn_norm", "embed_scale", "sliding_window", "final_logit_softcap",
              "attn_scale", "fused_qkv"):
        if getattr(cfg, f):
            why.append(f"{f}={getattr(cfg, f)!r} (needs off)")
    if cfg.norm != "rmsnorm" or cfg.positions != "rope" or cfg.rope_scale != 1.0:
        why.append("needs RMSNorm and unscaled RoPE")
    if why:
        raise UsageError(f"cannot export this mixture of experts to HF ({HF_CLASS[model_type]}): {'; '.join(why)}")
    return model_type


def hf_moe_config(cfg, model_type, common) -> dict:
    d = {"architectures": [HF_CLASS[model_type]], "model_type": model_type, "hidden_size": cfg.d_model,
         "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head, "num_key_value_heads": cfg.n_kv_head,
         "head_dim": cfg.head_dim, "hidden_act": "silu", "max_position_embeddings": cfg.n_ctx,
         "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
         "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
         "num_experts_per_tok": cfg.n_expert_used, "attention_dropout": 0.0, "router_aux_loss_coef": 0.0, **common}
    if model_type == "mixtral":
        d.update(num_local_experts=cfg.n_expert, intermediate_size=cfg.d_ff, sliding_window=None)
    else:
        d.update(num_experts=cfg.n_expert, norm_topk_prob=cfg.expert_norm)
    if model_type == "olmoe":
        d.update(intermediate_size=cfg.d_ff, attention_bias=cfg.attn_bias, clip_qkv=None)
    if model_type in ("qwen2_moe", "qwen3_moe"):
        d.update(moe_intermediate_size=cfg.d_ff, intermediate_size=cfg.d_ff, decoder_sparse_step=1,
                 mlp_only_layers=[], use_sliding_window=False)
    if model_type == "qwen2_moe":
        d.update(shared_expert_intermediate_size=cfg.d_ff_shexp, qkv_bias=cfg.attn_bias)
    if model_type == "qwen3_moe":
        d["attention_bias"] = cfg.attn_bias
    return d


def hf_moe_tensors(cfg, params, model_type, il) -> dict:
    """Layer il's MoE tensors (stacked [E, out, in]) -> the hub's per-expert names."""
    out = {}
    blk = f"blk.{il}."
    for which in ("gate", "up", "down"):
        stacked = params[f"{blk}ffn_{which}_exps.weight"]
        for e in range(cfg.n_expert):
            out[hf_expert_name(model_type, il, e, which)] = stacked[e]
    for name, hf in hf_moe_names(model_type, il).items():
        if blk + name in params:
            a = params[blk + name]
            out[hf] = a[None] if name == "ffn_gate_inp_shexp.weight" else a     # shared_expert_gate: [1, d_model]
    return out
