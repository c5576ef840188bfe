"""Forward + backward of one GPT-2-small block: ffnlab (NumPy) vs PyTorch eager, CPU, same threads.

  python3 bench/bench_block.py [--threads N] [--repeats R] [-T 256]

Block: d_model 768, 12 heads, d_ff 3072, GELU tanh, LayerNorm, fused qkv with biases; batch 1.
The PyTorch side is tests/reference/torch_reference.py's block (F.linear, F.layer_norm, softmax attention)
with autograd. Both use N threads: OpenBLAS through OPENBLAS_NUM_THREADS (set before NumPy is
imported), PyTorch through torch.set_num_threads. Prints the median of R timed repeats (the two sides
alternate) after two warm-ups, and the ratio ffnlab / torch.
"""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threads", type=int, default=1, help="BLAS / torch threads for both sides (default 1)")
ap.add_argument("--repeats", type=int, default=10, help="timed repeats per side (default 10)")
ap.add_argument("-T", type=int, default=256, dest="T", help="tokens (default 256)")
args = ap.parse_args()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402  (after the thread variables)
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import torch_reference as R  # noqa: E402

from ffnlab.config import ModelConfig  # noqa: E402
from ffnlab.model.block import block_backward, block_forward  # noqa: E402
from ffnlab.model.weights import layer_weights  # noqa: E402
from ffnlab.model.params import init_params  # noqa: E402
from ffnlab.ops import causal_mask  # noqa: E402

torch.set_num_threads(args.threads)

cfg = ModelConfig(arch="gpt2", n_layer=1, d_model=768, n_head=12, d_ff=3072, ffn="gelu_tanh", ffn_bias=True,
                  attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="learned",
                  vocab_size=16, n_ctx=args.T)
p = {k: v for k, v in init_params(cfg, seed=0).items() if k.startswith("blk.0.")}
rng = np.random.default_rng(0)
x = rng.normal(size=(1, args.T, cfg.d_model)).astype(np.float32)
dy = rng.normal(size=x.shape).astype(np.float32)
pos = np.arange(args.T)
allowed = causal_mask(pos, pos)


def ffnlab_step():
    w = layer_weights(p, cfg, 0)
    y, cache = block_forward(x, w, cfg, pos, allowed)
    dx, grads = block_backward(dy, w, cfg, cache)
    return y, dx


tp = R.params_to_torch(p, torch.float32)
tx = torch.tensor(x, requires_grad=True)
tdy = torch.from_numpy(dy)
t_allowed = torch.from_numpy(allowed)


def torch_step():
    for t in (*tp.values(), tx):
        t.grad = None
    y = R.block_forward(tx, tp, cfg, 0, pos, t_allowed)
    y.backward(tdy)
    return y, tx.grad


def timed(step):
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def median_times(a, b):
    """Median seconds of a() and of b(), alternated so that load from other processes on a shared
    machine falls on both sides alike; two untimed warm-up rounds first."""
    for _ in range(2):
        a(), b()
    ta, tb = [], []
    for _ in range(args.repeats):
        ta.append(timed(a))
        tb.append(timed(b))
    return float(np.median(ta)), float(np.median(tb))


# the two sides compute the same thing (the tests hold them to 1e-5; here a sanity check)
y, dx = ffnlab_step()
ty, tdx = torch_step()
print(f"max |y - torch| {np.abs(y - ty.detach().numpy()).max():.2e}, max |dx - torch| {np.abs(dx - tdx.numpy()).max():.2e}")

t_ffn, t_torch = median_times(ffnlab_step, torch_step)
print(f"GPT-2-small block fwd+bwd, T={args.T}, batch 1, float32, {args.threads} thread(s), median of {args.repeats}:")
print(f"  ffnlab  {t_ffn * 1e3:8.1f} ms")
print(f"  torch   {t_torch * 1e3:8.1f} ms")
print(f"  ratio ffnlab/torch = {t_ffn / t_torch:.2f}")
