"""Interventions: consumers of the model's hook points (model/hooks.py) that change what they see.

  hooks(model, {pattern: fn})   edit nodes during forward / forward_last / generate (api.py)
  patch                         activation patching, clean -> corrupt (patching.py)
  causal_trace                  ROME's causal tracing: noised subject, restored states (causal_trace.py)
  logit_lens                    each layer's residual through the final norm and head (lens.py)
  attribute                     direct logit attribution of MLP units (attribution.py)
"""
from .api import capture, hooks, node_names
