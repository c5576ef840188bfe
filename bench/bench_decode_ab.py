"""Decode A/B of two source trees: milliseconds and Python calls per decoded token, same machine, alternating.

  git worktree add /tmp/base COMMIT
  python3 bench/bench_decode_ab.py /tmp/base/src src [-m smollm2,gemma3] [--rounds 3] [--threads 2]

Each round runs one fresh process per tree (the order flips every round), each with its own
FFNLAB_CACHE_DIR so the two trees' packed-weight caches never meet. A process loads the model,
prefills a 64-token prompt, then times --steps single-token steps (Model.forward_last on the cache)
--repeats times and reports the fastest and the median repeat after the first; one more pass under
cProfile counts the Python function calls per token (deterministic: it does not depend on the
machine's load, so it shows where a step's interpreter overhead grew even when the times are noisy).
bench_generate.py measures decode against llama.cpp; this one compares ffnlab with itself.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import cProfile, json, os, pstats, sys, time
import numpy as np
import ffnlab
from ffnlab.threads import set_threads
set_threads(int(sys.argv[2]))
sys.path.insert(0, sys.argv[1]); import models as M
out = {"ffnlab": os.path.dirname(ffnlab.__file__)}
for name in sys.argv[5].split(","):
    m = ffnlab.load(M.model_path(name), progress=False)
    steps, repeats = int(sys.argv[3]), int(sys.argv[4])
    def run(n):
        kv = m.new_cache(n_ctx=64 + n + 1)
        tok = int(np.argmax(m.forward_last(list(range(100, 164)), kv)))
        t = time.perf_counter()
        for _ in range(n):
            tok = int(np.argmax(m.forward_last([tok], kv)))
        return (time.perf_counter() - t) / max(n, 1) * 1e3
    times = [run(steps) for _ in range(repeats)]
    ms = sorted(times[1:] if repeats > 1 else times)   # the first repeat warms the caches
    pr = cProfile.Profile(); pr.runcall(run, 8)
    calls = pstats.Stats(pr).total_calls
    pr = cProfile.Profile(); pr.runcall(run, 0)
    out[name] = {"ms_min": ms[0], "ms_median": ms[len(ms) // 2],
                 "calls_per_token": (calls - pstats.Stats(pr).total_calls) / 8}
print(json.dumps(out))
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the base tree's src/ directory")
    ap.add_argument("new", help="the new tree's src/ directory")
    ap.add_argument("-m", "--models", default="smollm2,gemma3", help="comma-separated: smollm2, gemma3")
    ap.add_argument("--rounds", type=int, default=3, help="processes per tree (default 3)")
    ap.add_argument("--threads", type=int, default=2, help="threads (default 2)")
    ap.add_argument("--steps", type=int, default=48, help="decoded tokens per repeat (default 48)")
    ap.add_argument("--repeats", type=int, default=4, help="timed repeats per process (default 4)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    from machine import cpu_model
    ref = os.path.join(here, "..", "tests", "reference")
    caches = {t: tempfile.mkdtemp(prefix=f"ffnlab-ab-{t}-") for t in ("base", "new")}
    print(f"{cpu_model()}, {os.cpu_count()} CPUs, {args.threads} threads, {args.steps} tokens x {args.repeats} "
          f"repeats a process, load average {os.getloadavg()[0]:.2f} at the start")
    rows = {t: [] for t in ("base", "new")}
    for r in range(args.rounds):
        for tree in (("base", "new") if r % 2 == 0 else ("new", "base")):
            env = dict(os.environ, PYTHONPATH=getattr(args, tree), FFNLAB_CACHE_DIR=caches[tree])
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
                env[var] = str(args.threads)
            p = subprocess.run([sys.executable, "-c", CHILD, ref, str(args.threads), str(args.steps),
                                str(args.repeats), args.models], env=env, capture_output=True, text=True)
            if p.returncode:
                sys.exit(f"{tree} ({getattr(args, tree)}): {p.stderr.strip().splitlines()[-1]}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            rows[tree].append(res)
            print(f"round {r + 1} {tree:4s} " + "  ".join(
                f"{m}: {res[m]['ms_min']:.2f} / {res[m]['ms_median']:.2f} ms, {res[m]['calls_per_token']:.0f} calls"
                for m in args.models.split(",")))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    for m in args.models.split(","):
        best = {t: min(x[m]["ms_min"] for x in rows[t]) for t in rows}
        print(f"{m}: fastest ms/token base {best['base']:.2f}, new {best['new']:.2f} "
              f"(new / base {best['new'] / best['base']:.3f}); Python calls per token "
              f"{rows['base'][0][m]['calls_per_token']:.0f} -> {rows['new'][0][m]['calls_per_token']:.0f}")


if __name__ == "__main__":
    main()
