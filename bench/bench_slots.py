"""A grid of small training runs on one machine, three ways: in-process at one thread, `--ray local -t 1`
(a node of C CPUs runs C workers of one thread, so C runs train at once) and `--ray local -t C` (one
worker of C threads, one run at a time). Prints the wall seconds of each (Ray's start included), the
ratios, and whether the runs' figures equal the in-process ones.

    python bench/bench_slots.py                      # the activation claim's grid, 2 seeds (4 runs)
    python bench/bench_slots.py --seeds 5            # its full grid (10 runs)

One run of each way, one after the other; the CPU and the load average are printed with the figures
(another job on the machine takes the cores the workers would use: rerun on a quiet one).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


def grid(name, seeds, out, args):
    """-> wall seconds of `ffnlab experiment NAME --seeds S --out OUT ARGS`, and its runs"""
    cmd = [sys.executable, "-m", "ffnlab.cli.main", "experiment", name, "--seeds", str(seeds), "--out", out,
           "--json", *args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)}: {r.stderr.strip()[-400:]}")
    with open(os.path.join(out, "results", "results.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    return dt, [{k: v for k, v in x.items() if "second" not in k and "tokens_per_s" not in k} for x in runs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experiment", default="activation", help="experiments/NAME.toml (default activation)")
    ap.add_argument("--seeds", type=int, default=2, help="seeds per variant (default 2)")
    a = ap.parse_args()
    from machine import cpu_model
    cpus = os.cpu_count() or 1
    ways = [("in-process -t 1", ["-t", "1"]), (f"--ray local -t 1 ({cpus} workers)", ["-t", "1", "--ray", "local"]),
            (f"--ray local -t {cpus} (1 worker)", ["-t", str(cpus), "--ray", "local"])]
    load0 = os.getloadavg()[0]
    fig = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, args) in enumerate(ways):
            fig.append((label, *grid(a.experiment, a.seeds, os.path.join(tmp, str(i), "runs"), args)))
    print(f"{cpu_model()}, {cpus} CPUs; experiment {a.experiment}, {a.seeds} seeds; load average {load0:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    base = fig[0][1]
    for label, dt, runs in fig:
        print(f"  {label:32s} {dt:7.1f} s  ({base / dt:.2f}x in-process's speed)  {len(runs)} runs, figures equal to "
              f"in-process -t 1: {runs == fig[0][2]}")


if __name__ == "__main__":
    main()
