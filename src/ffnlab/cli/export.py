"""`ffnlab export`: a trained checkpoint -> GGUF (llama.cpp) or an HF directory (transformers)."""
COMMAND = "export"
HELP = "export a trained checkpoint to GGUF (llama.cpp) or an HF directory (transformers)"


def add_arguments(p):
    p.add_argument("checkpoint", help="checkpoint directory written by `ffnlab train`")
    p.add_argument("--to", required=True, choices=["gguf", "hf"], help="gguf: one .gguf file; hf: a model directory")
    p.add_argument("out", help="output .gguf file (--to gguf) or directory (--to hf)")
    p.add_argument("--type", default="f32", choices=["f32", "q8_0"],
                   help="GGUF weight type: f32 (exact) or q8_0 (8-bit blocks of 32, matrices only); HF is always f32")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists (default: refuse, as train does)")


def run(args):
    import os

    from ..errors import UsageError
    from ..formats.checkpoint import load_checkpoint, read_meta

    out = os.path.normpath(args.out)                 # 'dir/' -> 'dir', so messages print no '//'
    if os.path.lexists(out) and not args.force and not (os.path.isdir(out) and not os.listdir(out)):
        raise UsageError(f"{out} already exists; add --force to overwrite it or choose another output")
    cfg, params, tok = load_checkpoint(args.checkpoint)
    tok_meta = read_meta(args.checkpoint).get("tokenizer", {})
    if args.to == "gguf":
        from ..formats.export_gguf import export_gguf
        export_gguf(cfg, params, tok, tok_meta, out, args.type)
        print(f"wrote {out} ({args.type}, {os.path.getsize(out) / 1e6:.1f} MB); "
              f"try: ffnlab run -m {out} -p \"...\"")
    else:
        if args.type != "f32":
            raise UsageError("--type q8_0 is for --to gguf; an HF export is float32")
        from ..formats.export_hf import export_hf
        export_hf(cfg, params, tok, out)
        print(f"wrote {out}/ (config.json, model.safetensors, tokenizer.json); "
              f"load it with transformers.AutoModelForCausalLM.from_pretrained({out!r})")
    return 0
