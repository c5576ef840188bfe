"""The FFN (MLP) family -- the heart of ffnlab. Every FFN kind, batched and one-token, forward and backward.

  dense  (GPT-2, BERT):        y = down(act(up(x) + b_up)) + b_down        act in {gelu, gelu_tanh, relu}
  gated  (Llama SwiGLU,        y = down(act(gate(x)) * up(x))              act = SiLU for swiglu,
          Gemma GeGLU):                                                          GELU-tanh for geglu
Biases are optional in both. x is the output of ffn_norm, shape [..., d_model].

Each named value passes through the hook (model/hooks.py) under llama.cpp's graph names
(llm_graph_context::build_ffn): ffn_up, ffn_up_b (after the up bias), ffn_gate, ffn_gate_b,
ffn_gelu / ffn_relu (dense) or ffn_swiglu / ffn_geglu (gated: act(gate) * up fused in one GLU
op), ffn_down (only when a down bias follows), and ffn_out for the FFN's result. A weight
source like "ffn_up.weight" is the block's own tensor (blk.L.ffn_up.weight).
"""
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..ops.activations import ACTIVATIONS
from ..ops.linear import linear_backward, linear_forward
from .hooks import identity


class FFNKind(NamedTuple):
    act: str            # the activation, a key of ops/activations.py's ACTIVATIONS
    gated: bool         # act(gate(x)) * up(x) instead of act(up(x))
    node: str           # llama.cpp's node name of the activation (dense) or the GLU (gated)
    op: str             # the ggml op that node prints


# The one table of FFN kinds (config.py validates ModelConfig.ffn against it)
FFN_KINDS = {
    "gelu": FFNKind("gelu", False, "ffn_gelu", "GELU_ERF"),
    "gelu_tanh": FFNKind("gelu_tanh", False, "ffn_gelu", "GELU"),
    "relu": FFNKind("relu", False, "ffn_relu", "RELU"),
    "swiglu": FFNKind("silu", True, "ffn_swiglu", "SWIGLU"),
    "geglu": FFNKind("gelu_tanh", True, "ffn_geglu", "GEGLU"),
}


@dataclass
class FFNWeights:
    """One layer's MLP weights, [out, in] like nn.Linear."""
    up: np.ndarray                      # [d_ff, d_model]
    down: np.ndarray                    # [d_model, d_ff]
    gate: np.ndarray | None = None      # [d_ff, d_model] (gated kinds only)
    up_b: np.ndarray | None = None      # [d_ff]
    gate_b: np.ndarray | None = None    # [d_ff]
    down_b: np.ndarray | None = None    # [d_model]
    gate_up: np.ndarray | None = None   # [2*d_ff, d_model] gate rows then up rows in one buffer
                                        # (model/packing.py, inference): one product for both


# the names of a layer's FFN tensors, relative to its blk.L. prefix
FFN_TENSOR = {"up": "ffn_up.weight", "down": "ffn_down.weight", "gate": "ffn_gate.weight",
              "up_b": "ffn_up.bias", "gate_b": "ffn_gate.bias", "down_b": "ffn_down.bias"}


def ffn_weights(p, il, gate_up=None):
    """Layer il's FFN tensors from the GGUF-named dict (gate_up: their packed buffer, if any)."""
    blk = f"blk.{il}."
    return FFNWeights(up=p[blk + "ffn_up.weight"], down=p[blk + "ffn_down.weight"],
                      gate=p.get(blk + "ffn_gate.weight"), up_b=p.get(blk + "ffn_up.bias"),
                      gate_b=p.get(blk + "ffn_gate.bias"), down_b=p.get(blk + "ffn_down.bias"), gate_up=gate_up)


class FFNCache(NamedTuple):
    """What ffn_backward needs from the forward."""
    x: np.ndarray                       # [..., d_model] the input (ffn_norm's output)
    up: np.ndarray                      # [..., d_ff] up(x) (+ b_up)
    gate: np.ndarray | None             # [..., d_ff] gate(x) (+ b_gate), gated kinds
    act: np.ndarray                     # [..., d_ff] act(gate) (gated) or act(up) (dense)
    h: np.ndarray                       # [..., d_ff] what enters down: act * up, or act


def ffn_forward(x, w: FFNWeights, kind, hook=identity):
    """x: [..., d_model] -> y: [..., d_model], FFNCache"""
    k = FFN_KINDS[kind]
    gu = linear_forward(x, w.gate_up) if w.gate_up is not None else None    # [..., 2*d_ff]: gate, up
    gate = None
    if k.gated:
        # gate before up, the order ggml executes them in (GLU's src0 is the gate)
        gate = gu[..., :gu.shape[-1] // 2] if gu is not None else linear_forward(x, w.gate)   # [..., d_ff]
        gate = hook("ffn_gate", gate, "MUL_MAT", ("ffn_gate.weight", "ffn_norm"))
        if w.gate_b is not None:
            gate = hook("ffn_gate_b", gate + w.gate_b, "ADD", ("ffn_gate", "ffn_gate.bias"))
    up = gu[..., gu.shape[-1] // 2:] if gu is not None else linear_forward(x, w.up)        # [..., d_ff]
    up = hook("ffn_up", up, "MUL_MAT", ("ffn_up.weight", "ffn_norm"))
    if w.up_b is not None:
        up = hook("ffn_up_b", up + w.up_b, "ADD", ("ffn_up", "ffn_up.bias"))   # a new array: ffn_up stays
    up_src = "ffn_up_b" if w.up_b is not None else "ffn_up"
    if k.gated:
        act = ACTIVATIONS[k.act].forward(gate)                            # [..., d_ff]
        h = hook(k.node, act * up, k.op, ("ffn_gate_b" if w.gate_b is not None else "ffn_gate", up_src))
    else:
        act = h = hook(k.node, ACTIVATIONS[k.act].forward(up), k.op, (up_src,))   # [..., d_ff]
    y = linear_forward(h, w.down)                                         # [..., d_ff] -> [..., d_model]
    if w.down_b is not None:
        y = hook("ffn_down", y, "MUL_MAT", ("ffn_down.weight", k.node))
        y = hook("ffn_out", y + w.down_b, "ADD", ("ffn_down", "ffn_down.bias"))
    else:
        y = hook("ffn_out", y, "MUL_MAT", ("ffn_down.weight", k.node))
    return y, FFNCache(x, up, gate, act, h)


def ffn_forward_one(x, w: FFNWeights, kind):
    """x: [d_model] -> [d_model]: ffn_forward for one token with no hooks (model/decode.py),
    in as few NumPy calls as possible."""
    k = FFN_KINDS[kind]
    if k.gated:
        if w.gate_up is not None:
            gu = linear_forward(x, w.gate_up)                             # [2*d_ff]: gate rows, then up rows
            gate, up = gu[:gu.shape[0] // 2], gu[gu.shape[0] // 2:]
        else:
            gate, up = linear_forward(x, w.gate), linear_forward(x, w.up)   # [d_ff] each
        if w.gate_b is not None:
            gate = gate + w.gate_b
        if w.up_b is not None:
            up = up + w.up_b
        h = ACTIVATIONS[k.act].forward(gate)
        h *= up                                                           # [d_ff] act(gate) * up
    else:
        up = linear_forward(x, w.up)                                      # [d_ff]
        if w.up_b is not None:
            up += w.up_b
        h = ACTIVATIONS[k.act].forward(up)
    y = linear_forward(h, w.down)                                         # [d_ff] -> [d_model]
    if w.down_b is not None:
        y += w.down_b
    return y


def ffn_backward(dy, w: FFNWeights, kind, cache: FFNCache):
    """dy: [..., d_model] -> dx: [..., d_model], grads: dict with the keys of FFNWeights"""
    k = FFN_KINDS[kind]
    act_bwd = ACTIVATIONS[k.act].backward
    c = cache
    g = {}
    dh, g["down"], g["down_b"] = linear_backward(dy, c.h, w.down, w.down_b is not None)   # [..., d_ff]
    if k.gated:
        dup = dh * c.act                                   # d(act * up)/d up
        dgate = act_bwd(dh * c.up, c.gate)                  # through act(gate)
        dx_gate, g["gate"], g["gate_b"] = linear_backward(dgate, c.x, w.gate, w.gate_b is not None)
    else:
        dup = act_bwd(dh, c.up)
        dx_gate = None
    dx, g["up"], g["up_b"] = linear_backward(dup, c.x, w.up, w.up_b is not None)
    if dx_gate is not None:
        dx += dx_gate
    return dx, {k: v for k, v in g.items() if v is not None}
