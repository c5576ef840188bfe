"""The SwiGLU width that keeps the MLP's parameter count equal to a dense 4x MLP.

A dense MLP of width 4*D has 2 * D * 4D = 8*D^2 weights; a gated one of width F has 3*D*F.
They are equal at F = 8*D/3 = 2/3 * 4*D. Llama's code (llama/model.py, FeedForward) rounds it:

    hidden = int(2 * (4 * dim) / 3)                  # 4096 -> 10922
    if ffn_dim_multiplier: hidden = int(ffn_dim_multiplier * hidden)
    hidden = multiple_of * ceil(hidden / multiple_of)

Llama 2 7B: dim 4096, multiple_of 256 -> 11008; 13B: 5120 -> 13824; 70B: 8192, x1.3, multiple_of
4096 -> 28672. Llama 3 8B uses x1.3 with multiple_of 1024 -> 14336, which is 1.3x the plain
equal-parameter width (11008).
"""


def llama_ffn_width(d_model, multiple_of=256, ffn_dim_multiplier=None) -> int:
    """Llama's rule for the gated MLP's width, exactly as its FeedForward computes it."""
    hidden = int(2 * (4 * d_model) / 3)
    if ffn_dim_multiplier:
        hidden = int(ffn_dim_multiplier * hidden)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


def swiglu_width_report(cfg, multiple_of=256, ffn_dim_multiplier=None) -> dict:
    """How a model's d_ff compares with the equal-parameter SwiGLU width for its d_model."""
    D = cfg.d_model
    exact = 8 * D / 3
    rounded = llama_ffn_width(D, multiple_of, ffn_dim_multiplier)
    equal = llama_ffn_width(D, multiple_of)                          # no multiplier: the equal-param width
    return {
        "d_model": D, "d_ff": cfg.d_ff, "gated": cfg.gated,
        "equal_param_width_exact": exact,                              # 8/3 * d_model
        "equal_param_width": equal,                                    # rounded up to multiple_of
        "llama_rule_width": rounded,                                   # with ffn_dim_multiplier, if given
        "multiple_of": multiple_of, "ffn_dim_multiplier": ffn_dim_multiplier,
        "ratio_to_equal_param": cfg.d_ff / equal,                      # Llama 3 8B: 14336 / 11008 = 1.30
        "ratio_to_d_model": cfg.d_ff / D,
        "gated_params_at_d_ff": 3 * D * cfg.d_ff,
        "dense_4x_params": 8 * D * D,
    }
