"""Prefill, decode, load time and peak memory: ffnlab vs llama.cpp vs HF transformers on a GGUF.

  python3 bench/bench_generate.py [-m smollm2|gemma3|FILE.gguf] [--threads 2] [--repeats 3] [-T 100] [-n 128]
  python3 bench/make_big_gguf.py /tmp/llama7b-q4_0.gguf        # 3.9 GB of random Q4_0 blocks, Llama 2 7B's shapes
  python3 bench/bench_generate.py -m /tmp/llama7b-q4_0.gguf --big --skip hf --threads 1 --repeats 1 -T 16 -n 8

All three engines run the same GGUF file and the same T prompt ids, on the same number of threads:
  ffnlab        weights kept in their GGUF blocks (quant/), numba kernels + OpenBLAS, the threads
                set through ffnlab.threads
  llama.cpp     llama-cpp-python's C API with llama.cpp's default settings (quantized weights,
                repacked where it can, f16 KV cache, flash attention auto), n_threads = n_threads_batch
  transformers  AutoModelForCausalLM.from_pretrained(dir, gguf_file=...) in float32, eager PyTorch,
                torch.set_num_threads, a forward loop with its KV cache (past_key_values)
prefill: one forward over the T prompt tokens, logits for the last position only (tokens / s = T / time);
decode: then n single-token steps, each feeding the previous greedy token (tokens / s = n / time).
Each repeat runs the engines one after the other from an empty cache, so a machine whose load
changes slows them alike: first --prefills prefills alone, the engines taking turns, then one
prefill + decode run each; the engines' order flips every repeat. The table shows the medians
(prefill: over all of an engine's prefills, (prefills + 1) x repeats of them; a prefill takes
~0.1-0.3 s and the shared VM's speed swings by up to 1.5x within seconds, so one sample a
repeat left the median's ratio moving by +-0.2 between runs), after one untimed warm-up per
engine. Greedy tokens are printed so a broken engine shows.
Load time and peak RSS come from fresh processes, one per engine and repeat: `ffnlab run
--ignore-eos --json` (its load line; the numba kernels and the packed weights come from their disk
caches after the first run, formats/pack_cache.py; each run says which) and a llama.cpp process doing the same work (load, prefill, n decode steps); each
reports its own peak RSS (VmHWM) at the end.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threads", type=int, default=2, help="threads for every engine (default 2)")
ap.add_argument("--repeats", type=int, default=3, help="timed repeats per engine (default 3)")
ap.add_argument("-T", type=int, default=100, dest="T", help="prompt tokens for prefill (default 100)")
ap.add_argument("-n", type=int, default=128, dest="n", help="decoded tokens (default 128)")
ap.add_argument("--prefills", type=int, default=3,
                help="extra prefill-only runs per engine and repeat, the engines taking turns (default 3)")
ap.add_argument("-m", "--model", default="smollm2",
                help="smollm2 (SmolLM2-135M-Instruct Q4_1, default), gemma3 (Gemma 3 270M Q4_K_M) or a GGUF file")
ap.add_argument("--skip", default="", help="comma-separated engines to leave out: ffnlab,llama.cpp,hf,memory")
ap.add_argument("--big", action="store_true",
                help="the 7B-class file of bench/make_big_gguf.py: its floors (decode >= 0.5x, peak RSS <= 6 GB)")
ap.add_argument("--child", default=None, help=argparse.SUPPRESS)   # internal: a llama.cpp run on these ids (a file)
args = ap.parse_args()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402  (after the thread variables)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import models as M  # noqa: E402  (tests/reference/models.py: the llama.cpp C-API wrapper, shared GGUF readers)

if args.child is None:           # a llama.cpp child measures llama.cpp's memory, not ffnlab's imports
    import ffnlab
    from ffnlab.threads import set_threads
    set_threads(args.threads)
# the floors the two real models are held to: (decode / llama.cpp, prefill / llama.cpp, RSS / llama.cpp, load s)
FLOORS = {"smollm2": (0.7, 1.5, 1.5, 0.5), "gemma3": (0.6, 1.5, 1.5, None)}
BIG_FLOORS = (0.5, None, None, None)     # and, separately: peak RSS <= 6 GB, logits cosine >= 0.99 everywhere
BIG_RSS = 6e9
BIG_COSINE = 0.99

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


def logits_cosine(path, ids):
    """Cosine between ffnlab's and llama.cpp's logits at every prompt position (llama.cpp with its
    default numerics: 8-bit activation blocks, f16 KV cache), one forward each. -> [T]"""
    ours = ffnlab.load(path, progress=False).forward(np.asarray(ids)).reshape(len(ids), -1).astype(np.float64)
    ref = M.LlamaCpp(path, n_ctx=max(64, len(ids) + 8), n_threads=args.threads, reference=False)
    theirs = ref.logits(ids).astype(np.float64)
    del ref
    return (ours * theirs).sum(-1) / np.linalg.norm(ours, axis=-1) / np.linalg.norm(theirs, axis=-1)


def model_path(name):
    if name in ("smollm2", "gemma3"):
        return M.model_path(name)
    return name


def llama_child(path, ids_file):
    """The --child run: load llama.cpp, prefill, decode args.n tokens; print load seconds.
    (It reads the prompt ids from a file: loading ffnlab here would add to the RSS measured.)"""
    with open(ids_file) as f:
        ids = json.load(f)
    t = time.perf_counter()
    engine = LlamaCpp(path)
    load = time.perf_counter() - t
    timed_run(engine, ids, args.n)
    print(json.dumps({"load_s": load, "peak_rss": peak_rss()}))


def peak_rss():
    """This process's peak resident memory in bytes (VmHWM). Not the ru_maxrss a parent gets from
    wait4: Linux starts a child's ru_maxrss at its parent's resident size (fork copies the
    counters, exec keeps the maximum), which would charge this script's own memory to the child."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))


# `ffnlab run` in a process that reports its own peak RSS when the command returns
FFNLAB_RUN = """import json, runpy, sys
sys.argv = ["ffnlab"] + sys.argv[1:]
try:
    runpy.run_module("ffnlab.cli.main", run_name="__main__")
except SystemExit as e:
    if e.code:
        raise
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
print(json.dumps({"peak_rss": hwm}))
"""


def memory_runs(path, ids, tok):
    """-> {engine: ([load seconds], [peak RSS bytes])}, fresh processes alternating engines."""
    tmp = tempfile.mkdtemp()
    prompt, ids_file = os.path.join(tmp, "prompt.txt"), os.path.join(tmp, "ids.json")
    with open(prompt, "w", encoding="utf-8") as f:
        f.write(tok.decode(ids))
    with open(ids_file, "w") as f:
        json.dump(list(map(int, ids)), f)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    cmds = {"ffnlab": [sys.executable, "-c", FFNLAB_RUN, "run", "-m", path, "-f", prompt, "-n", str(args.n),
                       "--temp", "0", "--ignore-eos", "--json", "-t", str(args.threads)],
            "llama.cpp": [sys.executable, os.path.abspath(__file__), "--child", ids_file, "-m", path,
                          "-T", str(args.T), "-n", str(args.n), "--threads", str(args.threads)]}
    out = {name: ([], []) for name in cmds}
    for r in range(args.repeats):
        for name, cmd in cmds.items():
            with tempfile.TemporaryFile("w+") as fo, tempfile.TemporaryFile("w+") as fe:
                code = subprocess.run(cmd, stdout=fo, stderr=fe, env=env, text=True).returncode
                fo.seek(0)
                fe.seek(0)
                stdout, stderr = fo.read(), fe.read()
            if code:
                raise SystemExit(f"{name} run failed:\n{stderr[-2000:]}")
            lines = stdout.strip().splitlines()
            rep = {k: v for line in lines[-2:] if line.startswith("{") for k, v in json.loads(line).items()}
            load = rep["timings"]["load_ms"] / 1000 if name == "ffnlab" else rep["load_s"]
            out[name][0].append(load)
            out[name][1].append(rep["peak_rss"])
            cached = {True: "  (packed weights from the cache)", False: "  (packed at load)"}.get(
                rep["timings"].get("packed_from_cache")) if name == "ffnlab" else ""
            print(f"memory run {r + 1} {name:10s} load {load:6.2f} s  peak RSS {out[name][1][-1] / 1e6:7.1f} MB{cached}",
                  flush=True)
    return out


def main():
    path = model_path(args.model)
    skip = set(filter(None, args.skip.split(",")))
    if args.child:
        return llama_child(path, args.child)
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
        order = engines if r % 2 == 0 else engines[::-1]        # neither engine always runs first
        for _ in range(args.prefills):                          # prefill alone, the engines taking turns
            for e in order:
                t = time.perf_counter()
                e.prefill(ids)
                times[e.name][0].append(time.perf_counter() - t)
        for e in order:
            p, d, toks = timed_run(e, ids, args.n)
            times[e.name][0].append(p)
            times[e.name][1].append(d)
            greedy[e.name] = toks
            pre = "  ".join(f"{1000 * t:.1f}" for t in times[e.name][0][-args.prefills - 1:])
            print(f"repeat {r + 1} {e.name:12s} prefill {pre} ms  decode {d * 1000:8.1f} ms", flush=True)
    del engines, ours                                            # free their memory before the memory runs
    cosine = logits_cosine(path, ids) if args.big and not {"ffnlab", "llama.cpp"} & skip else None
    mem = memory_runs(path, ids, tok) if "memory" not in skip and not {"ffnlab", "llama.cpp"} & skip else {}
    rate = {name: (args.T / statistics.median(p), args.n / statistics.median(d)) for name, (p, d) in times.items()}
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    print(f"\n| engine | prefill tokens/s (T={args.T}) | decode tokens/s ({args.n} tokens) | load s | peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, (pre, dec) in rate.items():
        load, rss = (statistics.median(mem[name][0]), statistics.median(mem[name][1]) / 1e6) if name in mem else (None, None)
        print(f"| {name} | {pre:.1f} | {dec:.1f} | {'-' if load is None else f'{load:.2f}'} | "
              f"{'-' if rss is None else f'{rss:.0f}'} |")
    if "ffnlab" in rate and "llama.cpp" in rate:
        print()
        f_dec, f_pre, f_rss, f_load = BIG_FLOORS if args.big else FLOORS.get(args.model, (None,) * 4)
        checks = [("decode ffnlab / llama.cpp", rate["ffnlab"][1] / rate["llama.cpp"][1], f_dec, ">="),
                  ("prefill ffnlab / llama.cpp", rate["ffnlab"][0] / rate["llama.cpp"][0], f_pre, ">=")]
        if mem:
            checks += [("peak RSS ffnlab / llama.cpp", statistics.median(mem["ffnlab"][1]) /
                        statistics.median(mem["llama.cpp"][1]), f_rss, "<="),
                       ("ffnlab load seconds", statistics.median(mem["ffnlab"][0]), f_load, "<=")]
        if args.big and mem:
            checks.append(("ffnlab peak RSS GB", statistics.median(mem["ffnlab"][1]) / 1e9, BIG_RSS / 1e9, "<="))
        if cosine is not None:
            checks.append(("min logits cosine vs llama.cpp", float(cosine.min()), BIG_COSINE, ">="))
        if "transformers" in rate:
            checks += [("decode ffnlab / transformers", rate["ffnlab"][1] / rate["transformers"][1], None, ">="),
                       ("prefill ffnlab / transformers", rate["ffnlab"][0] / rate["transformers"][0], None, ">=")]
        for label, value, floor, op in checks:
            ok = floor is None or (value >= floor if op == ">=" else value <= floor)
            verdict = "" if floor is None else f"  (floor {op} {floor}: {'met' if ok else 'MISSED'})"
            print(f"{label:32s} {value:6.2f}{verdict}")
    print()
    for name, toks in greedy.items():
        print(f"{name:12s} greedy: {tok.decode(toks[:24])!r}")


if __name__ == "__main__":
    main()
