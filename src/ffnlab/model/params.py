"""Parameter names, shapes and random init for a ModelConfig.

Names are GGUF tensor names (token_embd.weight, blk.0.ffn_up.weight, ...); arrays are stored
[out, in] like nn.Linear -- the numpy view of a GGUF tensor whose ggml ne order is {in, out}.
param_shapes() is the one place that says which tensors a config has: the loaders check files
against it, the sizing tools count it, the trainer initialises from it.
"""
import math

import numpy as np


def lm_head_name(cfg):
    """The LM head's tensor: the token embedding itself when the two are tied."""
    return "token_embd.weight" if cfg.tie_embeddings else "output.weight"


def param_shapes(cfg) -> dict:
    """-> {tensor name: numpy shape}, in GGUF file order"""
    D, F, V = cfg.d_model, cfg.d_ff, cfg.vocab_size
    s = {"token_embd.weight": (V, D)}
    if cfg.positions == "learned":
        s["position_embd.weight"] = (cfg.n_ctx, D)
    ln = cfg.norm == "layernorm"  # LayerNorm has a bias next to its weight
    for il in range(cfg.n_layer):
        b = f"blk.{il}."
        if cfg.pre_norm:                          # OLMo 2 has none: only post norms
            s[b + "attn_norm.weight"] = (D,)
            if ln:
                s[b + "attn_norm.bias"] = (D,)
        if cfg.fused_qkv:
            s[b + "attn_qkv.weight"] = (cfg.q_dim + 2 * cfg.kv_dim, D)
            if cfg.attn_bias:
                s[b + "attn_qkv.bias"] = (cfg.q_dim + 2 * cfg.kv_dim,)
        else:
            for which, out in (("q", cfg.q_dim), ("k", cfg.kv_dim), ("v", cfg.kv_dim)):
                s[b + f"attn_{which}.weight"] = (out, D)
                if cfg.attn_bias:
                    s[b + f"attn_{which}.bias"] = (out,)
        if cfg.qk_norm:
            # per head, or (OLMoE) over the whole projection
            s[b + "attn_q_norm.weight"] = (cfg.q_dim if cfg.qk_norm_full else cfg.head_dim,)
            s[b + "attn_k_norm.weight"] = (cfg.kv_dim if cfg.qk_norm_full else cfg.head_dim,)
        s[b + "attn_output.weight"] = (D, cfg.q_dim)
        if cfg.attn_out_bias:
            s[b + "attn_output.bias"] = (D,)
        if cfg.post_attn_norm:
            s[b + "post_attention_norm.weight"] = (D,)
        if cfg.pre_norm:
            s[b + "ffn_norm.weight"] = (D,)
            if ln:
                s[b + "ffn_norm.bias"] = (D,)
        if cfg.moe:
            s.update({b + k: v for k, v in moe_shapes(cfg).items()})
        elif cfg.gated:
            s[b + "ffn_gate.weight"] = (F, D)
            if cfg.ffn_bias:
                s[b + "ffn_gate.bias"] = (F,)
        if not cfg.moe:
            s[b + "ffn_up.weight"] = (F, D)
            if cfg.ffn_bias:
                s[b + "ffn_up.bias"] = (F,)
            s[b + "ffn_down.weight"] = (D, F)
            if cfg.ffn_bias:
                s[b + "ffn_down.bias"] = (D,)
        if cfg.post_ffn_norm:
            s[b + "post_ffw_norm.weight"] = (D,)
    s["output_norm.weight"] = (D,)
    if ln:
        s["output_norm.bias"] = (D,)
    if not cfg.tie_embeddings:
        s["output.weight"] = (V, D)
    return s


def moe_shapes(cfg) -> dict:
    """One layer's MoE tensors (names relative to blk.L.), llama.cpp's stacked layout: expert e's
    up matrix is ffn_up_exps.weight[e], [d_ff, d_model]."""
    D, F, E = cfg.d_model, cfg.d_ff, cfg.n_expert
    s = {"ffn_gate_inp.weight": (E, D), "ffn_gate_exps.weight": (E, F, D), "ffn_up_exps.weight": (E, F, D),
         "ffn_down_exps.weight": (E, D, F)}
    if cfg.d_ff_shexp:
        Fs = cfg.d_ff_shexp
        s.update({"ffn_gate_inp_shexp.weight": (D,), "ffn_gate_shexp.weight": (Fs, D),
                  "ffn_up_shexp.weight": (Fs, D), "ffn_down_shexp.weight": (D, Fs)})
    return s


def is_norm_or_bias(name: str) -> bool:
    """Norm scales and biases: 1-D tensors (AdamW leaves them without weight decay)."""
    return name.endswith(".bias") or "norm" in name


def init_params(cfg, seed=0, dtype=np.float32) -> dict:
    """GPT-2 style init: N(0, 0.02) for matrices, the residual projections scaled by
    1/sqrt(2*n_layer) (they add into the residual stream once per sub-layer), norms 1, biases 0."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".bias"):
            a = np.zeros(shape)
        elif "norm" in name:
            a = np.ones(shape)
        else:
            std = 0.02
            if name.endswith(("attn_output.weight", "ffn_down.weight", "ffn_down_exps.weight",
                              "ffn_down_shexp.weight")):
                std /= math.sqrt(2 * cfg.n_layer)
            a = rng.normal(0.0, std, size=shape)
        out[name] = a.astype(dtype)
    return out


def count_params(params: dict) -> int:
    return int(sum(a.size for a in params.values()))
