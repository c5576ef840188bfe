"""Training step of a TopK transcoder 576 -> 16384 (k = 32) on SmolLM2-135M's layer-12 activations:
ffnlab (NumPy + numba sparse decode) vs SAELens's TopKTrainingSAE on PyTorch CPU, same threads, same run.
And the harvest: tokens/s of the forward with the two sites hooked against the same forward without hooks.

  python3 bench/bench_features.py [--threads N] [--tokens T] [--steps S] [--batch B]

SAELens runs in the interpreter where sae_lens imports ($FFNLAB_SAELENS_PYTHON, or the venv scripts/install.sh
--test makes, ~/.cache/ffnlab/venv-saelens), as a subprocess on the same saved activations; where none exists,
the same step in plain torch (written out below) stands in, and the line says so. Both sides: forward, AuxK
(half the latents marked dead, so the auxiliary term costs what it costs late in training), backward,
gradient clipping, Adam; ffnlab also renormalises the decoder rows. Medians over S steps after one warm-up.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--threads", type=int, default=1)
ap.add_argument("--tokens", type=int, default=4096, help="activation rows to harvest (default 4096)")
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--batch", type=int, default=1024)
ap.add_argument("--side", default=None, help=argparse.SUPPRESS)        # internal: run one side on saved rows
ap.add_argument("--rows", default=None, help=argparse.SUPPRESS)
args = ap.parse_args()
for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[var] = str(args.threads)

import numpy as np  # noqa: E402

D_SAE, K = 16384, 32


def torch_steps(x, y, steps, batch, use_saelens):
    import torch
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    d_in, d_out = x.shape[1], y.shape[1]
    dead = torch.zeros(D_SAE, dtype=torch.bool)
    dead[::2] = True
    if use_saelens:
        from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
        from sae_lens.saes.sae import TrainStepInput
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=d_in, d_sae=D_SAE, k=K, aux_loss_coefficient=1 / 32,
                                                    rescale_acts_by_decoder_norm=False))

        def loss_of(xb, yb):
            return sae.training_forward_pass(TrainStepInput(sae_in=xb, coefficients={}, dead_neuron_mask=dead,
                                                            n_training_steps=0, is_logging_step=False)).loss
        params = list(sae.parameters())
    else:
        W_dec = torch.nn.Parameter(torch.nn.functional.normalize(torch.randn(D_SAE, d_out), dim=1))
        W_enc = torch.nn.Parameter(W_dec.detach().T.clone())
        b_enc, b_dec = torch.nn.Parameter(torch.zeros(D_SAE)), torch.nn.Parameter(torch.zeros(d_out))
        params = [W_enc, b_enc, W_dec, b_dec]

        def loss_of(xb, yb):
            pre = xb @ W_enc + b_enc
            v, i = pre.topk(K, dim=-1)
            a = torch.zeros_like(pre).scatter(-1, i, v.relu())
            out = a @ W_dec + b_dec
            e = (yb - out).detach()
            vz, iz = torch.where(dead[None], pre, -torch.inf).topk(d_out // 2, dim=-1)
            z = torch.zeros_like(pre).scatter(-1, iz, vz)
            return ((out - yb) ** 2).sum(-1).mean() + (1 / 32) * ((z @ W_dec - e) ** 2).sum(-1).mean()
    opt = torch.optim.Adam(params, lr=1e-4)
    times = []
    for s in range(steps + 1):
        i = (s * batch) % (len(x) - batch + 1)
        xb, yb = torch.tensor(x[i:i + batch]), torch.tensor(y[i:i + batch])
        t = time.perf_counter()
        loss = loss_of(xb, yb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t)
    return times[1:]


def ffnlab_steps(x, y, steps, batch):
    from ffnlab.features.dictionary import DictConfig, init_params
    from ffnlab.features.losses import loss_and_grads
    from ffnlab.features.trainer import renorm_decoder
    from ffnlab.training.optim import AdamW, clip_grad_norm
    cfg = DictConfig("transcoder", "topk", x.shape[1], D_SAE, y.shape[1], k=K)
    p = init_params(cfg, np.random.default_rng(0))
    opt = AdamW(p, weight_decay=0.0, betas=(0.9, 0.999))
    dead = np.zeros(D_SAE, bool)
    dead[::2] = True
    times = []
    for s in range(steps + 1):
        i = (s * batch) % (len(x) - batch + 1)
        t = time.perf_counter()
        _, g, _, _ = loss_and_grads(p, cfg, x[i:i + batch], y[i:i + batch], dead, 0.0, 1 / 32)
        clip_grad_norm(g, 1.0)
        opt.step(p, g, 1e-4)
        renorm_decoder(p)
        times.append(time.perf_counter() - t)
    return times[1:]


if args.side:                                             # a subprocess: one side on the saved rows
    rows = np.load(args.rows)
    t = torch_steps(rows["x"], rows["y"], args.steps, args.batch, args.side == "saelens")
    print(json.dumps(t))
    sys.exit(0)


def cpu_name():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown CPU"


def harvest(tokens):
    import ffnlab
    from ffnlab.evaluation.activations import context_windows
    from ffnlab.features.harvest import stream_rows
    from ffnlab.formats.installed import resolve_model
    model = ffnlab.load(resolve_model("smollm2"))
    here = os.path.dirname(os.path.abspath(__file__))
    corpus = os.path.join(here, "..", "..", "shared", "data", "tinyshakespeare.txt")
    corpus = corpus if os.path.exists(corpus) else "/work/shared/data/tinyshakespeare.txt"
    text = open(corpus, encoding="utf-8").read()[:tokens * 6]
    ids = np.array(model.tokenizer.encode(text, add_bos=False), dtype=np.int64)
    cw = context_windows(ids, 128, 16, None)
    model.forward(np.stack(cw.windows[:4]), last_only=True, n_layer=13)       # warm: kernels loaded, pages touched
    xs, ys, n, n_windows = [], [], 0, 0
    t = time.perf_counter()
    for n_windows, x, y in stream_rows(model, cw, "ffn_norm-12", "ffn_out-12", 4):
        xs.append(x), ys.append(y)
        n += len(x)
        if n >= tokens:
            break
    t_harvest = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(0, n_windows, 4):                                            # the same windows, no hooks
        model.forward(np.stack(cw.windows[i:i + 4]), last_only=True, n_layer=13)
    t_plain = time.perf_counter() - t
    return np.concatenate(xs)[:tokens], np.concatenate(ys)[:tokens], n / t_harvest, n / t_plain


x, y, harvest_tps, plain_tps = harvest(args.tokens)
py = os.environ.get("FFNLAB_SAELENS_PYTHON",
                    os.path.join(os.environ.get("FFNLAB_SAELENS_VENV", os.path.expanduser("~/.cache/ffnlab/venv-saelens")),
                                 "bin", "python"))
side = "saelens" if os.path.exists(py) and subprocess.run([py, "-c", "import sae_lens"], capture_output=True).returncode == 0 \
    else "torch"
with tempfile.TemporaryDirectory() as tmp:
    rows = os.path.join(tmp, "rows.npz")
    np.savez(rows, x=x, y=y)
    t_ours = ffnlab_steps(x, y, args.steps, args.batch)
    out = subprocess.run([py if side == "saelens" else sys.executable, os.path.abspath(__file__), "--side", side,
                          "--rows", rows, "--threads", str(args.threads), "--steps", str(args.steps), "--batch",
                          str(args.batch)], capture_output=True, check=True, env=os.environ)
    t_ref = json.loads(out.stdout.decode().strip().splitlines()[-1])
ours, ref = float(np.median(t_ours)), float(np.median(t_ref))
print(f"CPU: {cpu_name()}, {os.cpu_count()} logical CPUs; threads {args.threads}; load average "
      f"{os.getloadavg()[0]:.1f} at the end")
print(f"harvest SmolLM2 ffn_norm-12 + ffn_out-12: {harvest_tps:.0f} scored tokens/s; the same 13 blocks without "
      f"hooks: {plain_tps:.0f}; ratio {harvest_tps / plain_tps:.2f}")
print(f"TopK transcoder 576 -> {D_SAE}, k {K}, batch {args.batch}, AuxK on: ffnlab {ours * 1e3:.0f} ms/step "
      f"({args.batch / ours:.0f} tok/s), {'SAELens ' + subprocess.run([py, '-c', 'import sae_lens; print(sae_lens.__version__)'], capture_output=True).stdout.decode().strip() if side == 'saelens' else 'plain torch (no SAELens here)'} "
      f"{ref * 1e3:.0f} ms/step ({args.batch / ref:.0f} tok/s); ffnlab / reference speed {ref / ours:.2f}x "
      f"(medians of {args.steps} steps)")
