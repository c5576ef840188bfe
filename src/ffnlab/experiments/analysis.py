"""Training runs -> the figures of a train experiment: per run, per variant, and paired by seed.

Per run: the final held-out and training loss (the last evaluation, on the same fixed windows
for every run), the mean training loss over the steps after warmup (the area under the curve:
lower = faster convergence), and the oscillation measure of stats.py. Per variant: MLP
parameters and each figure's mean with its 95% t interval over seeds. Per comparison (a, b):
a - b by seed (stats.paired) for each figure.
"""
import math

import numpy as np

from ..config import ModelConfig
from ..training.ablate import n_params
from . import stats

WINDOW = 25            # steps in the trailing moving average of the oscillation measure
SPIKE_FRAC = 0.05      # a spike: a step's loss above its trailing average by more than 5% of it
METRICS = ("val_loss", "train_loss", "mean_train_loss", "osc_spread", "osc_spikes")


def mlp_params(cfg: ModelConfig) -> int:
    """Weights and biases of every layer's MLP."""
    mats = 3 if cfg.gated else 2
    bias = (cfg.d_ff * (2 if cfg.gated else 1) + cfg.d_model) if cfg.ffn_bias else 0
    return cfg.n_layer * (mats * cfg.d_model * cfg.d_ff + bias)


def run_metrics(result, warmup) -> dict:
    train = result["train"]
    last = result["eval"][-1] if result["eval"] else [0, float("nan"), float("nan")]
    ok = result["diverged_at"] is None
    osc = stats.oscillation(train, WINDOW, skip=warmup, spike_frac=SPIKE_FRAC)
    return {"variant": result["variant"], "seed": result["seed"], "diverged_at": result["diverged_at"],
            "val_loss": last[2] if ok else float("nan"), "train_loss": last[1] if ok else float("nan"),
            "mean_train_loss": float(np.mean(train[warmup:])) if ok and len(train) > warmup else float("nan"),
            "osc_spread": osc["spread"] if ok else float("nan"), "osc_spikes": osc["spikes"] if ok else float("nan"),
            "tokens_per_s": result["tokens_per_s"], "train_seconds": result["train_seconds"],
            "seconds": result["seconds"],
            "train": [round(float(x), 5) for x in train], "eval": [[e[0], round(e[1], 5), round(e[2], 5)]
                                                                   for e in result["eval"]]}


def variant_rows(exp, runs):
    rows = []
    for v in exp.variants:
        rs = [r for r in runs if r["variant"] == v.name]
        row = {"variant": v.name, "ffn": v.config.ffn, "d_ff": v.config.d_ff, "mult": v.config.d_ff / v.config.d_model,
               "ffn_bias": v.config.ffn_bias, "mlp_dropout": v.mlp_dropout, "mlp_params": mlp_params(v.config),
               "params_nonembed": n_params(v.config, embeddings=False), "params": n_params(v.config),
               "seeds": len(rs), "diverged": sum(r["diverged_at"] is not None for r in rs),
               "tokens_per_s": float(np.median([r["tokens_per_s"] for r in rs])) if rs else float("nan")}
        for m in METRICS:
            row[m] = stats.summary([r[m] for r in rs])
        rows.append(row)
    return rows


def comparisons(exp, runs):
    pairs = list(exp.compare)
    if exp.baseline:
        pairs += [(v.name, exp.baseline) for v in exp.variants if v.name != exp.baseline
                  and (v.name, exp.baseline) not in pairs]
    out = []
    for a, b in pairs:
        ra = {r["seed"]: r for r in runs if r["variant"] == a}
        rb = {r["seed"]: r for r in runs if r["variant"] == b}
        out.append({"a": a, "b": b, **{m: stats.paired({s: r[m] for s, r in ra.items()},
                                                       {s: r[m] for s, r in rb.items()}) for m in METRICS}})
    return out


def analyse(exp, results) -> dict:
    """results: {unit id: train_unit result} -> the experiment's tables (no raw weights)."""
    runs = [run_metrics(r, exp.settings.warmup) for _, r in sorted(results.items())]
    return {"variants": variant_rows(exp, runs), "comparisons": comparisons(exp, runs), "runs": runs}


def compute(exp, results) -> dict:
    """runs x tokens x seconds, as measured."""
    rs = list(results.values())
    s = exp.settings
    tokens = s.steps * s.batch * s.seq_len
    return {"runs": len(rs), "tokens_per_run": tokens, "tokens": tokens * len(rs),
            "train_seconds": float(sum(r["train_seconds"] for r in rs)),
            "unit_seconds": float(sum(r["seconds"] for r in rs)),
            "mean_seconds_per_run": float(np.mean([r["seconds"] for r in rs])) if rs else float("nan")}


def fmt_ci(s, digits=4):
    if not math.isfinite(s.get("lo", float("nan"))):
        return f"{s['mean']:.{digits}f}"
    return f"{s['mean']:.{digits}f} [{s['lo']:.{digits}f}, {s['hi']:.{digits}f}]"


def markdown(res) -> str:
    """The variant table and the comparison table, as docs/experiments.md shows them."""
    lines = ["| variant | d_ff | MLP params | val loss [95% CI] | train loss | osc. spread | spikes | tokens/s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res["variants"]:
        lines.append(f"| {r['variant']} | {r['d_ff']} | {r['mlp_params']:,} | {fmt_ci(r['val_loss'])} | "
                     f"{r['train_loss']['mean']:.4f} | {r['osc_spread']['mean']:.4f} | {r['osc_spikes']['mean']:.1f} | "
                     f"{r['tokens_per_s']:,.0f} |")
    if res["comparisons"]:
        lines += ["", "| a - b (paired by seed) | val loss diff [95% t CI] | bootstrap CI | relative | "
                      "mean train loss diff | osc. spread diff | spikes diff |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for c in res["comparisons"]:
            v = c["val_loss"]
            lines.append(f"| {c['a']} - {c['b']} | {v['mean']:+.4f} [{v['lo']:+.4f}, {v['hi']:+.4f}] | "
                         f"[{v['boot_lo']:+.4f}, {v['boot_hi']:+.4f}] | {100 * v['rel_mean']:+.2f}% "
                         f"[{100 * v['rel_lo']:+.2f}, {100 * v['rel_hi']:+.2f}] | "
                         f"{_d(c['mean_train_loss'])} | {_d(c['osc_spread'])} | {_d(c['osc_spikes'], 1)} |")
    return "\n".join(lines)


def _d(p, digits=4):
    if not math.isfinite(p["lo"]):
        return f"{p['mean']:+.{digits}f}"
    return f"{p['mean']:+.{digits}f} [{p['lo']:+.{digits}f}, {p['hi']:+.{digits}f}]"
