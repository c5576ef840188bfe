"""The LoRA targets experiment of docs/lora.md: SmolLM2-135M on tinyshakespeare, adapters on
{q,v}, attn (q,k,v,o), mlp (gate,up,down) or all seven projections, r in {4, 16} with alpha = 2r,
the same steps and tokens for every run, 2 seeds, two data sizes (the whole train split, and its
first SMALL tokens seen again and again).

    nice -n 10 python3 scripts/lora_experiment.py run  --runs /tmp/lora_grid      # resumable
    python3 scripts/lora_experiment.py report --runs /tmp/lora_grid              # table + PNG

`run` runs the grid one `ffnlab finetune` at a time (one thread); a finished run is skipped and an
interrupted one resumed (its own --resume), so the script can be stopped and started again.
`report` writes docs/lora_results.json, docs/lora.png and prints the markdown table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

TARGETS = ["q,v", "attn", "mlp", "all"]
RANKS = [4, 16]
SEEDS = [0, 1]
SMALL = 512                               # tokens in the small data set
DATA = {"full": 0, "small": SMALL}        # --train-tokens (0: the whole train split, 306,985 tokens)
# sized for ~30 min of one core (the machine was shared with four other jobs): 12 steps x 4 x 24 = 1,152
# training tokens per run; the val loss on 2 x 4 fixed windows of 24 tokens, every 4 steps
COMMON = ["-m", "smollm2", "--data", "/work/shared/data/tinyshakespeare.txt", "--steps", "12", "--batch", "4",
          "--seq-len", "24", "--lr", "2e-3", "--warmup", "2", "--eval-every", "4", "--eval-batches", "2",
          "--no-train-eval", "--ckpt-every", "4", "-t", "1", "--quiet"]


def grid():
    """every configuration with seed 0 first, then seed 1: a grid cut short still covers all of them"""
    for seed in SEEDS:
        for data in DATA:
            for r in RANKS:
                for t in TARGETS:
                    yield data, t, r, seed


def run_dir(runs, data, t, r, seed):
    return os.path.join(runs, f"{data}-{t.replace(',', '')}-r{r}-s{seed}")


def done(d):
    f = os.path.join(d, "trainer.json")
    return os.path.isfile(f) and json.load(open(f)).get("done")


def run(args):
    os.makedirs(args.runs, exist_ok=True)
    for data, t, r, seed in grid():
        d = run_dir(args.runs, data, t, r, seed)
        if done(d):
            continue
        cmd = [sys.executable, "-m", "ffnlab.cli.main", "finetune", *COMMON, "--target", t, "--lora-r", str(r),
               "--lora-alpha", str(2 * r), "--seed", str(seed), "--train-tokens", str(DATA[data]), "--out", d]
        if os.path.isfile(os.path.join(d, "trainer.json")):
            cmd.append("--resume")
        t0 = time.time()
        subprocess.run(cmd, check=True)
        print(f"{os.path.basename(d)}: {time.time() - t0:.0f} s", flush=True)


def report(args):
    import numpy as np
    rows, curves = [], {}
    for data, t, r, seed in grid():
        d = run_dir(args.runs, data, t, r, seed)
        if not done(d):
            continue
        rec = json.load(open(os.path.join(d, "trainer.json")))
        curves[(data, t, r, seed)] = rec["history"]["eval"]
        rows.append({"data": data, "targets": t, "r": r, "seed": seed, "trainable": rec["trainable_params"],
                     "val_loss": rec["final"]["val_loss"], "train_loss": float(np.mean(rec["history"]["train"][-4:])),
                     "val_loss_0": rec["history"]["eval"][0][2], "tokens_per_s": rec["tokens_per_s"]})
    summary = []
    for data in DATA:
        for r in RANKS:
            for t in TARGETS:
                g = [x for x in rows if (x["data"], x["targets"], x["r"]) == (data, t, r)]
                if not g:
                    continue
                summary.append({"data": data, "targets": t, "r": r, "alpha": 2 * r, "seeds": len(g),
                                "trainable": g[0]["trainable"], "val_loss_0": g[0]["val_loss_0"],
                                "val_loss": float(np.mean([x["val_loss"] for x in g])),
                                "val_loss_seeds": [x["val_loss"] for x in g],
                                "train_loss": float(np.mean([x["train_loss"] for x in g])),
                                "tokens_per_s": float(np.median([x["tokens_per_s"] for x in g]))})
    with open("docs/lora_results.json", "w") as f:
        json.dump({"settings": COMMON, "small_tokens": SMALL, "runs": rows, "summary": summary}, f, indent=1)
    print("| data | targets | r | trainable | val loss at 0 | final val loss (mean of 2 seeds) | seeds | train loss, last 4 steps | tokens/s |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|")
    for s in summary:
        print(f"| {s['data']} | {s['targets']} | {s['r']} | {s['trainable']:,} | {s['val_loss_0']:.3f} | "
              f"{s['val_loss']:.3f} | {', '.join(f'{v:.3f}' for v in s['val_loss_seeds'])} | {s['train_loss']:.3f} | "
              f"{s['tokens_per_s']:.1f} |")
    plot(curves, summary)


def plot(curves, summary):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    colors = dict(zip(TARGETS, ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for ax, data in zip(axes[:2], DATA):
        for t in TARGETS:
            for r, style in zip(RANKS, ["--", "-"]):
                c = [np.array(curves[k]) for k in curves if k[:3] == (data, t, r)]
                if not c:
                    continue
                mean = np.mean([x[:, 2] for x in c], axis=0)
                ax.plot(c[0][:, 0], mean, style, color=colors[t], label=f"{t} r={r}")
        ax.set_title(f"val loss, {data} data ({'306,985' if data == 'full' else f'{SMALL:,}'} train tokens)")
        ax.set_xlabel("step (x 96 tokens)")
        ax.set_ylabel("held-out loss (mean over seeds)")
        ax.legend(fontsize=7)
    ax = axes[2]
    for data, marker in zip(DATA, ["o", "s"]):
        for s in (x for x in summary if x["data"] == data):
            ax.scatter(s["trainable"], s["val_loss_0"] - s["val_loss"], color=colors[s["targets"]], marker=marker,
                       s=30 if s["r"] == 4 else 70)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v / 1e6:g}M"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("trainable parameters")
    ax.set_ylabel("val loss drop from the base model")
    ax.set_title("drop vs size (o full data, s small; small/large: r=4/16)")
    fig.tight_layout()
    fig.savefig("docs/lora.png", dpi=110)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["run", "report"])
    ap.add_argument("--runs", default="/tmp/lora_grid", help="directory of the runs (one adapter directory each)")
    a = ap.parse_args()
    run(a) if a.what == "run" else report(a)
