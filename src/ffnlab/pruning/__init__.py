"""Structured pruning of MLP hidden units: rank, select, cut, and write a smaller GGUF."""
