"""Training grids as work units: one unit is one run (a variant and a seed) of `ffnlab ablate`.

The worker trains the run in a folder of its own (training/ablate.py run_one, the code a local
--jobs process runs) and sends back every file of the run's folder -- trainer record, checkpoint,
train.log -- as bytes; the driver writes them under OUT/runs/<run>/ as each run lands, so the
results table, the plots and a later resume read exactly what a local run leaves. The text goes
with the units (it is the data a remote node does not have).
"""
import json
import os
import tempfile

import numpy as np

from ..runtime.executor import Task, Unit, execute


def run_id(spec):
    return f"{spec['variant']}-s{spec['seed']}"


def train_run(_model, params, spec):
    """On a worker: one run, trained from scratch in a temporary folder -> {dir, files, file<i>: bytes}."""
    from .ablate import run_one
    with tempfile.TemporaryDirectory(prefix="ffnlab-run-") as tmp:
        data = os.path.join(tmp, "data.txt")
        with open(data, "w", encoding="utf-8") as f:
            f.write(params["text"])
        run = os.path.join(tmp, "run")
        os.makedirs(run)
        with open(os.path.join(run, "spec.json"), "w", encoding="utf-8") as f:
            json.dump({**spec, "data": params["data"]}, f)
        run_one(os.path.join(run, "spec.json"), text_path=data)
        return pack_run(run, run_id(spec))


def pack_run(run, name):
    """A run's folder -> {dir: name, files: [relative paths], file<i>: bytes as uint8}."""
    names = sorted(os.path.relpath(os.path.join(d, n), run) for d, _, ns in os.walk(run) for n in ns)
    out = {"dir": name, "files": names}
    for i, rel in enumerate(names):
        with open(os.path.join(run, rel), "rb") as f:
            out[f"file{i}"] = np.frombuffer(f.read(), dtype=np.uint8)
    return out


def write_run(out, result):
    """A unit's files -> OUT/runs/<run>/ (each written whole, then renamed)."""
    d = os.path.join(out, "runs", result["dir"])
    for i, name in enumerate(result["files"]):
        if name == "spec.json":                                      # the driver's own spec (local data path) stays
            continue
        path = os.path.join(d, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as f:
            f.write(result[f"file{i}"].tobytes())
        os.replace(path + ".tmp", path)


def train_runs_on(backend, data):
    """-> train_runs(out, todo, log) for training/ablate.py run_ablation: the runs as units on `backend`."""
    from .data import read_text

    def train_runs(out, todo, log):
        units = sorted((Unit(f"run-{run_id(s)}", s) for s in todo), key=lambda u: u.id)
        outcome = execute(Task(None, train_run, {"text": read_text(data), "data": os.path.abspath(data)}), units,
                          lambda acc, r: acc + [r["dir"]], [], backend=backend, label="ablate",
                          on_unit=lambda u, r: (write_run(out, r), log(f"  done {r['dir']}")))
        for uid, reason in outcome.failures:
            log(f"  FAILED {uid}: {reason}")
        return [uid for uid, _ in outcome.failures]
    return train_runs
