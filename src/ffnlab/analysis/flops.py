"""Forward FLOPs per token, by component, counting matrix multiplies only.

A matmul of a [N, in] activation with an [in, out] weight costs 2*N*in*out FLOPs (one multiply
and one add per weight per token). Per token and per layer:

  attention projections   q 2*D*q_dim, k 2*D*kv_dim, v 2*D*kv_dim, o 2*q_dim*D
  attention scores        2*S*q_dim   (each of the n_head queries against S keys, head_dim each)
  attention weighted sum  2*S*q_dim   (probabilities [S] times values [S, head_dim], per head)
  MLP                     gated: gate + up + down = 6*D*F;  dense: up + down = 4*D*F
                          moe: router 2*D*E + k experts 6*k*D*F (+ shared expert 6*D*F_shexp + 2*D):
                          the active parameters, not the total
  LM head (once)          2*D*V

S is the context length the token attends over. The score and weighted-sum terms count every
key in the window the kernel multiplies, as a plain (non-flash) kernel and ffnlab compute them:
for a prefill of T tokens that is the full T x T matrix, masked afterwards, so S = T. A
causal-aware kernel does about half of that work on a prefill. Biases, norms, activations,
softmax and RoPE are element-wise (O(D) or O(F) per token) and are left out.

Training costs about 3x the forward: the backward computes two matmuls (input grad and weight
grad) for each forward one.
"""


def flops_per_token(cfg, seq_len: int) -> dict:
    """-> {"per_layer": {...}, "attention", "attention_scores", "mlp", "lm_head", "forward", "training",
           "mlp_share", "mlp_formula"} in FLOPs per token at context length seq_len"""
    D, F, V, S = cfg.d_model, cfg.d_ff, cfg.vocab_size, seq_len
    q, kv = cfg.q_dim, cfg.kv_dim
    per = {
        "attn_q": 2 * D * q,
        "attn_k": 2 * D * kv,
        "attn_v": 2 * D * kv,
        "attn_output": 2 * q * D,
        "attn_scores": 2 * S * q,            # kq = k^T q
        "attn_weighted_sum": 2 * S * q,      # kqv = v probs
        "ffn_gate": 2 * D * F if cfg.gated else 0,
        "ffn_up": 2 * D * F,
        "ffn_down": 2 * F * D,
    }
    if cfg.moe:                                       # k of the E experts, the router, a shared expert
        K, Fs = cfg.n_expert_used, cfg.d_ff_shexp
        per.update(ffn_gate=2 * K * D * F, ffn_up=2 * K * D * F, ffn_down=2 * K * F * D,
                   ffn_gate_inp=2 * D * cfg.n_expert, ffn_shexp=6 * D * Fs + 2 * D if Fs else 0)
    L = cfg.n_layer
    attention = L * (per["attn_q"] + per["attn_k"] + per["attn_v"] + per["attn_output"])
    scores = L * (per["attn_scores"] + per["attn_weighted_sum"])
    mlp = L * (per["ffn_gate"] + per["ffn_up"] + per["ffn_down"] + per.get("ffn_gate_inp", 0) + per.get("ffn_shexp", 0))
    lm_head = 2 * D * V
    forward = attention + scores + mlp + lm_head
    return {
        "seq_len": S,
        "per_layer": {**per, "total": sum(per.values())},
        "attention_projections": attention, "attention_scores": scores, "mlp": mlp, "lm_head": lm_head,
        "forward": forward, "training": 3 * forward,
        "mlp_share": mlp / forward,
        "mlp_formula": _mlp_formula(cfg),
    }


def _mlp_formula(cfg) -> str:
    if cfg.moe:
        return (f"2*d_model*n_expert + 6*k*d_model*d_ff (router, k={cfg.n_expert_used} of {cfg.n_expert} experts"
                + (", + shared expert)" if cfg.d_ff_shexp else ")"))
    return "6*d_model*d_ff (gate, up, down)" if cfg.gated else "4*d_model*d_ff (up, down)"
