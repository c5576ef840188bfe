"""ffnlab verify: run a reference engine on the same tokens and compare every named node."""
import json

COMMAND = "verify"
HELP = "compare every named tensor of a forward pass with llama.cpp or HF transformers, node by node"


def add_arguments(p):
    from .common import add_model_argument
    add_model_argument(p)
    p.add_argument("-p", "--prompt", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from a UTF-8 file")
    p.add_argument("--against", required=True, choices=("llama.cpp", "hf"),
                   help="the reference: llama.cpp (llama-cpp-python, eval callback) or hf (transformers, "
                        "forward hooks), both loading the same GGUF")
    p.add_argument("--f32", action="store_true",
                   help="llama.cpp only: run it on an F32 copy of the weights with an F32 KV cache, so it does "
                        "not round activations to 8 bits (tolerance 1e-2 instead of 0.2)")
    p.add_argument("--rtol", type=float, default=None,
                   help="a node passes if max|diff| <= atol + rtol * max|reference| (default: llama.cpp 0.2, "
                        "llama.cpp --f32 1e-2, hf 1e-4; see docs/glass-box.md)")
    p.add_argument("--atol", type=float, default=None, help="absolute slack per node (default 1e-6)")
    p.add_argument("--all", action="store_true", help="also list the nodes the reference does not compute")
    p.add_argument("--json", action="store_true", help="print one JSON object (every node's errors) instead of a table")


def run(args):
    import numpy as np

    from ..errors import UsageError
    from ..tracing.verify import report_dict, summary_lines, table_lines, verify
    from .common import load_model, read_prompt
    from .trace import json_safe

    if args.f32 and args.against != "llama.cpp":
        raise UsageError("--f32 applies to --against llama.cpp only")
    for flag in ("rtol", "atol"):
        v = getattr(args, flag)
        if v is not None and not v >= 0:
            raise UsageError(f"--{flag} must be >= 0, got {v}")
    prompt = read_prompt(args)
    model = load_model(args, quiet=True)
    if model.tokenizer is None:
        raise UsageError(f"{model.source}: the model has no tokenizer, so it cannot read a text prompt")
    if not str(model.source).endswith(".gguf"):
        raise UsageError(f"{model.source}: verify runs the references on a GGUF file; give -m FILE.gguf")
    ids = model.tokenizer.encode(prompt)
    if not ids:
        raise UsageError("the prompt encodes to no tokens")
    with np.errstate(all="ignore"):
        report = verify(model, ids, args.against, args.rtol, args.atol, f32=args.f32)
    if args.json:
        print(json.dumps(json_safe({"model": model.source, "prompt": prompt, "ids": [int(i) for i in ids],
                                    **report_dict(report)})))
    else:
        print(f"model {model.source}\nprompt {prompt!r} -> {len(ids)} tokens {list(map(int, ids))}\n")
        print("\n".join(table_lines(report, all_rows=args.all)))
        print()
        print("\n".join(summary_lines(report)))
    return 0 if report.passed else 1
