"""`ffnlab export ADAPTER --to gguf-lora OUT.gguf` and `ffnlab export ADAPTER --merge --to gguf|hf OUT`
(cli/export.py hands a LoRA adapter here). ADAPTER: a PEFT directory (`ffnlab finetune` writes one)
or a llama.cpp LoRA GGUF; the base model is -m, else the one the adapter records."""
import os

from ..errors import UsageError


def base_model_of(adapter, given):
    """--base's model, else ffnlab_adapter.json's base_model, else adapter_config.json's (when it is a path here)"""
    from ..formats.installed import resolve_model
    if given:
        return resolve_model(given)
    from ..formats.jsonfile import read_json_object
    from ..formats.peft import CONFIG_FILE, FFNLAB_FILE
    for name, key in ((FFNLAB_FILE, "base_model"), (CONFIG_FILE, "base_model_name_or_path")):
        f = os.path.join(adapter, name)
        if os.path.isfile(f):
            base = read_json_object(f, "adapter metadata").get(key)
            if isinstance(base, str) and os.path.exists(base):
                return base
    raise UsageError(f"{adapter}: the adapter names no base model found here; give it with --base MODEL")


def run_lora(args, out):
    from ..formats.load import load
    from ..training.lora import LoraWeight, merged, read_lora
    if args.model is None:
        raise UsageError("give the LoRA adapter to export (a PEFT directory or a llama.cpp LoRA GGUF)")
    adapter = os.path.normpath(args.model)
    base = base_model_of(adapter, args.base)
    model = load(base, progress=False)
    if args.to == "gguf-lora":
        if args.merge:
            raise UsageError("--merge writes a full model: use it with --to gguf or --to hf, not gguf-lora")
        from ..formats.gguf_lora import write_gguf_lora
        adapters, scale, info = read_lora(adapter, model.config, model.params)
        r = info["r"]
        alphas = {round(s * adapters[w + ".lora_a"].shape[0], 6) for w, s in scale.items()}
        if len(alphas) != 1:
            raise UsageError(f"{adapter}: the adapters' scales differ per matrix; llama.cpp's GGUF has one alpha")
        alpha = alphas.pop()                     # alpha / r per weight, as llama.cpp computes it (rsLoRA folded in)
        write_gguf_lora(out, model.config, adapters, alpha)
        print(f"wrote {out} (LoRA r={r}, alpha={alpha:g}, {info['tensors']} matrices, {os.path.getsize(out) / 1e6:.1f} MB); "
              f"try: llama-cli -m {base} --lora {out}, or ffnlab run -m {base} --lora {out}")
        return 0
    if not args.merge:
        raise UsageError(f"{adapter} is a LoRA adapter: export it --to gguf-lora, or --merge it into its base "
                         f"model --to gguf / --to hf")
    model.apply_lora(adapter, args.lora_scale)
    new = {n: merged(w.base, w.a, w.b, w.scale) for n, w in model.params.items() if isinstance(w, LoraWeight)}
    if args.to == "gguf":
        if not base.endswith(".gguf"):
            raise UsageError(f"--merge --to gguf copies a GGUF base model with the adapted matrices replaced; "
                             f"{base} is not a GGUF (use --to hf)")
        from ..formats.gguf_lora import write_merged_gguf
        write_merged_gguf(base, out, new)
        print(f"wrote {out} ({base} with {len(new)} matrices merged as F32, {os.path.getsize(out) / 1e6:.1f} MB)")
        return 0
    from ..formats.export_hf import export_hf
    from ..quant import QuantTensor
    params = {n: new.get(n, w) for n, w in model.params.items()}        # merged, or the base's own
    params = {n: w.dequantize() if isinstance(w, QuantTensor) else w for n, w in params.items()}
    export_hf(model.config, params, model.tokenizer, out)
    print(f"wrote {out}/ ({base} with {len(new)} matrices merged; transformers loads it)")
    return 0
