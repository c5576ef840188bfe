"""Named starting points for `ffnlab train` (gpt-fast style): a preset is a dict of ModelConfig
fields; command-line flags override single fields. Both are small enough to train on a laptop
CPU in minutes and both export to GGUF (llama.cpp) and HF (transformers).
"""
from ..config import ModelConfig
from ..errors import UsageError

PRESETS = {
    # GPT-2 block: LayerNorm, learned positions, fused qkv, biases everywhere, dense GELU-tanh MLP 4x
    "tiny-gpt2": dict(arch="gpt2", n_layer=4, d_model=128, n_head=4, d_ff=512, ffn="gelu_tanh",
                      ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=True,
                      norm="layernorm", positions="learned", n_ctx=256, tie_embeddings=True),
    # Llama block: RMSNorm, RoPE, grouped-query attention, no biases, SwiGLU MLP at 8/3 width
    "tiny-llama": dict(arch="llama", n_layer=4, d_model=128, n_head=4, n_kv_head=2, d_ff=344, ffn="swiglu",
                       norm="rmsnorm", positions="rope", rope_pairing="normal", rope_theta=10000.0,
                       n_ctx=256, tie_embeddings=False),
}


def default_d_ff(d_model: int, ffn: str, mult: float = 4.0, multiple_of: int = 8) -> int:
    """Dense MLPs: mult * d_model. Gated MLPs have a third matrix, so at equal parameters they
    get 2/3 of that width (4x dense -> 8/3 gated, Shazeer 2020), rounded up to multiple_of
    (Llama rounds to 256 for fast kernels; 1 keeps the parameter match exact)."""
    if ffn in ("swiglu", "geglu", "moe"):             # moe: each expert is a SwiGLU MLP
        return int(-(-round(mult * d_model * 2 / 3) // multiple_of) * multiple_of)
    return int(round(mult * d_model))


def build_config(preset: str, vocab_size: int, **overrides) -> ModelConfig:
    """preset name + non-None overrides -> ModelConfig. A changed d_model or ffn re-derives
    d_ff unless d_ff is given too."""
    if preset not in PRESETS:
        raise UsageError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    fields = dict(PRESETS[preset])
    given = {k: v for k, v in overrides.items() if v is not None}
    fields.update(given)
    if "d_ff" not in given and ("d_model" in given or "ffn" in given):
        fields["d_ff"] = default_d_ff(fields["d_model"], fields["ffn"])
    if "n_head" in given and "n_kv_head" not in given:
        fields["n_kv_head"] = 0        # multi-head unless asked otherwise
    fields["vocab_size"] = vocab_size
    if fields.get("ffn") == "moe":
        fields.setdefault("n_expert", 4)
        fields.setdefault("n_expert_used", min(2, fields["n_expert"]))
        fields.setdefault("expert_norm", fields["n_expert_used"] > 1)   # Mixtral renormalises; Switch (k=1) not
    return ModelConfig(**fields)
