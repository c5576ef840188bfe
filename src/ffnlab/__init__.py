"""ffnlab: a glass-box transformer lab in NumPy, centred on the MLP (FFN).

    import ffnlab
    model = ffnlab.load("model.gguf")                              # formats/load.py
    with ffnlab.trace(model, filter="ffn_") as t: ...             # tracing/api.py
    with ffnlab.hooks(model, {"ffn_out-5": fn}): ...             # interventions/api.py

The names below are imported on first use (PEP 562 module __getattr__): `import ffnlab` and
the command line's --help, argument errors and missing files then answer without importing
NumPy, numba and SciPy, which the model code needs and which take over a second to load.
"""
import importlib

__version__ = "0.1.0"

_LAZY = {                      # public name -> the module that defines it
    "load": ".formats.load",
    "Model": ".model",
    "trace": ".tracing",
    "hooks": ".interventions",
    "ModelConfig": ".config",
    "ConfigError": ".config",
}
__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name], __name__), name)
    globals()[name] = value                 # later lookups find it without calling here
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})
