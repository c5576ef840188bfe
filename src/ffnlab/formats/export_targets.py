"""What an export target (llama.cpp's GGUF architectures, transformers' classes) can represent."""


def config_mismatches(cfg, want, allow=()) -> list:
    """Why a config cannot be written as a target architecture: each field of `want` it differs
    in, and each Gemma-style feature (q/k norms, post norms, embedding scale, sliding window,
    softcap, custom attention scale, RoPE scaling, Granite's multipliers, NoPE layers) it uses that the target does not `allow`. [] when it fits."""
    why = [f"{k}={getattr(cfg, k)!r} (needs {v!r})" for k, v in want.items() if getattr(cfg, k) != v]
    for k in ("qk_norm", "post_attn_norm", "post_ffn_norm", "embed_scale", "sliding_window", "final_logit_softcap",
              "attn_scale", "attn_softcap", "parallel_residual", "rope_dim", "rope_freq_factors",
              "sliding_window_start", "embedding_multiplier", "residual_multiplier", "logits_scaling",
              "no_rope_layer_step"):
        if getattr(cfg, k) and k not in allow and k not in want:
            why.append(f"{k}={getattr(cfg, k)!r} (needs off)")
    if cfg.rope_scale != 1.0 and "rope_scale" not in allow:
        why.append(f"rope_scale={cfg.rope_scale} (needs 1)")
    if not cfg.pre_norm:
        why.append("pre_norm=False (needs pre norms)")
    return why
