"""`ffnlab causal-trace`: ROME's causal tracing of a fact about a subject (three-panel PNG + JSON)."""
import json
import sys

COMMAND = "causal-trace"
HELP = "causal tracing (ROME): noise the subject, restore hidden / MLP / attention states layer by layer"


def add_arguments(p):
    from .common import add_model_argument, nonneg, positive, refuse_together
    add_model_argument(p)
    p.add_argument("-p", "--prompt", default=None, help="the prompt, e.g. 'The Eiffel Tower is located in the city of'")
    p.add_argument("--subject", default=None, help="the subject, a substring of the prompt (its tokens get the noise)")
    p.add_argument("--target", default=None, help="the answer token (' Paris' or #ID; default: the model's prediction)")
    p.add_argument("--noise", type=nonneg("--noise", float), default=3.0,
                   help="noise std as a multiple of the embeddings' std (default 3, as ROME)")
    p.add_argument("--samples", type=positive("--samples"), default=10, help="noise samples (default 10)")
    p.add_argument("--window", type=positive("--window"), default=10, help="MLP/attention layers restored together (default 10)")
    p.add_argument("--seed", type=nonneg("--seed"), default=0, help="seed of the noise (default 0)")
    p.add_argument("--out", default="causal-trace.png", metavar="PNG", help="the three-panel figure (default causal-trace.png)")
    p.add_argument("--json", action="store_true", help="print one JSON object, no table or picture")
    refuse_together(p, "--out", "--json", "--json draws no figure")
    from .scaleout import add_prompts_arguments
    add_prompts_arguments(p, 'a dataset, one {"prompt", "subject", "target"} per line (target optional): every prompt '
                             "traced as a work unit, and --out draws ROME's average indirect effect over them",
                          "prompt's trace", "prompt", ("-p", "--subject", "--target"))


def run_dataset(args):
    """--prompts: one unit per line (interventions/datasets.py) -> per-prompt traces and their average indirect effect."""
    from ..interventions.datasets import average_indirect_effect, causal_trace_unit
    from .scaleout import largest, run_prompts

    code, traces, avg = run_prompts(args, "causal-trace", causal_trace_unit,
                                    {"noise": args.noise, "samples": args.samples, "window": args.window,
                                     "seed": args.seed}, args.out, average_indirect_effect, "average_indirect_effect")
    if code is not None:
        return code
    from ..interventions.plots import causal_trace_figure
    figure = {"tokens": avg["groups"], "subject": [0, 2], "target": "average indirect effect", "corrupt_p": 0.0,
              "hidden": avg["hidden"], "mlp": avg["mlp"], "attn": avg["attn"]}
    causal_trace_figure(args.out, figure, args.window)
    for kind in ("hidden", "mlp", "attn"):
        g = avg[kind]
        il, k = largest(g)
        print(f"{kind:>6}: largest average indirect effect {g[il][k]:.4f} at layer {il}, {avg['groups'][k]}")
    print(f"{len(traces)} prompts; figure: {args.out}", file=sys.stderr)
    return 0


def run(args):
    if args.prompts is not None:
        return run_dataset(args)
    from ..errors import UsageError
    if args.prompt is None or args.subject is None:
        raise UsageError("give -p PROMPT and --subject SUBJECT, or --prompts FILE.jsonl")
    if args.ray is not None:
        raise UsageError("--ray needs --prompts: a single prompt is one unit")
    from ..interventions.causal_trace import causal_trace, subject_range
    from ..interventions.common import one_token, prompt_ids, token_strings
    from ..pictures import check_png, model_label, written
    from .common import load_model
    if not args.json:
        check_png(args.out, "--out")                   # before the work, not after it
    model = load_model(args, quiet=args.json)
    ids = prompt_ids(model, args.prompt)
    tokens = token_strings(model, ids)
    first, last = subject_range(tokens, args.prompt, args.subject)
    target = one_token(model, args.target, "--target") if args.target is not None else None
    r = causal_trace(model, ids, first, last, target, args.noise, args.samples, args.window, args.seed)
    out = {"tokens": tokens, "subject": [first, last], "target": model.tokenizer.decode([r["target_id"]]),
           "target_id": r["target_id"], "clean_p": r["clean_p"], "corrupt_p": r["corrupt_p"],
           "hidden": r["hidden"], "mlp": r["mlp"], "attn": r["attn"],
           "noise": args.noise, "noise_std": r["noise_std"], "samples": args.samples, "window": args.window,
           "seed": args.seed}
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"target {out['target']!r}: clean p = {out['clean_p']:.4f}, subject noised p = {out['corrupt_p']:.4f}")
    for kind in ("hidden", "mlp", "attn"):
        g = out[kind]
        il, t = max(((i, j) for i in range(len(g)) for j in range(len(tokens))), key=lambda ij: g[ij[0]][ij[1]])
        print(f"{kind:>6}: strongest restore p = {g[il][t]:.4f} at layer {il}, token {t} {tokens[t]!r}")
    sys.stdout.flush()                                 # the figures stand whatever happens to the picture
    from ..interventions.plots import causal_trace_figure
    with written(args.out, "--out"):
        causal_trace_figure(args.out, out, args.window, f"{model_label(model)}: {args.prompt!r}, subject "
                                                        f"{args.subject!r} noised ({args.noise:g} x std, "
                                                        f"{args.samples} samples)")
    print(f"figure: {args.out}", file=sys.stderr)
    return 0
