"""Claim 7: LoRA with a low rank and little data, on the MLP or on attention.

    base     the base variant's seed-0 run (runs.py; shared with the other claims), written as an
             ffnlab checkpoint OUT/base/ (byte tokenizer)
    grid     training/finetune_grid.py: targets x ranks x training-data sizes x seeds, each a LoRA
             fine-tune on another text (lora.data) than the base was trained on
    learned  held-out loss on that text's tail after the fine-tune minus before (the base's), by
             seed; and MLP targets minus attention targets at the same rank and data, by seed
"""
import math
import os

from ..runtime.executor import ModelSpec, OutputDir
from ..training.finetune_grid import grid_units, run_grid
from . import stats
from .runs import data_digest, digest, weights_of


def write_base(exp, result, folder):
    """A training unit's weights -> an ffnlab checkpoint (what ModelSpec loads on every worker)."""
    from ..training.checkpoint import save_model
    from ..training.data import make_tokenizer
    if os.path.isfile(os.path.join(folder, "model.safetensors")):
        return folder
    tok, meta = make_tokenizer("byte", "")
    save_model(folder, exp.variant(exp.lora["base"]).config, weights_of(result), tok, meta)
    return folder


def run_lora(exp, out, backend, log=print):
    from .analysis import compute as train_compute
    from .runs import run_training
    lo = exp.lora
    if lo["model"]:                                   # an installed pretrained model (smollm2): no base run
        from ..formats.installed import resolve_model
        base, base_key, base_result = resolve_model(lo["model"]), lo["model"], None
    else:
        results, _ = run_training(exp, out, backend, log, variants=[exp.variant(lo["base"])])
        base_result = results[min(k for k, r in results.items() if r["seed"] == 0)]
        base, base_key = write_base(exp, base_result, os.path.join(out, "base")), base_result["key"]
    units = grid_units(lo["targets"], lo["ranks"], exp.seeds, lo["train_tokens"])
    settings = {**lo["settings"]}
    key = {"experiment": exp.name, "stage": "finetune", "quick": exp.quick, "base": base_key,
           "data_sha256": data_digest(lo["data"]), "settings": digest(settings)}
    if lo["data_chars"]:
        key["data_chars"] = lo["data_chars"]
    outdir = OutputDir(os.path.join(out, "finetune"), "experiment", key, [u.id for u in units])
    rows, outcome = run_grid(ModelSpec(os.path.abspath(base)), lo["data"], settings, units, out=outdir, backend=backend,
                             alpha_per_r=2.0, label=f"{exp.name} finetune",
                             on_unit=lambda u, r: log(f"  done {u.id}"), data_chars=lo["data_chars"])
    if outcome.failures:
        from ..errors import FfnlabError
        raise FfnlabError(f"{len(outcome.failures)} fine-tunes failed ({outcome.failures[0][0]}: {outcome.failures[0][1]}); "
                          f"rerun the same command to compute only those")
    log(f"{exp.name} finetune: {len(units)} units, {outcome.resumed} found in {out}/finetune")
    res = analyse(exp, rows)
    if base_result is None:
        res["base_model"] = os.path.basename(base)
        res["compute"] = {"runs": 0, "tokens": 0, "train_seconds": 0.0, "unit_seconds": 0.0}
    else:
        res["base_run"] = {"variant": lo["base"], "seed": 0, "val_loss_shakespeare": base_result["eval"][-1][2]}
        res["compute"] = train_compute(exp, {"base": base_result})
    tokens = [r["tokens_per_s"] for r in rows]
    res["compute"].update(finetune_units=len(rows), finetune_tokens=int(sum(
        settings.get("steps", 200) * settings.get("batch", 4) * settings.get("seq_len", 128) for _ in rows)),
        finetune_seconds=float(sum(r["train_seconds"] for r in rows)),
        finetune_tokens_per_s_median=float(sorted(tokens)[len(tokens) // 2]) if tokens else float("nan"))
    return res


def is_mlp(targets):
    return all(t.strip() in ("up", "down", "gate", "mlp") for t in targets.split(","))


def analyse(exp, rows):
    groups = {}
    for r in rows:
        groups.setdefault((r["targets"], r["r"], r["train_tokens"]), []).append(r)
    cells = []
    for (t, rank, n), rs in sorted(groups.items(), key=lambda kv: (kv[0][2], kv[0][1], kv[0][0])):
        before = {r["seed"]: r["eval"][0][2] for r in rs}
        after = {r["seed"]: (r["final"] or {}).get("val_loss", math.nan) for r in rs}
        learned = stats.paired(after, before)
        cells.append({"targets": t, "r": rank, "train_tokens": n, "mlp": is_mlp(t), "trainable": rs[0]["trainable_params"],
                      "val_loss_before": stats.summary(list(before.values())), "val_loss_after": stats.summary(list(after.values())),
                      "after_minus_before": learned,
                      "train_loss_last": stats.summary([r["train"][-1] for r in rs]),
                      "curves": {r["seed"]: [[e[0], round(e[2], 5)] for e in r["eval"]] for r in rs}})
    pairs = []
    for c in cells:
        if not c["mlp"]:
            continue
        for d in cells:
            if not d["mlp"] and (d["r"], d["train_tokens"]) == (c["r"], c["train_tokens"]):
                a = {int(s): v[-1][1] for s, v in c["curves"].items()}
                b = {int(s): v[-1][1] for s, v in d["curves"].items()}
                pairs.append({"a": c["targets"], "b": d["targets"], "r": c["r"], "train_tokens": c["train_tokens"],
                              "val_loss": stats.paired(a, b)})
    return {"cells": cells, "comparisons": pairs, "runs": [{k: v for k, v in r.items() if k != "train"} for r in rows]}


def markdown(res) -> str:
    from .analysis import _d, fmt_ci
    lines = ["| targets | r | train tokens | trainable | held-out loss before | after [95% CI] | after - before (paired) | "
             "seed sd of the change |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for c in res["cells"]:
        lines.append(f"| {c['targets']} | {c['r']} | {c['train_tokens'] or 'all'} | {c['trainable']:,} | "
                     f"{c['val_loss_before']['mean']:.4f} | {fmt_ci(c['val_loss_after'])} | {_d(c['after_minus_before'])} | "
                     f"{c['after_minus_before']['sd']:.4f} |")
    if res["comparisons"]:
        lines += ["", "| MLP - attention (paired by seed) | r | train tokens | final held-out loss diff [95% CI] |",
                  "|---|---:|---:|---:|"]
        for p in res["comparisons"]:
            lines.append(f"| {p['a']} - {p['b']} | {p['r']} | {p['train_tokens'] or 'all'} | {_d(p['val_loss'])} |")
    return "\n".join(lines)
