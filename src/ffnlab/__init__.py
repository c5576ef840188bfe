"""ffnlab: a glass-box transformer lab in NumPy, centred on the MLP (FFN)."""
from .config import ConfigError, ModelConfig
from .formats.load import load
from .model import Model
from .tracing import trace      # with ffnlab.trace(model, filter=...) as t: ...  (tracing/api.py)
from .interventions import hooks  # with ffnlab.hooks(model, {"ffn_out-5": fn}): ...  (interventions/api.py)

__version__ = "0.1.0"
