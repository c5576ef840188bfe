"""The prefill product's float32 GEMM (quant/gemm.py) against OpenBLAS's sgemm, one thread.

  python3 bench/bench_gemm.py [--tokens 100] [--repeats 50]

For each [tokens, n] x [n, rows] shape of a prefill tile (Gemma 3's and SmolLM2's layers, ~1 MB of
float32 weights): OpenBLAS (NumPy's matmul) over the weights as a [n, rows] array, and gemm_strips
over the same weights as 16-row strips. G multiply-adds per second of process CPU time, median over
the repeats, and the ratio; the CPU model is printed. OPENBLAS_NUM_THREADS and NUMBA_NUM_THREADS
are set to 1 before the imports.
"""
import argparse
import os
import time

for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402

from ffnlab.quant import gemm  # noqa: E402
from machine import cpu_model  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--tokens", type=int, default=100)
ap.add_argument("--repeats", type=int, default=50)
args = ap.parse_args()

SHAPES = [(640, 384), (640, 1536), (1024, 384), (2048, 128), (576, 384), (1536, 128)]   # (n, rows)


def cpu_median(f):
    f()                                                     # compile or load from the cache, warm caches
    times = []
    for _ in range(args.repeats):
        t = time.process_time()
        f()
        times.append(time.process_time() - t)
    return float(np.median(times))


print(f"{cpu_model()}, 1 thread, {args.tokens} tokens, AVX2 kernel: {gemm.HAS_AVX2}, AVX-512 kernel: {gemm.HAS_AVX512}")
print("| n x rows | OpenBLAS G MAC/s | gemm_strips G MAC/s | ratio |")
print("|---|---:|---:|---:|")
rng = np.random.default_rng(0)
ratios = []
for n, rows in SHAPES:
    x = rng.standard_normal((args.tokens, n)).astype(np.float32)
    w = rng.standard_normal((n, rows)).astype(np.float32)                       # [n, rows]
    strips = np.ascontiguousarray(w.reshape(n, rows // gemm.STRIP, gemm.STRIP).transpose(1, 0, 2))
    y = np.empty((args.tokens, rows), np.float32)
    macs = args.tokens * n * rows
    t_blas = cpu_median(lambda: np.matmul(x, w, out=y))
    t_ours = cpu_median(lambda: gemm.gemm_strips(strips, x, y, 0, 0, -1, gemm.HAS_AVX512))
    ratios.append(t_blas / t_ours)
    print(f"| {n} x {rows} | {macs / t_blas / 1e9:.1f} | {macs / t_ours / 1e9:.1f} | {t_blas / t_ours:.2f}x |")
print(f"\nmedian speed-up over OpenBLAS: {np.median(ratios):.2f}x")
