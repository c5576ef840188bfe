"""FFN ablations: train every (FFN kind, width multiplier, seed) on the same data with the same
token budget, then tabulate and plot final losses against parameters and FLOPs.

  OUT/ablation.json              the base settings (a rerun with other settings is refused)
  OUT/runs/<variant>-s<seed>/    one ordinary training checkpoint per run (+ train.log); a run an
                                 early-stopping scheduler ended holds stopped.json instead
                                 (the step, its evaluations; training/tune_grid.py)
  OUT/results.csv, results.json  one row per variant: mean +- std over seeds
  OUT/*.png                      plots (training/plots.py)

Each run is a separate `python -m ffnlab.training.ablate SPEC` process (--jobs at a time), so
runs are isolated, use their own BLAS threads, and a finished run is never retrained: a
rerun of the same command skips done runs and resumes interrupted ones from their checkpoint.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

from ..config import FFN_KINDS, ModelConfig
from ..errors import FfnlabError, UsageError
from ..progress import Progress
from ..model.params import param_shapes
from .checkpoint import atomic_write, atomic_write_json, check_writable, read_trainer
from .presets import default_d_ff
from .trainer import TrainSettings

DIVERGED_FILE = "diverged.json"
STOPPED_FILE = "stopped.json"


# --- sizes ----------------------------------------------------------------------------------
def n_params(cfg: ModelConfig, embeddings=True) -> int:
    shapes = param_shapes(cfg)
    skip = () if embeddings else ("token_embd.weight", "position_embd.weight", "output.weight")
    return int(sum(math.prod(s) for n, s in shapes.items() if n not in skip))


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token = 3 x forward (backward costs twice the forward):
    forward = 2 x (weights used in matmuls, LM head included; lookups, norms, biases excluded)
            + 2 x n_layer x seq_len x q_dim (q.k scores and the weighted sum of v, averaged over
              causal positions: T/2 keys x 2 matmuls x 2 FLOPs per multiply-add)."""
    shapes = param_shapes(cfg)
    matmul = sum(math.prod(s) for n, s in shapes.items()
                 if len(s) == 2 and n not in ("token_embd.weight", "position_embd.weight"))
    matmul += cfg.vocab_size * cfg.d_model if cfg.tie_embeddings else 0     # the head reuses token_embd
    if cfg.moe:                                       # a token runs k of the E stacked experts
        matmul += cfg.n_layer * cfg.n_expert_used * 3 * cfg.d_model * cfg.d_ff
    return int(3 * (2 * matmul + 2 * cfg.n_layer * seq_len * cfg.q_dim))


def n_params_active(cfg: ModelConfig) -> int:
    """Non-embedding parameters one token touches: all of them, less the experts it skips."""
    skipped = cfg.n_layer * (cfg.n_expert - cfg.n_expert_used) * 3 * cfg.d_model * cfg.d_ff if cfg.moe else 0
    return n_params(cfg, embeddings=False) - skipped


def variant_d_ff(d_model: int, ffn: str, mult: float, match_params: bool, moe=None) -> int:
    """mult x d_model; with match_params a gated FFN (three matrices) gets 2/3 of that so its
    parameters equal the dense FFN's at the same mult (mult 4 -> 8/3 d_model).
    moe (E, k, match): each expert gets that width / k (match "active": a token touches the
    parameters of one such MLP) or / E (match "total": all experts hold that many)."""
    d_ff = default_d_ff(d_model, ffn, mult, multiple_of=1) if match_params else int(round(mult * d_model))
    if moe:
        E, k, match = moe
        d_ff = round(d_ff / (k if match == "active" else E))
    return d_ff


def variant_name(ffn, mult, moe=None):
    if moe:
        return f"moe{moe[0]}k{moe[1]}-{moe[2]}-x{mult:g}"
    return f"{ffn}-x{mult:g}"


# --- planning -------------------------------------------------------------------------------
def plan(base: dict, ffns, mults, seeds, match_params, moe=None) -> list[dict]:
    """-> one spec per run: {variant, ffn, mult, seed, config, settings}
    moe: (E, k, [matches]) for --ffn moe: one variant per match ("active", "total")."""
    runs = []
    for ffn in ffns:
        if ffn not in FFN_KINDS:
            raise UsageError(f"--ffn: unknown FFN kind {ffn!r}; choose from {', '.join(FFN_KINDS)}")
        moes = [None]
        if FFN_KINDS[ffn].moe:
            E, k, matches = moe or (4, 1, ["active"])
            moes = [(E, k, m) for m in matches]
        for mult in mults:
            if mult <= 0:
                raise UsageError(f"--mult values must be positive, got {mult:g}")
            for m in moes:
                d_ff = variant_d_ff(base["model"]["d_model"], "swiglu" if m else ffn, mult, match_params, m)
                extra = dict(n_expert=m[0], n_expert_used=m[1], expert_norm=m[1] > 1) if m else {}
                cfg = ModelConfig(**{**base["model"], "ffn": ffn, "d_ff": max(1, d_ff), **extra})
                for seed in range(seeds):
                    settings = {**base["settings"], "seed": seed}
                    runs.append({"variant": variant_name(ffn, mult, m), "ffn": ffn, "mult": mult, "seed": seed,
                                 "config": cfg.to_dict(), "settings": settings})
    return runs


def run_dir(out, spec):
    return os.path.join(out, "runs", f"{spec['variant']}-s{spec['seed']}")


def run_state(out, spec) -> str:
    """'done' | 'diverged' | 'stopped' (by --early-stop's scheduler) | 'partial' (a checkpoint to resume) | 'new'"""
    d = run_dir(out, spec)
    if os.path.isfile(os.path.join(d, DIVERGED_FILE)):
        return "diverged"
    if os.path.isfile(os.path.join(d, STOPPED_FILE)):
        return "stopped"
    rec = read_trainer(d) if os.path.isdir(d) else None
    if rec is None:
        return "new"
    return "done" if rec.get("done") else "partial"


# --- one run (in its own process) -------------------------------------------------------------
def run_one(spec_path, text_path=None, on_eval=None):
    """Train one variant/seed from a spec file; a NaN/Inf is an outcome (diverged.json), not a failure.
    text_path: a copy of spec["data"] to read instead (a Ray worker's, training/grid.py);
    on_eval: the trainer's hook after each evaluation (training/tune_grid.py reports there)."""
    from .data import TokenData, data_info, encode, make_tokenizer, read_text
    from .trainer import DivergedError, train

    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    out = os.path.dirname(spec_path)
    text = read_text(text_path or spec["data"])
    tok, tok_meta = make_tokenizer("byte", text)
    cfg = ModelConfig.from_dict(spec["config"])
    settings = TrainSettings.from_dict(spec["settings"])
    ids = encode(tok, tok_meta, text)
    data = TokenData.from_ids(ids, settings.seq_len, settings.val_frac, path=spec["data"])
    try:
        train(cfg, settings, data, tok, tok_meta, out, resume=True, data_info=data_info(spec["data"], text, len(ids)),
              progress=True, on_eval=on_eval)
    except DivergedError as e:
        atomic_write_json(os.path.join(out, DIVERGED_FILE), {"step": e.step, "message": str(e)})
        print(f"diverged: {e}", file=sys.stderr)


# --- the driver -------------------------------------------------------------------------------
def _first_difference(old, new, prefix=""):
    """'settings.steps is 31, was 30' for the first differing leaf of two nested dicts, else ''."""
    for k in new:
        a, b = old.get(k), new[k]
        if isinstance(a, dict) and isinstance(b, dict):
            d = _first_difference(a, b, f"{prefix}{k}.")
            if d:
                return d
        elif a != b:
            return f"{prefix}{k} is {b!r}, was {a!r}"
    return ""


def run_ablation(data, out, base, ffns, mults, seeds, match_params, jobs=1, threads=1, log=print,
                 moe=None, train_runs=None, early_stop=None) -> list[dict]:
    """Run (or finish) every run of the grid, `jobs` processes at a time; -> the result rows.
    train_runs(out, todo, log) -> [failed run names]: trains the unfinished runs elsewhere
    (training/grid.py: on a Ray cluster) instead of in local processes.
    early_stop: {"scheduler", "grace_period", "reduction_factor"} when train_runs stops weak runs
    (training/tune_grid.py): part of the settings, so a grid is not resumed under another rule."""
    runs = plan(base, ffns, mults, seeds, match_params, moe)         # bad --ffn / --mult fail before any write
    if not os.path.isfile(data):
        raise UsageError(f"--data {data}: no such file")
    check_writable(out)
    data = os.path.abspath(data)
    info_path = os.path.join(out, "ablation.json")
    setup = {"data": data, "base": base, "match_params": match_params}
    if early_stop:
        setup["early_stop"] = early_stop
    if moe:
        setup["moe"] = list(moe[:2]) + [list(moe[2])]
    if os.path.isfile(info_path):
        with open(info_path, encoding="utf-8") as f:
            old = json.load(f)
        diff = _first_difference(old, setup)
        if not diff and ("early_stop" in old) != ("early_stop" in setup):   # a stopped run is not a finished one
            diff = f"--early-stop is {'on' if 'early_stop' in setup else 'off'}, was {'on' if 'early_stop' in old else 'off'}"
        if diff:
            raise UsageError(f"--out {out} holds an ablation with other settings ({diff}); "
                             f"rerun with the same settings or choose another --out")
    else:
        atomic_write_json(info_path, setup)
    todo = []
    for spec in runs:
        state = run_state(out, spec)
        if state in ("done", "diverged", "stopped"):
            continue
        d = run_dir(out, spec)
        os.makedirs(d, exist_ok=True)
        atomic_write_json(os.path.join(d, "spec.json"), {**spec, "data": data})
        todo.append(spec)
    log(f"ablation: {len(runs)} runs, {len(runs) - len(todo)} already finished, {len(todo)} to train, "
        + (f"{jobs} at a time" if train_runs is None else "as work units"))
    failed = (train_runs or (lambda o, t, lg: _train_in_processes(o, t, jobs, threads, lg)))(out, todo, log)
    if failed:
        raise FfnlabError(f"{len(failed)} run(s) failed: {', '.join(failed)}; see their train.log under {out}/runs")
    rows = collect(out, runs, base["settings"]["seq_len"])
    write_results(out, rows)
    return rows


def _train_in_processes(out, todo, jobs, threads, log):
    """Each run in its own `python -m ffnlab.training.ablate SPEC` process, `jobs` at a time -> failed names."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads)}
    running, failed, t0 = [], [], time.monotonic()
    queue = list(todo)
    bar = Progress(len(todo), "ablation runs")             # stderr, on a terminal; the log lines stay
    while queue or running:
        while queue and len(running) < jobs:
            spec = queue.pop(0)
            d = run_dir(out, spec)
            logf = open(os.path.join(d, "train.log"), "ab")
            p = subprocess.Popen([sys.executable, "-m", "ffnlab.training.ablate", os.path.join(d, "spec.json")],
                                 stdout=logf, stderr=subprocess.STDOUT, env=env)
            running.append((p, spec, logf))
        time.sleep(0.2)
        for item in list(running):
            p, spec, logf = item
            if p.poll() is None:
                continue
            running.remove(item)
            logf.close()
            bar.update(1)
            name = f"{spec['variant']} seed {spec['seed']}"
            state = run_state(out, spec)
            if p.returncode != 0 or state not in ("done", "diverged"):
                failed.append(name)
                log(f"  FAILED {name} (exit {p.returncode}); see {os.path.join(run_dir(out, spec), 'train.log')}")
            else:
                log(f"  {state} {name}  [{len(todo) - len(queue) - len(running)}/{len(todo)}, "
                    f"{time.monotonic() - t0:.0f}s]")
    bar.close()
    return failed


# --- results ----------------------------------------------------------------------------------
def run_result(out, spec) -> dict:
    d = run_dir(out, spec)
    cfg = ModelConfig.from_dict(spec["config"])
    res = {"seed": spec["seed"], "diverged_at": None, "stopped_at": None, "train_loss": float("nan"),
           "val_loss": float("nan"), "tokens_per_s": float("nan"), "curve": [], "eval": []}
    if os.path.isfile(os.path.join(d, DIVERGED_FILE)):
        with open(os.path.join(d, DIVERGED_FILE), encoding="utf-8") as f:
            res["diverged_at"] = json.load(f)["step"]
    if os.path.isfile(os.path.join(d, STOPPED_FILE)):                # no final loss: it did not finish
        with open(os.path.join(d, STOPPED_FILE), encoding="utf-8") as f:
            stopped = json.load(f)
        res.update(stopped_at=stopped["step"], curve=stopped["train"], eval=stopped["eval"])
    rec = read_trainer(d)
    if rec is not None:
        res["curve"], res["eval"] = rec["history"]["train"], rec["history"]["eval"]
        if rec.get("done") and rec.get("final"):
            res.update(train_loss=rec["final"]["train_loss"], val_loss=rec["final"]["val_loss"],
                       tokens_per_s=rec["tokens_per_s"])
    res["config"] = cfg
    return res


def _mean_std(xs):
    xs = [x for x in xs if math.isfinite(x)]
    if not xs:
        return float("nan"), float("nan")
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0


def collect(out, runs, seq_len) -> list[dict]:
    """Group runs by variant -> rows with mean and std (sample std, ddof=1) over seeds."""
    by_variant = {}
    for spec in runs:
        by_variant.setdefault(spec["variant"], []).append(spec)
    rows = []
    for variant, specs in by_variant.items():
        results = [run_result(out, s) for s in specs]
        cfg = results[0]["config"]
        tr, trs = _mean_std([r["train_loss"] for r in results])
        va, vas = _mean_std([r["val_loss"] for r in results])
        tps, _ = _mean_std([r["tokens_per_s"] for r in results])
        rows.append({
            "variant": variant, "ffn": specs[0]["ffn"], "mult": specs[0]["mult"], "d_model": cfg.d_model,
            "d_ff": cfg.d_ff, "params": n_params(cfg), "params_nonembed": n_params(cfg, embeddings=False),
            "params_active": n_params_active(cfg),
            "flops_per_token": flops_per_token(cfg, seq_len), "seeds": len(results),
            "train_loss_mean": tr, "train_loss_std": trs, "val_loss_mean": va, "val_loss_std": vas,
            "tokens_per_s": tps, "diverged": sum(r["diverged_at"] is not None for r in results),
            "stopped": sum(r["stopped_at"] is not None for r in results),
            "per_seed": [{k: r[k] for k in ("seed", "train_loss", "val_loss", "tokens_per_s", "diverged_at",
                                            "stopped_at")} for r in results],
            "curves": [{"seed": r["seed"], "train": r["curve"], "eval": r["eval"]} for r in results],
        })
    return rows


CSV_COLUMNS = ["variant", "ffn", "mult", "d_model", "d_ff", "params", "params_nonembed", "params_active",
               "flops_per_token", "seeds",
               "train_loss_mean", "train_loss_std", "val_loss_mean", "val_loss_std", "tokens_per_s", "diverged",
               "stopped"]


def write_results(out, rows):
    import io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for r in rows:
        w.writerow([f"{r[c]:g}" if c == "mult" else f"{r[c]:.4f}" if isinstance(r[c], float) else r[c]
                    for c in CSV_COLUMNS])
    atomic_write(os.path.join(out, "results.csv"), buf.getvalue().encode("utf-8"))
    atomic_write_json(os.path.join(out, "results.json"), {"rows": [{k: v for k, v in r.items() if k != "curves"}
                                                                   for r in rows]})
    atomic_write_json(os.path.join(out, "curves.json"), {r["variant"]: r["curves"] for r in rows})


def markdown_table(rows) -> str:
    """The results as a Markdown table (docs, `ffnlab ablate` output); a `stopped` column when an
    early-stopping scheduler ended some runs (their losses are left out of the means)."""
    stops = any(r.get("stopped") for r in rows)
    lines = ["| variant | d_ff | params (non-emb) | active | train FLOPs/token | train loss | val loss | tokens/s | "
             "diverged |" + (" stopped |" if stops else ""), "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|" if stops else "")]
    for r in rows:
        n = r["seeds"] - r["diverged"] - r.get("stopped", 0)     # a spread needs two finished seeds

        def loss(key):
            return f"{r[key + '_mean']:.4f}" + (f" ± {r[key + '_std']:.4f}" if n > 1 else "")
        lines.append(f"| {r['variant']} | {r['d_ff']} | {r['params_nonembed']:,} | {r.get('params_active', r['params_nonembed']):,} | "
                     f"{r['flops_per_token'] / 1e6:.2f}M | "
                     f"{loss('train_loss')} | {loss('val_loss')} | {r['tokens_per_s']:,.0f} | "
                     f"{r['diverged']}/{r['seeds']} |" + (f" {r.get('stopped', 0)}/{r['seeds']} |" if stops else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    run_one(sys.argv[1])
