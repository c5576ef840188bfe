"""What the hooks cost: ffnlab's forward with nothing attached vs the same forward built without them.

  python3 bench/bench_tracer.py [-m MODEL.gguf] [-T 1,32] [--repeats 15] [--threads 1]

Every node of the model is `x = hook(name, x, op, srcs)` (model/hooks.py); with nothing attached
the hook is the identity function. The reference here is a copy of the model code without them:
the sources of model/{ffn,attention,block,transformer}.py are parsed, every `hook(name, x, ...)`
call is replaced by its value argument `x` in the syntax tree, and the result is compiled as a
separate set of modules wired to each other. The script checks that no hook call is left in the
copy and that its logits are bit-identical to the real forward's before timing anything.

Timed, per forward of T tokens (no KV cache), sides alternating, medians of R repeats after 2
warm-ups:
  no hooks        the stripped copy
  nothing attached    the real code, identity hooks (what every user runs)
  Tracer(keep=False)  names, ops and shapes recorded, no copies
  Tracer()        every node's array copied (what `ffnlab trace` / verify do)
Model: the default SmolLM2-135M GGUF (or -m), else a random model with SmolLM2-135M's config.

On a shared, busy machine the medians move by more than the hooks cost, so the script also
times the hook itself -- a call of the identity hook with a constant sources tuple, as in the
model -- and multiplies by the number of nodes: the overhead bound printed last.
"""
import argparse
import ast
import timeit
import inspect
import os
import sys
import time
import types

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("-m", "--model", default=None, help="a GGUF file (default: SmolLM2-135M Q4_1 if installed)")
ap.add_argument("-T", default="1,32", help="comma-separated token counts (default 1,32)")
ap.add_argument("--repeats", type=int, default=15, help="timed repeats per side (default 15)")
ap.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
args = ap.parse_args()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402  (after the thread variables)

import ffnlab  # noqa: E402
from ffnlab.model import attention, block, ffn, transformer  # noqa: E402
from ffnlab.model.hooks import Hooks, identity  # noqa: E402
from ffnlab.tracing import Tracer  # noqa: E402

HOOK_NAMES = {"hook"}


class StripHooks(ast.NodeTransformer):
    """Replace every `hook(name, x, ...)` call by `x` (the value the identity hook returns)."""

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id in HOOK_NAMES:
            return node.args[1]
        return node


def hook_calls_left(tree):
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id in HOOK_NAMES]


def stripped(mod):
    tree = ast.fix_missing_locations(StripHooks().visit(ast.parse(inspect.getsource(mod))))
    left = hook_calls_left(tree)
    if left:
        sys.exit(f"{mod.__name__}: {len(left)} hook calls survive stripping (line {left[0].lineno}); "
                 "update StripHooks")
    m = types.ModuleType(mod.__name__ + "_nohooks")
    m.__package__ = mod.__package__                       # relative imports resolve as in the original
    exec(compile(tree, mod.__file__ + " (no hooks)", "exec"), m.__dict__)
    return m


s_ffn, s_attn, s_block, s_tr = (stripped(m) for m in (ffn, attention, block, transformer))
s_block.ffn_forward = s_ffn.ffn_forward                       # wire the copies to each other
s_block.attention_forward_layer = s_attn.attention_forward_layer
s_tr.block_forward, s_tr.norm_forward = s_block.block_forward, s_block.norm_forward

path = args.model
if path is None:
    try:
        from ffnlab.formats.load import default_model_path
        path = default_model_path()
    except ffnlab.errors.FfnlabError:
        path = None
if path:
    model = ffnlab.load(path, progress=False)
    what = os.path.basename(path)
else:
    from ffnlab.config import ModelConfig
    model = ffnlab.Model.random(ModelConfig(arch="llama", n_layer=30, d_model=576, n_head=9, n_kv_head=3, d_ff=1536,
                                            ffn="swiglu", norm="rmsnorm", positions="rope", vocab_size=49152,
                                            n_ctx=2048, tie_embeddings=True))
    what = "random SmolLM2-135M config"
p, cfg = model.params, model.config
kw = {"weights": model.weights()} if "weights" in inspect.signature(transformer.forward).parameters else {}

print(f"model: {what}; {args.threads} BLAS thread(s); medians of {args.repeats}")
print(f"{'T':>4} {'no hooks':>10} {'nothing att.':>12} {'ratio':>7} {'keep=False':>11} {'ratio':>7} {'Tracer()':>10} {'ratio':>7} {'nodes':>6}")
rng = np.random.default_rng(0)
for T in (int(t) for t in args.T.split(",")):
    ids = rng.integers(0, cfg.vocab_size, size=(1, T))
    ref = s_tr.forward(p, cfg, ids, **kw)[0]
    real = transformer.forward(p, cfg, ids, **kw)[0]
    assert np.array_equal(ref, real), "the stripped copy does not compute the same logits"
    sides = {
        "nohooks": lambda: s_tr.forward(p, cfg, ids, **kw),
        "none": lambda: transformer.forward(p, cfg, ids, **kw),
        "shapes": lambda: transformer.forward(p, cfg, ids, hooks=Hooks(Tracer(keep=False, params=p)), **kw),
        "copies": lambda: transformer.forward(p, cfg, ids, hooks=Hooks(Tracer(params=p)), **kw),
    }
    times = {k: [] for k in sides}
    for _ in range(2):
        for f in sides.values():
            f()
    for _ in range(args.repeats):
        for k, f in sides.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: float(np.median(v)) * 1000 for k, v in times.items()}
    t = Tracer(keep=False, params=p)
    transformer.forward(p, cfg, ids, hooks=Hooks(t), **kw)
    base = med["nohooks"]
    print(f"{T:>4} {base:>8.2f}ms {med['none']:>10.2f}ms {med['none'] / base:>7.3f} {med['shapes']:>9.2f}ms "
          f"{med['shapes'] / base:>7.3f} {med['copies']:>8.2f}ms {med['copies'] / base:>7.3f} {len(t.nodes):>6}")


def hook_calls(hook=identity, n=1000):
    x = None
    for _ in range(n):
        x = hook("ffn_up", x, "MUL_MAT", ("ffn_up.weight", "ffn_norm"))
    return x


def no_calls(hook=identity, n=1000):
    x = None
    for _ in range(n):
        x = x
    return x


per_loop = min(timeit.repeat(lambda: hook_calls(n=1000), number=200, repeat=5)) / 200 / 1000
empty = min(timeit.repeat(lambda: no_calls(n=1000), number=200, repeat=5)) / 200 / 1000
per_check = per_loop - empty
n_nodes = len(t.nodes)
print(f"identity hook call: {per_check * 1e9:.1f} ns; x {n_nodes} nodes = "
      f"{per_check * n_nodes * 1e6:.1f} us per forward = {per_check * n_nodes * 1e3 / med['none'] * 100:.4f}% "
      f"of the T={T} forward with nothing attached")
