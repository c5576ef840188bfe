"""`ffnlab patch`: activation patching from a clean prompt into a corrupt one, layer by position."""
import json
import sys

COMMAND = "patch"
HELP = "activation patching: restore one node's row from a clean run into a corrupt one (heat map + table)"


PAIR = ("--clean", "--corrupt", "--target", "--foil")


def add_arguments(p):
    from .common import add_model_argument, refuse_together
    add_model_argument(p)
    p.add_argument("--clean", default=None, help="the prompt whose answer is the target")
    p.add_argument("--corrupt", default=None, help="a prompt of the same token count whose answer differs")
    p.add_argument("--target", default=None, help="the clean answer: one token as text (' Paris') or #ID")
    p.add_argument("--foil", default=None, help="the corrupt answer: one token as text (' Rome') or #ID")
    p.add_argument("--node", default="l_out", help="the node patched at each layer: l_out (residual stream), attn_out, "
                                                   "ffn_out, or any per-layer node name (default l_out)")
    p.add_argument("--out", default=None, metavar="PNG", help="heat map file (default patch-NODE.png)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table or picture")
    refuse_together(p, "--out", "--json", "--json draws no heat map")
    from .scaleout import add_prompts_arguments
    add_prompts_arguments(p, 'a dataset, one {"clean", "corrupt", "target", "foil"} per line: every pair patched as a '
                             "work unit, and --out draws the effect averaged over position groups (the corrupted "
                             "span as ROME's subject)", "pair's result", "pair", PAIR)


def run_dataset(args):
    """--prompts: one unit per line (interventions/datasets.py) -> per-pair results and their average per position group."""
    from ..interventions.datasets import average_patch_effect, patch_unit
    from .scaleout import largest, run_prompts

    path = args.out or f"patch-{args.node}.png"
    code, results, avg = run_prompts(args, "patch", patch_unit, {"node": args.node}, path, average_patch_effect,
                                     "average_effect")
    if code is not None:
        return code
    from ..interventions.plots import patch_heatmap
    from ..pictures import written
    g = avg["effect"]
    il, k = largest(g)
    print(f"largest average effect of patching {args.node}: {g[il][k]:.4f} at layer {il}, {avg['groups'][k]}")
    sys.stdout.flush()
    with written(path, "--out"):
        patch_heatmap(path, avg, avg["groups"], f"patching {args.node}, averaged over {len(results)} pairs "
                                                f"by position group (the corrupted span as the subject)")
    print(f"{len(results)} pairs; heat map: {path}", file=sys.stderr)
    return 0


def run(args):
    if args.prompts is not None:
        return run_dataset(args)
    from ..errors import UsageError
    missing = [f for f in PAIR if getattr(args, f[2:]) is None]
    if missing:
        raise UsageError(f"give {' '.join(missing)} (all four of {', '.join(PAIR)}), or --prompts FILE.jsonl")
    if args.ray is not None:
        raise UsageError("--ray needs --prompts: a single pair is one unit")
    from ..interventions.common import one_token, prompt_ids, token_strings
    from ..interventions.patching import patch
    from ..pictures import check_png, model_label, written
    from .common import load_model
    path = args.out or f"patch-{args.node}.png"
    if not args.json:
        check_png(path, "--out")                       # before the work, not after it
    model = load_model(args, quiet=args.json)
    clean, corrupt = prompt_ids(model, args.clean, "--clean"), prompt_ids(model, args.corrupt, "--corrupt")
    target, foil = one_token(model, args.target, "--target"), one_token(model, args.foil, "--foil")
    r = patch(model, clean, corrupt, target, foil, args.node)
    tokens = token_strings(model, clean)
    out = {"node": r["node"], "tokens": tokens, "corrupt_tokens": token_strings(model, corrupt),
           "target": model.tokenizer.decode([target]), "foil": model.tokenizer.decode([foil]),
           "effect": r["effect"], "clean": r["clean"], "corrupt": r["corrupt"]}
    if args.json:
        print(json.dumps(out))
        return 0
    from ..token_text import columns, fit, visible
    w = min(12, max(6, *(columns(visible(t)) for t in tokens)))
    print(f"logit({out['target']!r}) - logit({out['foil']!r}): clean {r['clean']:.3f}, corrupt {r['corrupt']:.3f}")
    print(f"effect of patching {args.node}-L at each position (1 = restores the clean difference):")
    print("layer " + " ".join(fit(visible(t), w) for t in tokens))
    for il, row in enumerate(r["effect"]):
        print(f"{il:>5} " + " ".join(f"{v:>{w}.3f}" for v in row))
    sys.stdout.flush()                                 # the table stands whatever happens to the picture
    from ..interventions.plots import patch_heatmap
    with written(path, "--out"):
        patch_heatmap(path, r, tokens, f"{model_label(model)}: patching {args.node} from {args.clean!r} into "
                                       f"{args.corrupt!r}; metric logit({out['target']!r}) - logit({out['foil']!r})")
    print(f"heat map: {path}", file=sys.stderr)
    return 0
