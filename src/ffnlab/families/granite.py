"""Granite (IBM Granite 3.x dense): Llama's block with four multipliers, flags the block reads.

  x   = embedding_multiplier * embd                           (llama.cpp: embedding_scale)
  h   = x + residual_multiplier * attn(attn_norm(x))          (residual_scale)
  out = h + residual_multiplier * ffn(ffn_norm(h))
  scores scaled by attention_multiplier, not 1/sqrt(head_dim) (attention.scale; ModelConfig.attn_scale)
  logits = lm_head(norm(out)) / logits_scaling                (logit_scale)
transformers' GraniteConfig always carries all four (defaults 1.0); llama.cpp's granite graph reads
logit_scale (required) and the other three when present, 0 meaning none. Tensors and Q/K rows are
Llama's: the converter permutes Q/K as for llama, so a GGUF rotates adjacent pairs."""
from .hf_common import COMMON_USED, HF_BASE, PARTIAL_ROTARY, SWIGLU
from .llama import LLAMA_SHAPED
from .record import Family, Graph, HFFields

_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attn_scale", "logits_scaling")


def _hf_export(cfg) -> dict:
    """The four multipliers as GraniteConfig names them (an unset one is 1.0 there, 0 here)."""
    return {"embedding_multiplier": cfg.embedding_multiplier or 1.0, "residual_multiplier": cfg.residual_multiplier
            or 1.0, "attention_multiplier": cfg.scale, "logits_scaling": cfg.logits_scaling or 1.0,
            "attention_bias": cfg.attn_bias, "mlp_bias": cfg.ffn_bias}


FAMILY = Family(
    arch="granite", hf_types=("granite",), gguf_pairing="normal", gguf_qk_permuted=True,
    gguf_keys={"embedding_multiplier": ("embedding_scale", 0.0), "residual_multiplier": ("residual_scale", 0.0),
               "attn_scale": ("attention.scale", 0.0), "logits_scaling": ("logit_scale", ...)},
    gguf_target=(dict(SWIGLU, attn_bias=False, fused_qkv=False), _MULTIPLIERS),
    hf_keys={"embedding_multiplier": ("embedding_multiplier", 1.0), "residual_multiplier": ("residual_multiplier", 1.0),
             "attn_scale": ("attention_multiplier", 1.0), "logits_scaling": ("logits_scaling", 1.0)},
    hf_tensors=LLAMA_SHAPED,
    hf_fields={"granite": HFFields("GraniteConfig", COMMON_USED + (
        "attention_bias", "mlp_bias", "embedding_multiplier", "residual_multiplier", "attention_multiplier",
        "logits_scaling"), {}, {"partial_rotary_factor": PARTIAL_ROTARY})},
    hf_llama_shaped=True,
    hf_export={"granite": ("GraniteForCausalLM", dict(HF_BASE, fused_qkv=False, ffn="swiglu"), _MULTIPLIERS)},
    hf_export_extra=_hf_export,
    # llama.cpp's granite graph leaves the residual multiplier's products unnamed
    graph=Graph(attn_out_named=True, unnamed=("residual_scaled_attn", "residual_scaled_ffn")))
