"""Qwen2: Llama's block with q/k/v biases (always, no config flag) and no o bias; RoPE NEOX.
Sliding windows only with use_sliding_window, on the layers from max_window_layers on."""
from .hf_common import COMMON_USED, HF_BASE, PARTIAL_ROTARY, SWIGLU
from .llama import LLAMA_SHAPED
from .record import Family, HFFields

FAMILY = Family(
    arch="qwen2", hf_types=("qwen2",),
    gguf_target=(dict(SWIGLU, attn_bias=True, fused_qkv=False, rope_pairing="neox"), ()),
    hf_flags=dict(attn_bias=True, attn_out_bias=False), hf_fixed_bias=("qwen2",), hf_tensors=LLAMA_SHAPED,
    hf_fields={"qwen2": HFFields("Qwen2Config", COMMON_USED + ("use_sliding_window", "sliding_window",
                                                               "max_window_layers", "layer_types"), {},
                                 {"partial_rotary_factor": PARTIAL_ROTARY})},
    hf_llama_shaped=True,
    hf_export={"qwen2": ("Qwen2ForCausalLM", dict(HF_BASE, attn_bias=True, attn_out_bias=False, fused_qkv=False,
                                                  ffn="swiglu"), ("sliding_window", "sliding_window_start"))})
