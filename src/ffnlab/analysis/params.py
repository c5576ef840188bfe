"""Parameter counts by component, from a ModelConfig alone (no weights).

Counted from the architecture with one formula per tensor, independently of
model/params.py's tensor list, so the tests can hold the two against each other.

  embedding   token table V*D                       position   learned table n_ctx*D (GPT-2, BERT)
  attention   q D*q_dim, k/v D*kv_dim, o q_dim*D, and their biases
  mlp         gate D*F (gated kinds only), up D*F, down F*D, and their biases
  norm        every norm weight (and LayerNorm bias), incl. Gemma's q/k and post norms
  lm_head     V*D when untied, 0 when it reuses the token table
  extra       parameters ModelConfig does not model (BERT: token-type table, pooler)

A mixture of experts (ffn moe) has E experts of gate, up and down (E*3*D*F), a router
ffn_gate_inp (E*D) and, for Qwen2-MoE, a shared expert (3*D*F_shexp + its D-wide gate). A token
runs only k of the E experts: `active` is what one token touches, the total less the (E - k)
experts it skips in every layer; FLOPs per token follow active, memory follows total.
"""


def qk_norm_params(cfg) -> int:
    """q/k norm weights: one head wide (Gemma 3, Qwen3) or the whole projections (OLMoE)."""
    if not cfg.qk_norm:
        return 0
    return cfg.q_dim + cfg.kv_dim if cfg.qk_norm_full else 2 * cfg.head_dim


def moe_layer_params(cfg) -> dict:
    """A MoE layer's FFN: every expert's gate/up/down, the router and a shared expert -> {name: count}"""
    if not cfg.moe:
        return {}
    D, F, E, Fs = cfg.d_model, cfg.d_ff, cfg.n_expert, cfg.d_ff_shexp
    return {"ffn_gate": E * D * F, "ffn_up": E * D * F, "ffn_down": E * F * D, "ffn_gate_inp": E * D,
            "ffn_shexp": 3 * D * Fs + D if Fs else 0}


def inactive_expert_params(cfg) -> int:
    """Parameters one token does not touch: the (E - k) unchosen experts of every layer."""
    return cfg.n_layer * (cfg.n_expert - cfg.n_expert_used) * 3 * cfg.d_model * cfg.d_ff if cfg.moe else 0


def layer_params(cfg) -> dict:
    """One block's parameter count per tensor kind -> {name: count}"""
    D, F, q, kv = cfg.d_model, cfg.d_ff, cfg.q_dim, cfg.kv_dim
    ln = cfg.norm == "layernorm"                     # LayerNorm: weight + bias; RMSNorm: weight only
    n_block_norms = 2 * cfg.pre_norm + cfg.post_attn_norm + cfg.post_ffn_norm     # OLMo 2: post norms only
    p = {
        "attn_q": D * q,
        "attn_k": D * kv,
        "attn_v": D * kv,
        "attn_output": q * D,
        "attn_bias": (q + 2 * kv) * cfg.attn_bias + D * cfg.attn_out_bias,
        "ffn_gate": D * F if cfg.gated else 0,
        "ffn_up": D * F,
        "ffn_down": F * D,
        **moe_layer_params(cfg),
        "ffn_bias": (F * (1 + cfg.gated) + D) * cfg.ffn_bias,
        "norm": n_block_norms * D * (2 if ln else 1) + qk_norm_params(cfg),
    }
    return p


def param_counts(cfg, extra: dict | None = None) -> dict:
    """-> {"per_layer": {...}, "embedding", "position", "attention", "mlp", "norm", "lm_head",
           "extra", "total", "non_embedding", "active", "mlp_active", "mlp_share", "mlp_share_non_embedding"}

    non_embedding excludes the token table, the position table and an untied LM head (the
    convention of Kaplan et al. 2020: only the blocks and the final norm)."""
    L, D, V = cfg.n_layer, cfg.d_model, cfg.vocab_size
    per = layer_params(cfg)
    attention = L * (per["attn_q"] + per["attn_k"] + per["attn_v"] + per["attn_output"] + per["attn_bias"])
    mlp_per_layer = per["ffn_gate"] + per["ffn_up"] + per["ffn_down"] + per["ffn_bias"] \
        + per.get("ffn_gate_inp", 0) + per.get("ffn_shexp", 0)
    mlp = L * mlp_per_layer
    norm = L * per["norm"] + D * (2 if cfg.norm == "layernorm" else 1)      # + output_norm
    embedding = V * D
    position = cfg.n_ctx * D if cfg.positions == "learned" else 0
    lm_head = 0 if cfg.tie_embeddings else V * D
    extra = dict(extra or {})
    total = embedding + position + attention + mlp + norm + lm_head + sum(extra.values())
    non_embedding = total - embedding - position - lm_head - sum(extra.values())
    return {
        "per_layer": {**per, "total": sum(per.values()), "mlp": mlp_per_layer},
        "embedding": embedding, "position": position, "attention": attention, "mlp": mlp,
        "norm": norm, "lm_head": lm_head, "lm_head_tied": bool(cfg.tie_embeddings), "extra": extra,
        "total": total, "non_embedding": non_embedding,
        "active": total - inactive_expert_params(cfg),    # what one token touches (= total for a dense FFN)
        "mlp_active": mlp - inactive_expert_params(cfg),
        "mlp_share": mlp / total,
        "mlp_share_non_embedding": mlp / non_embedding,
    }
