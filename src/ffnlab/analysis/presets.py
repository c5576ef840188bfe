"""Named presets: the published config.json of well-known models, addressable by HF repo id or alias.

Each preset stores the fields of the model's config.json on the Hugging Face Hub exactly as
published (only the fields that size the model), and goes through the same reader as a real
config.json (formats/hf_config.py). `source` is the file the values were copied from.

    preset_config("llama3-8b")                   -> (ModelConfig, Preset)
    preset_config("meta-llama/Meta-Llama-3-8B")  -> the same
"""
import difflib
from dataclasses import dataclass

from ..config import ModelConfig
from ..errors import UsageError
from ..formats.hf_config import config_from_hf


@dataclass(frozen=True)
class Preset:
    alias: str          # short name, e.g. "llama3-8b"
    repo: str           # HF repo id, e.g. "meta-llama/Meta-Llama-3-8B"
    hf: dict            # config.json fields, as published
    note: str = ""      # what the row is for, when not obvious

    @property
    def source(self) -> str:
        return f"https://huggingface.co/{self.repo}/blob/main/config.json"


def _gpt2(n_embd, n_layer, n_head):
    return {"model_type": "gpt2", "n_embd": n_embd, "n_layer": n_layer, "n_head": n_head, "n_inner": None,
            "n_positions": 1024, "vocab_size": 50257, "activation_function": "gelu_new",
            "layer_norm_epsilon": 1e-5}


def _llama(hidden, inter, heads, kv, layers, ctx, vocab, theta=10000.0, eps=1e-5, tie=False, **extra):
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": inter,
            "num_attention_heads": heads, "num_key_value_heads": kv, "num_hidden_layers": layers,
            "max_position_embeddings": ctx, "vocab_size": vocab, "rope_theta": theta, "rms_norm_eps": eps,
            "hidden_act": "silu", "tie_word_embeddings": tie, **extra}


def _gemma2(hidden, inter, heads, kv, layers):
    """Google's Gemma 2 config.json: head_dim 256, query_pre_attn_scalar 256, window 4096, soft-caps 50 / 30."""
    return {"model_type": "gemma2", "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": 256, "num_hidden_layers": layers, "max_position_embeddings": 8192,
            "vocab_size": 256000, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "query_pre_attn_scalar": 256,
            "sliding_window": 4096, "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}


def _pythia(hidden, layers, heads, vocab=50304):
    """EleutherAI's Pythia config.json (transformers 4 names: rotary_pct, rotary_emb_base)."""
    return {"model_type": "gpt_neox", "hidden_size": hidden, "intermediate_size": 4 * hidden,
            "num_attention_heads": heads, "num_hidden_layers": layers, "max_position_embeddings": 2048,
            "vocab_size": vocab, "rotary_pct": 0.25, "rotary_emb_base": 10000, "use_parallel_residual": True,
            "hidden_act": "gelu", "layer_norm_eps": 1e-5, "tie_word_embeddings": False}


_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
_LLAMA32_ROPE = {**_LLAMA3_ROPE, "factor": 32.0}                 # Llama 3.2 1B/3B stretch 8k to 128k


def _qwen3(hidden, inter, heads, kv, layers, tie):
    """Qwen3's config.json: head_dim 128 whatever the width, per-head q/k norms, no sliding window."""
    return {**_llama(hidden, inter, heads, kv, layers, 40960, 151936, 1000000.0, 1e-6, tie=tie),
            "model_type": "qwen3", "head_dim": 128, "attention_bias": False, "use_sliding_window": False,
            "sliding_window": None, "max_window_layers": layers}

PRESETS = [
    Preset("gpt2", "openai-community/gpt2", _gpt2(768, 12, 12)),
    Preset("gpt2-medium", "openai-community/gpt2-medium", _gpt2(1024, 24, 16)),
    Preset("gpt2-large", "openai-community/gpt2-large", _gpt2(1280, 36, 20)),
    Preset("gpt2-xl", "openai-community/gpt2-xl", _gpt2(1600, 48, 25)),
    Preset("bert-base", "google-bert/bert-base-uncased",
           {"model_type": "bert", "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
            "num_hidden_layers": 12, "max_position_embeddings": 512, "type_vocab_size": 2,
            "vocab_size": 30522, "hidden_act": "gelu", "layer_norm_eps": 1e-12},
           "encoder (post-norm), for comparison; counts include the pooler and token-type table"),
    Preset("llama2-7b", "meta-llama/Llama-2-7b-hf", _llama(4096, 11008, 32, 32, 32, 4096, 32000)),
    Preset("llama2-13b", "meta-llama/Llama-2-13b-hf", _llama(5120, 13824, 40, 40, 40, 4096, 32000)),
    Preset("llama2-70b", "meta-llama/Llama-2-70b-hf", _llama(8192, 28672, 64, 8, 80, 4096, 32000)),
    Preset("llama3-8b", "meta-llama/Meta-Llama-3-8B", _llama(4096, 14336, 32, 8, 32, 8192, 128256, 500000.0)),
    Preset("llama3-70b", "meta-llama/Meta-Llama-3-70B", _llama(8192, 28672, 64, 8, 80, 8192, 128256, 500000.0)),
    Preset("llama3.1-8b", "meta-llama/Llama-3.1-8B",
           _llama(4096, 14336, 32, 8, 32, 131072, 128256, 500000.0, rope_scaling=_LLAMA3_ROPE)),
    Preset("llama3.2-1b", "meta-llama/Llama-3.2-1B",
           _llama(2048, 8192, 32, 8, 16, 131072, 128256, 500000.0, tie=True, head_dim=64, rope_scaling=_LLAMA32_ROPE)),
    Preset("llama3.2-3b", "meta-llama/Llama-3.2-3B",
           _llama(3072, 8192, 24, 8, 28, 131072, 128256, 500000.0, tie=True, head_dim=128,
                  rope_scaling=_LLAMA32_ROPE)),
    Preset("llama3.1-405b", "meta-llama/Llama-3.1-405B",
           _llama(16384, 53248, 128, 8, 126, 131072, 128256, 500000.0, rope_scaling=_LLAMA3_ROPE)),
    Preset("mistral-7b", "mistralai/Mistral-7B-v0.1",
           {**_llama(4096, 14336, 32, 8, 32, 32768, 32000), "model_type": "mistral", "sliding_window": 4096}),
    Preset("mistral-7b-v0.3", "mistralai/Mistral-7B-v0.3",
           {**_llama(4096, 14336, 32, 8, 32, 32768, 32768, 1000000.0), "model_type": "mistral", "head_dim": 128,
            "sliding_window": None}),
    Preset("qwen3-0.6b", "Qwen/Qwen3-0.6B", _qwen3(1024, 3072, 16, 8, 28, tie=True)),
    Preset("qwen3-8b", "Qwen/Qwen3-8B", _qwen3(4096, 12288, 32, 8, 36, tie=False)),
    Preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B",
           {**_llama(896, 4864, 14, 2, 24, 32768, 151936, 1000000.0, 1e-6, tie=True), "model_type": "qwen2"}),
    Preset("qwen2.5-7b", "Qwen/Qwen2.5-7B",
           {**_llama(3584, 18944, 28, 4, 28, 131072, 152064, 1000000.0, 1e-6), "model_type": "qwen2"}),
    Preset("gemma2-2b", "google/gemma-2-2b", _gemma2(2304, 9216, 8, 4, 26)),
    Preset("gemma2-9b", "google/gemma-2-9b", _gemma2(3584, 14336, 16, 8, 42)),
    Preset("gemma3-270m", "google/gemma-3-270m",
           {"model_type": "gemma3_text", "hidden_size": 640, "intermediate_size": 2048, "num_attention_heads": 4,
            "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 18, "max_position_embeddings": 32768,
            "vocab_size": 262144, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
            "query_pre_attn_scalar": 256, "sliding_window": 512, "sliding_window_pattern": 6,
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True}),
    Preset("smollm2-135m", "HuggingFaceTB/SmolLM2-135M",
           _llama(576, 1536, 9, 3, 30, 8192, 49152, 100000.0, tie=True)),
    Preset("smollm2-360m", "HuggingFaceTB/SmolLM2-360M",
           _llama(960, 2560, 15, 5, 32, 8192, 49152, 100000.0, tie=True)),
    Preset("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B",
           _llama(2048, 8192, 32, 32, 24, 8192, 49152, 130000.0, tie=True)),
    Preset("tinyllama-1.1b", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", _llama(2048, 5632, 32, 4, 22, 2048, 32000)),
    Preset("phi3-mini-4k", "microsoft/Phi-3-mini-4k-instruct",
           {**_llama(3072, 8192, 32, 32, 32, 4096, 32064), "model_type": "phi3", "sliding_window": 2047}),
    Preset("pythia-70m", "EleutherAI/pythia-70m", _pythia(512, 6, 8)),
    Preset("pythia-160m", "EleutherAI/pythia-160m", _pythia(768, 12, 12)),
    Preset("pythia-410m", "EleutherAI/pythia-410m", _pythia(1024, 24, 16)),
    Preset("pythia-1b", "EleutherAI/pythia-1b", _pythia(2048, 16, 8)),
    Preset("pythia-1.4b", "EleutherAI/pythia-1.4b", _pythia(2048, 24, 16)),
    Preset("pythia-2.8b", "EleutherAI/pythia-2.8b", _pythia(2560, 32, 32)),
    Preset("pythia-6.9b", "EleutherAI/pythia-6.9b", _pythia(4096, 32, 32, 50432)),
    Preset("pythia-12b", "EleutherAI/pythia-12b", _pythia(5120, 36, 40, 50688)),
    Preset("olmo2-7b", "allenai/OLMo-2-1124-7B",
           {**_llama(4096, 11008, 32, 32, 32, 4096, 100352, 500000.0, 1e-6), "model_type": "olmo2",
            "attention_bias": False}),
    # mixtures of experts: total / active parameters 46,702,792,704 / 12,879,925,248 (Mixtral),
    # 30,532,122,624 / 3,353,032,704 (Qwen3), 6,919,161,856 / 1,282,017,280 (OLMoE)
    Preset("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1",
           {**_llama(4096, 14336, 32, 8, 32, 32768, 32000, 1000000.0), "model_type": "mixtral",
            "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None, "router_aux_loss_coef": 0.02},
           "mixture of experts: 8 SwiGLU experts per layer, 2 per token"),
    Preset("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B",
           {**_llama(2048, 6144, 32, 4, 48, 40960, 151936, 1000000.0, 1e-6), "model_type": "qwen3_moe",
            "head_dim": 128, "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
            "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 48},
           "mixture of experts: 128 experts per layer, 8 per token"),
    Preset("olmoe-1b-7b", "allenai/OLMoE-1B-7B-0924",
           {**_llama(2048, 1024, 16, 16, 16, 4096, 50304), "model_type": "olmoe", "num_experts": 64,
            "num_experts_per_tok": 8, "norm_topk_prob": False, "clip_qkv": None, "attention_bias": False},
           "mixture of experts: 64 experts per layer, 8 per token"),
]

# short names every sizing command takes (shapes, inspect, analyze, compare); `smollm2` and
# `gemma3` are also the installed models' names (formats/installed.py), which those commands
# prefer when the package is installed: the same model, read from its real file
SHORT_NAMES = {"llama": "llama2-7b", "smollm2": "smollm2-135m", "gemma3": "gemma3-270m"}

_BY_NAME = {}
for _p in PRESETS:
    _BY_NAME[_p.alias.lower()] = _p
    _BY_NAME[_p.repo.lower()] = _p


def preset_names() -> list[str]:
    return list(SHORT_NAMES) + [p.alias for p in PRESETS] + [p.repo for p in PRESETS]


def find_preset(name: str) -> Preset | None:
    """Look a preset up by alias or repo id (case-insensitive); None if there is none."""
    key = name.strip().lower()
    return _BY_NAME.get(SHORT_NAMES.get(key, key))


def get_preset(name: str) -> Preset:
    """Like find_preset, but an unknown name raises UsageError with the closest names."""
    p = find_preset(name)
    if p is None:
        lower = {n.lower(): n for n in preset_names()}
        close = difflib.get_close_matches(name.lower(), list(lower), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(lower[c] for c in close)}?" if close else ""
        from ..formats.installed import looks_like_hub_id
        hub = (" -- a Hugging Face hub id that is not a preset: ffnlab does not download models"
               if looks_like_hub_id(name) else "")
        raise UsageError(f"unknown preset or file {name!r}{hint}{hub} (ffnlab compare --list shows all presets, "
                         f"ffnlab models the installed models)")
    return p


def preset_config(name: str) -> tuple[ModelConfig, Preset]:
    p = get_preset(name)
    return config_from_hf(p.hf, p.source, name=p.repo), p
