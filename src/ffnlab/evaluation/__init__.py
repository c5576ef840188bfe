"""Evaluation: perplexity (llama-perplexity's convention) and the neuron view of the MLP."""
