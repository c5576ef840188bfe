"""An experiment's training runs as work units of the execution layer (runtime/executor.py).

    units  = train_units(exp)                 # one per (variant, seed), ids sorted
    result = train_unit(None, params, spec)   # on a worker: trains one run from scratch
    results = run_units(exp, units, train_unit, params, out, backend)

A training unit's result is its loss history (every step's training loss, the evaluations),
the final losses, its speed and the final weights (.npy; compression and LoRA start from them).
Each finished unit is kept in OUT/units/ID/ (executor.OutputDir: atomic, resumable); the same
run is also kept under OUT/../shared/KEY/, KEY the digest of everything that decides it (model
config, settings, seed, data), so another experiment that needs the same run (GELU 4x is the
baseline of five claims) finds it there instead of training it again. A run is deterministic for
its seed: seed s fixes the init and the batch order of every variant, so runs pair by seed.
"""
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict

import numpy as np

from ..runtime.executor import OutputDir, Task, Unit, execute, read_result
from ..training.data import read_text

SHARED = "shared"


def digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:20]


def data_digest(path) -> str:
    from ..runtime.executor import file_digest
    return file_digest(path)


def train_spec(exp, variant, seed, data_sha) -> dict:
    settings = {**asdict(exp.settings), "seed": seed, "mlp_dropout": variant.mlp_dropout}
    return {"variant": variant.name, "seed": seed, "config": variant.config.to_dict(), "settings": settings,
            "data_sha256": data_sha}


def run_key(spec) -> str:
    """What decides a training run's numbers (not its name in one experiment)."""
    return "train-" + digest({k: spec[k] for k in ("config", "settings", "data_sha256")})


def train_units(exp, data_sha, variants=None):
    """-> [Unit] for every (variant, seed), in id order."""
    units = []
    for v in variants or exp.variants:
        for seed in range(exp.seeds):
            spec = train_spec(exp, v, seed, data_sha)
            units.append(Unit(f"train-{v.name}-s{seed:02d}", spec, spec["settings"]["steps"] * spec["settings"]["batch"]
                              * spec["settings"]["seq_len"]))
    return sorted(units, key=lambda u: u.id)


_DATA = {}


def token_data(text, seq_len, val_frac, path=""):
    """The byte tokens of the text, split as `ffnlab train` splits it (cached per worker process)."""
    from ..training.data import TokenData, encode, make_tokenizer
    key = (hashlib.sha256(text.encode()).hexdigest(), seq_len, val_frac)
    if key not in _DATA:
        tok, meta = make_tokenizer("byte", text)
        ids = encode(tok, meta, text)
        _DATA[key] = (TokenData.from_ids(ids, seq_len, val_frac, path=path), tok, meta, len(ids))
    return _DATA[key]


def train_unit(_model, params, spec):
    """On a worker: one run from scratch in a temporary folder (training/trainer.py's loop) -> its
    history, final losses, speed and weights. A non-finite loss is an outcome (diverged_at)."""
    import time

    from ..config import ModelConfig
    from ..training.checkpoint import read_trainer
    from ..training.data import data_info
    from ..training.trainer import DivergedError, TrainSettings, train
    from ..formats.checkpoint import read_weights

    cfg = ModelConfig.from_dict(spec["config"])
    settings = TrainSettings.from_dict(spec["settings"])
    data, tok, meta, n = token_data(params["text"], settings.seq_len, settings.val_frac, params["data"])
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ffnlab-exp-") as tmp:
        diverged = None
        try:
            init = params.get("init")
            rec = train(cfg, settings, data, tok, meta, tmp, data_info=data_info(params["data"], params["text"], n),
                        progress=False, init_hook=(lambda p: _copy_into(p, init)) if init else None)
        except DivergedError as e:
            diverged, rec = e.step, read_trainer(tmp) or {"history": {"train": [], "grad_norm": [], "eval": []}}
        weights = read_weights(tmp, cfg) if diverged is None else {}
    out = {"variant": spec["variant"], "seed": spec["seed"], "key": run_key(spec), "diverged_at": diverged,
           "train": rec["history"]["train"], "grad_norm": rec["history"]["grad_norm"], "eval": rec["history"]["eval"],
           "final": rec.get("final"), "tokens_per_s": rec.get("tokens_per_s", 0.0),
           "train_seconds": rec.get("train_seconds", 0.0), "seconds": time.perf_counter() - t0}
    out.update({f"w.{k}": np.asarray(v) for k, v in weights.items()})
    return out


def _copy_into(p, init):
    """init_hook: the freshly initialised weights take the given values (a recovery fine-tune
    continues from a pruned model's weights)."""
    for k, v in init.items():
        p[k][...] = v


def weights_of(result) -> dict:
    return {k[2:]: v for k, v in result.items() if k.startswith("w.")}


# --- running units with the shared store ----------------------------------------------------------
def shared_dir(exp_out):
    """The store beside an experiment's runs folder: experiments/runs/shared for experiments/runs/NAME."""
    return os.path.join(os.path.dirname(os.path.abspath(exp_out)), SHARED)


def _copy_unit(src, dst_folder, unit_id):
    """A finished unit folder -> dst_folder/unit_id, whole or not at all (copy, then rename)."""
    final = os.path.join(dst_folder, unit_id)
    if os.path.exists(final):
        return
    tmp = os.path.join(dst_folder, f".{unit_id}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    try:
        os.rename(tmp, final)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)


def run_units(job, units, fn, params, out, backend, key_of, shared, label="", log=print):
    """Run (or finish) `units` with fn on backend into OutputDir `out` -> {unit id: result}.
    key_of(unit) -> a key in the shared store folder `shared`, or None (not shared)."""
    outdir = OutputDir(out, "experiment", job, [u.id for u in units])
    if shared:
        os.makedirs(shared, exist_ok=True)
    for u in units:                                   # runs another experiment already trained
        k = shared and key_of(u)
        if k and not outdir.finished(u.id) and os.path.isfile(os.path.join(shared, k, "result.json")):
            _copy_unit(os.path.join(shared, k), outdir.units, u.id)

    def landed(u, result):
        k = shared and key_of(u)
        if k:
            _copy_unit(os.path.join(outdir.units, u.id), shared, k)
        log(f"  done {u.id}")

    outcome = execute(Task(None, fn, params), units, lambda acc, r: acc + 1, 0, out=outdir, backend=backend,
                      label=label, on_unit=landed)
    if outcome.failures:
        from ..errors import FfnlabError
        for uid, reason in outcome.failures:
            log(f"unit {uid} failed: {reason}")
        raise FfnlabError(f"{len(outcome.failures)} of {len(units)} units failed ({outcome.failures[0][0]}: "
                          f"{outcome.failures[0][1]}); rerun the same command to compute only those")
    log(f"{label}: {len(units)} units, {outcome.resumed} found in {out}" + (f" or {shared}" if shared else "") + ", "
        f"{len(units) - outcome.resumed} computed in {outcome.seconds:.0f} s")
    return {u.id: outdir.read(u.id) for u in units}, outcome


def read_unit(out, unit_id):
    return read_result(os.path.join(out, "units"), unit_id)


def job_key(exp, sha, stage, specs):
    return {"experiment": exp.name, "stage": stage, "quick": exp.quick, "data_sha256": sha, "specs": digest(specs)}


def run_training(exp, out, backend, log=print, variants=None):
    """Every (variant, seed) of exp (or of `variants`) trained -> {unit id: result}, outcome."""
    sha = data_digest(exp.data)
    units = train_units(exp, sha, variants)
    params = {"text": read_text(exp.data), "data": exp.data}
    return run_units(job_key(exp, sha, "train", [u.payload for u in units]), units, train_unit, params,
                     os.path.join(out, "train"), backend, key_of=lambda u: run_key(u.payload), shared=shared_dir(out),
                     label=f"{exp.name} train", log=log)
