"""Compile (or load from numba's disk cache) the kernels a model's weights need, at load time.

numba compiles a kernel on its first call and caches the machine code on disk (cache=True, in
__pycache__ beside each source file, or NUMBA_CACHE_DIR), so the first load on a machine pays the
compilation and later loads only read the cache. Doing it here, on one row of each weight type,
keeps that cost out of the first timed product and lets the load line report it.

    warm_up(model, path, arith)   # at load (formats/gguf.py): every step below, once -> seconds

The work is a list of steps (warm_up_steps): the products per weight type, one decode step, the
prompt's row kernels. The first load on a machine compiles them all: 63 s of one core for SmolLM2
on an Intel Xeon with AVX-512, 2 cores (2026-12-01, measured on 33c6ed9's kernels). That load shows one progress line on stderr
("compiling kernels for this CPU, once, 5/11, ~25 s left") and splits the steps over worker
processes, one per core and one more (python -m ffnlab.runtime.warmup --worker), which compile them and write
the cache side by side; this process then loads every kernel from the cache. A stamp beside the
cache (stamp_path) records that this file's steps were compiled for these sources on this CPU,
so a later load runs the steps in-process only, reading the cache (~0.1 s). Without the stamp, or
on one core, the steps run in-process, with the same progress line when they take a while.

`python -m ffnlab.runtime.warmup [MODEL ...]` (runtime/warmup.py) compiles the kernels of installed models (default:
smollm2) ahead of the first run: scripts/install.sh does it.
"""
import dataclasses
from typing import Callable
import hashlib
import os
import select
import subprocess
import sys
import time

import numpy as np

from ..progress import Progress
from ..threads import available_cores, busy_cores
from ..quant.packed import R
from ..quant.simd import HAS_AVX512
from ..quant.tensor import QuantTensor

LABEL = "compiling kernels for this CPU, once"
KERNEL_FOLDERS = ("quant", "ops", "model")     # where the warm-up's kernels are written
FMT = "{desc}{postfix}"         # "compiling kernels for this CPU, once, 3/11, ~40 s left"


@dataclasses.dataclass
class Step:
    name: str          # what it compiles, for the progress line and the worker's command line
    run: Callable      # () -> None: the calls that compile or load the step's kernels
    group: str         # steps of one group share kernels (a decode step calls the one-token products):
    cost: float        # a worker takes a group whole; cost: CPU seconds to compile it cold (SmolLM2
                       # on the Xeon above: 63 s in all, the tiled product 18 s, the prompt's
                       # attention 17 s), for balancing the workers and the first estimate of the time left


def warm_up(model, path=None, arith="f32", progress=None) -> float:
    """Every step of warm_up_steps(model), compiled once per machine (by workers, when the stamp
    says this file's steps were never compiled here and there are cores for them), then loaded
    here from numba's cache. progress: None = a line on a terminal, False = none. -> seconds."""
    t0 = time.perf_counter()
    steps = warm_up_steps(model)
    stamp = stamp_path(model, arith, steps) if path else None
    # a worker per group up to one more than the cores: LLVM's memory while it compiles grows with
    # the kernels one process compiles (one worker with the one-token and the tiled products
    # peaked at 456 MB, against 232 MB for a warm run), and a third process on two cores costs
    # nothing in time, the compile being all CPU
    cores = available_cores()
    n_workers = min(cores + 1, len({s.group for s in steps})) if cores > 1 else 0
    work = sum(s.cost for s in steps)
    if stamp and not os.path.exists(stamp) and n_workers > 1:
        bar = Progress(work, LABEL, enabled=progress, fmt=FMT)
        _compile_in_workers(path, arith, steps, n_workers, bar)
        bar.close()
    bar = Progress(work, LABEL, enabled=progress, delay=1.0, fmt=FMT)   # shown only if this compiles
    t1, done = time.perf_counter(), 0.0
    with np.errstate(all="ignore"):                                    # zeros and a model's real rows:
        for i, s in enumerate(steps):                                  # what comes out is thrown away
            s.run()
            done += s.cost
            bar.update(s.cost, _note(i + 1, len(steps), done, work, time.perf_counter() - t1))
    bar.close()
    if stamp:
        _write_stamp(stamp)
    return time.perf_counter() - t0


def _note(n_done, n_steps, done, work, elapsed) -> str:
    """'3/11, ~15 s left' for steps run one after another: the time left at the pace so far,
    measured in the steps' costs."""
    return f"{n_done}/{n_steps}, ~{elapsed * (work - done) / done:.0f} s left"


def warm_up_steps(model) -> list:
    """-> [Step] for model: its weight types' products, one decode step, the prompt's row kernels."""
    return _product_steps(model.params) + [Step("decode step", lambda: compile_decode(model), "one-token", 4.0)] + \
        _prompt_steps(model)


def _product_steps(params) -> list:
    """The one-token product for every matrix type, the prompt's tiled product for the layers'
    matrices, the row lookup for the embedding tables, each on one row (packed: one row group).
    (The LM head's tiled product, for logits at every position, loads on first use.)"""
    steps, seen = [], set()
    for name, w in params.items():
        if not isinstance(w, QuantTensor):
            continue
        uses = ["matvec"] + (["matmul"] if name.startswith("blk.") else []) + (["lookup"] if "embd" in name else [])
        layout = "packed" if w.packed is not None else "blocks"
        for use in uses:
            key = (use, w.qtype, layout)
            if key in seen:
                continue
            seen.add(key)
            part = w[:min(w.shape[0], R)]                  # same array kinds as the model's: packed views, mapped rows
            call = {"matvec": lambda p=part: p.matvec(np.zeros(p.shape[1], np.float32)),
                    "matmul": lambda p=part: p.matmul(np.zeros((2, p.shape[1]), np.float32)),
                    "lookup": lambda p=part: p[np.zeros(1, np.int64)]}[use]
            # the one-token products go with the decode step, which calls them; the tiled ones alone
            steps.append(Step(f"{use} {w.qtype.name} {layout}", call, "one-token" if use != "matmul" else "prompt",
                              {"matvec": 6.0, "matmul": 18.0, "lookup": 0.2}[use]))
    return steps


def compile_decode(model) -> float:
    """One decode step (model/decode.py) on a throwaway one-position cache: its compiled calls
    (RMSNorm, RoPE + attention, the GLU; ggml's in arith "ggml") are loaded from numba's cache at
    load, not inside the first timed step (~55 ms for SmolLM2). The step runs one layer of each
    kind (the same weight types and shapes) and the first 64 rows of the LM head: it loads every
    kernel a step calls while reading ~1/30 of the weights, so nothing of a weight the cache has
    mapped (formats/pack_cache.py) is made resident before release_code() runs. -> seconds taken."""
    from .decode import decode_step
    t0 = time.perf_counter()
    w, cfg = model.weights(), model.config
    kinds = {}
    for L in w.layers:
        kinds.setdefault((_kind(L), L.window, L.rope), L)
    head = w.head[:min(R, w.head.shape[0])]
    decode_step(dataclasses.replace(w, layers=list(kinds.values()), head=head), cfg, 0, model.new_cache(n_ctx=1),
                model.arith)
    return time.perf_counter() - t0


def _prompt_steps(model) -> list:
    """The compiled calls a prompt makes besides the products (ops/fastmath.py: the softmax, the
    FFN's activation and gated product, RMSNorm and RoPE in float32, serial and parallel; the q/k
    pass of model/attention.py's unhooked path; the cached attention of model/decode_kernels.py),
    on a few values: loaded here, not in the first timed prefill, and before release_code().
    Only in float32 arithmetic on float32 weights (the path those kernels serve)."""
    from .decode_kernels import attend_rows
    from .arith import glu_halves
    from .ffn import FFN_KINDS
    from ..ops import fastmath
    from ..ops.activations import ACTIVATIONS
    from ..ops.norms import rmsnorm_forward
    from ..ops.rope import rope_forward
    from ..ops.softmax import softmax_forward
    if not (model.arith.name == "f32" and model.params["token_embd.weight"].dtype == np.float32):
        return []
    act = FFN_KINDS[model.config.ffn].act
    glu = act in ("silu", "gelu_tanh")
    z, x = np.zeros((1, 8), np.float32), np.zeros((2, 16), np.float32)

    def rows():
        softmax_forward(z)
        ACTIVATIONS[act].forward(np.zeros(8, np.float32))
        rmsnorm_forward(z, np.ones(8, np.float32), 1e-6)
        rmsnorm_forward(z, None, 1e-6)
        fastmath._rms_norm_parallel(x, np.ones(16, np.float32), np.float32(1e-6), x.copy(), x.copy(), np.zeros(2, np.float32))
        fastmath._rms_norm_parallel(x, np.zeros(0, np.float32), np.float32(1e-6), x.copy(), x.copy(), np.zeros(2, np.float32))

    def rope():
        q = np.zeros((1, 1, 1, 32), np.float32)
        rope_forward(q, np.ones((1, 16), np.float32), np.zeros((1, 16), np.float32), model.config.rope_pairing)
        q = np.zeros((1, 2, 1, 32), np.float32)
        fastmath._rope_parallel(q, np.ones((2, 16), np.float32), np.zeros((2, 16), np.float32), False, q.copy())

    def attention():                                   # attend_rows: head widths a multiple of 16
        q = np.zeros((1, 1, 1, 32), np.float32)
        attend_rows(q, np.zeros((1, 1, 2, 32), np.float32), np.zeros((1, 1, 2, 32), np.float32), 0, 0,
                    np.float32(1.0), np.empty_like(q), HAS_AVX512)

    def qk(kernel):                                    # both variants: C-contiguous rows, and a slice
        for a in (np.zeros((2, 1, 16), np.float32), np.zeros((2, 1, 32), np.float32)[:, :, :16]):
            for w in (np.ones(16, np.float32), np.zeros(0, np.float32)):
                kernel(a, w, np.float32(1e-6), w.shape[0] > 0, np.ones((2, 8), np.float32), np.zeros((2, 8), np.float32),
                       False, np.float32(1.0), False, np.zeros((2, 1, 16), np.float32), 2)

    def gated():
        gu = np.zeros((1, 16), np.float32)
        glu_halves(gu[:, :8], gu[:, 8:], act == "gelu_tanh", gu)
        fastmath._glu_parallel(x, 0, x, 8, act == "gelu_tanh", np.float32(0.8), np.float32(0.04),
                               np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32))

    steps = [Step("prompt rows", rows, "rows", 1.5), Step("prompt rope", rope, "rows", 1.8),
             Step("prompt attention", attention, "attention", 17.0),
             Step("prompt q/k serial", lambda: qk(fastmath._qk_serial), "qk", 1.7),
             Step("prompt q/k parallel", lambda: qk(fastmath._qk_parallel), "qk", 3.6)]
    return steps + ([Step("prompt gated product", gated, "rows", 1.1)] if glu else [])


# --- the first load on a machine: workers compile, the stamp remembers -----------------------------
def stamp_path(model, arith, steps):
    """The file that says the model's `steps` compiled here: in numba's cache folder, named by what
    the cache depends on (this CPU, numba, ffnlab's sources) and by the steps and the model's kind.
    None where there is no writable cache folder."""
    import llvmlite.binding as llvm
    import numba
    folder = numba.config.CACHE_DIR or os.path.join(os.path.dirname(os.path.abspath(__file__)), "__pycache__")
    if not os.access(folder if os.path.isdir(folder) else os.path.dirname(folder), os.W_OK):
        return None
    # the folders of the kernels (numba invalidates a file's cache when it changes): an edit
    # elsewhere needs no workers; a stale stamp costs only an in-process compile, with its line
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sources = sorted((os.path.relpath(os.path.join(d, f), package), os.stat(os.path.join(d, f)).st_mtime_ns)
                     for folder in KERNEL_FOLDERS for d, _, files in os.walk(os.path.join(package, folder))
                     for f in files if f.endswith(".py"))
    key = repr((llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), numba.__version__, sources,
                arith, [s.name for s in steps], _model_kinds(model)))
    return os.path.join(folder, f"ffnlab-warm-{hashlib.sha256(key.encode()).hexdigest()[:16]}")


def _model_kinds(model):
    """What of the model picks kernels besides the weight types (in the steps' names): the config's
    choices (norm, FFN kind, positions, ...), not its sizes, which numba's signatures do not hold,
    so that models of one family and types share a stamp."""
    cfg = dataclasses.asdict(model.config)
    return sorted((k, v) for k, v in cfg.items() if isinstance(v, (bool, str)) and k != "name")


def _write_stamp(stamp):
    try:
        os.makedirs(os.path.dirname(stamp), exist_ok=True)
        with open(stamp, "w") as f:
            f.write("compiled\n")
    except OSError:                                    # a read-only cache: the next load checks again
        pass


def _split(steps, n):
    """Groups of steps -> n lists of step indices with about equal cost (longest group first)."""
    groups = {}
    for i, s in enumerate(steps):
        groups.setdefault(s.group, []).append(i)
    bins = [[] for _ in range(n)]
    load = [0.0] * n
    for g in sorted(groups.values(), key=lambda ix: -sum(steps[i].cost for i in ix)):
        k = load.index(min(load))
        bins[k] += g
        load[k] += sum(steps[i].cost for i in g)
    return [sorted(b) for b in bins if b]


def _compile_in_workers(path, arith, steps, n_workers, bar):
    """Run the steps in n_workers processes (each: load the model without its warm-up, run its share,
    print 'done I SECONDS' per step); bar advances as they report, its time left redrawn every
    second. A worker that fails costs nothing but time: this process runs every step afterwards
    and compiles whatever is still missing."""
    env = {**os.environ, "NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    shares = _split(steps, n_workers)
    procs = [subprocess.Popen([sys.executable, "-m", "ffnlab.runtime.warmup", "--worker", path, arith,
                               ",".join(map(str, share))], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
             for share in shares]
    live = {p.stdout.fileno(): k for k, p in enumerate(procs)}
    left = [sum(steps[i].cost for i in share) for share in shares]      # each worker's cost still to do
    last = [time.perf_counter()] * len(procs)                           # its last report
    pace = Pace(max(1.0, (n_workers + (busy_cores() or 0.0)) / available_cores()))
    n_done = 0
    while live:
        ready, _, _ = select.select(list(live), [], [], 1.0)
        now = time.perf_counter()
        for fd in ready:
            k = live[fd]
            line = procs[k].stdout.readline()
            if not line:
                procs[k].wait()
                left[k] = 0.0
                del live[fd]
            elif line.startswith(b"done "):
                i, seconds = line.split()[1:3]
                c = steps[int(i)].cost
                pace.add(c, float(seconds))
                left[k], last[k], n_done = max(0.0, left[k] - c), now, n_done + 1
                bar.update(c)
        eta = max(max(0.0, r * pace.seconds_per_cost - (now - t)) for r, t in zip(left, last))
        bar.update(0, f"{n_done}/{len(steps)}, ~{eta:.0f} s left")


class Pace:
    """Seconds of wall time per unit of step cost, from the steps done; before any, a guess: the
    processes that want a core per core there is (this machine's others included)."""

    def __init__(self, guess):
        self.cost, self.seconds, self.guess = 0.0, 0.0, guess

    def add(self, cost, seconds):
        self.cost, self.seconds = self.cost + cost, self.seconds + seconds

    @property
    def seconds_per_cost(self):
        return self.seconds / self.cost if self.cost else self.guess


def _kind(value):
    """What decides the kernels a layer's step calls: the types, dtypes and shapes of its weights"""
    if isinstance(value, (tuple, list)):
        return tuple(_kind(v) for v in value)
    if dataclasses.is_dataclass(value):                            # LayerWeights, the experts' weights
        return (type(value).__name__,) + tuple(_kind(getattr(value, f.name)) for f in dataclasses.fields(value))
    return (type(value).__name__, getattr(value, "shape", None), str(getattr(value, "dtype", "")),
            getattr(value, "qtype", None), getattr(value, "packed", None) is None)

