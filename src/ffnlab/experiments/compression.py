"""Claim 2 as a compression experiment: a model trained with a 4x MLP cut to narrower MLPs.

    for every seed of the base variant (trained by runs.py; shared with the width claim):
        for keep in keeps, method in methods:
            scores   activation: mean |h_i| over calibration windows of the training split
                     (pruning/prune.py activation_scores, what `ffnlab prune --by activation` uses);
                     naive: none, the last units are cut (units 0 .. n_keep-1 stay)
            cut      pruning/prune.py select_units + prune_params: the same width in every layer
            loss     held-out loss on the fixed windows every run's final evaluation uses
            recover  recovery_steps of training from the cut weights (all weights, AdamW from zero
                     moments, lr recovery_lr), then the same held-out loss
    and SmolLM2-135M (MLP 1536 = 2.67 d_model): `ffnlab prune`'s code on its GGUF, perplexity on
    held-out text before and after, paired on the same tokens (evaluation/perplexity.py).

Every cut is compared paired by seed with the uncut base and with the variant trained from
scratch at the cut width (the references).
"""
import hashlib
import math
import os
import tempfile
from dataclasses import asdict, replace

import numpy as np

from ..runtime.executor import Unit
from . import stats
from .runs import data_digest, digest, run_units, token_data, weights_of

MIN_CONTEXT = 16           # calibration: each scored token with >= 16 tokens before it in its window


def cut_units(exp, base_results):
    c = exp.compression
    units = []
    for uid, r in sorted(base_results.items()):
        for method in c["methods"]:
            for keep in c["keeps"]:
                payload = {"seed": r["seed"], "method": method, "keep": keep, "config": exp.variant(c["base"]).config.to_dict(),
                           "settings": asdict(exp.settings), "recovery_steps": c["recovery_steps"],
                           "recovery_lr": c["recovery_lr"], "recovery_warmup": c["recovery_warmup"],
                           "calib_windows": c["calib_windows"], "weights": weights_of(r)}
                units.append(Unit(f"cut-{method}-k{keep:.3f}-s{r['seed']:02d}", payload))
    return sorted(units, key=lambda u: u.id)


def keep_index(model, cfg, method, n_keep, train_ids, seq_len, n_windows):
    """-> [n_layer, n_keep] units kept, and the share of the score they carry (nan for naive)."""
    from ..evaluation.activations import context_windows
    from ..pruning.prune import activation_scores, select_units
    if method == "naive":
        return np.tile(np.arange(n_keep), (cfg.n_layer, 1)), float("nan")
    cw = context_windows(train_ids, seq_len, min(MIN_CONTEXT, seq_len // 4), None, n_windows)
    scores, _ = activation_scores(model, cw, batch=8)                    # [n_layer, d_ff]
    idx = select_units(scores, n_keep)
    return idx, float(np.mean(np.take_along_axis(scores, idx, 1).sum(1) / scores.sum(1)))


def cut_unit(_model, params, p):
    """On a worker: cut one base run's MLP, measure, recover, measure -> the figures."""
    from ..config import ModelConfig
    from ..model import Model
    from ..pruning.prune import kept_width, prune_params
    from ..training.data import data_info, eval_batches
    from ..training.trainer import TrainSettings, mean_loss, train
    from .runs import _copy_into

    cfg = ModelConfig.from_dict(p["config"])
    s = TrainSettings.from_dict(p["settings"])
    data, tok, meta, n = token_data(params["text"], s.seq_len, s.val_frac, params["data"])
    w = {k: np.asarray(v) for k, v in p["weights"].items()}
    val = eval_batches(data.val, s.batch, s.seq_len, s.eval_batches)   # the trainer's final-evaluation windows
    base = Model(cfg, w)
    n_keep = kept_width(cfg.d_ff, p["keep"])
    idx, kept_share = keep_index(base, cfg, p["method"], n_keep, data.train, s.seq_len, p["calib_windows"])
    cut, cut_cfg = prune_params(w, cfg, idx)
    out = {"seed": p["seed"], "method": p["method"], "keep": p["keep"], "d_ff": cfg.d_ff, "d_ff_after": n_keep,
           "score_kept": kept_share, "val_loss_base": mean_loss(base, val), "val_loss_cut": mean_loss(Model(cut_cfg, cut), val),
           "val_loss_recovered": float("nan"), "recovery_tokens": 0}
    if p["recovery_steps"]:
        rs = replace(s, steps=p["recovery_steps"], lr=p["recovery_lr"], warmup=p["recovery_warmup"],
                     eval_every=p["recovery_steps"], seed=1000 + p["seed"], ckpt_every=0, schedule_steps=0)
        with tempfile.TemporaryDirectory(prefix="ffnlab-recover-") as tmp:
            rec = train(cut_cfg, rs, data, tok, meta, tmp, data_info=data_info(params["data"], params["text"], n),
                        progress=False, init_hook=lambda q: _copy_into(q, cut))
        out["val_loss_recovered"] = rec["final"]["val_loss"]
        out["recovery_tokens"] = rs.steps * rs.batch * rs.seq_len
        out["recovery_seconds"] = rec["train_seconds"]
    return out


def smollm2_unit(_model, params, c):
    """On a worker: SmolLM2's MLP cut by `ffnlab prune`'s code (activation scores) and naively,
    perplexity on held-out text before and after, paired on the same tokens."""
    from ..evaluation.perplexity import paired_ratio, perplexity
    from ..formats.load import load
    from ..pruning.prune import kept_width
    path, model, chunks, before, scores, n_calib = _smollm2_base(c)
    cfg = model.config
    out = {"model": os.path.basename(path), "d_model": cfg.d_model, "d_ff": cfg.d_ff, "calib_tokens": n_calib,
           "tokens_scored": before.tokens_scored, "ppl_base": before.ppl, "ppl_base_stderr": before.ppl_stderr, "cuts": []}
    for method in ("activation", "naive"):
        for keep in c["keeps"]:
            with tempfile.TemporaryDirectory(prefix="ffnlab-prune-") as tmp:
                after = perplexity(load(_smollm2_cut(path, c, method, keep, scores, tmp), progress=False), chunks, 4,
                                   keep_nll=True)
            ratio, se = paired_ratio(after, before)
            out["cuts"].append({"method": method, "keep": keep, "d_ff_after": kept_width(cfg.d_ff, keep), "ppl": after.ppl,
                                "ppl_stderr": after.ppl_stderr, "ppl_ratio": ratio, "ppl_ratio_stderr": se,
                                "ppl_ratio_lo": ratio - 1.96 * se, "ppl_ratio_hi": ratio + 1.96 * se})
    return out


def _smollm2_cut(path, c, method, keep, scores, folder):
    """-> the GGUF of SmolLM2 with its MLP cut to `keep` (path itself when keep is 1)."""
    from ..pruning.gguf_rewrite import write_pruned_gguf
    from ..pruning.prune import kept_width, select_units
    if keep >= 1.0:
        return path
    d_ff, n_layer = scores.shape[1], scores.shape[0]
    n_keep = kept_width(d_ff, keep)
    idx = select_units(scores, n_keep) if method == "activation" else np.tile(np.arange(n_keep), (n_layer, 1))
    f = os.path.join(folder, "pruned.gguf")
    write_pruned_gguf(path, f, idx)
    return f


_SMOL = {}


def _smollm2_base(c):
    """-> (path, model, held-out chunks, the uncut model's perplexity with every token's nll, activation
    scores): once per worker and settings."""
    from ..evaluation.activations import context_windows
    from ..evaluation.perplexity import perplexity, text_chunks
    from ..formats.installed import resolve_model
    from ..formats.load import load
    from ..pruning.prune import activation_scores
    from ..training.data import read_text
    key = (c["model"], c["eval"], c["calib"], c["ctx"], c["eval_chunks"], c["calib_chunks"])
    if key not in _SMOL:
        path = resolve_model(c["model"])
        model = load(path, progress=False)
        chunks = text_chunks(model, read_text(c["eval"]), c["ctx"], c["eval_chunks"], c["eval"])
        before = perplexity(model, chunks, 4, keep_nll=True)
        tok = model.tokenizer
        cw = context_windows(tok.encode(read_text(c["calib"]), add_bos=False), c["ctx"], MIN_CONTEXT,
                             tok.bos_id if tok.add_bos else None, c["calib_chunks"])
        scores, n_calib = activation_scores(model, cw, 4)
        _SMOL[key] = (path, model, chunks, before, scores, n_calib)
    return _SMOL[key]


def recovery_units(c):
    """SmolLM2's recovery grid: every cut x seed, and the uncut model fine-tuned the same way (the
    control: the fine-tune text alone moves the held-out perplexity)."""
    r = c["recovery"]
    cells = [("uncut", 1.0)] + [(m, k) for m in r["methods"] for k in c["keeps"]]
    return sorted((Unit(f"recover-{m}-k{k:.3f}-s{s:02d}", {"method": m, "keep": k, "seed": s})
                   for m, k in cells for s in range(r["seeds"])), key=lambda u: u.id)


def smollm2_recovery_unit(_model, params, p):
    """On a worker: cut SmolLM2's MLP, fine-tune LoRA adapters on the recovery text (the base frozen,
    as `ffnlab finetune`), then perplexity with the adapters on the held-out chunks, paired on the
    same tokens with the uncut model before any fine-tune."""
    from ..evaluation.perplexity import paired_ratio, perplexity
    from ..formats.load import load
    from ..training.data import TokenData, data_info
    from ..training.finetune import FinetuneSettings, finetune
    c, r = params["smollm2"], params["smollm2"]["recovery"]
    path, _, chunks, before, scores, _ = _smollm2_base(c)
    s = FinetuneSettings.from_dict({**r["settings"], "seed": p["seed"]})
    with tempfile.TemporaryDirectory(prefix="ffnlab-recover-") as tmp:
        f = _smollm2_cut(path, c, p["method"], p["keep"], scores, tmp)
        model = load(f, progress=False)
        ids = model.tokenizer.encode(params["text"], add_bos=False)
        data = TokenData.from_ids(ids, s.seq_len, s.val_frac, path=r["data"])
        adapter = os.path.join(tmp, "adapter")
        rec = finetune(model, s, data, adapter, data_info=data_info(r["data"], params["text"], len(ids)),
                       base_model=os.path.basename(path), progress=False)
        cut = perplexity(model, chunks, 4)
        after = perplexity(load(f, progress=False, lora=adapter), chunks, 4, keep_nll=True)
    ratio, se = paired_ratio(after, before)
    return {**p, "d_ff_after": int(model.config.d_ff), "ppl_cut": cut.ppl, "ppl": after.ppl,
            "mean_nll": after.nll, "ppl_ratio": ratio, "ppl_ratio_stderr": se,
            "finetune_val_loss_before": rec["history"]["eval"][0][2], "finetune_val_loss": rec["final"]["val_loss"],
            "trainable_params": rec["trainable_params"], "tokens": s.steps * s.batch * s.seq_len,
            "train_seconds": rec["train_seconds"], "tokens_per_s": rec["tokens_per_s"]}


def run_compression(exp, out, backend, log=print):
    res = run_cuts(exp, out, backend, log) if exp.variants else {"cuts": [], "compute": {}}
    sm = exp.compression.get("smollm2")
    if sm:
        smol, outcome = run_units({"experiment": exp.name, "stage": "smollm2", "settings": _no_recovery(sm)},
                                  [Unit("smollm2", _no_recovery(sm))], smollm2_unit, {}, os.path.join(out, "smollm2"),
                                  backend, key_of=lambda u: None, shared=None, label=f"{exp.name} smollm2", log=log)
        res["smollm2"] = smol["smollm2"]
        res["compute"]["smollm2_seconds"] = outcome.seconds
    if sm and sm.get("recovery"):
        from ..training.data import read_text
        r = sm["recovery"]
        text = read_text(r["data"])
        text = text[:r["data_chars"]] if r["data_chars"] else text
        units = recovery_units(sm)
        job = {"experiment": exp.name, "stage": "smollm2-recovery", "settings": sm,
               "data_sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}
        recs, outcome = run_units(job, units, smollm2_recovery_unit, {"smollm2": sm, "text": text},
                                  os.path.join(out, "smollm2-recovery"), backend, key_of=lambda u: None, shared=None,
                                  label=f"{exp.name} smollm2 recovery", log=log)
        res["smollm2"]["recovery"] = analyse_recovery(sm, list(recs.values()))
        res["compute"].update(smollm2_recovery_units=len(recs),
                              smollm2_recovery_tokens=int(sum(x["tokens"] for x in recs.values())),
                              smollm2_recovery_seconds=outcome.seconds)
    return res


def _no_recovery(sm):
    """the no-recovery unit's settings as they were before recovery existed (its stored results stay valid)"""
    return {k: v for k, v in sm.items() if k != "recovery"}


def analyse_recovery(sm, recs):
    """-> per cut: the perplexity ratio to the uncut model before any fine-tune (paired on tokens within a
    seed, t interval over seeds), and to the uncut model fine-tuned the same way with the same seed."""
    control = {x["seed"]: x["mean_nll"] for x in recs if x["method"] == "uncut"}
    cells = []
    for m, k in [("uncut", 1.0)] + [(m, k) for m in sm["recovery"]["methods"] for k in sm["keeps"]]:
        xs = sorted((x for x in recs if x["method"] == m and x["keep"] == k), key=lambda x: x["seed"])
        if not xs:
            continue
        cell = {"method": m, "keep": k, "d_ff_after": xs[0]["d_ff_after"], "seeds": len(xs),
                "ppl_cut": xs[0]["ppl_cut"], "ppl": stats.summary([x["ppl"] for x in xs]),
                "ppl_ratio": stats.summary([x["ppl_ratio"] for x in xs]),
                "runs": [{kk: v for kk, v in x.items()} for x in xs]}
        if m != "uncut" and control:
            # exp of the mean nll difference on the same tokens, by seed: PPL(recovered cut) / PPL(recovered uncut)
            cell["ratio_to_control"] = stats.summary([math.exp(x["mean_nll"] - control[x["seed"]]) for x in xs
                                                      if x["seed"] in control])
        cells.append(cell)
    return {"settings": sm["recovery"], "cells": cells}


def run_cuts(exp, out, backend, log=print):
    from ..training.data import read_text
    from .analysis import compute as train_compute
    from .runs import run_training
    base_results, _ = run_training(exp, out, backend, log)
    sha = data_digest(exp.data)
    params = {"text": read_text(exp.data), "data": exp.data}
    units = cut_units(exp, {k: r for k, r in base_results.items() if r["variant"] == exp.compression["base"]})
    job = {"experiment": exp.name, "stage": "cut", "quick": exp.quick, "data_sha256": sha,
           "specs": digest([{k: v for k, v in u.payload.items() if k != "weights"} for u in units])}
    cuts, outcome = run_units(job, units, cut_unit, params, os.path.join(out, "cut"), backend, key_of=lambda u: None,
                              shared=None, label=f"{exp.name} cut", log=log)
    res = analyse(exp, base_results, list(cuts.values()))
    res["compute"] = train_compute(exp, base_results)
    res["compute"]["cut_units"] = len(cuts)
    res["compute"]["recovery_tokens"] = int(sum(c["recovery_tokens"] for c in cuts.values()))
    res["compute"]["cut_seconds"] = outcome.seconds
    return res


def analyse(exp, base_results, cuts):
    from .analysis import analyse as train_analyse
    tr = train_analyse(exp, base_results)
    base = {r["seed"]: r["val_loss"] for r in tr["runs"] if r["variant"] == exp.compression["base"]}
    scratch = {}
    for r in tr["runs"]:
        if r["variant"] in exp.compression["references"]:
            scratch.setdefault(exp.variant(r["variant"]).config.d_ff, {})[r["seed"]] = r["val_loss"]
    rows = []
    for method in exp.compression["methods"]:
        for keep in exp.compression["keeps"]:
            cs = [c for c in cuts if c["method"] == method and c["keep"] == keep]
            if not cs:
                continue
            d_ff = cs[0]["d_ff_after"]
            cut = {c["seed"]: c["val_loss_cut"] for c in cs}
            rec = {c["seed"]: c["val_loss_recovered"] for c in cs}
            b = {c["seed"]: c["val_loss_base"] for c in cs}
            row = {"method": method, "keep": keep, "d_ff_after": d_ff, "mult_after": d_ff / exp.variant(exp.compression["base"]).config.d_model,
                   "score_kept": stats.summary([c["score_kept"] for c in cs]),
                   "val_loss_cut": stats.summary(list(cut.values())), "val_loss_recovered": stats.summary(list(rec.values())),
                   "cut_minus_base": stats.paired(cut, b), "recovered_minus_base": stats.paired(rec, b),
                   # the share of what training gained over a uniform guess (ln 256 nats) that the cut loses
                   "share_lost": stats.summary([(cut[s] - b[s]) / (math.log(256) - b[s]) for s in cut])}
            if d_ff in scratch:
                row["cut_minus_scratch"] = stats.paired(cut, scratch[d_ff])
                row["recovered_minus_scratch"] = stats.paired(rec, scratch[d_ff])
            rows.append(row)
    base_check = max((abs(c["val_loss_base"] - base[c["seed"]]) for c in cuts if c["seed"] in base), default=0.0)
    return {"variants": tr["variants"], "runs": tr["runs"], "comparisons": tr["comparisons"], "cuts": rows,
            "base_loss_recomputed_max_diff": base_check, "cut_runs": cuts}


def markdown(res) -> str:
    from .analysis import _d, fmt_ci
    from .analysis import markdown as train_markdown
    lines = [train_markdown(res), "",
             "| cut | d_ff after | val loss after cut | cut - base (paired) | share of the learned drop lost | "
             "after recovery | recovered - base | recovered - trained at that width |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"] if res.get("variants") else []
    for r in res["cuts"]:
        sc = r.get("recovered_minus_scratch")
        lines.append(f"| {r['method']} keep {r['keep']:g} | {r['d_ff_after']} | {fmt_ci(r['val_loss_cut'])} | "
                     f"{_d(r['cut_minus_base'])} | {100 * r['share_lost']['mean']:.1f}% | {fmt_ci(r['val_loss_recovered'])} | "
                     f"{_d(r['recovered_minus_base'])} | {_d(sc) if sc else '-'} |")
    sm = res.get("smollm2")
    if sm:
        lines += ["", f"SmolLM2 ({sm['model']}, d_ff {sm['d_ff']} = {sm['d_ff'] / sm['d_model']:.2f} d_model): "
                      f"PPL {sm['ppl_base']:.3f} +/- {sm['ppl_base_stderr']:.3f} on {sm['tokens_scored']} held-out tokens", "",
                  "| cut | d_ff after | PPL | PPL ratio (paired) [95% CI] |", "|---|---:|---:|---:|"]
        for c in sm["cuts"]:
            lines.append(f"| {c['method']} keep {c['keep']:g} | {c['d_ff_after']} | {c['ppl']:.3f} | "
                         f"{c['ppl_ratio']:.3f} [{c['ppl_ratio_lo']:.3f}, {c['ppl_ratio_hi']:.3f}] |")
    rec = (sm or {}).get("recovery")
    if rec:
        st = rec["settings"]["settings"]
        lines += ["", f"After a LoRA recovery fine-tune (r {st['r']}, alpha {st['alpha']:g}, on {st['targets']}; "
                      f"{st['steps']} steps x {st['batch']} x {st['seq_len']} tokens, lr {st['lr']:g}), mean over "
                      f"{rec['cells'][0]['seeds']} seeds [95% t interval]:", "",
                  "| cut | d_ff after | PPL before recovery | PPL after | PPL ratio to the uncut base | "
                  "ratio to the uncut model fine-tuned the same way |", "|---|---:|---:|---:|---:|---:|"]
        for c in rec["cells"]:
            rc = c.get("ratio_to_control")
            name = c["method"] if c["method"] == "uncut" else f"{c['method']} keep {c['keep']:g}"
            lines.append(f"| {name} | {c['d_ff_after']} | {c['ppl_cut']:.3f} | {fmt_ci(c['ppl'], 3)} | {fmt_ci(c['ppl_ratio'], 3)} | "
                         f"{fmt_ci(rc, 3) if rc else '-'} |")
    return "\n".join(lines)
