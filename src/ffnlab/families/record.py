"""What a family is: one record of what is true of it in every format.

A family module (families/<name>.py) fills one Family; families/__init__.py registers it. The
readers (formats/gguf_meta.py, hf_config.py, hf.py), the exporters (export_gguf.py, export_hf*.py),
the block's node names (model/block.py, attention.py) and the tracers (tracing/hf.py, llamacpp.py)
look the family up and read its fields; none of them names an architecture. Pure data and small
functions: this module imports nothing of ffnlab, so every layer may consult it.
"""
from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Refuse:
    """A config.json field whose other values change the math in a way ffnlab does not implement."""
    ok: Callable                    # value -> True when ffnlab computes it exactly
    bad: object                     # a value that must be refused (tests/engines/test_hf_fields.py sets it)
    why: str                        # the end of the error line


@dataclass(frozen=True)
class HFFields:
    """Every field of a transformers config class, sorted: used (read into ModelConfig), irrelevant
    (cannot change the logits, with why), refused (other values raise ConfigError naming the field)."""
    config_class: str                               # transformers class the lists are held to
    used: tuple
    irrelevant: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)     # field -> Refuse; rope_parameters' keys are looked up too


@dataclass(frozen=True)
class Graph:
    """How llama.cpp's graph for the family names its nodes (names only: the math reads config flags)."""
    sa_out: bool = False              # the first residual sum is sa_out (Gemma), ffn_inp elsewhere
    bare_ffn_post_norm: bool = False  # cb(ffn_post_norm, -1): the post-FFN norm has no layer suffix
    fused_gate_up: bool = False       # one ffn_up product [.., 2*d_ff] that SWIGLU splits (Phi-3)
    q_scaled: str = ""                # the graph multiplies q by the attention scale after RoPE, naming it so
    unnamed: tuple = ()               # ffnlab node names (without -il) the graph leaves as node_N
    attn_out_named: bool = False      # the attention output projection is named attn_out (llama's graph)
    residual_scaled: tuple = ("residual_scaled_attn", "residual_scaled_ffn")   # the residual multiplier's
                                      # SCALE nodes (attention output, FFN output)


@dataclass(frozen=True)
class HFTensors:
    """HF tensor names -> GGUF names: top-level tensors whole, block tensors relative to the layer."""
    top: dict                         # {HF name: GGUF name}
    block: dict                       # {HF module path in the layer: GGUF tensor base}
    layers: str = r"model\.layers"    # regex of the layer list's prefix
    prefix: str = ""                  # stripped from every name first (GPT-2's "transformer.")
    conv1d: bool = False              # matrices stored [in, out] (GPT-2's Conv1D), transposed on the way in
    moe_names: bool = False           # routers, shared experts and q/k norms by formats/hf_moe.py's names


@dataclass(frozen=True)
class Family:
    arch: str                         # GGUF general.architecture and ModelConfig.arch
    runnable: bool = True             # False: sizing only (bert)
    hf_types: tuple = ()              # transformers model_types read as this family
    # --- GGUF -> config (formats/gguf_meta.py) -----------------------------------------------------
    activation: str = "silu"          # the activation llama.cpp's graph hard-codes
    dense_ffn: bool = False           # up -> act -> down, no gate
    layernorm: bool = False           # LayerNorm with bias (eps key attention.layer_norm_epsilon)
    gguf_pairing: str = "neox"        # the RoPE pairing of the file's Q/K rows
    gguf_qk_permuted: bool = False    # llama.cpp's converter permuted Q/K rows from HF's rotate_half order
    gguf_flags: dict = field(default_factory=dict)     # config fields the graph implies, set on read
    gguf_window: bool = False         # attention.sliding_window slides every layer (Mistral, Phi-3)
    gguf_keys: dict = field(default_factory=dict)      # {config field: (key after "{arch}.", default)}
                                                       # read and written; default ... : required
    # --- config -> GGUF (formats/export_gguf.py) ---------------------------------------------------
    gguf_target: tuple = ()           # (flags the graph computes, features beyond plain Llama it reads):
                                      # a Llama-shaped llama.cpp graph ffnlab exports to; () if none
    llama_cpp_ignores_window: bool = False   # its graph attends to every position whatever the file says
    # --- HF -> config (formats/hf_config.py, hf.py) ------------------------------------------------
    hf_flags: dict = field(default_factory=dict)       # config fields the HF class hard-codes
    hf_fixed_bias: tuple = ()         # model_types whose class fixes the attention biases (config.json's
                                      # attention_bias is not read; hf_flags says what they are)
    hf_pairing: str = "neox"          # the pairing config_from_hf reports (formats/hf.py loads rotate_half rows)
    hf_keys: dict = field(default_factory=dict)        # {config field: (config.json field, default)}
    hf_config_extra: Callable | None = None            # (d, req, n_layer, path) -> {config field: value}
    hf_tensors: HFTensors | None = None
    hf_fields: dict = field(default_factory=dict)      # {model_type: HFFields}
    # --- config -> HF (formats/export_hf*.py) ------------------------------------------------------
    hf_export: dict = field(default_factory=dict)      # {model_type: (transformers class, flags the class
                                                       # computes, features beyond plain Llama it allows)}
    hf_llama_shaped: bool = False     # its class is Llama's block and flags (formats/export_hf_llama.py)
    hf_export_extra: Callable | None = None            # cfg -> {config.json field: value} (Llama-shaped)
    # --- the block's and the tracers' names -------------------------------------------------------
    graph: Graph = Graph()
    hf_hooks: str = "llama"           # tracing/hf.py's hook set: llama | gpt2 | neox | "" (none)
