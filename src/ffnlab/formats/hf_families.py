"""Gemma 2, GPT-NeoX/Pythia and OLMo 2 Hugging Face directories: config.json fields and tensor names.

  model_type  ffnlab arch  block (model/block.py flags)
  gemma2      gemma2       pre and post norms, GeGLU, attention logit softcap, alternating sliding
                           windows (layer_types), q scaled by query_pre_attn_scalar^-0.5, final softcap
  gpt_neox    gptneox      parallel residual (use_parallel_residual), partial rotary
                           (rope_parameters.partial_rotary_factor or rotary_pct), LayerNorm with bias,
                           fused qkv with biases, exact-GELU MLP with biases, untied embed_out
  olmo2       olmo2        no pre norms: post-attention and post-feedforward norms only, q/k RMSNorm over
                           the whole projection before the heads are split, SwiGLU

Tensors (HF name in the block -> GGUF name, blk.L.):
  gemma2   input_layernorm -> attn_norm, post_attention_layernorm -> post_attention_norm,
           pre_feedforward_layernorm -> ffn_norm, post_feedforward_layernorm -> post_ffw_norm,
           self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj as llama's
  gpt_neox gpt_neox.layers.L.{input_layernorm -> attn_norm, post_attention_layernorm -> ffn_norm,
           attention.query_key_value -> attn_qkv, attention.dense -> attn_output,
           mlp.dense_h_to_4h -> ffn_up, mlp.dense_4h_to_h -> ffn_down}; gpt_neox.embed_in,
           gpt_neox.final_layer_norm, embed_out
  olmo2    self_attn.q_norm / k_norm -> attn_q_norm / attn_k_norm, post_attention_layernorm ->
           post_attention_norm, post_feedforward_layernorm -> post_ffw_norm
Two tensors change on the way in, as llama.cpp's converter changes them for GGUF:
  Gemma's RMSNorm computes x_hat * (1 + w): the stored w gets its 1 added, so every norm is x_hat * w.
  GPT-NeoX's query_key_value rows are per head [n_head, 3, head_dim] (q, k, v of head 0, then head 1,
  ...): they are reordered to [3, n_head, head_dim], the q; k; v blocks of a fused attn_qkv.

Every field of the three config classes is used, known not to change the logits, or refused:
formats/hf_fields.py lists them, tests/engines/test_hf_fields.py holds the lists to transformers' classes.
"""

import numpy as np

from ..config import MAX_LAYERS, ConfigError, ModelConfig
from ..families import FAMILIES, family
from .hf_values import dense_act, rope_scaling   # linear and llama3 RoPE run; other types are refused


# --- config fields (formats/hf_fields.py sorts every field of the three classes) ----------------
def _refuse(path, key, value, why):
    raise ConfigError(f"{path}: field '{key}' = {value!r:.80} is not supported ({why})")


def gemma2_fields(d, req, path) -> dict:
    """Gemma 2's addition to the decoder fields hf_config reads (post norms, query_pre_attn_scalar,
    final softcap, the sliding window and the biases are shared with Gemma 3 there): the attention softcap."""
    return {"attn_softcap": req("attn_logit_softcapping", float, None, lo=1e-30, hi=1e30) or 0.0}


def check_layer_types(d, cfg, path):
    """layer_types (transformers 5) must be the sliding/full pattern cfg computes, layer by layer."""
    types = d.get("layer_types")
    if types is None or not cfg.sliding_window:
        return
    want = ["sliding_attention" if cfg.is_sliding(il) else "full_attention" for il in range(cfg.n_layer)]
    if types != want:
        _refuse(path, "layer_types", types, f"ffnlab runs {cfg.arch} as every {cfg.sliding_window_pattern}th "
                                            f"layer global, the others sliding: {want[:4]}...")


def gptneox_config(d, req, path, name) -> ModelConfig:
    """GPTNeoXConfig -> ModelConfig. HF computes rotary_ndims = int(head_dim * partial_rotary_factor)."""
    D, n_head = req("hidden_size"), req("num_attention_heads")
    if D % n_head:
        raise ConfigError(f"{path}: hidden_size {D} is not a multiple of num_attention_heads {n_head}")
    hd = D // n_head
    rp = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    factor = rp.get("partial_rotary_factor", d.get("rotary_pct", 0.25))
    theta = rp.get("rope_theta", d.get("rotary_emb_base", 10000.0))
    for key, v in (("partial_rotary_factor", factor), ("rope_theta", theta)):
        if type(v) not in (int, float) or not 0 < v < 1e30:
            _refuse(path, key, v, "a positive number is needed")
    if factor > 1:
        _refuse(path, "partial_rotary_factor", factor, "at most 1: the rotated part of a head")
    rope_dim = int(hd * factor)
    if rope_dim % 2:
        _refuse(path, "partial_rotary_factor", factor, f"it rotates {rope_dim} of {hd} dims, an odd number")
    bias = req("attention_bias", bool, True)
    scaling = rope_scaling(req("rope_scaling", dict, None) or {}, path)
    return ModelConfig(**scaling,
        arch="gptneox", n_layer=req("num_hidden_layers", hi=MAX_LAYERS), d_model=D, n_head=n_head,
        d_ff=req("intermediate_size"), ffn=dense_act(req("hidden_act", str, "gelu"), path, "hidden_act"),
        ffn_bias=True, attn_bias=bias, attn_out_bias=bias, fused_qkv=True,
        norm="layernorm", norm_eps=req("layer_norm_eps", float, 1e-5, lo=1e-30, hi=1.0),
        parallel_residual=req("use_parallel_residual", bool, True),
        positions="rope", rope_pairing="neox", rope_theta=float(theta), rope_dim=rope_dim if rope_dim < hd else 0,
        vocab_size=req("vocab_size"), n_ctx=req("max_position_embeddings"),
        tie_embeddings=req("tie_word_embeddings", bool, False), name=name)


# --- tensors --------------------------------------------------------------------------------------
def family_tensor(name, a, cfg):
    """A tensor as HF stores it -> as ffnlab (and GGUF) computes with it (see the module docstring)."""
    if cfg.arch == "gemma2" and name.endswith("norm.weight"):
        return a + np.asarray(1.0, a.dtype)                      # Gemma: x_hat * (1 + w)
    if cfg.arch == "gptneox" and ".attn_qkv." in name:
        H, hd = cfg.n_head, cfg.head_dim
        return a.reshape(H, 3, hd, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)   # [H, 3, hd] -> [3, H, hd]
    return a


def hf_tensor(name, a, cfg):
    """The inverse of family_tensor: ffnlab's tensor -> as HF stores it (export)."""
    if cfg.arch == "gemma2" and name.endswith("norm.weight"):
        return a - np.asarray(1.0, a.dtype)
    if cfg.arch == "gptneox" and ".attn_qkv." in name:
        H, hd = cfg.n_head, cfg.head_dim
        return a.reshape(3, H, hd, *a.shape[1:]).swapaxes(0, 1).reshape(a.shape)   # [3, H, hd] -> [H, 3, hd]
    return a


# --- export (formats/export_hf.py) ----------------------------------------------------------------
# the families whose HF class export writes here (families/<arch>.py hf_export; the Llama-shaped ones
# are export_hf_llama.py's)
HF_CLASS = {a: c for a, f in FAMILIES.items() if not f.hf_llama_shaped for c, _, _ in f.hf_export.values()}
MODEL_TYPE = {a: t for a in HF_CLASS for t in family(a).hf_export}
_HF_NEOX_ACT = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


def family_hf_mismatches(cfg) -> list:
    """What the transformers class of cfg.arch computes differently from cfg -> ["field=value (why)", ...]"""
    want = family(cfg.arch).hf_export[MODEL_TYPE[cfg.arch]][1]
    why = [f"{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
    if cfg.attn_bias != cfg.attn_out_bias:
        why.append(f"attn_bias={cfg.attn_bias} but attn_out_bias={cfg.attn_out_bias} (one attention_bias covers both)")
    if cfg.arch == "gemma2" and cfg.sliding_window and cfg.sliding_window_pattern != 2:
        why.append(f"sliding_window_pattern={cfg.sliding_window_pattern} (Gemma 2 alternates: 2)")
    if cfg.arch == "gemma2" and abs(cfg.scale ** -2 - round(cfg.scale ** -2)) > 1e-6 * cfg.scale ** -2:
        why.append(f"attention scale {cfg.scale:.6g} (Gemma 2's is query_pre_attn_scalar^-0.5, an integer's)")
    if cfg.arch in ("gptneox", "olmo2") and cfg.q_dim != cfg.d_model:
        why.append(f"n_head*head_dim={cfg.q_dim} != d_model={cfg.d_model}")
    if cfg.arch == "gptneox":
        if cfg.ffn not in _HF_NEOX_ACT:
            why.append(f"ffn={cfg.ffn!r} (GPT-NeoX's MLP is dense: {', '.join(_HF_NEOX_ACT)})")
        if cfg.n_kv_head != cfg.n_head:
            why.append("grouped-query attention (GPT-NeoX's qkv holds n_head keys and values)")
        if cfg.rope_dim and int(cfg.head_dim * (cfg.rope_dim / cfg.head_dim)) != cfg.rope_dim:
            why.append(f"rope_dim={cfg.rope_dim} (no partial_rotary_factor gives it back)")
    return why


def family_hf_config(cfg, common) -> dict:
    """config.json for cfg (common: vocab, token ids, tie_word_embeddings, dtype)."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scale != 1.0:                               # linear scaling: positions / factor, every layer
        rope.update(rope_type="linear", factor=cfg.rope_scale)
    d = {"architectures": [HF_CLASS[cfg.arch]], "model_type": MODEL_TYPE[cfg.arch], "hidden_size": cfg.d_model,
         "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
         "max_position_embeddings": cfg.n_ctx, "attention_bias": cfg.attn_bias, "attention_dropout": 0.0,
         "rope_parameters": rope, **common}
    if cfg.arch == "gptneox":
        rope["partial_rotary_factor"] = cfg.n_rot / cfg.head_dim
        return {**d, "hidden_act": _HF_NEOX_ACT[cfg.ffn], "layer_norm_eps": cfg.norm_eps, "hidden_dropout": 0.0,
                "use_parallel_residual": cfg.parallel_residual}
    d.update(num_key_value_heads=cfg.n_kv_head, rms_norm_eps=cfg.norm_eps)
    if cfg.arch == "olmo2":
        return {**d, "hidden_act": "silu"}
    window = cfg.sliding_window or None
    return {**d, "head_dim": cfg.head_dim, "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": round(cfg.scale ** -2), "sliding_window": window,
            "layer_types": ["sliding_attention" if cfg.is_sliding(il) else "full_attention"
                            for il in range(cfg.n_layer)],
            "attn_logit_softcapping": cfg.attn_softcap or None,
            "final_logit_softcapping": cfg.final_logit_softcap or None}


def family_hf_tensors(cfg, params) -> dict:
    """GGUF-named [out, in] arrays -> HF-named arrays in HF layout (the inverse of the load tables)."""
    arch = cfg.arch
    params = dict(params)
    if arch == "gptneox" and not cfg.fused_qkv:            # HF keeps one query_key_value
        for il in range(cfg.n_layer):
            for kind in ("weight", "bias"):
                if f"blk.{il}.attn_q.{kind}" in params:
                    params[f"blk.{il}.attn_qkv.{kind}"] = np.concatenate(
                        [params.pop(f"blk.{il}.attn_{x}.{kind}") for x in "qkv"])
    names = family(arch).hf_tensors
    top = {g: h for h, g in names.top.items()}
    block = {g: h for h, g in names.block.items()}
    prefix = names.layers.replace("\\", "")
    out = {}
    for name, a in params.items():
        if name == "output.weight" and cfg.tie_embeddings:
            continue
        if name in top:
            hf = top[name]
        else:
            _, il, short, kind = name.split(".")
            hf = f"{prefix}.{il}.{block[short]}.{kind}"
        out[hf] = np.ascontiguousarray(hf_tensor(name, np.asarray(a, np.float32), cfg))
    return out
