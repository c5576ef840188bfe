"""Llama (and Mistral, and Mixtral's attention): RMSNorm, RoPE, a SwiGLU MLP.

llama.cpp's converter permutes the Q/K rows of its llama architecture so that ggml's adjacent-pair
RoPE equals HF's rotate_half: a GGUF llama rotates "normal" pairs, an HF directory "neox" ones.
Mistral slides every layer (sliding_window), which llama.cpp's llama graph does not apply."""
from .hf_common import COMMON_USED, HF_BASE, LLAMA_BLOCK, LLAMA_TOP, PARTIAL_ROTARY, SWIGLU
from .record import Family, Graph, HFFields, HFTensors

# Phi-3's fused matrices are read by every Llama-shaped directory (formats/hf.py splits gate_up)
GATE_UP = "ffn_gate_up"     # Phi-3's [2*d_ff, hidden] gate_up_proj, split at load into ffn_gate, ffn_up
LLAMA_SHAPED = HFTensors(top=LLAMA_TOP, block={**LLAMA_BLOCK, "self_attn.qkv_proj": "attn_qkv",
                                                "mlp.gate_up_proj": GATE_UP}, moe_names=True)

FAMILY = Family(
    arch="llama", hf_types=("llama", "mistral", "mixtral"), gguf_pairing="normal", gguf_qk_permuted=True, gguf_window=True,
    hf_pairing="normal", hf_fixed_bias=("mistral",),
    gguf_target=(dict(SWIGLU, attn_bias=False, fused_qkv=False), ("sliding_window", "rope_freq_factors",
                                                                  "rope_scale")),
    llama_cpp_ignores_window=True,
    hf_tensors=LLAMA_SHAPED,
    hf_fields={
        "llama": HFFields("LlamaConfig", COMMON_USED + ("head_dim", "attention_bias", "mlp_bias"),
                          {"pretraining_tp": "tensor-parallel rank of the original training; transformers 5 never "
                                             "reads it"},
                          {"partial_rotary_factor": PARTIAL_ROTARY}),
        "mistral": HFFields("MistralConfig", COMMON_USED + ("head_dim", "sliding_window"), {},
                            {"partial_rotary_factor": PARTIAL_ROTARY}),
    },
    hf_llama_shaped=True,
    hf_export={"llama": ("LlamaForCausalLM", dict(HF_BASE, fused_qkv=False), ("rope_freq_factors",)),
               "mistral": ("MistralForCausalLM", dict(HF_BASE, attn_bias=False, attn_out_bias=False, fused_qkv=False,
                                                      ffn="swiglu"), ("sliding_window",))},
    graph=Graph(attn_out_named=True))
