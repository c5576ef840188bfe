"""`ffnlab finetune`: LoRA adapters on a real model, written as a PEFT adapter directory."""
COMMAND = "finetune"
HELP = "fine-tune LoRA adapters on a model (GGUF, HF directory); writes a PEFT adapter directory"

SETTING_FLAGS = {  # flag -> (FinetuneSettings field, type, help)
    "--lora-r": ("r", "positive", "adapter rank r (default 8)"),
    "--lora-alpha": ("alpha", "positive_float", "LoRA alpha: the update is scaled by alpha / r (default 16)"),
    "--target": ("targets", str, "adapted matrices: q,k,v,o,gate,up,down (or HF names q_proj, ...), attn (q,k,v,o), "
                                 "mlp (gate,up,down) or all (default q,v, as PEFT's default for Llama)"),
    "--lora-dropout": ("dropout", float, "dropout on the adapter input, as PEFT's lora_dropout (default 0)"),
    "--steps": ("steps", "positive", "optimizer steps (default 200); with --resume, more extend the run"),
    "--lr": ("lr", "positive_float", "peak learning rate (default 1e-3)"),
    "--warmup": ("warmup", "nonneg", "linear warmup steps before the cosine decay (default 10)"),
    "--batch": ("batch", "positive", "sequences per step (default 4)"),
    "--seq-len": ("seq_len", "positive", "tokens per sequence (default 128)"),
    "--val-frac": ("val_frac", float, "held-out fraction at the end of the data (default 0.1)"),
    "--train-tokens": ("train_tokens", "nonneg", "train on the first N tokens of the train split only "
                                                 "(a smaller data set, same validation tail); 0 = all (default)"),
    "--eval-every": ("eval_every", "positive", "evaluate train/val loss every N steps (default 50)"),
    "--eval-batches": ("eval_batches", "positive", "batches per evaluation (default 4)"),
    "--ckpt-every": ("ckpt_every", "nonneg", "commit a checkpoint every N steps, 0 = only at the end (default 50)"),
    "--weight-decay": ("weight_decay", float, "AdamW decoupled weight decay on A and B (default 0)"),
    "--seed": ("seed", "nonneg", "seed for the adapter init, the batch order and dropout (default 0)"),
}


def add_arguments(p):
    from .common import add_flag_table, add_model_argument, positive
    add_model_argument(p)
    p.add_argument("--data", required=True, help="UTF-8 text file to fine-tune on")
    p.add_argument("--out", required=True, help="adapter directory (PEFT's adapter_config.json + "
                                                "adapter_model.safetensors, and the resume state)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (same settings; --steps may grow)")
    add_flag_table(p, SETTING_FLAGS)
    p.add_argument("--no-train-eval", dest="eval_train", action="store_false", default=None,
                   help="evaluate on the held-out windows only (half the evaluation cost)")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    # a grid of fine-tunes (training/finetune_grid.py): targets x ranks x seeds, one work unit each
    p.add_argument("--grid-targets", default=None, metavar="T1;T2",
                   help="run a grid: ';'-separated target sets, e.g. 'q,v;up,down' (--out is then the grid's folder: "
                        "one result per run, resumable; a table of every run is printed)")
    p.add_argument("--grid-ranks", default=None, metavar="R1,R2", help="grid ranks, e.g. 2,8 (default: --lora-r)")
    p.add_argument("--grid-train-tokens", default=None, metavar="N1,N2",
                   help="grid training-data sizes (--train-tokens values, 0 = all; default: --train-tokens)")
    p.add_argument("--seeds", type=positive("--seeds"), default=None,
                   help="grid: seeds 0..N-1 per configuration (default 1)")
    from .scaleout import add_ray_arguments
    add_ray_arguments(p)


def run(args):
    import os

    from ..formats.installed import resolve_model
    from ..formats.load import load
    from ..training.data import TokenData, data_info, read_text
    from ..training.finetune import FINETUNE_FILE, FinetuneSettings, finetune
    from .common import flag_values

    if args.grid_targets is not None or args.grid_ranks or args.grid_train_tokens or args.seeds or args.ray is not None:
        return run_grid(args)
    given = {**flag_values(args, SETTING_FLAGS), "eval_train": args.eval_train}
    given = {k: v for k, v in given.items() if v is not None}
    saved = {}
    if args.resume and os.path.isfile(os.path.join(args.out, FINETUNE_FILE)):
        from ..formats.jsonfile import read_json_object
        saved = read_json_object(os.path.join(args.out, FINETUNE_FILE), "fine-tuning record").get("settings", {})
    settings = FinetuneSettings.from_dict({**saved, **given})
    settings.validate()
    from ..errors import UsageError
    from ..training.checkpoint import read_trainer
    if getattr(args, "arith", "f32") != "f32":
        raise UsageError(f"--arith {args.arith}: fine-tuning runs in float32 arithmetic (the reference ops, which "
                         f"have backward passes); drop --arith, or evaluate the adapter with `ffnlab perplexity "
                         f"--lora DIR --arith {args.arith}`")
    record = read_trainer(args.out) if os.path.isdir(args.out) else None
    if record is not None and not args.resume:          # before the model loads
        raise UsageError(f"--out {args.out} already holds a fine-tuning run at step {record['step']}; "
                         f"add --resume to continue it or choose another --out")
    if settings.warmup_warning():                       # as `ffnlab train` says it
        import sys
        print(settings.warmup_warning(), file=sys.stderr, flush=True)
    path = resolve_model(args.model)
    model = load(path, progress=None if not args.quiet else False)
    if model.tokenizer is None:
        raise UsageError(f"{path}: the model has no tokenizer, so --data cannot be tokenized for it")
    text = read_text(args.data)
    ids = model.tokenizer.encode(text, add_bos=False)
    data = TokenData.from_ids(ids, settings.seq_len, settings.val_frac, path=args.data)
    if not args.quiet:
        from ..threads import threads
        print(f"threads: {threads()}; model: {os.path.basename(path)} ({model.config.arch}, {model.config.n_layer} layers); "
              f"LoRA r={settings.r} alpha={settings.alpha:g} on {settings.targets}; data: "
              f"{len(data.train) if not settings.train_tokens else min(settings.train_tokens, len(data.train))} "
              f"train / {len(data.val)} val tokens", flush=True)
    rec = finetune(model, settings, data, args.out, resume=args.resume, data_info=data_info(args.data, text, len(ids)),
                   base_model=os.path.abspath(path), progress=not args.quiet)
    if not args.quiet:
        fin = rec.get("final") or {}
        print(f"done: step {rec['step']}, {rec.get('trainable_params', 0):,} trainable parameters, "
              f"train loss {fin.get('train_loss', float('nan')):.4f}, val loss {fin.get('val_loss', float('nan')):.4f}, "
              f"{rec.get('tokens_per_s', 0):.0f} tok/s; adapter in {args.out} "
              f"(try: ffnlab run -m {args.model or 'smollm2'} --lora {args.out} -p \"...\")")
    return 0


def _ints(text, flag):
    from ..errors import UsageError
    try:
        v = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        v = []
    if not v or min(v) < 0:
        raise UsageError(f"{flag}: expected comma-separated integers >= 0, got {text!r}")
    return v


def run_grid(args):
    """--grid-targets / --grid-ranks / --seeds: the grid as work units into --out (OUT/job.json, OUT/units/)."""
    from dataclasses import asdict

    from ..errors import UsageError
    from ..formats.installed import resolve_model
    from ..runtime.executor import ModelSpec, OutputDir
    from ..training.finetune_grid import grid_units, run_grid as grid, table
    from ..training.finetune import FinetuneSettings
    from ..runtime.executor import file_digest
    from .common import flag_values
    from .scaleout import backend

    if args.resume:
        raise UsageError("--resume: a grid resumes by itself (rerun the same command with the same --out)")
    given = {**flag_values(args, SETTING_FLAGS), "eval_train": args.eval_train}
    settings = FinetuneSettings.from_dict({k: v for k, v in given.items() if v is not None})
    targets = [t.strip() for t in (args.grid_targets or settings.targets).split(";") if t.strip()]
    ranks = _ints(args.grid_ranks, "--grid-ranks") if args.grid_ranks else [settings.r]
    if 0 in ranks:
        raise UsageError("--grid-ranks: a rank must be positive")
    tokens = _ints(args.grid_train_tokens, "--grid-train-tokens") if args.grid_train_tokens else [settings.train_tokens]
    for t in targets:                                  # every configuration is checked before any runs
        FinetuneSettings.from_dict({**asdict(settings), "targets": t}).validate()
    units = grid_units(targets, ranks, args.seeds or 1, tokens)
    path = resolve_model(args.model)
    key = {"model": path, "data_sha256": file_digest(args.data), "settings": asdict(settings)}
    out = OutputDir(args.out, "finetune-grid", key, [u.id for u in units])
    rows, outcome = grid(ModelSpec(path), args.data, asdict(settings), units, out=out, backend=backend(args))
    from .scaleout import finish
    code, _ = finish(outcome, len(units))
    if rows is not None:
        print(table(rows))
    if not args.quiet:
        print(f"{len(units)} runs, {outcome.resumed} found in {args.out}, {len(units) - outcome.resumed - len(outcome.failures)} "
              f"fine-tuned in {outcome.seconds:.0f} s")
    return code
