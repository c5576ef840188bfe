"""`ffnlab experiment NAME`: run an experiment's grid, analyse it, store results.json.

    exp = config.load("width")
    res = run(exp, out="experiments/runs/width", backend=InProcess())   # resumable: rerun = resume
    write_results(res, "experiments/results/width")

Kinds: train (a grid of variants x seeds: runs.py, analysis.py), compression (a base variant's
runs cut to narrower MLPs, with and without a recovery fine-tune, and SmolLM2 pruned:
compression.py) and lora (a base variant's run fine-tuned with LoRA over targets x ranks x
seeds x data sizes: training/finetune_grid.py, lora.py). Every stage is a list of work units of
runtime/executor.py, so `--ray ADDRESS` runs the same grid on a cluster.
"""
import json
import os
import platform
import subprocess
import time
from dataclasses import asdict

from ..threads import blas_kernels
from . import analysis
from .config import ROOT
from .runs import data_digest, run_training


def run(exp, out, backend, log=print) -> dict:
    """Run (or resume) the experiment into out -> its results (the dict results.json holds)."""
    started = _machine()
    t0 = time.perf_counter()
    if exp.kind == "train":
        results, _ = run_training(exp, out, backend, log)
        res = analysis.analyse(exp, results)
        res["compute"] = analysis.compute(exp, results)
    elif exp.kind == "compression":
        from .compression import run_compression
        res = run_compression(exp, out, backend, log)
    else:
        from .lora import run_lora
        res = run_lora(exp, out, backend, log)
    res["compute"]["wall_seconds"] = time.perf_counter() - t0
    return {"experiment": exp.name, "claim": exp.claim, "kind": exp.kind, "quick": exp.quick,
            "config": os.path.relpath(exp.path, ROOT) if exp.path.startswith(ROOT) else exp.path,
            "setup": setup(exp), "machine": {"start": started, "end": _machine()}, **res}


def setup(exp) -> dict:
    base = exp.variants[0].config.to_dict() if exp.variants else {}
    return {"data": os.path.relpath(exp.data, ROOT) if exp.data.startswith(ROOT) else exp.data,
            "data_sha256": data_digest(exp.data), "seeds": exp.seeds, "settings": asdict(exp.settings),
            "model": {k: base[k] for k in ("arch", "n_layer", "d_model", "n_head", "norm", "positions", "n_ctx",
                                           "vocab_size", "tie_embeddings") if k in base},
            "tokens_per_run": exp.settings.steps * exp.settings.batch * exp.settings.seq_len}


def _machine() -> dict:
    """Where and when: commit, date, CPU, load average (the figures' context)."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            info = f.read()
        name = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name")), cpu)
        fam = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("cpu family")), "?")
        model = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model\t")), "?")
        cpu = f"{name} (family {fam} model {model}, {os.cpu_count()} vCPUs)"
    except OSError:                                   # no /proc (not Linux): platform's name alone
        pass
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    return {"commit": commit or "unknown", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cpu": cpu, "blas": blas_kernels(), "load_average": [round(x, 2) for x in os.getloadavg()]}


def write_results(res, folder):
    """results.json (atomically), small: no weights; curves rounded to 5 digits."""
    from ..training.checkpoint import atomic_write
    os.makedirs(folder, exist_ok=True)
    atomic_write(os.path.join(folder, "results.json"), (json.dumps(res, indent=None, separators=(",", ":"))
                                                        + "\n").encode("utf-8"))


def read_results(folder):
    from ..errors import UsageError
    path = os.path.join(folder, "results.json")
    if not os.path.isfile(path):
        raise UsageError(f"{path}: no stored results; run the experiment first (without --plot)")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except ValueError as e:
        raise UsageError(f"{path}: not valid JSON ({e})") from None


def markdown(res) -> str:
    if res["kind"] == "train":
        return analysis.markdown(res)
    if res["kind"] == "compression":
        from .compression import markdown as m
    else:
        from .lora import markdown as m
    return m(res)


def compute_line(res) -> str:
    c = res["compute"]
    extra = ""
    if "finetune_units" in c:
        extra = f"; {c['finetune_units']} LoRA fine-tunes, {c['finetune_tokens'] / 1e6:.2f}M tokens, {c['finetune_seconds']:.0f} s"
    if "cut_units" in c:
        extra = (f"; {c['cut_units']} cuts with {c['recovery_tokens'] / 1e6:.2f}M recovery tokens, {c['cut_seconds']:.0f} s"
                 + (f"; SmolLM2 {c['smollm2_seconds']:.0f} s" if "smollm2_seconds" in c else ""))
    if "smollm2_recovery_units" in c:
        extra += (f"; SmolLM2 {c['smollm2_seconds']:.0f} s, {c['smollm2_recovery_units']} LoRA recoveries with "
                  f"{c['smollm2_recovery_tokens'] / 1e6:.2f}M tokens, {c['smollm2_recovery_seconds']:.0f} s")
    return (f"compute: {c.get('runs', 0)} training runs, {c.get('tokens', 0) / 1e6:.2f}M tokens, "
            f"{c.get('unit_seconds', 0):.0f} s{extra} ({c['wall_seconds']:.0f} s wall the last time it ran; "
            f"finished units are not recomputed)")
