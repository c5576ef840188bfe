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
    from ..evaluation.activations import context_windows
    from ..evaluation.perplexity import paired_ratio, perplexity, text_chunks
    from ..formats.installed import resolve_model
    from ..formats.load import load
    from ..pruning.gguf_rewrite import write_pruned_gguf
    from ..pruning.prune import activation_scores, kept_width, select_units
    from ..training.data import read_text

    path = resolve_model(c["model"])
    model = load(path, progress=False)
    cfg = model.config
    chunks = text_chunks(model, read_text(c["eval"]), c["ctx"], c["eval_chunks"], c["eval"])
    before = perplexity(model, chunks, 4, keep_nll=True)
    tok = model.tokenizer
    cw = context_windows(tok.encode(read_text(c["calib"]), add_bos=False), c["ctx"], MIN_CONTEXT,
                         tok.bos_id if tok.add_bos else None, c["calib_chunks"])
    scores, n_calib = activation_scores(model, cw, 4)
    out = {"model": os.path.basename(path), "d_model": cfg.d_model, "d_ff": cfg.d_ff, "calib_tokens": n_calib,
           "tokens_scored": before.tokens_scored, "ppl_base": before.ppl, "ppl_base_stderr": before.ppl_stderr, "cuts": []}
    for method in ("activation", "naive"):
        for keep in c["keeps"]:
            n_keep = kept_width(cfg.d_ff, keep)
            idx = select_units(scores, n_keep) if method == "activation" else np.tile(np.arange(n_keep), (cfg.n_layer, 1))
            with tempfile.TemporaryDirectory(prefix="ffnlab-prune-") as tmp:
                f = os.path.join(tmp, "pruned.gguf")
                write_pruned_gguf(path, f, idx)
                after = perplexity(load(f, progress=False), chunks, 4, keep_nll=True)
            ratio, se = paired_ratio(after, before)
            out["cuts"].append({"method": method, "keep": keep, "d_ff_after": n_keep, "ppl": after.ppl,
                                "ppl_stderr": after.ppl_stderr, "ppl_ratio": ratio, "ppl_ratio_stderr": se,
                                "ppl_ratio_lo": ratio - 1.96 * se, "ppl_ratio_hi": ratio + 1.96 * se})
    return out


def run_compression(exp, out, backend, log=print):
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
    sm = exp.compression.get("smollm2")
    if sm:
        smol, outcome = run_units({"experiment": exp.name, "stage": "smollm2", "settings": sm},
                                  [Unit("smollm2", sm)], smollm2_unit, {}, os.path.join(out, "smollm2"), backend,
                                  key_of=lambda u: None, shared=None, label=f"{exp.name} smollm2", log=log)
        res["smollm2"] = smol["smollm2"]
        res["compute"]["smollm2_seconds"] = outcome.seconds
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
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
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
    return "\n".join(lines)
