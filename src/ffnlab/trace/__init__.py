"""Tracing: every named intermediate tensor of a forward pass, under llama.cpp's node names.

`ffnlab.trace` is both this package and a function: `with ffnlab.trace(model) as t:` calls
api.trace, while `ffnlab.trace.Tracer` etc. are the package's names. (The package module's
class is swapped for a callable one, so neither use shadows the other.)
"""
import sys
import types

from .api import trace as _trace
from .finite import NonFiniteError
from .tracer import Node, Tracer, ggml_shape


class _CallablePackage(types.ModuleType):
    def __call__(self, model, **kwargs):
        return _trace(model, **kwargs)

    __call__.__doc__ = _trace.__doc__


sys.modules[__name__].__class__ = _CallablePackage
