"""Qwen3: Llama's block with an RMSNorm over each query/key head before RoPE (q_norm, k_norm); NEOX."""
from .hf_common import COMMON_USED, HF_BASE, PARTIAL_ROTARY, SWIGLU
from .llama import LLAMA_SHAPED
from .record import Family, HFFields

FAMILY = Family(
    arch="qwen3", hf_types=("qwen3",), gguf_window=True,
    gguf_target=(dict(SWIGLU, attn_bias=False, fused_qkv=False, qk_norm=True, qk_norm_full=False,
                      rope_pairing="neox"), ("sliding_window",)),
    llama_cpp_ignores_window=True,
    hf_flags=dict(qk_norm=True), hf_tensors=LLAMA_SHAPED,
    hf_fields={"qwen3": HFFields("Qwen3Config", COMMON_USED + ("head_dim", "attention_bias", "use_sliding_window",
                                                               "sliding_window", "max_window_layers", "layer_types"),
                                 {}, {"partial_rotary_factor": PARTIAL_ROTARY})},
    hf_llama_shaped=True,
    hf_export={"qwen3": ("Qwen3ForCausalLM", dict(HF_BASE, fused_qkv=False, qk_norm=True, qk_norm_full=False,
                                                  ffn="swiglu"), ("sliding_window", "sliding_window_start"))},
    hf_hooks="llama")
