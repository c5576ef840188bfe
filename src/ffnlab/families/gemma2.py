"""Gemma 2: pre and post norms around both sub-layers, GeGLU, token embeddings scaled by
sqrt(d_model), attention-score and logit soft-caps, alternating sliding windows, q scaled after RoPE
by query_pre_attn_scalar^-0.5 (llama.cpp reads no query_pre_attn_scalar: 1/sqrt(head_dim)).
HF's RMSNorm computes x_hat * (1 + w): the 1 is added on the way in (formats/hf_families.py)."""
from .hf_common import COMMON_USED, LLAMA_ATTN_MLP, LLAMA_TOP
from .record import Family, Graph, HFFields, HFTensors, Refuse

GEMMA_BLOCK = {**LLAMA_ATTN_MLP, "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
               "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}

FAMILY = Family(
    arch="gemma2", hf_types=("gemma2",), activation="gelu_tanh",
    hf_tensors=HFTensors(top=LLAMA_TOP, block=GEMMA_BLOCK),
    hf_fields={"gemma2": HFFields(
        "Gemma2Config", tuple(f for f in COMMON_USED if f != "hidden_act") + (
            "hidden_activation", "head_dim", "attention_bias", "query_pre_attn_scalar", "sliding_window",
            "layer_types", "final_logit_softcapping", "attn_logit_softcapping"), {},
        {"use_bidirectional_attention": Refuse(lambda v: not v, True, "ffnlab's attention is causal")})},
    hf_export={"gemma2": ("Gemma2ForCausalLM", dict(
        norm="rmsnorm", ffn="geglu", ffn_bias=False, fused_qkv=False, pre_norm=True, post_attn_norm=True,
        post_ffn_norm=True, qk_norm=False, parallel_residual=False, rope_dim=0, embed_scale=True,
        rope_theta_local=0.0, rope_freq_factors=(), rope_pairing="neox"), ())},
    graph=Graph(sa_out=True, bare_ffn_post_norm=True, q_scaled="Qcur_scaled"))
