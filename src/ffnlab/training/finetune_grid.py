"""`ffnlab finetune` grids: targets x ranks x seeds (x training-data sizes) as work units.

    units = grid_units(["q,v", "up,down"], [2, 8], seeds=5, train_tokens=[1024, 0])
    rows  = run_grid(ModelSpec(path), "text.txt", {"steps": 60, ...}, units, out=OutputDir(...))

One unit is one LoRA fine-tune (training/finetune.py), in a temporary folder on the worker, of
the model the worker loaded once (executor.ModelSpec: the base stays frozen, so every unit of
the worker shares it). Its result is the run's record: the loss history, the final losses and
the trainable parameters; the adapter itself is not kept (a grid compares runs; `ffnlab
finetune --out` keeps one). A unit's numbers are those of `ffnlab finetune` with the same
settings run alone, bit for bit (tests/unit/test_experiments.py).
"""
import os
import tempfile

from ..runtime.executor import Task, Unit, execute


def target_slug(targets):
    return targets.replace(",", "+").replace(" ", "")


def grid_units(targets, ranks, seeds, train_tokens=(0,)):
    """-> [Unit] for every (targets, rank, train_tokens, seed), sorted by id."""
    units = []
    for t in targets:
        for r in ranks:
            for n in train_tokens:
                for s in range(seeds):
                    units.append(Unit(f"ft-{target_slug(t)}-r{r:04d}-n{n:08d}-s{s:02d}",
                                      {"targets": t, "r": int(r), "train_tokens": int(n), "seed": s}))
    return sorted(units, key=lambda u: u.id)


_IDS = {}


def finetune_unit(model, params, p):
    """On a worker: one LoRA fine-tune of the loaded model -> its record (no adapter files)."""
    from .data import TokenData, data_info
    from .finetune import FinetuneSettings, finetune

    settings = {**params["settings"], "targets": p["targets"], "r": p["r"], "seed": p["seed"],
                "train_tokens": p["train_tokens"]}
    if params.get("alpha_per_r"):                     # alpha = k r keeps the update's scale across ranks
        settings["alpha"] = float(params["alpha_per_r"] * p["r"])
    s = FinetuneSettings.from_dict(settings)
    key = (id(model), params["data_sha256"])
    if key not in _IDS:
        _IDS[key] = model.tokenizer.encode(params["text"], add_bos=False)
    ids = _IDS[key]
    data = TokenData.from_ids(ids, s.seq_len, s.val_frac, path=params["data"])
    with tempfile.TemporaryDirectory(prefix="ffnlab-lora-") as tmp:
        rec = finetune(model, s, data, os.path.join(tmp, "adapter"), data_info=data_info(params["data"], params["text"], len(ids)),
                       base_model=params.get("base_model", ""), progress=False)
    return {**p, "alpha": s.alpha, "trainable_params": rec["trainable_params"], "final": rec["final"],
            "eval": rec["history"]["eval"], "train": rec["history"]["train"], "tokens_per_s": rec["tokens_per_s"],
            "train_seconds": rec["train_seconds"]}


def run_grid(model_spec, data, settings, units, out=None, backend=None, alpha_per_r=None, label="finetune grid",
             on_unit=None, data_chars=0):
    """-> (rows in unit order, Outcome). settings: FinetuneSettings fields shared by every unit;
    data_chars: fine-tune on the file's first N characters only (0: all of it)."""
    import hashlib
    from ..runtime.executor import file_digest
    from .data import read_text
    text = read_text(data)
    sha = hashlib.sha256(text[:data_chars].encode("utf-8")).hexdigest() if data_chars else file_digest(data)
    params = {"text": text[:data_chars] if data_chars else text, "data": os.path.abspath(data), "data_sha256": sha,
              "settings": settings, "alpha_per_r": alpha_per_r, "base_model": model_spec.path}
    outcome = execute(Task(model_spec, finetune_unit, params), units, lambda acc, r: acc + [r], [], out=out,
                      backend=backend, label=label, on_unit=on_unit)
    return outcome.merged, outcome


def table(rows) -> str:
    """One line per unit: the grid's table (`ffnlab finetune --grid-*`)."""
    lines = ["| targets | r | train tokens | seed | trainable | val loss at 0 | final val loss | final train loss |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f = r["final"] or {}
        lines.append(f"| {r['targets']} | {r['r']} | {r['train_tokens'] or 'all'} | {r['seed']} | {r['trainable_params']:,} | "
                     f"{r['eval'][0][2]:.4f} | {f.get('val_loss', float('nan')):.4f} | {f.get('train_loss', float('nan')):.4f} |")
    return "\n".join(lines)
