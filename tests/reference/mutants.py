"""A compiled-kernel module with one line changed, for tests that prove a kernel check can fail.

As tests/model/test_mistakes.py's mutated(), for numba modules: the copy has no source file, so
numba cannot cache its kernels; cache=True is turned off in it."""
import inspect
import types


def mutated_module(module, *edits):
    """A fresh copy of `module` with each (old, new) source edit applied (each `old` occurs exactly
    once) and numba's disk cache off."""
    src = inspect.getsource(module)
    for old, new in edits:
        assert src.count(old) == 1, f"{module.__name__}: {old!r} occurs {src.count(old)} times"
        src = src.replace(old, new)
    src = src.replace("cache=True", "cache=False")
    copy = types.ModuleType(module.__name__ + "_mutated")
    copy.__package__ = module.__package__                 # relative imports resolve to the real package
    exec(compile(src, f"<mutated {module.__file__}>", "exec"), copy.__dict__)
    return copy
