"""The FFN (MLP) family -- the heart of ffnlab.

  dense  (GPT-2, BERT):        y = down(act(up(x) + b_up)) + b_down        act in {gelu, gelu_tanh, relu}
  gated  (Llama SwiGLU,        y = down(act(gate(x)) * up(x))              act = SiLU for swiglu,
          Gemma GeGLU):                                                          GELU-tanh for geglu
Biases are optional in both. x is the output of ffn_norm, shape [..., d_model].

The forward returns y and the named intermediates the backward needs; when a tracer is given
it observes each of them under llama.cpp's graph names (llm_graph_context::build_ffn):
  ffn_up, ffn_up_b (after the up bias), ffn_gate, ffn_gate_b, ffn_gelu / ffn_relu (dense) or
  ffn_swiglu / ffn_geglu (gated: act(gate) * up fused in one GLU op), ffn_down (only when a
  down bias follows), and ffn_out for the FFN's result.
"""
from dataclasses import dataclass

import numpy as np

from ..ops.activations import ACTIVATIONS
from ..ops.linear import linear_backward, linear_forward

# FFN kind -> (activation, gated?, llama.cpp node name of the activation / GLU, ggml op it prints)
FFN_ACT = {
    "gelu": ("gelu", False, "ffn_gelu", "GELU_ERF"),
    "gelu_tanh": ("gelu_tanh", False, "ffn_gelu", "GELU"),
    "relu": ("relu", False, "ffn_relu", "RELU"),
    "swiglu": ("silu", True, "ffn_swiglu", "SWIGLU"),
    "geglu": ("gelu_tanh", True, "ffn_geglu", "GEGLU"),
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


def ffn_forward(x, w: FFNWeights, kind, emit=None, names=None, gate_up=None):
    """x: [..., d_model] -> y: [..., d_model], cache (the inputs the backward needs)

    emit(name, op, array, srcs) is the tracer hook (None: no tracing). names maps the
    weights to their tensor names (e.g. {'up': 'blk.0.ffn_up.weight'}) for the trace.
    gate_up: [2*d_ff, d_model], gate rows then up rows in one buffer (model/packing.py), so
    both products are one matmul; same values as the separate gate and up.
    """
    act_name, gated, act_node, act_op = FFN_ACT[kind]
    act_fwd = ACTIVATIONS[act_name][0]
    n = names or {}
    # gated: gate before up, the order ggml executes them in (GLU's src0 is the gate)
    gate = gu = None
    if gate_up is not None:
        gu = linear_forward(x, gate_up)                               # [..., d_model] -> [..., 2*d_ff]
    if gated:
        gate = linear_forward(x, w.gate) if gu is None else gu[..., :w.gate.shape[0]]   # [..., d_ff]
        if emit: emit("ffn_gate", "MUL_MAT", gate, (n.get("gate"), "ffn_norm"))
        if w.gate_b is not None:
            gate = gate + w.gate_b
            if emit: emit("ffn_gate_b", "ADD", gate, ("ffn_gate", n.get("gate_b")))
    up = linear_forward(x, w.up) if gu is None else gu[..., w.gate.shape[0]:]    # [..., d_model] -> [..., d_ff]
    if emit: emit("ffn_up", "MUL_MAT", up, (n.get("up"), "ffn_norm"))
    if w.up_b is not None:
        up = up + w.up_b                                               # new array: pre-bias up stays traced
        if emit: emit("ffn_up_b", "ADD", up, ("ffn_up", n.get("up_b")))
    if gated:
        act = act_fwd(gate)                                            # [..., d_ff]
        h = act * up                                                   # [..., d_ff] the gated product
        if emit: emit(act_node, act_op, h, ("ffn_gate_b" if w.gate_b is not None else "ffn_gate",
                                            "ffn_up_b" if w.up_b is not None else "ffn_up"))
    else:
        act = act_fwd(up)                                              # [..., d_ff]
        h = act
        if emit: emit(act_node, act_op, h, ("ffn_up_b" if w.up_b is not None else "ffn_up",))
    y = linear_forward(h, w.down)                                     # [..., d_ff] -> [..., d_model]
    if w.down_b is not None:
        if emit: emit("ffn_down", "MUL_MAT", y, (n.get("down"), act_node))
        y += w.down_b
        if emit: emit("ffn_out", "ADD", y, ("ffn_down", n.get("down_b")))
    elif emit:
        emit("ffn_out", "MUL_MAT", y, (n.get("down"), act_node))
    return y, (x, up, gate, act, h)


def ffn_backward(dy, w: FFNWeights, kind, cache):
    """dy: [..., d_model] -> dx: [..., d_model], grads: dict with the keys of FFNWeights"""
    act_name, gated, _, _ = FFN_ACT[kind]
    act_bwd = ACTIVATIONS[act_name][1]
    x, up, gate, act, h = cache
    g = {}
    dh, g["down"], g["down_b"] = linear_backward(dy, h, w.down, w.down_b is not None)   # [..., d_ff]
    if gated:
        dup = dh * act                                     # d(act * up)/d up
        dgate = act_bwd(dh * up, gate)                      # through act(gate)
        dx_gate, g["gate"], g["gate_b"] = linear_backward(dgate, x, w.gate, w.gate_b is not None)
    else:
        dup = act_bwd(dh, up)
        dx_gate = None
    dx, g["up"], g["up_b"] = linear_backward(dup, x, w.up, w.up_b is not None)
    if dx_gate is not None:
        dx += dx_gate
    return dx, {k: v for k, v in g.items() if v is not None}
