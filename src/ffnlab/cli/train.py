"""`ffnlab train`: train a small model from scratch on a text file."""
COMMAND = "train"
HELP = "train a small model from scratch on a text file (checkpoints resume bit-exactly)"

MODEL_FLAGS = {  # flag -> (ModelConfig field, type, help)
    "--n-layer": ("n_layer", "positive", "number of transformer blocks"),
    "--d-model": ("d_model", "positive", "residual stream width"),
    "--n-head": ("n_head", "positive", "attention heads"),
    "--n-kv-head": ("n_kv_head", "positive", "key/value heads (fewer than --n-head: grouped-query attention)"),
    "--d-ff": ("d_ff", "positive", "MLP hidden width (default: 4*d_model dense, 8/3*d_model gated)"),
    "--ffn": ("ffn", str, "MLP kind: gelu | gelu_tanh | relu | swiglu | geglu | moe (a mixture of SwiGLU experts)"),
    "--experts": ("n_expert", "positive", "--ffn moe: experts per layer (each --d-ff wide; default 4)"),
    "--top-k": ("n_expert_used", "positive", "--ffn moe: experts per token (default 2; k > 1 renormalises "
                                             "their weights as Mixtral does, k = 1 keeps p as Switch does)"),
    "--norm": ("norm", str, "layernorm | rmsnorm"),
    "--n-ctx": ("n_ctx", "positive", "context length (learned position table size); must be >= --seq-len"),
}

SETTING_FLAGS = {  # flag -> (TrainSettings field, type, help)
    "--steps": ("steps", int, "optimizer steps (default 1000); with --resume, more steps than the checkpoint's "
                              "extend the run (its learning-rate schedule is kept, the added steps run at its "
                              "final rate)"),
    "--batch": ("batch", int, "sequences per step (default 16)"),
    "--seq-len": ("seq_len", int, "tokens per sequence (default 128)"),
    "--lr": ("lr", float, "peak learning rate (default 1e-3)"),
    "--warmup": ("warmup", int, "linear warmup steps before the cosine decay (default 100)"),
    "--min-lr-frac": ("min_lr_frac", float, "final learning rate as a fraction of --lr (default 0.1)"),
    "--weight-decay": ("weight_decay", float, "AdamW decoupled weight decay on matrices (default 0.1)"),
    "--grad-clip": ("grad_clip", float, "max global gradient norm, 0 = off (default 1.0)"),
    "--seed": ("seed", "nonneg", "seed for the init and the batch order (default 0)"),
    "--eval-every": ("eval_every", int, "evaluate train/val loss every N steps (default 100)"),
    "--eval-batches": ("eval_batches", int, "batches per evaluation (default 4)"),
    "--ckpt-every": ("ckpt_every", int, "checkpoint every N steps, 0 = only at the end (default 100)"),
    "--val-frac": ("val_frac", float, "held-out fraction at the end of the data (default 0.1)"),
    "--aux-loss": ("aux_loss", float, "--ffn moe: weight of the Switch/Mixtral load-balancing loss (default 0.01)"),
}


def add_arguments(p):
    from .common import add_flag_table, add_threads_argument, needs
    p.add_argument("--data", help="UTF-8 text file to train on (on --resume: defaults to the checkpoint's)")
    p.add_argument("--out", required=True, help="checkpoint directory (created; `ffnlab run -m OUT` loads it)")
    p.add_argument("--resume", action="store_true",
                   help="continue the checkpoint in --out (unset flags take its values); starts fresh if there is none")
    p.add_argument("--preset", default=None, help="tiny-gpt2 | tiny-llama (default tiny-llama)")
    add_flag_table(p, MODEL_FLAGS)
    p.add_argument("--tokenizer", default=None,
                   help="byte (default, vocab 256) | bpe (trained on --data) | a GGUF/HF model (or smollm2, gemma3) whose "
                        "tokenizer to use")
    p.add_argument("--vocab-size", type=int, default=None, help="vocabulary size of --tokenizer bpe (default 1024)")
    add_flag_table(p, SETTING_FLAGS)
    p.add_argument("--decay-embeddings", action="store_true", default=None,
                   help="apply weight decay to the embedding tables too")
    p.add_argument("--quiet", action="store_true", help="no progress output")
    add_threads_argument(p)
    needs(p, "--vocab-size", "--tokenizer=bpe", "the byte tokenizer has 256 ids, a model's tokenizer its own")


def run(args):
    from ..errors import UsageError
    from ..formats.checkpoint import is_checkpoint, read_tokenizer
    from ..training.checkpoint import read_resume_meta, read_trainer
    from ..training.data import TokenData, data_info, encode, make_tokenizer, read_text
    from ..training.presets import build_config
    from ..training.trainer import TrainSettings, train
    from .common import flag_values

    given = flag_values(args, SETTING_FLAGS)
    if args.decay_embeddings is not None:
        given["decay_embeddings"] = True
    model_given = flag_values(args, MODEL_FLAGS)

    record = read_trainer(args.out) if is_checkpoint(args.out) else None
    if record is not None and not args.resume:          # before the model line and any warning
        raise UsageError(f"--out {args.out} already holds a checkpoint at step {record['step']}; "
                         f"add --resume to continue it or choose another --out")
    resuming = args.resume and record is not None
    if resuming:
        # the checkpoint's settings, with any flag given on this command line on top (train() checks they agree)
        meta = read_resume_meta(args.out)                   # ffnlab.json's train section, checked
        saved = meta["train"]
        settings = TrainSettings.from_dict({**saved["settings"], **{k: v for k, v in given.items() if v is not None}})
        data_path = args.data or saved["data"].get("path")
        from ..config import ModelConfig
        cfg = ModelConfig.from_dict({**meta["config"], **{k: v for k, v in model_given.items() if v is not None}})
        if args.preset or args.tokenizer or args.vocab_size:
            raise UsageError("--resume: --preset, --tokenizer and --vocab-size come from the checkpoint; leave them out")
        tok, tok_meta = read_tokenizer(args.out, meta), meta["tokenizer"]
        text = read_text(data_path)
    else:
        if not args.data:
            raise UsageError("--data is required (a UTF-8 text file)")
        data_path = args.data
        settings = TrainSettings.from_dict({k: v for k, v in given.items() if v is not None})
        settings.validate()
        text = read_text(data_path)
        from ..formats.installed import NAMES, model_path
        kind = args.tokenizer or "byte"
        if kind.lower() in NAMES:                     # an installed model's tokenizer: smollm2, gemma3
            kind = model_path(kind.lower())
        tok, tok_meta = make_tokenizer(kind, text, args.vocab_size or 1024)
        if model_given["n_ctx"] is None:
            from ..training.presets import PRESETS
            model_given["n_ctx"] = max(settings.seq_len, PRESETS.get(args.preset or "tiny-llama", {}).get("n_ctx", 0))
        cfg = build_config(args.preset or "tiny-llama", tok.vocab_size, **model_given)
    warning = settings.warmup_warning()
    if warning:
        import sys
        print(warning, file=sys.stderr, flush=True)
    ids = encode(tok, tok_meta, text)
    data = TokenData.from_ids(ids, settings.seq_len, settings.val_frac, path=data_path)
    info = data_info(data_path, text, len(ids))
    if not args.quiet:
        from ..threads import threads
        from ..training.ablate import n_params
        print(f"threads: {threads()}; model: {cfg.arch} {cfg.n_layer} layers, d_model {cfg.d_model}, {cfg.ffn} d_ff {cfg.d_ff}, "
              f"{n_params(cfg) / 1e6:.2f}M params; data: {len(data.train)} train / {len(data.val)} val tokens "
              f"({tok_meta['kind']} tokenizer, vocab {tok.vocab_size})", flush=True)
    rec = train(cfg, settings, data, tok, tok_meta, args.out, resume=args.resume, data_info=info,
                progress=not args.quiet)
    if not args.quiet:
        fin = rec.get("final") or {}
        print(f"done: step {rec['step']}, train loss {fin.get('train_loss', float('nan')):.4f}, "
              f"val loss {fin.get('val_loss', float('nan')):.4f}, {rec.get('tokens_per_s', 0) / 1e3:.1f}k tok/s; "
              f"checkpoint in {args.out} (try: ffnlab run -m {args.out} -p \"...\")")
    return 0
