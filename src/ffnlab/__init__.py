"""ffnlab: a glass-box transformer lab in NumPy, centred on the MLP (FFN)."""
from .config import ConfigError, ModelConfig
from .formats.load import load
from .model import Model
from . import trace             # ffnlab.trace(model, filter=...): see trace/__init__.py

__version__ = "0.1.0"
