"""Training throughput: ffnlab (NumPy + numba) vs the same model in PyTorch eager on the CPU, and vs llm.c.

One training step = forward, cross-entropy, backward, gradient clipping, AdamW update, on the
same config, the same init and the same batch, with the same number of threads for NumPy's BLAS,
numba's kernels and torch. Steps alternate between the two engines so a change in machine load
hits both; the medians are compared, by wall clock and by the process's CPU time.

    python bench/bench_train.py [--threads 1] [--arch gpt2|llama] [--n-layer 6 --d-model 384] [--steps 7]
    python bench/bench_train.py --sweep [--threads 1,2]     # gpt2 and llama at (6, 384), (4, 256), (2, 128)
    python bench/bench_train.py --llmc PATH [--threads 1,2] # llm.c's train_gpt2.c on its own shapes
torch's step runs in a worker process of its own (--torch process, the default), stepped in turn with
ffnlab's over a pipe and timed there: ffnlab's trainer sets its process's malloc thresholds
(training/heap.py), which torch, run on its own, does not have. --torch inline runs both in this
one process, torch with ffnlab's malloc settings.
Default model: 6 layers, d_model 384, 6 heads, T=256, batch 4, byte vocab (nanoGPT's
shakespeare-char size).

--llmc PATH: a checkout of https://github.com/karpathy/llm.c that you provide (llm.c is not on
PyPI or any package registry; this script downloads nothing). bench/llmc_step.c, which includes
its train_gpt2.c, is built with gcc -Ofast -march=native -fopenmp (llm.c's Makefile flags) into
bench/build/. The weights file llm.c reads (gpt2_build_from_checkpoint: a 256-int header, magic
20240326 version 3, then the 16 parameter tensors in its order) is written from a random-init
ffnlab GPT-2 124M, and the tokens file (dataloader.h: magic 20240520 version 1, uint16 tokens)
from random tokens, both under bench/build/. llm.c's step is its main()'s: forward, zero_grad,
backward, AdamW (lr 1e-4, betas 0.9/0.999, eps 1e-8, no weight decay, no clipping) at B=4, T=64;
ffnlab runs the same step on the same weights and tokens.
"""
import argparse
import json
import os
import subprocess
import sys
import time

SWEEP = [(6, 384, 6), (4, 256, 4), (2, 128, 2)]          # (n_layer, d_model, n_head): the ablation shapes
BENCH = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(BENCH, "build")


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1", help="BLAS / numba / torch threads, or a list: 1,2 (default 1)")
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2", help="GPT-2 or Llama style block")
    p.add_argument("--n-layer", type=int, default=6, help="blocks (default 6)")
    p.add_argument("--d-model", type=int, default=384, help="residual width (default 384)")
    p.add_argument("--n-head", type=int, default=6, help="heads (default 6)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--steps", type=int, default=7, help="timed steps per engine (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per engine first (default 2)")
    p.add_argument("--sweep", action="store_true",
                   help="gpt2 and llama at (n_layer, d_model) = (6, 384), (4, 256), (2, 128), each thread count")
    p.add_argument("--llmc", metavar="PATH", help="a checkout of karpathy/llm.c: time its train_gpt2.c step "
                   "against ffnlab's on GPT-2 124M, B=4, T=64 (nothing is downloaded)")
    p.add_argument("--profile", action="store_true", help="also print the ffnlab step's top functions (cProfile)")
    p.add_argument("--torch", choices=["process", "inline"], default="process",
                   help="torch's step in a worker process of its own (default: malloc as torch has it on its own) "
                   "or in this process (with the malloc thresholds ffnlab's trainer sets, training/heap.py)")
    p.add_argument("--torch-worker", metavar="JSON", help=argparse.SUPPRESS)   # the worker: {cfg, batch, seq_len, threads}
    return p.parse_args()


args = parse()
THREADS = [int(t) for t in args.threads.split(",")]
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = str(max(THREADS))                   # before numpy/torch/numba load their pools

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(BENCH, "..", "tests", "reference"))
sys.path.insert(0, BENCH)
import torch_reference as R  # noqa: E402
from machine import cpu_model  # noqa: E402

from ffnlab.config import ModelConfig  # noqa: E402
from ffnlab.model import Model  # noqa: E402
from ffnlab.model.params import init_params  # noqa: E402
from ffnlab.threads import blas_kernels, set_threads  # noqa: E402
from ffnlab.training.optim import AdamW, clip_grad_norm, decays  # noqa: E402
from ffnlab.training.trainer import loss_and_grads  # noqa: E402

torch.set_num_interop_threads(1)


def cpu_named():
    """the CPU's model name with its family and model numbers and AVX-512 (model names alone are vague: "Intel(R) Xeon(R) Processor")"""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                info.setdefault(k.strip(), v.strip())
    except OSError:
        return cpu_model()
    avx512 = "AVX-512" if "avx512f" in info.get("flags", "").split() else "no AVX-512"
    return (f"{cpu_model()}, family {info.get('cpu family', '?')} model {info.get('model', '?')}, "
            f"{os.cpu_count()} vCPUs, {avx512}; {blas_kernels()}")


def use_threads(n):
    set_threads(n)                               # OpenBLAS (and torch's pools, through threadpoolctl) and numba
    torch.set_num_threads(n)


def config(arch, n_layer, d_model, n_head, seq_len):
    if arch == "gpt2":
        return ModelConfig(arch="gpt2", n_layer=n_layer, d_model=d_model, n_head=n_head, d_ff=4 * d_model,
                           ffn="gelu_tanh", ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=True,
                           norm="layernorm", positions="learned", vocab_size=256, n_ctx=seq_len, tie_embeddings=True)
    return ModelConfig(arch="llama", n_layer=n_layer, d_model=d_model, n_head=n_head, d_ff=(8 * d_model) // 3,
                       ffn="swiglu", norm="rmsnorm", positions="rope", rope_pairing="neox", vocab_size=256,
                       n_ctx=seq_len, tie_embeddings=False)


def timed(fn):
    """-> (wall seconds, CPU seconds of this process). On a shared machine the wall clock also
    counts time spent waiting for a core; the CPU time counts only the work (all threads)."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def alternate(steps_a, steps_b, steps, warmup):
    """steps_*() -> (wall, cpu) of one step; -> ([(wall, cpu)] of a, of b), interleaved a, b, a, b, ..."""
    for _ in range(warmup):
        steps_a()
        steps_b()
    a, b = [], []
    for _ in range(steps):
        a.append(steps_a())
        b.append(steps_b())
    return a, b


def medians(runs):
    return float(np.median([w for w, _ in runs])), float(np.median([c for _, c in runs]))


def batch_for(cfg, batch, seq_len):
    """the one batch both engines train on: x, y [batch, seq_len]"""
    rng = np.random.default_rng(0)
    return (rng.integers(0, cfg.vocab_size, size=(batch, seq_len)), rng.integers(0, cfg.vocab_size, size=(batch, seq_len)))


def torch_stepper(cfg, batch, seq_len):
    """-> torch eager's training step on cfg's seed-0 init and the batch: forward, cross-entropy,
    backward, clip_grad_norm_, AdamW"""
    x, y = batch_for(cfg, batch, seq_len)
    tp = R.params_to_torch(init_params(cfg, seed=0), torch.float32)
    topt = torch.optim.AdamW([{"params": [t for n, t in tp.items() if decays(n)], "weight_decay": 0.1},
                              {"params": [t for n, t in tp.items() if not decays(n)], "weight_decay": 0.0}], lr=1e-4)
    tx, ty = torch.as_tensor(x), torch.as_tensor(y).reshape(-1)

    def torch_step():
        topt.zero_grad(set_to_none=True)
        logits = R.forward(tp, cfg, tx)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), ty)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(tp.values()), 1.0)
        topt.step()
        return loss.item()
    return torch_step


def torch_worker(spec):
    """--torch-worker: torch's step for the parent, one per "step" line on stdin, answered "wall cpu"
    (this process's seconds) on stdout; ffnlab's training code never runs here"""
    use_threads(spec["threads"])
    step = torch_stepper(ModelConfig.from_dict(spec["cfg"]), spec["batch"], spec["seq_len"])
    for line in sys.stdin:
        if line.strip() != "step":
            break
        w, c = timed(step)
        print(f"{w!r} {c!r}", flush=True)


class TorchProcess:
    """torch's step in a worker process (--torch-worker), called like a step: -> (wall, cpu)"""

    def __init__(self, cfg, batch, seq_len, n_threads):
        spec = json.dumps({"cfg": cfg.to_dict(), "batch": batch, "seq_len": seq_len, "threads": n_threads})
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--threads", str(max(THREADS)),
                                      "--torch-worker", spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def __call__(self):
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            sys.exit(f"the torch worker ended (exit status {self.proc.wait()})")
        w, c = line.split()
        return float(w), float(c)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def compare_torch(cfg, batch, seq_len, steps, warmup, profile=False, n_threads=1):
    """ffnlab's step and torch eager's on cfg -> {"ours": [(wall, cpu)], "torch": [(wall, cpu)], ...}"""
    params = init_params(cfg, seed=0)
    x, y = batch_for(cfg, batch, seq_len)
    opt = AdamW(params, weight_decay=0.1)
    model = Model(cfg, params)

    def ffnlab_step():
        loss, grads = loss_and_grads(model, x, y)
        clip_grad_norm(grads, 1.0)
        opt.step(params, grads, 1e-4)
        return float(loss)

    if args.torch == "process":
        torch_step = TorchProcess(cfg, batch, seq_len, n_threads)
    else:
        inline = torch_stepper(cfg, batch, seq_len)

        def torch_step():
            return timed(inline)
    ours, theirs = alternate(lambda: timed(ffnlab_step), torch_step, steps, warmup)
    if args.torch == "process":
        torch_step.close()
    if profile:
        import cProfile
        import pstats
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(3):
            ffnlab_step()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)
    return {"ours": ours, "torch": theirs, "params": sum(a.size for a in params.values())}


def one_shape():
    D = args.d_model
    for n in THREADS:
        use_threads(n)
        cfg = config(args.arch, args.n_layer, D, args.n_head, args.seq_len)
        r = compare_torch(cfg, args.batch, args.seq_len, args.steps, args.warmup, args.profile, n)
        tokens = args.batch * args.seq_len
        (m_ours, cpu_ours), (m_theirs, cpu_theirs) = medians(r["ours"]), medians(r["torch"])
        print(f"model: {cfg.arch}-style, {cfg.n_layer} layers, d_model {D}, {cfg.ffn} d_ff {cfg.d_ff}, T={args.seq_len}, "
              f"batch {args.batch}, {r['params'] / 1e6:.2f}M params; threads {n}; "
              f"numpy {np.__version__}, torch {torch.__version__}; {cpu_named()}")
        print(f"ffnlab  : median {m_ours * 1e3:7.1f} ms/step  {tokens / m_ours:8.0f} tokens/s   (steps: "
              + ", ".join(f"{t * 1e3:.0f}" for t, _ in r["ours"]) + " ms)")
        print(f"pytorch : median {m_theirs * 1e3:7.1f} ms/step  {tokens / m_theirs:8.0f} tokens/s   (steps: "
              + ", ".join(f"{t * 1e3:.0f}" for t, _ in r["torch"]) + " ms)")
        print(f"CPU time: ffnlab median {cpu_ours * 1e3:.1f} ms/step ({tokens / cpu_ours:.0f} tokens/CPU-s), "
              f"pytorch {cpu_theirs * 1e3:.1f} ms/step ({tokens / cpu_theirs:.0f} tokens/CPU-s)")
        print(f"ratio ffnlab/pytorch tokens/s: {m_theirs / m_ours:.2f}x wall clock, {cpu_theirs / cpu_ours:.2f}x CPU time")


def sweep():
    print(f"{cpu_named()}; numpy {np.__version__}, torch {torch.__version__}; T={args.seq_len}, batch {args.batch}, "
          f"{args.steps} timed steps per engine, alternating; torch {'in a worker process' if args.torch == 'process' else 'in this process'}; "
          f"load average {os.getloadavg()[0]:.2f} at the start")
    print(f"{'arch':6} {'layers':>6} {'d_model':>7} {'thr':>3} {'ffnlab ms':>9} {'torch ms':>9} {'ratio':>6} "
          f"{'ffnlab CPU':>10} {'torch CPU':>9} {'ratio':>6}")
    for n in THREADS:
        use_threads(n)
        for arch in ("gpt2", "llama"):
            for n_layer, d_model, n_head in SWEEP:
                cfg = config(arch, n_layer, d_model, n_head, args.seq_len)
                r = compare_torch(cfg, args.batch, args.seq_len, args.steps, args.warmup, n_threads=n)
                (wo, co), (wt, ct) = medians(r["ours"]), medians(r["torch"])
                print(f"{arch:6} {n_layer:6d} {d_model:7d} {n:3d} {wo * 1e3:9.1f} {wt * 1e3:9.1f} {wt / wo:5.2f}x "
                      f"{co * 1e3:10.1f} {ct * 1e3:9.1f} {ct / co:5.2f}x", flush=True)
    print(f"ratio = torch / ffnlab time per step = ffnlab's tokens/s over torch's; load average "
          f"{os.getloadavg()[0]:.2f} at the end")


# --- llm.c ----------------------------------------------------------------------------------
LLMC = dict(n_layer=12, d_model=768, n_head=12, vocab=50257, padded_vocab=50304, max_t=1024, B=4, T=64)


def llmc_config():
    c = LLMC
    return ModelConfig(arch="gpt2", n_layer=c["n_layer"], d_model=c["d_model"], n_head=c["n_head"],
                       d_ff=4 * c["d_model"], ffn="gelu_tanh", ffn_bias=True, attn_bias=True, attn_out_bias=True,
                       fused_qkv=True, norm="layernorm", norm_eps=1e-5, positions="learned", vocab_size=c["vocab"],
                       n_ctx=c["max_t"], tie_embeddings=True)


def write_llmc_checkpoint(path, params, cfg):
    """llm.c's gpt2_build_from_checkpoint format: int32 header[256] = {20240326, 3, maxT, V, L, NH, C, Vp},
    then float32 wte (Vp x C, the padding rows zero), wpe, and each per-layer tensor stacked over layers"""
    L, C = cfg.n_layer, cfg.d_model
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, 3, cfg.n_ctx, cfg.vocab_size, L, cfg.n_head, C, LLMC["padded_vocab"]]
    wte = np.zeros((LLMC["padded_vocab"], C), np.float32)
    wte[:cfg.vocab_size] = params["token_embd.weight"]

    def stack(name):
        return np.stack([params[f"blk.{i}.{name}"] for i in range(L)])

    tensors = [wte, params["position_embd.weight"], stack("attn_norm.weight"), stack("attn_norm.bias"),
               stack("attn_qkv.weight"), stack("attn_qkv.bias"), stack("attn_output.weight"),
               stack("attn_output.bias"), stack("ffn_norm.weight"), stack("ffn_norm.bias"), stack("ffn_up.weight"),
               stack("ffn_up.bias"), stack("ffn_down.weight"), stack("ffn_down.bias"),
               params["output_norm.weight"], params["output_norm.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for t in tensors:
            f.write(np.ascontiguousarray(t, np.float32).tobytes())


def write_llmc_tokens(path, tokens):
    """llm.c's dataloader format: int32 header[256] = {20240520, 1, n_tokens}, then uint16 tokens"""
    header = np.zeros(256, np.int32)
    header[:3] = [20240520, 1, tokens.size]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype(np.uint16).tobytes())


def build_llmc(checkout):
    if not os.path.isfile(os.path.join(checkout, "train_gpt2.c")):
        sys.exit(f"--llmc {checkout}: no train_gpt2.c there; pass a checkout of https://github.com/karpathy/llm.c")
    os.makedirs(BUILD, exist_ok=True)
    exe = os.path.join(BUILD, "llmc_step")
    cmd = ["gcc", "-Ofast", "-march=native", "-fopenmp", "-DOMP", "-Wno-unused-result", "-I", checkout,
           os.path.join(BENCH, "llmc_step.c"), "-lm", "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"--llmc: building llm.c failed ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    return exe


def llmc_anchor(checkout):
    exe = build_llmc(checkout)
    cfg = llmc_config()
    c = LLMC
    params = init_params(cfg, seed=0)
    ckpt, data = os.path.join(BUILD, "gpt2_124M_random.bin"), os.path.join(BUILD, "tokens_random.bin")
    write_llmc_checkpoint(ckpt, params, cfg)
    rng = np.random.default_rng(0)
    n_batches = args.warmup + args.steps
    tokens = rng.integers(0, cfg.vocab_size, size=n_batches * c["B"] * c["T"] + 1)
    write_llmc_tokens(data, tokens)
    print(f"llm.c anchor: GPT-2 124M ({sum(a.size for a in params.values()) / 1e6:.1f}M params, random init seed 0), "
          f"B={c['B']}, T={c['T']}; {cpu_named()}; llm.c {checkout}")
    for n in THREADS:
        use_threads(n)
        env = dict(os.environ, OMP_NUM_THREADS=str(n))
        r = subprocess.run([exe, ckpt, data, str(args.warmup), str(args.steps)], capture_output=True, text=True, env=env)
        if r.returncode:
            sys.exit(f"--llmc: {exe} failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
        lines = [line.split() for line in r.stdout.splitlines() if line.startswith("step ")]
        llmc_ms = [float(w[5]) for w in lines[args.warmup:]]
        llmc_loss0 = float(lines[0][3])
        # ffnlab: the same step on the same weights and the same batches, in llm.c's order
        p = {k: a.copy() for k, a in params.items()}
        model = Model(cfg, p)
        opt = AdamW(p, weight_decay=0.0, betas=(0.9, 0.999), eps=1e-8)
        ours, losses = [], []
        for s in range(n_batches):
            chunk = tokens[s * c["B"] * c["T"]:(s + 1) * c["B"] * c["T"] + 1]
            x, y = chunk[:-1].reshape(c["B"], c["T"]), chunk[1:].reshape(c["B"], c["T"])

            def step():
                loss, grads = loss_and_grads(model, x, y)
                opt.step(p, grads, 1e-4)
                losses.append(float(loss))
            w, cpu = timed(step)
            if s >= args.warmup:
                ours.append(w)
        m_llmc, m_ours = float(np.median(llmc_ms)), float(np.median(ours))
        print(f"threads {n}: llm.c median {m_llmc:8.1f} ms/step (steps: {', '.join(f'{t:.0f}' for t in llmc_ms)}); "
              f"ffnlab median {m_ours * 1e3:8.1f} ms/step (steps: {', '.join(f'{t * 1e3:.0f}' for t in ours)}); "
              f"ratio ffnlab/llm.c tokens/s {m_llmc / (m_ours * 1e3):.2f}x; first loss llm.c {llmc_loss0:.4f}, "
              f"ffnlab {losses[0]:.4f}", flush=True)


if args.torch_worker:
    torch_worker(json.loads(args.torch_worker))
elif args.llmc:
    llmc_anchor(os.path.abspath(args.llmc))
elif args.sweep:
    sweep()
else:
    one_shape()
