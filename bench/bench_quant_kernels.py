"""Throughput of each quant kernel on one thread: weights per second, against NumPy's float32 gemv.

  python3 bench/bench_quant_kernels.py [--rows 1536] [--cols 576] [--repeats 200] [TYPE ...]

For each ggml type: random blocks of a [rows, cols] matrix (tests/reference/quant_blocks.py), then
  dequant   QuantTensor.dequantize() into float32 (the prefill path's tile work)
  matvec    the row kernels on the blocks as they lie in the file (quant/kernels.py), W x
  packed    the decode kernel a loaded model runs: the blocks packed row-interleaved
            (quant/packed.py; "-" for the types that keep the row kernels)
  f32 gemv  NumPy/OpenBLAS on the dequantized float32 matrix (the reference the blocks replace)
Times are process CPU time (time.process_time), minimum over the repeats, so that other jobs on a
shared machine slow the figures less than wall-clock time would; NUMBA_NUM_THREADS and
OPENBLAS_NUM_THREADS are set to 1 before the imports.
"""
import argparse
import os
import sys
import time

for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from gguf import GGMLQuantizationType as T  # noqa: E402
from quant_blocks import random_blocks  # noqa: E402

from ffnlab.quant import KERNEL_TYPES, QuantTensor  # noqa: E402


def cpu_min(f, repeats):
    f()                                                     # compile or load from the cache, warm caches
    best = float("inf")
    for _ in range(repeats):
        t = time.process_time()
        f()
        best = min(best, time.process_time() - t)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1536)
    ap.add_argument("--cols", type=int, default=768, help="a multiple of 256 (default 768)")
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("types", nargs="*", default=[t.name for t in KERNEL_TYPES])
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n = args.rows * args.cols
    print(f"[{args.rows}, {args.cols}] matrix, 1 thread, min CPU time of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| type | bytes/weight | dequant Gw/s | matvec Gw/s | packed Gw/s | f32 gemv Gw/s | packed / gemv |")
    print("|---|---|---|---|---|---|---|")
    for name in args.types:
        w = QuantTensor(random_blocks(T[name], args.rows, args.cols, rng), T[name], (args.rows, args.cols))
        x = rng.normal(size=args.cols).astype(np.float32)
        f32 = w.dequantize()
        deq, mv, gemv = (cpu_min(f, args.repeats) for f in (w.dequantize, lambda: w.matvec(x), lambda: f32 @ x))
        p = QuantTensor(w.data, w.qtype, w.shape)
        pk = cpu_min(lambda: p.matvec(x), args.repeats) if p.pack(release=False) else None
        best = pk if pk is not None else mv
        print(f"| {name} | {w.nbytes / n:.3f} | {n / deq / 1e9:.2f} | {n / mv / 1e9:.2f} | "
              f"{'-' if pk is None else f'{n / pk / 1e9:.2f}'} | {n / gemv / 1e9:.2f} | {gemv / best:.2f} |")


if __name__ == "__main__":
    main()
