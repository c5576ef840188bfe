"""The kinds of FFN (MLP) ffnlab computes: one table, read by the config's checks, the FFN's
forward and backward (model/ffn.py), the tracer's node names and the sizing tools."""
from typing import NamedTuple


class FFNKind(NamedTuple):
    act: str            # the activation, a key of ops/activations.py's ACTIVATIONS
    gated: bool         # act(gate(x)) * up(x) instead of act(up(x))
    node: str           # llama.cpp's node name of the activation (dense) or the GLU (gated)
    op: str             # the ggml op that node prints
    moe: bool = False   # a mixture of experts of this gated kind (model/ffn.py's MoE section)


# The one table of FFN kinds (config.py validates ModelConfig.ffn against it)
FFN_KINDS = {
    "gelu": FFNKind("gelu", False, "ffn_gelu", "GELU_ERF"),
    "gelu_tanh": FFNKind("gelu_tanh", False, "ffn_gelu", "GELU"),
    "relu": FFNKind("relu", False, "ffn_relu", "RELU"),
    "swiglu": FFNKind("silu", True, "ffn_swiglu", "SWIGLU"),
    "geglu": FFNKind("gelu_tanh", True, "ffn_geglu", "GEGLU"),
    "moe": FFNKind("silu", True, "ffn_moe_swiglu", "SWIGLU", moe=True),
}
