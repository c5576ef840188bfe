"""ggml mode's quantized products, per matrix: the int8 kernels (quant/ggml_int8.py, ggml_int8_k.py:
ggml's vpmaddubsw / vpmaddwd) against the float kernels they replace on AVX2 hosts
(quant/ggml_packed.py, ggml_packed_k.py) and against OpenBLAS's float32 GEMM on the same shape
(the f32 mode's prompt products).

  python3 bench/bench_ggml_kernels.py [--repeats 20]

Shapes are SmolLM2's (Q4_1 gate/up [1536, 576], down [576, 1536], Q8_0 vocabulary rows), Gemma 3's
(Q5_0 gate/up, Q4_K attention output and down, Q6_K down) and a Q4_0; random blocks, activations quantized as ggml does (not timed). One
thread, median process CPU time; G MAC/s = rows x n x tokens / time. The CPU model and the load
average are printed (a neighbour's load on a shared machine slows every column alike).
"""
import argparse
import os
import statistics
import sys
import time

for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[var] = "1"

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as T  # noqa: E402

from ffnlab.quant import ggml_packed, simd  # noqa: E402
from ffnlab.quant.blocks import table_for  # noqa: E402
from ffnlab.quant.ggml_quants import Q8Rows  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))
from ggml_blocks import PAIRS, activations, random_blocks  # noqa: E402
from bench_ggml import cpu_model  # noqa: E402

SHAPES = [(T.Q4_1, 1536, 576), (T.Q4_1, 576, 1536), (T.Q8_0, 4096, 576), (T.Q4_0, 1536, 576), (T.Q5_0, 1536, 640),
          (T.Q4_K, 640, 1024), (T.Q4_K, 640, 2048), (T.Q6_K, 640, 2048)]


def median_time(f, repeats):
    f()
    times = []
    for _ in range(repeats):
        t = time.process_time()
        f()
        times.append(time.process_time() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if not simd.HAS_AVX2:
        sys.exit("this CPU has no AVX2 (or NUMBA_CPU_NAME is set): the int8 kernels do not run here")
    rng = np.random.default_rng(0)
    print(f"{cpu_model()}, 1 thread, median CPU time of {args.repeats}; load average {os.getloadavg()[0]:.1f}\n")
    print("| type | [rows, n] | tokens | float kernels G MAC/s | int8 G MAC/s | OpenBLAS f32 G MAC/s | int8 / float speed | int8 / BLAS speed |")
    print("|---|---|---|---|---|---|---|---|")
    for qtype, rows, n in SHAPES:
        data = random_blocks(qtype, rows, n, rng)
        new = ggml_packed.pack(int(qtype), data, table_for(qtype), n, int8=True)
        old = ggml_packed.pack(int(qtype), data, table_for(qtype), n, int8=False)
        w = rng.standard_normal((n, rows)).astype(np.float32)
        for N in (1, 4, 64) if qtype in (T.Q4_K, T.Q6_K) else (1, 64):   # K: vec_dot below 8 tokens
            x = activations(rng, N, n)
            a = Q8Rows(PAIRS[qtype][0], x)
            reps = args.repeats * (10 if N == 1 else 1)
            t_old = median_time(lambda: old.mul_q8(a), reps)
            t_new = median_time(lambda: new.mul_q8(a), reps)
            t_blas = median_time(lambda: x @ w, reps)
            g = rows * n * N / 1e9
            print(f"| {qtype.name} | [{rows}, {n}] | {N} | {g / t_old:.1f} | {g / t_new:.1f} | {g / t_blas:.1f} | "
                  f"{t_old / t_new:.2f}x | {t_blas / t_new:.2f}x |")


if __name__ == "__main__":
    main()
