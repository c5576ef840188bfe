"""Single BLAS products with 1 and 2 threads, with and without a competing process on one core.

  python3 bench/bench_threads.py [--seconds 1.5]

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
