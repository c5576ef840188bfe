"""An experiment's PNGs, drawn from its stored results.json only (`ffnlab experiment NAME --plot`).

    docs/experiments_NAME_curves.png    training loss (moving average of 25 steps) per variant: the
                                        mean over seeds and its 95% t band (stats.band)
    docs/experiments_NAME_params.png    width: final held-out loss against MLP parameters, 95% t bars
    docs/experiments_NAME_diffs.png     every paired comparison: the mean difference by seed and its
                                        95% t interval, per figure (val loss, mean train loss, spread)
    docs/experiments_NAME_cuts.png      compression: held-out loss of each cut, recovered and trained
                                        from scratch, with 95% t bars; SmolLM2's paired PPL ratios
    docs/experiments_NAME_lora.png      lora: held-out loss change per cell, 95% t bars
"""
import os

import numpy as np

from ..pictures import pyplot
from . import stats
from .analysis import WINDOW


def plot(res, folder) -> list:
    os.makedirs(folder, exist_ok=True)
    name = res["experiment"] + ("-quick" if res.get("quick") else "")
    out = []
    if res["kind"] == "train":
        out.append(curves(res, os.path.join(folder, f"experiments_{name}_curves.png")))
        if res["comparisons"]:
            out.append(diffs(res, os.path.join(folder, f"experiments_{name}_diffs.png")))
        if res["kind"] == "train" and len({v["d_ff"] for v in res["variants"]}) > 2:   # a width grid
            out.append(params(res, os.path.join(folder, f"experiments_{name}_params.png")))
    if res["kind"] == "compression":
        out.append(cuts(res, os.path.join(folder, f"experiments_{name}_cuts.png")))
    if res["kind"] == "lora":
        out.append(lora(res, os.path.join(folder, f"experiments_{name}_lora.png")))
    return out


def _title(res):
    s = res["setup"]
    m = s["model"]
    if res.get("base_model"):                       # a pretrained model's fine-tunes (lora.model)
        return f"{res['base_model']}, {s['seeds']} seeds, commit {res['machine']['start']['commit']}"
    return (f"{m.get('n_layer')} layers, d_model {m.get('d_model')}, {s['tokens_per_run'] / 1e3:.0f}k tokens/run, "
            f"{s['seeds']} seeds, commit {res['machine']['start']['commit']}")


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path)
    pyplot().close(fig)
    return path


def curves(res, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=110)
    for v in res["variants"]:
        runs = [r["train"] for r in res["runs"] if r["variant"] == v["variant"] and r["train"]]
        n = min((len(r) for r in runs), default=0)
        if n <= WINDOW:
            continue
        smooth = [stats.moving_average(r[:n], WINDOW) for r in runs]         # [seeds][n - WINDOW]
        m, lo, hi = stats.band(smooth)
        x = np.arange(WINDOW + 1, n + 1)
        line, = ax.plot(x, m, lw=1.2, label=v["variant"])
        ax.fill_between(x, lo, hi, color=line.get_color(), alpha=0.25, lw=0)
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss, moving average of {WINDOW} steps (nats/byte)")
    ax.set_title(f"{res['experiment']}: mean over seeds, 95% t band\n{_title(res)}", fontsize=9)
    if ax.get_legend_handles_labels()[0]:                                    # runs shorter than the window draw none
        ax.legend(fontsize=8)
    tail = [r["train"][len(r["train"]) // 2:] for r in res["runs"] if r["train"]]
    if tail:                                                                  # the second half, where the variants part
        lo_y, hi_y = min(min(t) for t in tail), max(max(t) for t in tail)
        ax.set_ylim(lo_y - 0.05, hi_y + 0.15)
    return _save(fig, path)


def diffs(res, path):
    plt = pyplot()
    metrics = [("val_loss", "final held-out loss"), ("mean_train_loss", "mean training loss (convergence)"),
               ("osc_spread", "oscillation spread")]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.0 * len(metrics), 0.6 * len(res["comparisons"]) + 1.8),
                             dpi=110, squeeze=False)
    labels = [f"{c['a']} - {c['b']}" for c in res["comparisons"]]
    for ax, (key, title) in zip(axes[0], metrics):
        for i, c in enumerate(res["comparisons"]):
            p = c[key]
            ax.errorbar([p["mean"]], [i], xerr=[[p["mean"] - p["lo"]], [p["hi"] - p["mean"]]], fmt="o", capsize=4,
                        color="tab:red" if p["excludes_zero"] else "tab:gray")
        ax.axvline(0, color="k", lw=0.8)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels if ax is axes[0][0] else [""] * len(labels), fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("difference by seed, 95% t interval (red: excludes 0)", fontsize=7)
    fig.suptitle(f"{res['experiment']}: paired differences; {_title(res)}", fontsize=9)
    return _save(fig, path)


def params(res, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=110)
    by_ffn = {}
    for v in res["variants"]:
        by_ffn.setdefault(v["ffn"], []).append(v)
    for ffn, vs in by_ffn.items():
        vs = sorted(vs, key=lambda v: v["mlp_params"])
        x = [v["mlp_params"] for v in vs]
        y = [v["val_loss"]["mean"] for v in vs]
        err = [[v["val_loss"]["mean"] - v["val_loss"]["lo"] for v in vs], [v["val_loss"]["hi"] - v["val_loss"]["mean"] for v in vs]]
        ax.errorbar(x, y, yerr=err, marker="o", capsize=4, label=ffn)
        for v in vs:
            ax.annotate(f"{v['mult']:.2g}x", (v["mlp_params"], v["val_loss"]["mean"]), textcoords="offset points",
                        xytext=(5, 5), fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("MLP parameters (all layers)")
    ax.set_ylabel("final held-out loss (nats/byte)")
    ax.set_title(f"{res['experiment']}: mean and 95% t interval over seeds\n{_title(res)}", fontsize=9)
    ax.legend(fontsize=8)
    return _save(fig, path)


def _bar(ax, i, s, color, label=None):
    ax.errorbar([i], [s["mean"]], yerr=[[s["mean"] - s["lo"]], [s["hi"] - s["mean"]]], fmt="o", capsize=4, color=color,
                label=label)


def cuts(res, path):
    plt = pyplot()
    sm = res.get("smollm2")
    panels = (["small"] if res.get("variants") else []) + (["smollm2"] if sm else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels) if len(panels) > 1 else 7, 4.4), dpi=110,
                             squeeze=False)
    axes = dict(zip(panels, axes[0]))
    if "small" in axes:
        ax = axes["small"]
        base = next(v for v in res["variants"] if v["d_ff"] == max(x["d_ff"] for x in res["variants"]))
        ticks = [f"{base['variant']}\n(uncut)"]
        _bar(ax, 0, base["val_loss"], "k")
        scratch = {v["d_ff"]: v for v in res["variants"]}
        for i, r in enumerate(res["cuts"], 1):
            _bar(ax, i - 0.15, r["val_loss_cut"], "tab:red", "cut" if i == 1 else None)
            _bar(ax, i + 0.0, r["val_loss_recovered"], "tab:green", "cut + recovery" if i == 1 else None)
            if r["d_ff_after"] in scratch:
                _bar(ax, i + 0.15, scratch[r["d_ff_after"]]["val_loss"], "tab:blue", "trained at that width" if i == 1 else None)
            ticks.append(f"{r['method']}\nd_ff {r['d_ff_after']}")
        ax.set_xticks(range(len(ticks)))
        ax.set_xticklabels(ticks, fontsize=7)
        ax.set_ylabel("held-out loss (nats/byte), 95% t bars")
        ax.set_title(f"{res['experiment']}: {_title(res)}", fontsize=8)
        ax.legend(fontsize=7)
    if sm:
        ax = axes["smollm2"]
        rec = {(c["method"], c["keep"]): c for c in (sm.get("recovery") or {}).get("cells", [])}
        names = []
        for i, c in enumerate(sm["cuts"]):
            ax.errorbar([i - (0.1 if rec else 0)], [c["ppl_ratio"]],
                        yerr=[[c["ppl_ratio"] - c["ppl_ratio_lo"]], [c["ppl_ratio_hi"] - c["ppl_ratio"]]], fmt="o",
                        capsize=4, color="tab:red" if c["method"] == "naive" else "tab:purple",
                        label="cut (paired on tokens)" if i == 0 else None)
            r = rec.get((c["method"], c["keep"]))
            if r:                                      # after the LoRA recovery: mean over seeds, 95% t
                _bar(ax, i + 0.1, r["ppl_ratio"], "tab:green", "cut + LoRA recovery (seeds)" if i == 0 else None)
            names.append(f"{c['method']}\nd_ff {c['d_ff_after']}")
        if ("uncut", 1.0) in rec:
            _bar(ax, len(names), rec[("uncut", 1.0)]["ppl_ratio"], "k", "uncut + the same fine-tune")
            names.append("uncut\nd_ff " + str(sm["d_ff"]))
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=7)
        ax.set_yscale("log")
        ax.axhline(1, color="k", lw=0.8)
        ax.set_ylabel("PPL / the uncut model's PPL, same tokens (95%)")
        ax.set_title(f"{sm['model']}: d_ff {sm['d_ff']}, {sm['tokens_scored']} held-out tokens", fontsize=8)
        if rec:
            ax.legend(fontsize=7)
    return _save(fig, path)


def lora(res, path):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 4.4), dpi=110)
    cells = res["cells"]
    for i, c in enumerate(cells):
        p = c["after_minus_before"]
        ax.errorbar([i], [p["mean"]], yerr=[[p["mean"] - p["lo"]], [p["hi"] - p["mean"]]], fmt="o", capsize=4,
                    color="tab:green" if c["mlp"] else "tab:blue")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(cells)))
    ax.set_xticklabels([f"{c['targets']}\nr={c['r']}\n{c['train_tokens'] or 'all'} tok" for c in cells], fontsize=7)
    ax.set_ylabel(f"held-out loss after - before (nats/{'token' if res.get('base_model') else 'byte'}), 95% t")
    ax.set_title(f"{res['experiment']}: LoRA on the MLP (green) or attention (blue)\n{_title(res)}", fontsize=9)
    return _save(fig, path)
