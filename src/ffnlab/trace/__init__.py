from .tracer import Node, Tracer, ggml_shape
