"""Threads under contention: BLAS products with 1 and 2 threads, and ffnlab's default thread count.

  python3 bench/bench_threads.py [--seconds 1.5] [--part products|default|all] [-m MODEL] [--rounds 3]

Part "default" (ffnlab/threads.py's default_threads) runs `ffnlab run -m MODEL -n 32 --temp 0
--ignore-eos --json` as a user would, in two situations, and prints the decode and prefill times:
  idle     right after another ffnlab run (the 1-minute load average then reads ~1-1.6 on an
           idle 2-core machine): the default must match -t = all cores, within noise
  1 busy   beside `python3 -c "while True: pass"`: the default must stay within 1.5x of the best
           fixed -t
Each cell is the median of --rounds runs, interleaved (default, -t 1, ..., -t cores, then again), so
drift of the machine's load falls on every cell alike. The threads column is what the run used.

Part "products":
Why: on a shared machine `ffnlab run` decoded at 13 ms/token one time and 502 ms/token the next.
OpenBLAS splits a product across its threads and each thread waits for the others at the end; a
thread whose core another process holds finishes a scheduler slice later, and the whole product
waits for it. This measures that directly on three products of SmolLM2-135M's shapes:
  gemv up    [1536, 576] @ [576]       one decode step's ffn_up (2 threads above OpenBLAS's threshold)
  gemv head  [49152, 576] @ [576]      the LM head of one decode step (bandwidth-bound)
  gemm up    [128, 576] @ [576, 1536]  ffn_up over a 128-token prompt
For each (threads, load) the product is repeated for --seconds; the table shows the median, the
mean (what a loop of products costs), the 90th percentile and the worst call in microseconds,
and the ratio of the mean to the 1-thread mean without the extra load. The competing load is `python3 -c "while True: pass"` (one busy core). The
thread count is set with threadpoolctl, ffnlab's own control (ffnlab/threads.py).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np
from threadpoolctl import threadpool_limits
from machine import cpu_model

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--seconds", type=float, default=1.5, help="time per (op, threads, load) cell (default 1.5)")
ap.add_argument("--part", choices=("products", "default", "all"), default="all", help="which table (default all)")
ap.add_argument("-m", "--model", default="smollm2", help="the model of part default (default smollm2)")
ap.add_argument("--rounds", type=int, default=3, help="runs per cell of part default, median shown (default 3)")
args = ap.parse_args()


rng = np.random.default_rng(0)
OPS = {
    "gemv up [1536,576]@[576]": (rng.standard_normal((1536, 576), np.float32), rng.standard_normal(576, np.float32)),
    "gemv head [49152,576]@[576]": (rng.standard_normal((49152, 576), np.float32),
                                    rng.standard_normal(576, np.float32)),
    "gemm up [128,576]@[576,1536]": (rng.standard_normal((128, 576), np.float32),
                                     rng.standard_normal((576, 1536), np.float32)),
}


def timings(a, b, seconds):
    """-> per-call times in microseconds over `seconds` of back-to-back calls (after 3 warm-ups)."""
    for _ in range(3):
        a @ b
    out, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        a @ b
        out.append(1e6 * (time.perf_counter() - t))
    return out


def cell(a, b, threads, load):
    burner = None
    if load:
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        time.sleep(0.3)                                 # let it get its core
    try:
        with threadpool_limits(limits=threads):
            ts = sorted(timings(a, b, args.seconds))
    finally:
        if burner:
            burner.kill()
            burner.wait()
    return statistics.median(ts), statistics.fmean(ts), ts[int(0.9 * (len(ts) - 1))], ts[-1], len(ts)


def products():
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores visible, NumPy {np.__version__}; "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'product':30s} {'threads':>7s} {'load':>7s} {'median us':>10s} {'mean us':>10s} {'p90 us':>10s} "
          f"{'worst us':>10s} {'calls':>6s} {'mean vs 1 thread, no load':>26s}")
    for name, (a, b) in OPS.items():
        base = None
        for threads in (1, 2):
            for load in (False, True):
                med, mean, p90, worst, n = cell(a, b, threads, load)
                base = base or mean
                print(f"{name:30s} {threads:7d} {'1 busy' if load else 'none':>7s} {med:10.1f} {mean:10.1f} {p90:10.1f} "
                      f"{worst:10.1f} {n:6d} {mean / base:25.2f}x", flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


def ffnlab_run(threads):
    """One `ffnlab run` (-t threads, None: the default) -> (threads used, decode ms/token, prefill ms)."""
    cmd = [sys.executable, "-m", "ffnlab.cli.main", "run", "-m", args.model, "-p", "The capital of France is",
           "-n", "32", "--temp", "0", "--ignore-eos", "--json"] + ([] if threads is None else ["-t", str(threads)])
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    t = out["timings"]
    return out["threads"]["threads"], t["eval_ms"] / max(t["eval_tokens"], 1), t["prompt_ms"]


def default_threads_table():
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    choices = [None] + list(range(1, cores + 1))
    print(f"\nffnlab run -m {args.model} -n 32: decode ms/token and prefill ms, median of {args.rounds}; "
          f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'situation':10s} {'-t':>8s} {'threads':>8s} {'decode ms/tok':>14s} {'prefill ms':>11s} "
          f"{'decode vs best fixed':>21s}")
    ffnlab_run(None)                                   # the model's kernels and packed layout: cached
    for load in (False, True):
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load else None
        try:
            cells = {c: [] for c in choices}
            for _ in range(args.rounds):
                for c in choices:                      # each right after the previous run: "idle"
                    cells[c].append(ffnlab_run(c))
        finally:
            if burner:
                burner.kill()
                burner.wait()
        rows = {c: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v),
                    statistics.median(r[2] for r in v)) for c, v in cells.items()}
        best = min(rows[c][1] for c in choices if c is not None)
        for c, (used, dec, pre) in rows.items():
            print(f"{'1 busy' if load else 'idle':10s} {'default' if c is None else str(c):>8s} {used:8g} {dec:14.2f} "
                  f"{pre:11.1f} {dec / best:20.2f}x", flush=True)


if args.part in ("products", "all"):
    products()
if args.part in ("default", "all"):
    default_threads_table()
