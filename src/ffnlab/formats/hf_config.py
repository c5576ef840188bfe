"""Hugging Face config.json -> ModelConfig.

config_from_hf(d, path) maps the fields a transformers config.json publishes onto ffnlab's
ModelConfig, for the families ffnlab knows:

  model_type        d_model       d_ff                     FFN      norm       positions
  gpt2              n_embd        n_inner (None: 4*n_embd)  gelu_tanh layernorm learned, fused qkv, all biases
  bert              hidden_size   intermediate_size         gelu     layernorm  learned, all biases (encoder)
  llama, mistral    hidden_size   intermediate_size         swiglu   rmsnorm    rope (normal pairing in GGUF)
  qwen2             hidden_size   intermediate_size         swiglu   rmsnorm    rope neox, q/k/v biases
  qwen3             hidden_size   intermediate_size         swiglu   rmsnorm    rope neox, per-head q/k norm
  phi3              hidden_size   intermediate_size         swiglu   rmsnorm    rope neox, fused qkv and gate_up
  gemma2            hidden_size   intermediate_size         geglu    rmsnorm    rope neox, post norms, softcaps
  gpt_neox          hidden_size   intermediate_size         gelu     layernorm  partial rope, parallel residual
  olmo2             hidden_size   intermediate_size         swiglu   rmsnorm    rope neox, post norms only, q/k norms
  gemma3(_text)     hidden_size   intermediate_size         geglu    rmsnorm    rope neox, qk norm, post norms
  mixtral, qwen2_moe, qwen3_moe, olmoe: mixtures of SwiGLU experts (formats/hf_moe.py)
  gemma2, gpt_neox, olmo2: their own fields and tensor names in formats/hf_families.py

Every field of each family's transformers config class is read here, listed as irrelevant to the
logits, or refused with a line naming it (formats/hf_fields.py holds the lists; a test enumerates the
classes). Sliding windows: Mistral and Phi-3 slide every layer; Qwen2/Qwen3 only with
use_sliding_window, on the layers layer_types (or max_window_layers) names; Gemma alternates.
RoPE (rope_parameters): default, linear and Llama 3's llama3 scaling run; other types are refused.
BERT's token-type table and pooler are not part of ModelConfig; hf_extra_params() counts them for
the sizing tools.

A required field that is missing raises ConfigError naming the field and the file.
"""
import os

from ..config import MAX_DIM, MAX_LAYERS, ConfigError, ModelConfig
from ..errors import ModelFileError
from ..families import hf_family, hf_types
from .hf_families import check_layer_types, gemma2_fields, gptneox_config
from .hf_fields import refuse_unsupported
from .hf_values import GELU_TANH, dense_act, rope_scaling
from .hf_moe import MOE_TYPES, moe_fields
from .jsonfile import field, read_json_object

SUPPORTED = hf_types()                  # families/: one module per family, its hf_types

# transformers' hidden_act / activation_function -> the activation inside ffnlab's FFN kinds


def load_hf_config(path) -> tuple[dict, str]:
    """A config.json file or an HF model directory -> (parsed dict, path of the config.json)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file (expected an HF config.json or a directory holding one)")
    return read_json_object(path, "config", max_bytes=16 << 20), path


def config_from_hf(d: dict, path="config.json", name="") -> ModelConfig:
    """d: the parsed config.json; path: where it came from (for messages) -> ModelConfig"""
    if "text_config" in d and d.get("model_type") == "gemma3":
        d = {**field(d, "text_config", dict, path), "model_type": "gemma3_text"}   # multimodal: the LM is text_config
    d = flat_rope_parameters(d)
    model_type = field(d, "model_type", str, path)
    if model_type not in SUPPORTED:
        raise ConfigError(f"{path}: model_type {model_type!r} is not supported (supported: {', '.join(SUPPORTED)})")

    def req(key, kind=int, default=..., lo=1, hi=MAX_DIM):
        """A field typed and ranged: sizes are positive integers, so a string, a list, a null, a
        5,000-digit or a negative number fails here naming the field."""
        try:
            return field(d, key, kind, path, default, lo=lo if kind in (int, float) else None,
                         hi=hi if kind in (int, float) else None)
        except ConfigError as e:
            if "missing field" in str(e):
                raise ConfigError(f"{e} (needed for model_type {model_type})") from None
            raise

    name = name or field(d, "_name_or_path", str, path, "") or ""
    refuse_unsupported(d, model_type, path)          # fields that change the math and are not implemented
    try:
        if model_type == "gpt2":
            return _gpt2(d, req, path, name)
        if model_type == "bert":
            return _bert(d, req, path, name)
        if model_type == "gpt_neox":
            return gptneox_config(d, req, path, name)
        return _decoder(d, req, model_type, path, name)
    except ConfigError as e:                     # ModelConfig's own checks name its fields, not the file
        raise ConfigError(str(e) if str(e).startswith(f"{path}:") else f"{path}: {e}") from None


def flat_rope_parameters(d):
    """transformers 5 writes rope_theta / rope scaling inside "rope_parameters" ({"rope_theta": 5e5,
    "rope_type": "default"}); older files have top-level rope_theta / rope_scaling. -> the old form"""
    rp = d.get("rope_parameters")
    if not isinstance(rp, dict) or type(rp.get("rope_theta")) not in (int, float):
        return d                                    # absent, or per-layer-type (Gemma 3: not loaded here)
    d = {**d, "rope_theta": d.get("rope_theta") or rp["rope_theta"]}
    if rp.get("rope_type", "default") not in ("default", None) and not d.get("rope_scaling"):
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
    if act in GELU_TANH:
        return "geglu"
    raise ConfigError(f"{path}: field '{key}' = {act!r} is not a gated activation ffnlab knows (silu, gelu_pytorch_tanh)")


def _gpt2(d, req, path, name):
    D = req("n_embd")
    d_ff = req("n_inner", default=None) or 4 * D          # GPT2Config: n_inner None means 4 * n_embd
    return ModelConfig(
        arch="gpt2", n_layer=req("n_layer", hi=MAX_LAYERS), d_model=D, n_head=req("n_head"), d_ff=d_ff,
        ffn=dense_act(req("activation_function", str, "gelu_new"), path, "activation_function"),
        ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=True,
        norm="layernorm", norm_eps=req("layer_norm_epsilon", float, 1e-5, lo=1e-30, hi=1.0), positions="learned",
        vocab_size=req("vocab_size"), n_ctx=req("n_positions"),
        tie_embeddings=req("tie_word_embeddings", bool, True), name=name)


def _bert(d, req, path, name):
    return ModelConfig(
        arch="bert", n_layer=req("num_hidden_layers", hi=MAX_LAYERS), d_model=req("hidden_size"),
        n_head=req("num_attention_heads"), d_ff=req("intermediate_size"),
        ffn=dense_act(req("hidden_act", str, "gelu"), path, "hidden_act"),
        ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=False,
        norm="layernorm", norm_eps=req("layer_norm_eps", float, 1e-12, lo=1e-30, hi=1.0), positions="learned",
        vocab_size=req("vocab_size"), n_ctx=req("max_position_embeddings"),
        tie_embeddings=True, name=name)


def _decoder(d, req, model_type, path, name):
    D, n_head = req("hidden_size"), req("num_attention_heads")
    n_kv = req("num_key_value_heads", default=None) or n_head
    head_dim = req("head_dim", default=None) or D // n_head
    fam = hf_family(model_type)                            # families/<arch>.py
    gemma = model_type.startswith("gemma")
    act_key = "hidden_activation" if gemma and "hidden_activation" in d else "hidden_act"
    act = req(act_key, str, None) or ("gelu_pytorch_tanh" if gemma else "silu")
    # q/k/v and o biases: attention_bias where the family's attention reads it (Llama, Qwen3, Gemma,
    # OLMo 2); Qwen2 always has q/k/v biases and no o bias; Mistral and Phi-3 have none (hf_flags)
    attention_bias = req("attention_bias", bool, False) if model_type not in fam.hf_fixed_bias else False
    n_layer = req("num_hidden_layers", hi=MAX_LAYERS)
    kw = dict(
        arch=fam.arch,
        n_layer=n_layer, d_model=D, n_head=n_head, n_kv_head=n_kv, head_dim=head_dim,
        d_ff=req("intermediate_size"), ffn=_ffn_from_act(act, path, act_key),
        ffn_bias=req("mlp_bias", bool, False), attn_bias=attention_bias, attn_out_bias=attention_bias,
        norm="rmsnorm", norm_eps=req("rms_norm_eps", float, 1e-6 if gemma else 1e-5, lo=1e-30, hi=1.0),
        positions="rope", rope_pairing=fam.hf_pairing,
        rope_theta=req("rope_theta", float, None, lo=1e-30, hi=1e30) or 10000.0,
        vocab_size=req("vocab_size"), n_ctx=req("max_position_embeddings"),
        tie_embeddings=req("tie_word_embeddings", bool, gemma), name=name)
    kw.update(rope_scaling(req("rope_scaling", dict, None) or {}, path))
    kw.update(fam.hf_flags)                                # what the class hard-codes (Qwen2's q/k/v biases,
                                                           # Qwen3's per-head q/k norms, Phi-3's fused qkv_proj)
    kw.update({f: req(k, type(getattr(ModelConfig, f)), default, lo=0) for f, (k, default) in fam.hf_keys.items()})
    if fam.hf_config_extra is not None:
        kw.update(fam.hf_config_extra(d, req, n_layer, lambda msg: _fail(path, msg)))
    if model_type in MOE_TYPES:
        kw.update(moe_fields(d, req, model_type, path))    # formats/hf_moe.py
    if model_type == "phi3":
        kw["rope_dim"] = _phi3_rope_dim(d, head_dim, path)
    if gemma:
        kw.update(post_attn_norm=True, post_ffn_norm=True, embed_scale=True,
                  attn_scale=float(req("query_pre_attn_scalar", float, None, lo=1e-30, hi=1e30) or head_dim) ** -0.5,
                  final_logit_softcap=req("final_logit_softcapping", float, None, lo=0, hi=1e30) or 0.0)
    if model_type not in MOE_TYPES:                        # hf_moe refuses their windows
        kw["sliding_window"], kw["sliding_window_pattern"], kw["sliding_window_start"] = \
            _sliding(d, req, model_type, n_layer, path)
    if model_type in ("gemma3", "gemma3_text"):
        kw["qk_norm"] = True
        kw["rope_theta_local"] = req("rope_local_base_freq", float, None, lo=1e-30, hi=1e30) or 10000.0
        kw["rope_theta"] = req("rope_theta", float, None, lo=1e-30, hi=1e30) or 1_000_000.0
    if model_type == "gemma2":
        kw.update(gemma2_fields(d, req, path))             # formats/hf_families.py
    cfg = ModelConfig(**kw)
    if model_type == "gemma2":
        check_layer_types(d, cfg, path)
    return cfg


def _fail(path, msg):
    raise ConfigError(f"{path}: {msg}")


def _phi3_rope_dim(d, head_dim, path) -> int:
    """Phi-3's partial rotary: HF rotates the first int(head_dim * partial_rotary_factor) dims of each
    head (rope_parameters, or top-level in older files) -> rope_dim, 0 for all of them."""
    rp = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    f = rp.get("partial_rotary_factor", d.get("partial_rotary_factor", 1.0))
    if type(f) not in (int, float) or not 0 < f <= 1:
        raise ConfigError(f"{path}: field 'partial_rotary_factor' = {f!r:.40}: must be a number in (0, 1]")
    n = int(head_dim * f)
    if n % 2 or n == 0:
        raise ConfigError(f"{path}: field 'partial_rotary_factor' = {f!r}: rotates {n} of {head_dim} dims, "
                          f"which must be even and nonzero")
    return n if n < head_dim else 0


def _sliding(d, req, model_type, n_layer, path) -> tuple:
    """-> (sliding_window, sliding_window_pattern, sliding_window_start) as ModelConfig reads them
    (window 0: none).

    Mistral and Phi-3 slide every layer when sliding_window is set (pattern 0). Qwen2/Qwen3 use
    the window only with use_sliding_window, and only on the layers layer_types calls
    sliding_attention (by default those from max_window_layers on: start). Gemma alternates."""
    if model_type in ("qwen2", "qwen3") and not req("use_sliding_window", bool, False):
        return 0, 0, 0                       # transformers sets sliding_window to None: full attention
    window = req("sliding_window", int, None, lo=0) or 0
    if not window:
        return 0, 0, 0
    if model_type.startswith("gemma"):
        return window, _sliding_pattern(d, model_type), 0
    types = d.get("layer_types")
    if types is None and model_type in ("qwen2", "qwen3"):
        first = req("max_window_layers", int, 28, lo=0, hi=MAX_LAYERS)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n_layer)]
    if types is None:
        return window, 0, 0                  # every layer slides
    start = next((i for i, t in enumerate(types) if t != "full_attention"), len(types)) \
        if isinstance(types, list) else -1
    if start == len(types):
        return 0, 0, 0
    if start < 0 or any(t != "sliding_attention" for t in types[start:]) or \
            (start and model_type not in ("qwen2", "qwen3")):
        raise ConfigError(f"{path}: field 'layer_types' must be full layers then sliding ones (Qwen's "
                          f"max_window_layers; Mistral and Phi-3: all sliding), found {types!r:.80}")
    return window, 0, start


def _sliding_pattern(d, model_type):
    """Every Nth layer is global. Gemma 2 alternates (N=2); Gemma 3 has N=6, given either as
    sliding_window_pattern or as a layer_types list ending each period with 'full_attention'."""
    if model_type == "gemma2":
        return 2
    types = d.get("layer_types")
    if isinstance(types, list) and types:
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            return full[0] + 1
    p = d.get("sliding_window_pattern")
    if p is not None and (type(p) is not int or not 0 < p <= MAX_LAYERS):
        raise ConfigError(f"field 'sliding_window_pattern' must be a positive integer, found {p!r:.60}")
    return p or 6
