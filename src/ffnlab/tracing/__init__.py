"""Tracing: every named intermediate tensor of a forward pass, under llama.cpp's node names.

    with ffnlab.trace(model, filter="ffn_") as t:     # ffnlab.trace is tracing.api.trace
        model.forward(ids)
    t["ffn_swiglu-0"]
"""
from .api import trace
from .finite import NonFiniteError
from .tracer import Node, Tracer, ggml_shape
