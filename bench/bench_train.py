"""Training throughput: ffnlab (NumPy) vs the same model in PyTorch eager on the CPU.

One training step = forward, cross-entropy, backward, gradient clipping, AdamW update, on the
same config, the same init and the same batch, with the same number of threads for NumPy's BLAS
and for torch. Steps alternate between the two engines so a change in machine load hits both;
the medians are compared.

    python bench/bench_train.py [--threads 1] [--arch gpt2|llama] [--steps 7]
Default model: 6 layers, d_model 384, 6 heads, T=256, batch 4, byte vocab (nanoGPT's
shakespeare-char size).
"""
import argparse
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1, help="BLAS / torch threads (default 1)")
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2", help="GPT-2 or Llama style block")
    p.add_argument("--n-layer", type=int, default=6, help="blocks (default 6)")
    p.add_argument("--d-model", type=int, default=384, help="residual width (default 384)")
    p.add_argument("--n-head", type=int, default=6, help="heads (default 6)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--batch", type=int, default=4, help="sequences per step (default 4)")
    p.add_argument("--steps", type=int, default=7, help="timed steps per engine (default 7)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per engine first (default 2)")
    p.add_argument("--profile", action="store_true", help="also print the ffnlab step's top functions (cProfile)")
    return p.parse_args()


args = parse()
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)                       # before numpy/torch load their BLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import torch_reference as R  # noqa: E402

from ffnlab.config import ModelConfig  # noqa: E402
from ffnlab.model import Model  # noqa: E402
from ffnlab.model.params import init_params  # noqa: E402
from ffnlab.training.optim import AdamW, clip_grad_norm, decays  # noqa: E402
from ffnlab.training.trainer import loss_and_grads  # noqa: E402

torch.set_num_threads(args.threads)
torch.set_num_interop_threads(args.threads)
D = args.d_model
if args.arch == "gpt2":
    cfg = ModelConfig(arch="gpt2", n_layer=args.n_layer, d_model=D, n_head=args.n_head, d_ff=4 * D, ffn="gelu_tanh",
                      ffn_bias=True, attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm",
                      positions="learned", vocab_size=256, n_ctx=args.seq_len, tie_embeddings=True)
else:
    cfg = ModelConfig(arch="llama", n_layer=args.n_layer, d_model=D, n_head=args.n_head, d_ff=(8 * D) // 3,
                      ffn="swiglu", norm="rmsnorm", positions="rope", rope_pairing="neox", vocab_size=256,
                      n_ctx=args.seq_len, tie_embeddings=False)
params = init_params(cfg, seed=0)
rng = np.random.default_rng(0)
x = rng.integers(0, 256, size=(args.batch, args.seq_len))
y = rng.integers(0, 256, size=(args.batch, args.seq_len))
tokens = args.batch * args.seq_len

# --- ffnlab ---------------------------------------------------------------------------------
opt = AdamW(params, weight_decay=0.1)
model = Model(cfg, params)


def ffnlab_step():
    loss, grads = loss_and_grads(model, x, y)
    clip_grad_norm(grads, 1.0)
    opt.step(params, grads, 1e-4)
    return float(loss)


# --- PyTorch eager --------------------------------------------------------------------------
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


def timed(fn):
    """-> (wall seconds, CPU seconds of this process). On a shared machine the wall clock also
    counts time spent waiting for a core; the CPU time counts only the work (all threads)."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


for _ in range(args.warmup):
    ffnlab_step()
    torch_step()
ours, theirs = [], []
for _ in range(args.steps):
    ours.append(timed(ffnlab_step))
    theirs.append(timed(torch_step))
cpu_ours, cpu_theirs = float(np.median([c for _, c in ours])), float(np.median([c for _, c in theirs]))
ours, theirs = [w for w, _ in ours], [w for w, _ in theirs]
m_ours, m_theirs = float(np.median(ours)), float(np.median(theirs))
n_params = sum(a.size for a in params.values())
print(f"model: {cfg.arch}-style, {cfg.n_layer} layers, d_model {D}, {cfg.ffn} d_ff {cfg.d_ff}, T={args.seq_len}, "
      f"batch {args.batch}, {n_params / 1e6:.2f}M params; threads {args.threads}; "
      f"numpy {np.__version__}, torch {torch.__version__}")
print(f"ffnlab  : median {m_ours * 1e3:7.1f} ms/step  {tokens / m_ours:8.0f} tokens/s   (steps: "
      + ", ".join(f"{t * 1e3:.0f}" for t in ours) + " ms)")
print(f"pytorch : median {m_theirs * 1e3:7.1f} ms/step  {tokens / m_theirs:8.0f} tokens/s   (steps: "
      + ", ".join(f"{t * 1e3:.0f}" for t in theirs) + " ms)")
print(f"CPU time: ffnlab median {cpu_ours * 1e3:.1f} ms/step ({tokens / cpu_ours:.0f} tokens/CPU-s), "
      f"pytorch {cpu_theirs * 1e3:.1f} ms/step ({tokens / cpu_theirs:.0f} tokens/CPU-s)")
print(f"ratio ffnlab/pytorch tokens/s: {m_theirs / m_ours:.2f}x wall clock, {cpu_theirs / cpu_ours:.2f}x CPU time")

if args.profile:
    import cProfile
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3):
        ffnlab_step()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(15)
