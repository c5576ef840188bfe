"""Phi-3: one fused qkv_proj and one gate_up_proj [gate; up] (llama.cpp keeps both fused: attn_qkv,
and ffn_up of 2*d_ff rows that its SWIGLU splits); partial rotary (partial_rotary_factor); every
layer slides (sliding_window), which llama.cpp's phi3 graph does not apply. Its graph scales q
after RoPE and names the product Qcur again, and leaves its first residual sum unnamed."""
from .hf_common import COMMON_USED, HF_BASE, SWIGLU
from .llama import LLAMA_SHAPED
from .record import Family, Graph, HFFields

FAMILY = Family(
    arch="phi3", hf_types=("phi3",), gguf_window=True,
    gguf_target=(dict(SWIGLU, attn_bias=False, fused_qkv=True, rope_pairing="neox"), ("sliding_window", "rope_dim")),
    llama_cpp_ignores_window=True,
    hf_flags=dict(fused_qkv=True, attn_bias=False, attn_out_bias=False), hf_fixed_bias=("phi3",),
    hf_tensors=LLAMA_SHAPED,
    # Phi-3's partial_rotary_factor (in rope_parameters) rotates the first head_dim * factor dims
    hf_fields={"phi3": HFFields("Phi3Config", COMMON_USED + ("sliding_window", "partial_rotary_factor"),
                                {"resid_pdrop": "dropout, zero at inference", "embd_pdrop": "dropout, zero at inference",
                                 "original_max_position_embeddings": "read by longrope scaling only, which is "
                                                                     "refused"})},
    hf_llama_shaped=True,
    hf_export={"phi3": ("Phi3ForCausalLM", dict(HF_BASE, attn_bias=False, attn_out_bias=False, fused_qkv=True,
                                                ffn="swiglu", rope_pairing="neox"), ("sliding_window", "rope_dim"))},
    graph=Graph(fused_gate_up=True, q_scaled="Qcur", unnamed=("ffn_inp",)))
