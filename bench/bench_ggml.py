"""arith="ggml" against arith="f32" on the same quantized model: prompt processing and decoding.

  python3 bench/bench_ggml.py [-m smollm2] [-t 1] [--prompt-tokens 64] [--decode 16] [--repeats 3]

For each arithmetic, the same model file (weights in their GGUF blocks both times):
  prompt   forward() over a prompt of --prompt-tokens ids (one batch, logits for every position)
  decode   --decode tokens, one forward_last() each against the KV cache (f16 in ggml mode)
Times are process CPU time per run (time.process_time: other jobs on a shared machine slow them
less than wall-clock time); the median over --repeats is reported, with the ratio ggml / f32
measured in this same process, the two arithmetics taking turns in each repeat. Threads: -t
(NUMBA_NUM_THREADS / OPENBLAS_NUM_THREADS, set before numba loads; default 1, the figures per
core; with more, CPU time is summed over the threads). The CPU model is printed with the load average.
"""
import argparse
import os
import statistics
import sys
import time


def _threads(argv):
    """-t N / --threads N from the command line, read before numba is imported (it fixes its pool then)"""
    for i, a in enumerate(argv):
        if a in ("-t", "--threads") and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--threads="):
            return a.split("=", 1)[1]
    return "1"


THREADS = _threads(sys.argv[1:])
for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[var] = THREADS

import numpy as np  # noqa: E402

from ffnlab.formats.installed import resolve_model  # noqa: E402
from ffnlab.formats.load import load  # noqa: E402
from ffnlab.quant import ggml_path  # noqa: E402
from machine import cpu_model  # noqa: E402


def cpu_time(f):
    t = time.process_time()
    f()
    return time.process_time() - t


def measure(models, ids, n_decode, repeats):
    """models: {arith: model} -> {arith: (median prompt seconds, median seconds per decoded token)}.
    The arithmetics take turns within each repeat, so a neighbour's load on a shared machine
    falls on both alike."""
    def prompt(model):
        return cpu_time(lambda: model.forward(ids))

    def decode(model):
        kv = model.new_cache(n_ctx=len(ids) + n_decode + 1)
        tok = int(np.argmax(model.forward_last(ids[:8], kv)))   # a short prompt, not timed
        t = time.process_time()
        for _ in range(n_decode):
            tok = int(np.argmax(model.forward_last([tok], kv)))
        return (time.process_time() - t) / n_decode

    for model in models.values():                            # compile (or load numba's cache), warm caches
        prompt(model), decode(model)
    times = {arith: ([], []) for arith in models}
    for _ in range(repeats):
        for arith, model in models.items():
            times[arith][0].append(prompt(model))
        for arith, model in models.items():
            times[arith][1].append(decode(model))
    return {arith: (statistics.median(p), statistics.median(d)) for arith, (p, d) in times.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("-t", "--threads", type=int, default=1, help="numba and BLAS threads (default 1)")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    path = resolve_model(args.model)
    rng = np.random.default_rng(0)
    models = {arith: load(path, arith=arith, progress=False) for arith in ("f32", "ggml")}
    ids = rng.integers(100, models["f32"].config.vocab_size - 100, args.prompt_tokens).tolist()
    results = measure(models, ids, args.decode, args.repeats)
    print(f"{os.path.basename(path)} on {cpu_model()}, {args.threads} thread(s), median CPU time of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.1f}; ggml mode on llama.cpp's {ggml_path.PATH} path\n")
    print("| arith | prompt (%d tokens) s | prompt tok/s | decode ms/token | decode tok/s |" % args.prompt_tokens)
    print("|---|---|---|---|---|")
    for arith, (p, d) in results.items():
        print(f"| {arith} | {p:.3f} | {args.prompt_tokens / p:.1f} | {d * 1e3:.1f} | {1 / d:.1f} |")
    (pf, df), (pg, dg) = results["f32"], results["ggml"]
    print(f"\nggml / f32 time: prompt {pg / pf:.2f}x, decode {dg / df:.2f}x (the ceiling: 1.5x)")


if __name__ == "__main__":
    main()
