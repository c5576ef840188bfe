"""ffnlab: a glass-box transformer lab in NumPy, centred on the MLP (FFN)."""
from .config import ConfigError, ModelConfig
from .formats.load import load
from .model import Model

__version__ = "0.1.0"
