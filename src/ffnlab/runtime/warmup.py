"""Compiling the kernels of a model ahead of its first use, from the command line (model/warmup.py
does the work at load):

    python -m ffnlab.runtime.warmup [MODEL ...]            what scripts/install.sh runs (default: smollm2)
    python -m ffnlab.runtime.warmup --worker PATH ARITH I,J,...     one of model/warmup.py's compile workers
"""
import sys
import time

import numpy as np

from ..errors import FfnlabError
from ..formats.gguf import load_gguf
from ..formats.installed import resolve_model
from ..formats.load import load
from ..model.warmup import warm_up_steps


def worker(path, arith, indices):
    """One worker's share: the model's steps at these indices, each reported with its seconds."""
    model = load_gguf(path, arith=arith, warm=False)
    steps = warm_up_steps(model)
    with np.errstate(all="ignore"):
        for i in indices:
            t = time.perf_counter()
            steps[i].run()
            print(f"done {i} {time.perf_counter() - t:.3f}", flush=True)


def main(argv=None):
    """Compile the kernels of installed models for this CPU, once (what scripts/install.sh runs).

    python -m ffnlab.runtime.warmup [MODEL ...]: load each model (default smollm2), which compiles
    its kernels with the progress line, or only reads numba's cache when they are there."""
    import argparse
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        worker(argv[1], argv[2], [int(i) for i in argv[3].split(",") if i])
        return 0
    p = argparse.ArgumentParser(prog="python -m ffnlab.runtime.warmup", description=main.__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=["smollm2"], help="installed model names or GGUF paths")
    p.add_argument("--arith", choices=("f32", "ggml"), default="f32", help="the arithmetic to compile for")
    args = p.parse_args(argv)
    for name in args.models:
        try:
            m = load(resolve_model(name), arith=args.arith)
        except FfnlabError as e:
            print(f"ffnlab warm-up: error: {e}", file=sys.stderr)
            return 1
        print(f"ffnlab warm-up: {name}: kernels ready ({m.compile_seconds:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
