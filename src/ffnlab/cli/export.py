"""`ffnlab export`: any model ffnlab loads (checkpoint, GGUF, HF directory, installed name) -> GGUF
(llama.cpp) or an HF directory (transformers)."""
COMMAND = "export"
HELP = "export a model (checkpoint, GGUF, HF directory) to GGUF (llama.cpp) or an HF directory (transformers)"


def add_arguments(p):
    from .common import add_model_flag, needs
    add_model_flag(p, "a checkpoint directory written by `ffnlab train`, a .gguf file, an HF directory, an "
                      "installed model (smollm2, gemma3), or a LoRA adapter (--to gguf-lora, --merge)",
                   required="give the model and the output: -m MODEL OUT, or MODEL OUT")
    p.add_argument("--to", required=True, choices=["gguf", "hf", "gguf-lora"],
                   help="gguf: one .gguf file; hf: a model directory; gguf-lora: MODEL is a LoRA adapter (a PEFT "
                        "directory), written as llama.cpp's adapter GGUF")
    p.add_argument("out", help="output .gguf file (--to gguf) or directory (--to hf)")
    p.add_argument("--type", default="f32", choices=["f32", "q8_0"],
                   help="GGUF weight type: f32 (exact; a quantized GGUF is dequantized) or q8_0 (8-bit blocks of 32, "
                        "matrices only); HF is always f32")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists (default: refuse, as train does)")
    # a LoRA adapter (`ffnlab finetune`'s directory, or a llama.cpp LoRA GGUF): cli/export_lora.py
    p.add_argument("--merge", action="store_true", help="LoRA adapter: write its base model with W + alpha/r B A "
                                                        "merged in (--to gguf: a GGUF base; --to hf)")
    p.add_argument("--base", default=None, help="LoRA adapter: its base model (default: the one it records)")
    p.add_argument("--lora-scale", type=float, default=1.0, help="--merge: scale of the adapter's update (default 1)")
    needs(p, "--lora-scale", "--merge", "it scales the update merged in")


def source(model):
    """MODEL -> (ModelConfig, {GGUF name: array}, Tokenizer, tokenizer record for export_gguf).
    A checkpoint keeps its ffnlab.json tokenizer record; a GGUF's own tokenizer.* keys are copied."""
    import os

    from ..errors import UsageError
    from ..formats.checkpoint import is_checkpoint, load_checkpoint, read_meta
    from ..formats.installed import resolve_model
    from ..formats.load import load

    if model is not None and is_checkpoint(model):
        cfg, params, tok = load_checkpoint(model)
        return cfg, params, tok, read_meta(model).get("tokenizer", {})
    path = resolve_model(model)
    m = load(path, progress=False)
    if m.tokenizer is None:
        raise UsageError(f"{path}: no tokenizer (tokenizer.json) to export with the weights")
    kind = "model" if os.path.isfile(path) else "hf"
    return m.config, m.params, m.tokenizer, {"kind": kind, "source": path}


def run(args):
    import os
    import sys

    from ..errors import UsageError

    out = os.path.normpath(args.out)                 # 'dir/' -> 'dir', so messages print no '//'
    if os.path.lexists(out) and not args.force and not (os.path.isdir(out) and not os.listdir(out)):
        raise UsageError(f"{out} already exists; add --force to overwrite it or choose another output")
    from ..formats.peft import is_adapter_dir
    if args.to == "gguf-lora" or args.merge or (args.model is not None and is_adapter_dir(args.model)):
        from .export_lora import run_lora
        return run_lora(args, out)
    if args.to == "hf" and args.type != "f32":
        raise UsageError("--type q8_0 is for --to gguf; an HF export is float32")
    cfg, params, tok, tok_meta = source(args.model)
    if args.to == "gguf":
        from ..formats.export_gguf import export_gguf, gguf_arch, window_warning
        note = window_warning(cfg, gguf_arch(cfg))
        export_gguf(cfg, params, tok, tok_meta, out, args.type)
        if note:
            print(note, file=sys.stderr)
        print(f"wrote {out} ({args.type}, {os.path.getsize(out) / 1e6:.1f} MB); "
              f"try: ffnlab run -m {out} -p \"...\"")
    else:
        from ..formats.export_hf import export_hf
        export_hf(cfg, params, tok, out)
        print(f"wrote {out}/ (config.json, model.safetensors, tokenizer.json); "
              f"load it with transformers.AutoModelForCausalLM.from_pretrained({out!r})")
    return 0
