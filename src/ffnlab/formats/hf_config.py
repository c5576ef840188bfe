"""Hugging Face config.json -> ModelConfig.

config_from_hf(d, path) maps the fields a transformers config.json publishes onto ffnlab's
ModelConfig, for the families ffnlab knows:

  model_type        d_model       d_ff                     FFN      norm       positions
  gpt2              n_embd        n_inner (None: 4*n_embd)  gelu_tanh layernorm learned, fused qkv, all biases
  bert              hidden_size   intermediate_size         gelu     layernorm  learned, all biases (encoder)
  llama, mistral    hidden_size   intermediate_size         swiglu   rmsnorm    rope (normal pairing in GGUF)
  qwen2             hidden_size   intermediate_size         swiglu   rmsnorm    rope neox, q/k/v biases
  phi3              hidden_size   intermediate_size         swiglu   rmsnorm    rope neox, fused qkv
  gemma2            hidden_size   intermediate_size         geglu    rmsnorm    rope neox, post norms, softcap
  gemma3(_text)     hidden_size   intermediate_size         geglu    rmsnorm    rope neox, qk norm, post norms

What ModelConfig cannot express is left out on purpose, because it changes neither the
parameter count nor the FFN: Llama 3.1's "llama3" RoPE frequency scaling, Mistral's and Phi-3's
all-layer sliding window, Gemma 2's attention-logit softcap. BERT's token-type table and pooler
are not part of ModelConfig either; hf_extra_params() counts them for the sizing tools.

A required field that is missing raises ConfigError naming the field and the file.
"""
import json
import os

from ..config import ConfigError, ModelConfig
from ..errors import ModelFileError

SUPPORTED = ("gpt2", "bert", "llama", "mistral", "qwen2", "phi3", "gemma2", "gemma3", "gemma3_text")

# transformers' hidden_act / activation_function -> the activation inside ffnlab's FFN kinds
_GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_tanh")


def load_hf_config(path) -> tuple[dict, str]:
    """A config.json file or an HF model directory -> (parsed dict, path of the config.json)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: no such file (expected an HF config.json or a directory holding one)")
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(d).__name__}")
    return d, path


def config_from_hf(d: dict, path="config.json", name="") -> ModelConfig:
    """d: the parsed config.json; path: where it came from (for messages) -> ModelConfig"""
    if "text_config" in d and d.get("model_type") == "gemma3":
        d = {**d["text_config"], "model_type": "gemma3_text"}    # multimodal Gemma 3: the LM is text_config
    d = flat_rope_parameters(d)
    model_type = d.get("model_type")
    if model_type is None:
        raise ConfigError(f"{path}: missing field 'model_type'")
    if model_type not in SUPPORTED:
        raise ConfigError(f"{path}: model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED)})")

    def req(key):
        if key not in d or d[key] is None:
            raise ConfigError(f"{path}: missing field '{key}' (needed for model_type {model_type})")
        return d[key]

    name = name or d.get("_name_or_path", "") or ""
    if model_type == "gpt2":
        return _gpt2(d, req, path, name)
    if model_type == "bert":
        return _bert(d, req, path, name)
    return _decoder(d, req, model_type, path, name)


def flat_rope_parameters(d):
    """transformers 5 writes rope_theta / rope scaling inside "rope_parameters" ({"rope_theta": 5e5,
    "rope_type": "default"}); older files have top-level rope_theta / rope_scaling. -> the old form"""
    rp = d.get("rope_parameters")
    if not isinstance(rp, dict) or not isinstance(rp.get("rope_theta"), (int, float)):
        return d                                    # absent, or per-layer-type (Gemma 3: not loaded here)
    d = {**d, "rope_theta": d.get("rope_theta") or rp["rope_theta"]}
    if rp.get("rope_type", "default") != "default" and not d.get("rope_scaling"):
        d["rope_scaling"] = rp
    return d


def hf_extra_params(d: dict) -> dict:
    """Parameters of an HF model that ModelConfig does not describe -> {component: count}.

    BERT: the token-type (segment) embedding table [type_vocab_size, hidden] and the pooler
    (a dense hidden -> hidden with bias) that BertModel carries."""
    if d.get("model_type") != "bert":
        return {}
    D = d["hidden_size"]
    return {"token_types": d.get("type_vocab_size", 2) * D, "pooler": D * D + D}


def _ffn_from_act(act, path, key):
    if act in ("silu", "swish"):
        return "swiglu"
    if act in _GELU_TANH:
        return "geglu"
    raise ConfigError(f"{path}: field '{key}' = {act!r} is not a gated activation ffnlab knows (silu, gelu_pytorch_tanh)")


def _dense_act(act, path, key):
    if act in _GELU_TANH:
        return "gelu_tanh"
    if act == "gelu":
        return "gelu"
    if act == "relu":
        return "relu"
    raise ConfigError(f"{path}: field '{key}' = {act!r} is not an activation ffnlab knows (gelu, gelu_new, relu)")


def _gpt2(d, req, path, name):
    D = req("n_embd")
    d_ff = d.get("n_inner") or 4 * D                       # GPT2Config: n_inner None means 4 * n_embd
    return ModelConfig(
        arch="gpt2", n_layer=req("n_layer"), d_model=D, n_head=req("n_head"), d_ff=d_ff,
        ffn=_dense_act(d.get("activation_function", "gelu_new"), path, "activation_function"),
        ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=True,
        norm="layernorm", norm_eps=d.get("layer_norm_epsilon", 1e-5), positions="learned",
        vocab_size=req("vocab_size"), n_ctx=req("n_positions"),
        tie_embeddings=d.get("tie_word_embeddings", True), name=name)


def _bert(d, req, path, name):
    return ModelConfig(
        arch="bert", n_layer=req("num_hidden_layers"), d_model=req("hidden_size"),
        n_head=req("num_attention_heads"), d_ff=req("intermediate_size"),
        ffn=_dense_act(d.get("hidden_act", "gelu"), path, "hidden_act"),
        ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=False,
        norm="layernorm", norm_eps=d.get("layer_norm_eps", 1e-12), positions="learned",
        vocab_size=req("vocab_size"), n_ctx=req("max_position_embeddings"),
        tie_embeddings=True, name=name)


def _decoder(d, req, model_type, path, name):
    D, n_head = req("hidden_size"), req("num_attention_heads")
    n_kv = d.get("num_key_value_heads") or n_head
    head_dim = d.get("head_dim") or D // n_head
    gemma = model_type.startswith("gemma")
    act_key = "hidden_activation" if gemma and "hidden_activation" in d else "hidden_act"
    act = d.get(act_key) or ("gelu_pytorch_tanh" if gemma else "silu")
    kw = dict(
        arch={"mistral": "llama", "gemma3_text": "gemma3"}.get(model_type, model_type),
        n_layer=req("num_hidden_layers"), d_model=D, n_head=n_head, n_kv_head=n_kv, head_dim=head_dim,
        d_ff=req("intermediate_size"), ffn=_ffn_from_act(act, path, act_key),
        ffn_bias=bool(d.get("mlp_bias", False)), attn_bias=bool(d.get("attention_bias", False)),
        attn_out_bias=bool(d.get("attention_bias", False)) and model_type in ("llama", "mistral"),
        norm="rmsnorm", norm_eps=d.get("rms_norm_eps", 1e-6 if gemma else 1e-5), positions="rope",
        rope_pairing="normal" if model_type in ("llama", "mistral") else "neox",
        rope_theta=float(d.get("rope_theta") or 10000.0),
        vocab_size=req("vocab_size"), n_ctx=req("max_position_embeddings"),
        tie_embeddings=bool(d.get("tie_word_embeddings", gemma)), name=name)
    scaling = d.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        kw["rope_scale"] = float(scaling["factor"])
    if model_type == "qwen2":
        kw["attn_bias"] = True                             # Qwen2 always has q/k/v biases (no config flag)
    if model_type == "phi3":
        kw["fused_qkv"] = True                             # qkv_proj: one [q+2kv, hidden] matrix
    if gemma:
        kw.update(post_attn_norm=True, post_ffn_norm=True, embed_scale=True,
                  attn_scale=float(d.get("query_pre_attn_scalar") or head_dim) ** -0.5,
                  final_logit_softcap=float(d.get("final_logit_softcapping") or 0.0))
        if d.get("sliding_window"):
            kw["sliding_window"] = int(d["sliding_window"])
            kw["sliding_window_pattern"] = _sliding_pattern(d, model_type)
    if model_type in ("gemma3", "gemma3_text"):
        kw["qk_norm"] = True
        kw["rope_theta_local"] = float(d.get("rope_local_base_freq") or 10000.0)
        kw["rope_theta"] = float(d.get("rope_theta") or 1_000_000.0)
    return ModelConfig(**kw)


def _sliding_pattern(d, model_type):
    """Every Nth layer is global. Gemma 2 alternates (N=2); Gemma 3 has N=6, given either as
    sliding_window_pattern or as a layer_types list ending each period with 'full_attention'."""
    if model_type == "gemma2":
        return 2
    types = d.get("layer_types")
    if types:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            return full[0] + 1
    return int(d.get("sliding_window_pattern") or 6)
