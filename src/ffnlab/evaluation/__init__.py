"""Evaluation: perplexity (llama-perplexity's convention), the neuron view of the MLP, expert routing.

The constant below is here, not in activations.py, so that a command's --help can show it without
importing NumPy and the model."""

DEFAULT_MIN_CONTEXT = 16       # text tokens a scored token has before it in its window (--min-context)
