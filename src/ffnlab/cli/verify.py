"""ffnlab verify: run a reference engine on the same tokens and compare every named node."""
import json
import os
import tempfile

COMMAND = "verify"
HELP = "compare every named tensor of a forward pass with llama.cpp or HF transformers, node by node"


def add_arguments(p):
    from .common import add_lora_arguments, add_model_argument, add_prompt_arguments, refuse_together
    add_model_argument(p)
    add_lora_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("--against", required=True, choices=("llama.cpp", "hf"),
                   help="the reference: llama.cpp (llama-cpp-python, eval callback) or hf (transformers, "
                        "forward hooks), both loading the same GGUF")
    p.add_argument("--f32", action="store_true",
                   help="llama.cpp only: run it on an F32 copy of the weights with an F32 KV cache, so it does "
                        "not round activations to 8 bits (tolerance 1e-2 instead of 0.2)")
    p.add_argument("--rtol", type=float, default=None,
                   help="a node passes if max|diff| <= atol + rtol * max|reference| (default: llama.cpp 0.2, "
                        "llama.cpp --arith ggml 1e-3, llama.cpp --f32 1e-2, hf 1e-4; see docs/glass-box.md)")
    p.add_argument("--atol", type=float, default=None, help="absolute slack per node (default 1e-6)")
    p.add_argument("--all", action="store_true", help="also list the nodes the reference does not compute")
    p.add_argument("--json", action="store_true", help="print one JSON object (every node's errors) instead of a table")
    refuse_together(p, "--all", "--json", "the JSON lists every node")


def lora_reference(model, ids, args, tmp):
    """--lora: llama.cpp runs the GGUF with the adapter written as its LoRA GGUF (--lora-scale
    folded into alpha), so both sides compute W x + scale * B (A x)."""
    from ..errors import UsageError
    from ..formats.gguf_lora import write_gguf_lora
    from ..tracing.verify import reference_nodes
    from ..training.lora import adapters_of
    if args.against != "llama.cpp" or os.path.isdir(model.source):
        raise UsageError("--lora: verify compares an adapted GGUF model with llama.cpp (--against llama.cpp); "
                         "for an HF directory, PEFT's logits are checked by tests/engines/test_finetune.py")
    adapters, scale = adapters_of(model.params)
    alphas = {round(s * adapters[w + ".lora_a"].shape[0], 6) for w, s in scale.items()}
    if len(alphas) != 1:
        raise UsageError(f"{model.lora['path']}: the adapters' scales differ per matrix; llama.cpp's GGUF has one alpha")
    path = os.path.join(tmp, "lora.gguf")
    write_gguf_lora(path, model.config, adapters, alphas.pop())
    return reference_nodes("llama.cpp", model.source, ids, f32=args.f32, lora=(path, 1.0))


def directory_reference(model, ids, args, tmp):
    """The reference nodes for a model that is a directory. An HF directory: transformers loads it
    as it is (llama.cpp reads GGUF only). An ffnlab checkpoint: exported first (export_gguf /
    export_hf, which refuse what the target cannot hold, in one line) into tmp."""
    from ..errors import UsageError
    from ..formats.checkpoint import is_checkpoint, read_meta
    from ..tracing.verify import reference_nodes
    cfg, src = model.config, model.source
    if not is_checkpoint(src):
        if args.against == "llama.cpp":
            raise UsageError(f"{src}: llama.cpp reads GGUF files only; convert the directory with llama.cpp's "
                             "convert_hf_to_gguf.py --outtype f32 and verify that file, or use --against hf")
        from ..tracing.hf import capture
        return {(n, op, 0): a for (n, op), a in capture(src, ids, permuted=False).items()}
    tok_meta = read_meta(src).get("tokenizer", {})
    if args.against == "hf":
        from ..formats.export_hf import export_hf
        from ..tracing.hf import capture
        export_hf(cfg, model.params, model.tokenizer, os.path.join(tmp, "hf"))
        # export_hf writes Q/K rows in HF's rotate_half order; ffnlab's "normal" pairing keeps GGUF's
        permuted = cfg.positions == "rope" and cfg.rope_pairing == "normal"
        return {(n, op, 0): a for (n, op), a in capture(os.path.join(tmp, "hf"), ids, permuted=permuted).items()}
    if cfg.positions == "rope" and cfg.rope_pairing != "normal":
        raise UsageError(f"{src}: its Q/K rows use HF's rotate_half pairing, which the GGUF export permutes, so "
                         "llama.cpp's Qcur/Kcur would not line up node by node; use --against hf")
    from ..formats.export_gguf import export_gguf
    path = os.path.join(tmp, "model.gguf")
    export_gguf(cfg, model.params, model.tokenizer, tok_meta, path, "f32")
    return reference_nodes("llama.cpp", path, ids, f32=args.f32)


def run(args):
    import numpy as np

    from ..errors import UsageError
    from ..tracing.verify import report_dict, summary_lines, table_lines, verify
    from .common import model_and_prompt
    from .trace import json_safe

    if args.f32 and args.against != "llama.cpp":
        raise UsageError("--f32 applies to --against llama.cpp only")
    if args.f32 and args.arith == "ggml":
        raise UsageError("--f32 runs llama.cpp on dequantized weights, which --arith ggml does not reproduce: "
                         "use one or the other")
    for flag in ("rtol", "atol"):
        v = getattr(args, flag)
        if v is not None and not v >= 0:
            raise UsageError(f"--{flag} must be >= 0, got {v}")
    prompt, model, ids = model_and_prompt(args)
    with tempfile.TemporaryDirectory(prefix="ffnlab-verify-") as tmp, np.errstate(all="ignore"):
        if model.lora is not None:
            reference = lora_reference(model, ids, args, tmp)
        else:
            reference = directory_reference(model, ids, args, tmp) if os.path.isdir(model.source) else None
        report = verify(model, ids, args.against, args.rtol, args.atol, f32=args.f32, reference=reference)
    if args.json:
        from ..threads import threads
        print(json.dumps(json_safe({"model": model.source, "threads": threads(), "prompt": prompt, "ids": [int(i) for i in ids],
                                    **report_dict(report)})))
    else:
        print(f"model {model.source}\nprompt {prompt!r} -> {len(ids)} tokens {list(map(int, ids))}\n")
        print("\n".join(table_lines(report, all_rows=args.all)))
        print()
        print("\n".join(summary_lines(report)))
    return 0 if report.passed else 1
