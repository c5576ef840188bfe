"""Ablation plots (matplotlib, Agg backend: no display needed).

  val_loss_vs_params.png   final validation loss against non-embedding parameters
  val_loss_vs_flops.png    ... against training FLOPs per token
      one line per FFN kind, a point per width multiplier, error bars = std over seeds
  loss_curves.png          one panel per FFN kind: training loss (smoothed, mean over seeds)
                           and the validation evaluations, a line per width multiplier
"""
from __future__ import annotations

import os
import textwrap

import numpy as np

from ..pictures import pyplot as _plt


def _by_ffn(rows):
    groups = {}
    for r in rows:
        groups.setdefault(r["ffn"], []).append(r)
    return groups


def loss_vs(rows, x_key, xlabel, path, title):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    for ffn, rs in _by_ffn(rows).items():
        rs = sorted(rs, key=lambda r: r[x_key])
        x = [r[x_key] for r in rs]
        y = [r["val_loss_mean"] for r in rs]
        e = [r["val_loss_std"] for r in rs]
        ax.errorbar(x, y, yerr=e, marker="o", capsize=3, label=ffn)
        for r in rs:
            ax.annotate(f"x{r['mult']:g}", (r[x_key], r["val_loss_mean"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xscale("log")
    _log_ticks(ax, [r[x_key] for r in rows])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("final validation loss (nats/token)")
    ax.set_title(textwrap.fill(title, 70), fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(title="FFN")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _log_ticks(ax, values):
    """Labelled ticks at 1-2-5 (or, within a factor of 4, 1-1.5-2-3-5-7) times a power of ten,
    written 90k / 150k / 2.0M, and unlabelled minor ticks: matplotlib's default labels every
    minor tick of a narrow log range as 9x10^4, 2x10^5, ..., which run into each other."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from ..analysis.text import human
    values = [v for v in values if v > 0]
    if not values:
        return
    narrow = max(values) / min(values) < 4
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0) if narrow else (1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: human(v).replace(".0", "")))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs="auto"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def smooth(y, alpha=0.1):
    """Exponential moving average (bias-corrected, so the first points are not pulled to 0)."""
    out, m = [], 0.0
    for i, v in enumerate(y, 1):
        m = (1 - alpha) * m + alpha * v
        out.append(m / (1 - (1 - alpha) ** i))
    return np.array(out)


def curve_ylim(lowest, finals):
    """The loss panels' y range: the first steps fall from ln(vocab), so the comparison is in the
    last nat above the best smoothed training loss, widened so that every variant's final
    validation point shows (short runs end above that nat). None when nothing is finite."""
    lowest = [v for v in lowest if np.isfinite(v)]
    finals = [v for v in finals if np.isfinite(v)]
    if not lowest:
        return None
    return min(lowest + finals) - 0.1, max([min(lowest) + 1.0] + [v + 0.1 for v in finals])


def loss_curves(rows, path, title):
    plt = _plt()
    groups = _by_ffn(rows)
    n = len(groups)
    cols = min(n, 2)
    nrows = (n + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.0 * cols, 3.6 * nrows), dpi=110, squeeze=False, sharey=True)
    lowest, finals = [], []                            # finals: each variant's last validation point
    for ax, (ffn, rs) in zip(axes.flat, groups.items()):
        for i, r in enumerate(sorted(rs, key=lambda r: r["mult"])):
            color = f"C{i}"
            curves = [c["train"] for c in r["curves"] if c["train"]]
            if curves:
                L = min(len(c) for c in curves)
                mean = np.mean([smooth(c[:L]) for c in curves], axis=0)
                ax.plot(np.arange(1, L + 1), mean, color=color, lw=1, label=f"x{r['mult']:g} train")
                lowest.append(float(np.nanmin(mean)))
            evals = [c["eval"] for c in r["curves"] if c["eval"]]
            if evals:
                L = min(len(e) for e in evals)
                steps = [e[0] for e in evals[0][:L]]
                val = np.mean([[e[2] for e in ev[:L]] for ev in evals], axis=0)
                ax.plot(steps, val, "o--", color=color, ms=3, lw=0.8, label=f"x{r['mult']:g} val")
                finals.append(float(val[-1]))
        ax.set_title(f"{ffn}", fontsize=10)
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:          # a variant that diverged at once has no curve
            ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    ylim = curve_ylim(lowest, finals)
    if ylim:
        axes.flat[0].set_ylim(*ylim)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_all(rows, out, title="") -> list[str]:
    return [loss_vs(rows, "params_nonembed", "non-embedding parameters", os.path.join(out, "val_loss_vs_params.png"), title),
            loss_vs(rows, "flops_per_token", "training FLOPs per token", os.path.join(out, "val_loss_vs_flops.png"), title),
            loss_curves(rows, os.path.join(out, "loss_curves.png"), title)]
