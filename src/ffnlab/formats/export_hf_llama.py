"""HF export of the Llama-shaped families: Llama (3.x rope scaling included), Mistral, Qwen2, Qwen3, Phi-3.

They share one block (RMSNorm, RoPE in rotate_half order, gated MLP) and differ in a few flags,
so the transformers class is chosen from the config's flags, each of which must be what the class
computes:
  family    class               attention                            extra
  llama     LlamaForCausalLM    q/k/v/o biases all or none            rope_parameters default | linear | llama3
  mistral   MistralForCausalLM  no biases                             sliding_window on every layer
  qwen2     Qwen2ForCausalLM    q/k/v biases, no o bias               use_sliding_window (every layer)
  qwen3     Qwen3ForCausalLM    per-head q/k RMSNorm, biases all/none use_sliding_window (every layer)
  phi3      Phi3ForCausalLM     fused qkv_proj, no biases             gate_up_proj = [gate; up]; sliding_window;
                                                                        partial_rotary_factor (rope_dim)
A config loaded from an HF directory goes back to its own class (cfg.arch); a GGUF llama with a
window goes to Mistral. Llama 3's rope_freq_factors are written as rope_parameters llama3: the
four numbers config.json had (cfg.rope_llama3), or, for a GGUF's rope_freqs.weight alone, numbers
fitted to the divisors (llama3_from_factors) that give the same frequencies.
"""
import numpy as np

from ..errors import UsageError
from ..families import FAMILIES, hf_family
from ..families import family as family_of
from .export_targets import config_mismatches

HF_LLAMA_ACT = {"swiglu": "silu", "geglu": "gelu_pytorch_tanh"}
# the Llama-shaped families (families/<arch>.py hf_export): model_type -> transformers class, and
# (flags the class computes, features it allows beyond plain Llama)
CLASS = {t: e[0] for f in FAMILIES.values() if f.hf_llama_shaped for t, e in f.hf_export.items()}
WANT = {t: e[1:] for f in FAMILIES.values() if f.hf_llama_shaped for t, e in f.hf_export.items()}


def llama_family(cfg) -> str:
    """The transformers family that computes this RoPE config exactly, or UsageError naming why none."""
    fam = family_of(cfg.arch)
    if fam.hf_llama_shaped and len(fam.hf_export) == 1:       # a config's own class (Qwen2, Phi-3, ...)
        family = next(iter(fam.hf_export))
    else:                                                      # Llama's two: Mistral slides every layer
        family = "mistral" if cfg.sliding_window else "llama"
    want, allow = WANT[family]
    why = []
    if cfg.ffn not in HF_LLAMA_ACT:
        why.append(f"ffn={cfg.ffn!r}: Llama's MLP is gated ({', '.join(HF_LLAMA_ACT)}); a dense MLP needs learned "
                   f"positions, LayerNorm and biases (GPT-2)")
    why += config_mismatches(cfg, want, allow + (("rope_scale",) if family == "llama" else ()))
    if family in ("llama", "qwen3") and cfg.attn_bias != cfg.attn_out_bias:
        why.append(f"attn_bias={cfg.attn_bias} with attn_out_bias={cfg.attn_out_bias} (attention_bias covers both)")
    if cfg.sliding_window and cfg.sliding_window_pattern:
        why.append(f"sliding_window_pattern={cfg.sliding_window_pattern} ({CLASS[family]} slides every layer)")
    if cfg.rope_freq_factors and len(cfg.rope_llama3) != 4 and llama3_from_factors(cfg) is None:
        why.append("rope_freq_factors that no llama3 rope_parameters reproduce (fewer than two frequencies "
                   "in the interpolated band, or not Llama 3's shape)")
    if why:
        raise UsageError(f"cannot export to HF ({CLASS[family]}): " + "; ".join(why))
    return family


def llama3_from_factors(cfg):
    """(factor, low_freq_factor, high_freq_factor, original_max_position_embeddings) that give
    cfg.rope_freq_factors, or None. In the interpolated band the divisor is 1 / ((1 - s)/factor + s)
    with s = orig / (wavelength * (high - low)) - low / (high - low) = A / wavelength - B: two
    numbers, fitted from two band frequencies; any (orig, low, high) with the same A and B gives the
    same frequencies, so low = 1 is chosen. The fit is accepted only if it reproduces every divisor."""
    from ..config import llama3_freq_factors
    f = np.asarray(cfg.rope_freq_factors, dtype=np.float64)
    n = 2 * len(f)
    wl = 2 * np.pi * cfg.rope_theta ** (np.arange(0, n, 2, dtype=np.float64) / n)      # wavelengths [n/2]
    factor = float(f.max())
    band = (f > 1 + 1e-6) & (f < factor * (1 - 1e-6))
    if factor <= 1 or band.sum() < 2:
        return None
    s = (1 / f[band] - 1 / factor) / (1 - 1 / factor)              # invert the divisor: s per band frequency
    A, B = np.polyfit(1 / wl[band], s, 1)                          # s = A / wavelength - B, fitted
    B = -B
    if A <= 0 or B <= 0:
        return None
    low, high = 1.0, round(1.0 + 1.0 / B, 6)                       # round: 4 and 8192 for Llama 3's own
    orig = round(A / B, 3)
    fit = np.asarray(llama3_freq_factors(n, cfg.rope_theta, factor, low, high, orig))
    return (factor, low, high, orig) if np.allclose(fit, f, rtol=1e-5, atol=0) else None


def _rope_parameters(cfg) -> dict:
    rp = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    llama3 = cfg.rope_llama3 if len(cfg.rope_llama3) == 4 else llama3_from_factors(cfg) if cfg.rope_freq_factors else ()
    if llama3:
        factor, low, high, orig = llama3
        # transformers reads original_max_position_embeddings as a number; a fitted one need not be whole
        rp.update(rope_type="llama3", factor=factor, low_freq_factor=low, high_freq_factor=high,
                  original_max_position_embeddings=int(orig) if float(orig).is_integer() else float(orig))
    elif cfg.rope_scale != 1.0:
        rp.update(rope_type="linear", factor=cfg.rope_scale)
    if cfg.rope_dim:                          # Phi-3's partial rotary (other families refuse rope_dim)
        rp["partial_rotary_factor"] = cfg.rope_dim / cfg.head_dim
    return rp


def llama_config(cfg, family, common) -> dict:
    """config.json of a Llama-shaped family."""
    d = {"architectures": [CLASS[family]], "model_type": family, "hidden_size": cfg.d_model,
         "intermediate_size": cfg.d_ff, "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
         "num_key_value_heads": cfg.n_kv_head, "hidden_act": HF_LLAMA_ACT[cfg.ffn],
         "max_position_embeddings": cfg.n_ctx, "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_theta,
         "rope_parameters": _rope_parameters(cfg), "attention_dropout": 0.0,
         "pad_token_id": None, **common}              # Phi3Config would default to 32000, outside small vocabs
    if family != "phi3":                      # Phi3Config has no head_dim: hidden_size / num_attention_heads
        d["head_dim"] = cfg.head_dim
    elif cfg.head_dim * cfg.n_head != cfg.d_model:
        raise UsageError(f"cannot export to HF (Phi3ForCausalLM): head_dim={cfg.head_dim} is not "
                         f"d_model/n_head={cfg.d_model // cfg.n_head}")
    if family in ("llama", "qwen3"):
        d["attention_bias"] = cfg.attn_bias
    if family == "llama":
        d["mlp_bias"] = False
    if family in ("qwen2", "qwen3"):
        d.update(use_sliding_window=bool(cfg.sliding_window), sliding_window=cfg.sliding_window or None,
                 max_window_layers=cfg.sliding_window_start)
    if family in ("mistral", "phi3"):
        d["sliding_window"] = cfg.sliding_window or None
    extra = hf_family(family).hf_export_extra                  # what a family adds (families/<arch>.py)
    return {**d, **extra(cfg)} if extra else d


def normal_to_neox_rows(w, n_head):
    """Q/K rows of each head from adjacent pairs (x_2i, x_2i+1) to (x_i, x_{i+hd/2}):
    the inverse of convert_hf_to_gguf.py's permute(). w: [n_head*hd, ...]"""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
          "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
          "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
          "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}


def llama_tensors(cfg, params, family) -> dict:
    """GGUF-named [out, in] arrays -> HF names and layout (q/k rows in rotate_half order; Phi-3's
    fused qkv_proj and gate_up_proj)."""
    out = {"model.embed_tokens.weight": params["token_embd.weight"], "model.norm.weight": params["output_norm.weight"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["output.weight"]
    for il in range(cfg.n_layer):
        blk, hf = f"blk.{il}.", f"model.layers.{il}."
        p = {n.removeprefix(blk): a for n, a in params.items() if n.startswith(blk)}
        if cfg.rope_pairing == "normal":
            for which, heads in (("q", cfg.n_head), ("k", cfg.n_kv_head)):
                for kind in ("weight", "bias"):
                    if f"attn_{which}.{kind}" in p:
                        p[f"attn_{which}.{kind}"] = normal_to_neox_rows(p[f"attn_{which}.{kind}"], heads)
        if family == "phi3":
            out[hf + "self_attn.qkv_proj.weight"] = p.pop("attn_qkv.weight")       # [q_dim + 2*kv_dim, d_model]
            out[hf + "mlp.gate_up_proj.weight"] = np.concatenate([p.pop("ffn_gate.weight"), p.pop("ffn_up.weight")])
        for name, a in p.items():
            base, kind = name.rsplit(".", 1)
            out[f"{hf}{_NAMES[base]}.{kind}"] = a
    return out
