"""OLMo 2: no pre norms (the sub-layers read the residual stream as it is), post-attention and
post-feedforward RMSNorms, q/k RMSNorm over the whole projection before the heads split, SwiGLU."""
from .hf_common import COMMON_USED, LLAMA_ATTN_MLP, LLAMA_TOP
from .record import Family, Graph, HFFields, HFTensors

FAMILY = Family(
    arch="olmo2", hf_types=("olmo2",),
    gguf_flags=dict(pre_norm=False, qk_norm_full=True),
    hf_flags=dict(pre_norm=False, post_attn_norm=True, post_ffn_norm=True, qk_norm=True, qk_norm_full=True),
    hf_tensors=HFTensors(top=LLAMA_TOP, block={
        **LLAMA_ATTN_MLP, "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
        "post_attention_layernorm": "post_attention_norm", "post_feedforward_layernorm": "post_ffw_norm"}),
    hf_fields={"olmo2": HFFields("Olmo2Config", COMMON_USED + ("attention_bias",))},
    hf_export={"olmo2": ("Olmo2ForCausalLM", dict(
        norm="rmsnorm", ffn="swiglu", ffn_bias=False, fused_qkv=False, pre_norm=False, post_attn_norm=True,
        post_ffn_norm=True, qk_norm=True, qk_norm_full=True, parallel_residual=False, rope_dim=0,
        embed_scale=False, attn_scale=0.0, attn_softcap=0.0, final_logit_softcap=0.0, sliding_window=0,
        rope_freq_factors=(), rope_pairing="neox"), ())},
    graph=Graph(bare_ffn_post_norm=True))
