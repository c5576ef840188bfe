"""A model's weights as records: a field per tensor, each with its shape (llama2.c's TransformerWeights).

Readers give a dict of GGUF-named arrays ({"blk.3.ffn_up.weight": [d_ff, d_model], ...});
model_weights() reads it once into one LayerWeights per block, and the block, the attention, the
FFN and the one-token step read fields. A weight is whatever the one product function accepts
(ops/linear.py: an array, a QuantTensor, a ComposedWeight). The layouts made at load
(model/packing.py) are resolved here, so the math never asks which it has:
  qkv        the products that give q | k | v, rows in that order: one stack of all three (packed
             at load, or GPT-2's fused attn_qkv), q and k stacked beside v (a quantized v of
             another type), or three
  gate_up    gate rows then up rows in one buffer (packed at load), else None: two products
  wo_padded  attn_output with zero rows below it (packing.py's Threading), for the one-token step
A stack is used only while params still holds the views it was made from: params entries may
be replaced after load (LoRA, pruning, interventions, training steps, ablations), and a replaced
part is then multiplied apart. Model.weights() reads the records again whenever an entry has
been replaced; an entry updated in place (a training step) needs nothing, as the records hold
the arrays themselves, never copies. Gradients are keyed by GGUF name: TENSOR maps a field to
its name under blk.L.
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..kinds import FFN_KINDS
from .params import lm_head_name

ATTN_TENSOR = {"q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight", "q_b": "attn_q.bias",
               "k_b": "attn_k.bias", "v_b": "attn_v.bias", "wqkv": "attn_qkv.weight", "wqkv_b": "attn_qkv.bias",
               "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight", "wo": "attn_output.weight",
               "wo_b": "attn_output.bias"}
FFN_TENSOR = {"up": "ffn_up.weight", "down": "ffn_down.weight", "gate": "ffn_gate.weight",
              "up_b": "ffn_up.bias", "gate_b": "ffn_gate.bias", "down_b": "ffn_down.bias"}
# a mixture of experts: llama.cpp's stacked layout, one [E, ...] tensor per projection
MOE_TENSOR = {"gate_inp": "ffn_gate_inp.weight", "gate_exps": "ffn_gate_exps.weight",
              "up_exps": "ffn_up_exps.weight", "down_exps": "ffn_down_exps.weight",
              "gate_inp_shexp": "ffn_gate_inp_shexp.weight", "gate_shexp": "ffn_gate_shexp.weight",
              "up_shexp": "ffn_up_shexp.weight", "down_shexp": "ffn_down_shexp.weight"}
TENSOR = {**ATTN_TENSOR, **FFN_TENSOR, **MOE_TENSOR}     # field -> GGUF name under blk.L.


class Norm(NamedTuple):
    weight: np.ndarray              # [D]
    bias: np.ndarray | None         # [D] (LayerNorm families)
    name: str                       # its GGUF name without ".weight" ("blk.3.attn_norm"): the hooks' source


@dataclass
class MoEWeights:
    """One layer's experts (stacked, [E, out, in] each) and router."""
    gate_inp: np.ndarray                # [E, d_model] the router
    gate_exps: np.ndarray               # [E, d_ff, d_model]
    up_exps: np.ndarray                 # [E, d_ff, d_model]
    down_exps: np.ndarray               # [E, d_model, d_ff]
    n_used: int                         # k: experts per token
    norm: bool                          # renormalise the k probabilities to sum 1 (norm_topk_prob)
    shexp: "LayerWeights | None" = None  # Qwen2-MoE: the shared expert (its up/gate/down, d_ff_shexp wide)
    gate_inp_shexp: np.ndarray | None = None   # [d_model] its sigmoid gate


@dataclass
class LayerWeights:
    """One block's tensors, [out, in] like nn.Linear; None where the family has no such tensor."""
    il: int = 0                         # the block's index
    attn_norm: Norm | None = None       # [d_model] (None: no pre norms, OLMo 2)
    q: np.ndarray | None = None         # [q_dim, d_model]   (q_dim = n_head * head_dim)
    k: np.ndarray | None = None         # [kv_dim, d_model]  (kv_dim = n_kv_head * head_dim)
    v: np.ndarray | None = None         # [kv_dim, d_model]
    q_b: np.ndarray | None = None       # [q_dim] (Qwen2)
    k_b: np.ndarray | None = None       # [kv_dim]
    v_b: np.ndarray | None = None       # [kv_dim]
    wqkv: np.ndarray | None = None      # [q_dim + 2*kv_dim, d_model] GPT-2's fused q/k/v (q, k, v: None)
    wqkv_b: np.ndarray | None = None    # [q_dim + 2*kv_dim]
    q_norm: np.ndarray | None = None    # [head_dim] per-head RMSNorm (Gemma 3, Qwen3); OLMoE: [q_dim]
    k_norm: np.ndarray | None = None    # [head_dim]; OLMoE: [kv_dim]
    wo: np.ndarray | None = None        # [d_model, q_dim] attn_output
    wo_b: np.ndarray | None = None      # [d_model]
    post_attn_norm: Norm | None = None  # [d_model] (Gemma 2/3, OLMo 2)
    ffn_norm: Norm | None = None        # [d_model]
    gate: np.ndarray | None = None      # [d_ff, d_model] (gated kinds)
    up: np.ndarray | None = None        # [d_ff, d_model]
    down: np.ndarray | None = None      # [d_model, d_ff]
    gate_b: np.ndarray | None = None    # [d_ff]
    up_b: np.ndarray | None = None      # [d_ff]
    down_b: np.ndarray | None = None    # [d_model]
    moe: MoEWeights | None = None       # a mixture of experts (then gate/up/down are None)
    post_ffn_norm: Norm | None = None   # [d_model] (Gemma 2/3, OLMo 2)
    # what the config says of this block's attention, read once
    rope: tuple | None = None           # its RoPE's (theta, scale, factors), None: none (learned positions, NoPE)
    window: int = 0                     # the sliding window it attends over, 0: every past position
    # the layouts of load, resolved (see the module docstring)
    qkv: tuple = ()                     # ((matrix [rows, d_model], "qkv" | "qk" | "q" | "k" | "v"), ...)
    gate_up: np.ndarray | None = None   # [2*d_ff, d_model] gate rows, then up rows: one product
    wo_padded: np.ndarray | None = None  # [d_model (+ zero rows), q_dim] the one-token step's attn_output

    @property
    def ffn(self):
        """The FFN's weights: the experts' record, or this record's gate/up/down."""
        return self.moe if self.moe is not None else self


@dataclass
class Weights:
    """The whole model's records, and the params values they were read from."""
    layers: list                        # [n_layer] LayerWeights
    token_embd: np.ndarray              # [vocab, d_model]
    position_embd: np.ndarray | None    # [n_ctx, d_model] (GPT-2's learned positions)
    output_norm: Norm                   # [d_model]
    head: np.ndarray                    # [vocab, d_model] the LM head (the token table when tied)
    stacks: dict                        # packing.py's {(layer, "qkv"|"qk"|"gate_up"|"attn_output"): (stack, views)}
    config: object                      # the ModelConfig they were read for
    values: tuple                       # the params values read: held, so no id in key is reused
    key: tuple                          # their ids


def params_key(p):
    return tuple(map(id, p.values()))


def model_weights(p, cfg, stacks=None) -> Weights:
    """p: {GGUF name: array} -> Weights; stacks: pack()'s, used where params still holds their views."""
    stacks = stacks or {}
    return Weights([layer_weights(p, cfg, il, stacks) for il in range(cfg.n_layer)], p["token_embd.weight"],
                   p.get("position_embd.weight"), _norm(p, "output_norm"), p[lm_head_name(cfg)], stacks, cfg,
                   tuple(p.values()), params_key(p))


def _norm(p, name, on=True):
    return Norm(p[name + ".weight"], p.get(name + ".bias"), name) if on else None


def layer_weights(p, cfg, il, stacks=None) -> LayerWeights:
    """Block il's tensors from the GGUF-named dict, with the stacks of load that are still valid."""
    blk = f"blk.{il}."
    t = {f: p.get(blk + n) for f, n in {**ATTN_TENSOR, **FFN_TENSOR}.items()}

    def stack(key, fields):
        entry = (stacks or {}).get((il, key))
        if entry is None or any(t[f] is not v for f, v in zip(fields, entry[1])):
            return None
        return entry[0]

    if cfg.fused_qkv:
        qkv = ((t["wqkv"], "qkv"),)
    elif (s := stack("qkv", "qkv")) is not None:
        qkv = ((s, "qkv"),)
    elif (s := stack("qk", "qk")) is not None:
        qkv = ((s, "qk"), (t["v"], "v"))
    else:
        qkv = tuple((t[w], w) for w in "qkv")
    moe = FFN_KINDS[cfg.ffn].moe
    padded = stack("attn_output", ("wo",))
    return LayerWeights(
        il=il, attn_norm=_norm(p, blk + "attn_norm", cfg.pre_norm),
        post_attn_norm=_norm(p, blk + "post_attention_norm", cfg.post_attn_norm),
        ffn_norm=_norm(p, blk + "ffn_norm", cfg.pre_norm), moe=moe_weights(p, il, cfg) if moe else None,
        post_ffn_norm=_norm(p, blk + "post_ffw_norm", cfg.post_ffn_norm), **t,
        rope=cfg.layer_rope(il) if cfg.uses_rope(il) else None,
        window=cfg.sliding_window if cfg.is_sliding(il) else 0, qkv=qkv,
        gate_up=stack("gate_up", ("gate", "up")) if cfg.gated else None,
        wo_padded=t["wo"] if padded is None else padded)


def moe_weights(p, il, cfg) -> MoEWeights:
    t = {f: p[f"blk.{il}.{n}"] for f, n in MOE_TENSOR.items() if cfg.d_ff_shexp or not f.endswith("shexp")}
    shexp = None
    if cfg.d_ff_shexp:
        shexp = LayerWeights(il=il, up=t["up_shexp"], down=t["down_shexp"], gate=t["gate_shexp"])
    return MoEWeights(gate_inp=t["gate_inp"], gate_exps=t["gate_exps"], up_exps=t["up_exps"], down_exps=t["down_exps"],
                      n_used=cfg.n_expert_used, norm=cfg.expert_norm, shexp=shexp,
                      gate_inp_shexp=t.get("gate_inp_shexp"))
