"""Every config.json field of each dense family, sorted into three lists.

A transformers config class has a few dozen fields. For ffnlab to be right it is not enough to
read the ones it knows: a field it silently ignores may change the logits (Mistral's
sliding_window did). So each family lists each field of its transformers 5 config class as
  used        read by hf_config.py into ModelConfig
  irrelevant  cannot change a forward pass's logits (a label, an output option, dropout, init), with why
  refused     changes the math in a way ffnlab does not implement: a value other than the accepted
              ones raises ConfigError naming the field (refuse_unsupported below, called by config_from_hf)
tests/engines/test_hf_fields.py enumerates the classes (LlamaConfig, ...) and holds these lists to them. A new
family adds one entry to FAMILIES. The MoE families keep their lists in hf_moe.py.
"""
from dataclasses import dataclass, field
from typing import Callable

from ..config import ConfigError

# fields every transformers 5 decoder config carries that cannot change the logits
COMMON_IRRELEVANT = {
    "_name_or_path": "a label", "architectures": "a label", "transformers_version": "a label",
    "model_type": "a label (decides the family, read first)",
    "dtype": "the storage dtype (ffnlab computes in float32)",
    "attention_dropout": "dropout, zero at inference",
    "initializer_range": "random init only",
    "use_cache": "KV cache on/off: the same logits",
    "bos_token_id": "tokenizer", "eos_token_id": "tokenizer", "pad_token_id": "tokenizer",
    "output_attentions": "an output option", "output_hidden_states": "an output option",
    "return_dict": "an output option", "chunk_size_feed_forward": "memory chunking, same math",
    "is_encoder_decoder": "false for these decoders", "id2label": "classification heads only",
    "label2id": "classification heads only", "problem_type": "classification heads only",
}

# fields hf_config.py's _decoder reads for every RMSNorm/RoPE decoder
COMMON_USED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "hidden_act", "rms_norm_eps", "rope_parameters", "vocab_size",
               "max_position_embeddings", "tie_word_embeddings")


@dataclass(frozen=True)
class Refuse:
    """A field whose other values change the math in a way ffnlab does not implement."""
    ok: Callable                    # value -> True when ffnlab computes it exactly
    bad: object                     # a value that must be refused (the test sets it)
    why: str                        # the end of the error line


def _partial_rotary_ok(v):
    return v is None or v == 1


_PARTIAL_ROTARY = Refuse(_partial_rotary_ok, 0.5, "rotary on part of each head is not implemented for this family")


@dataclass(frozen=True)
class Family:
    config_class: str                               # transformers class the lists are held to
    used: tuple
    irrelevant: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)     # field -> Refuse; rope_parameters' keys are looked up too


FAMILIES = {
    "llama": Family("LlamaConfig", COMMON_USED + ("head_dim", "attention_bias", "mlp_bias"),
                    {"pretraining_tp": "tensor-parallel rank of the original training; transformers 5 never reads it"},
                    {"partial_rotary_factor": _PARTIAL_ROTARY}),
    "mistral": Family("MistralConfig", COMMON_USED + ("head_dim", "sliding_window"), {},
                      {"partial_rotary_factor": _PARTIAL_ROTARY}),
    "qwen2": Family("Qwen2Config", COMMON_USED + ("use_sliding_window", "sliding_window", "max_window_layers",
                                                  "layer_types"), {}, {"partial_rotary_factor": _PARTIAL_ROTARY}),
    "qwen3": Family("Qwen3Config", COMMON_USED + ("head_dim", "attention_bias", "use_sliding_window",
                                                  "sliding_window", "max_window_layers", "layer_types"), {},
                    {"partial_rotary_factor": _PARTIAL_ROTARY}),
    # Phi-3's partial_rotary_factor (in rope_parameters) rotates the first head_dim * factor dims
    "phi3": Family("Phi3Config", COMMON_USED + ("sliding_window", "partial_rotary_factor"),
                   {"resid_pdrop": "dropout, zero at inference", "embd_pdrop": "dropout, zero at inference",
                    "original_max_position_embeddings": "read by longrope scaling only, which is refused"}),
    # Gemma 2, GPT-NeoX, OLMo 2: read in formats/hf_families.py
    "gemma2": Family("Gemma2Config", tuple(f for f in COMMON_USED if f != "hidden_act") + (
                         "hidden_activation", "head_dim", "attention_bias", "query_pre_attn_scalar", "sliding_window",
                         "layer_types", "final_logit_softcapping", "attn_logit_softcapping"), {},
                     {"use_bidirectional_attention": Refuse(lambda v: not v, True, "ffnlab's attention is causal")}),
    "gpt_neox": Family("GPTNeoXConfig", (
                           "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
                           "layer_norm_eps", "rope_parameters", "vocab_size", "max_position_embeddings",
                           "tie_word_embeddings", "use_parallel_residual", "attention_bias"),
                       {"hidden_dropout": "dropout, zero at inference",
                        "classifier_dropout": "the sequence-classification head only",
                        "is_decoder": "GPTNeoXAttention is causal whatever it says (is_causal = True)"}),
    "olmo2": Family("Olmo2Config", COMMON_USED + ("attention_bias",)),
}


def refuse_unsupported(d, model_type, path):
    """Raise ConfigError naming the first refused field of `model_type` whose value ffnlab does not
    compute (top-level, or inside rope_parameters / rope_scaling)."""
    fam = FAMILIES.get(model_type)
    if fam is None:
        return
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    scaling = d.get("rope_scaling") if isinstance(d.get("rope_scaling"), dict) else {}
    for name, r in fam.refused.items():
        for where, src in (("", d), ("rope_parameters.", rope), ("rope_scaling.", scaling)):
            if name in src and not r.ok(src[name]):
                raise ConfigError(f"{path}: field '{where}{name}' = {src[name]!r:.60}: {r.why}")


def family_fields(model_type) -> set:
    """Every field a family's lists name (the test compares it with the config class)."""
    fam = FAMILIES[model_type]
    return set(fam.used) | set(COMMON_IRRELEVANT) | set(fam.irrelevant) | set(fam.refused)
