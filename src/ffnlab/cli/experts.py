"""`ffnlab experts`: how a mixture of experts routes a text, layer by layer."""
import json
import sys

COMMAND = "experts"
HELP = "routing statistics of a mixture of experts on a text: tokens per expert, balance, entropy, co-firing"


def add_arguments(p):
    from .common import add_model_argument, count_or_all, positive
    from .neurons import add_min_context_argument
    add_model_argument(p)
    p.add_argument("--data", required=True, help="UTF-8 text file to stream through the model")
    p.add_argument("--layer", type=int, default=None, help="report this block only (default: every layer)")
    p.add_argument("--top", type=positive("--top"), default=5, help="tokens listed per expert (default 5)")
    p.add_argument("--ctx", type=positive("--ctx"), default=128, help="window length in tokens (default 128)")
    add_min_context_argument(p)
    p.add_argument("--batch", type=positive("--batch"), default=4, help="windows per forward (default 4)")
    p.add_argument("--max-windows", type=count_or_all("--max-windows"), default=-1,
                   help="stop after this many windows; -1 = the whole file (default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--png", metavar="OUT.png", help="write a heatmap of each layer's load share per expert")
    p.add_argument("--html", metavar="OUT.html", help="write one self-contained page with every table")
    from .scaleout import add_scale_arguments
    add_scale_arguments(p, "windows", "a multiple of --batch; default 16 batches")


def run(args):
    from ..errors import DataError, UsageError
    from ..evaluation.experts import layer_report
    from ..pictures import check_page, check_png, model_label, written
    from ..training.data import read_text
    from .common import load_model
    from .neurons import check_min_context
    from .scaleout import finish

    check_min_context(args)                            # every check on the flags before the model loads
    check_png(args.png, "--png")
    check_page(args.html, "--html")
    text = read_text(args.data)
    refuse_dense_before_loading(args.model)
    model = load_model(args)
    cfg = model.config
    if not cfg.moe:
        raise UsageError(f"{model.source} has a dense MLP ({cfg.ffn}), not a mixture of experts; "
                         f"`ffnlab neurons` studies its units")
    if args.layer is not None and not 0 <= args.layer < cfg.n_layer:
        raise UsageError(f"--layer {args.layer} is out of range: {model.source} has {cfg.n_layer} layers")
    if args.ctx > cfg.n_ctx:
        raise UsageError(f"--ctx {args.ctx} is longer than the model's context length {cfg.n_ctx}")
    if model.tokenizer is None:
        raise DataError(f"{model.source}: the model has no tokenizer, so it cannot read {args.data}")
    layers, outcome, n_units = route_units(args, model, text)
    code, summary = finish(outcome, n_units)
    if code:
        return code
    if layers[0].n_tokens == 0:
        raise DataError(f"{args.data}: no token has --min-context {args.min_context} tokens before it; give a "
                        f"longer text or a smaller --min-context")
    shown = [args.layer] if args.layer is not None else list(range(cfg.n_layer))
    reports = {il: layer_report(layers[il], model.tokenizer, args.top) for il in shown}
    if args.json:
        print(json.dumps({"model": model.source, "data": args.data, "min_context": args.min_context,
                          "n_expert": cfg.n_expert,
                          "n_expert_used": cfg.n_expert_used, "layers": {str(k): v for k, v in reports.items()},
                          "executor": summary},
                         ensure_ascii=False))
    else:
        print(render(reports, cfg))
    sys.stdout.flush()                                 # the text stands whatever happens to the files
    if args.png:
        with written(args.png, "--png"):
            write_heatmap(args.png, reports, cfg, f"{model_label(model)}, {args.data}")
        print(f"wrote {args.png}", file=sys.stderr)
    if args.html:
        with written(args.html, "--html"):
            write_page(args.html, reports, cfg, model.source)
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def refuse_dense_before_loading(model_arg):
    """A dense model is one line before its weights load: read from a GGUF's header or a checkpoint's
    ffnlab.json. Anything else (an HF folder, a file that does not parse) is left to the full load."""
    import os

    from ..errors import FfnlabError, UsageError
    from ..formats.installed import resolve_model
    path = resolve_model(model_arg)
    dense = None
    if os.path.isfile(path):
        from ..formats.gguf_peek import scalar_metadata
        meta = scalar_metadata(path)
        arch = meta.get("general.architecture")
        if arch and f"{arch}.block_count" in meta:
            dense = None if meta.get(f"{arch}.expert_count") else f"no {arch}.expert_count"
    else:
        from ..formats.checkpoint import is_checkpoint, read_config
        if is_checkpoint(path):
            try:
                cfg = read_config(path)
            except FfnlabError:
                return
            dense = None if cfg.moe else cfg.ffn
    if dense:
        raise UsageError(f"{path} has a dense MLP ({dense}), not a mixture of experts; "
                         f"`ffnlab neurons` studies its units")


def route_units(args, model, text):
    """The routing scan as units of --shard windows (evaluation/shards.py) -> ([LayerRouting] or None, Outcome,
    units): the counts add exactly and the entropy sums batch by batch, as evaluation/experts.py scan_routing."""
    import numpy as np
    from ..evaluation.activations import context_windows
    from ..evaluation.experts import LayerRouting
    from ..evaluation.shards import check_shard, experts_merge, experts_shard, window_units
    from ..runtime.executor import ModelSpec, Task, execute
    from ..runtime.executor import file_digest
    from .scaleout import backend, output_dir

    shard = args.shard or 16 * args.batch
    check_shard(shard, args.batch)
    cfg, tok = model.config, model.tokenizer
    ids = np.array(tok.encode(text, add_bos=False), dtype=np.int64)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    cw = context_windows(ids, args.ctx, args.min_context, bos, args.max_windows)
    units = window_units(cw, shard)
    spec = ModelSpec.from_args(args)
    key = {"model": spec.path, "arith": spec.arith, "data": file_digest(args.data), "ctx": args.ctx,
           "batch": args.batch, "max_windows": args.max_windows, "min_context": args.min_context, "shard": shard}
    init = [LayerRouting(cfg.n_expert, cfg.n_expert_used, cfg.vocab_size) for _ in range(cfg.n_layer)]
    outcome = execute(Task(spec, experts_shard, {"batch": args.batch}), units, experts_merge, init,
                      out=output_dir(args, "experts", key, units), backend=backend(args, model), label="routing")
    return outcome.merged, outcome, len(units)


def render(reports, cfg) -> str:
    from ..analysis.text import table
    from ..token_text import visible
    out = []
    for il, r in reports.items():
        out.append(f"layer {il}: {r['n_tokens']} tokens, {cfg.n_expert_used} of {cfg.n_expert} experts each; "
                   f"load CV {r['cv']:.3f}, router entropy {r['router_entropy']:.3f} nats "
                   f"({100 * r['router_entropy_frac']:.0f}% of log E)")
        rows = [[e["expert"], e["tokens"], f"{100 * e['share']:.1f}%",
                 "  ".join(f"[{visible(t['text'])}] {t['count']} ({100 * t['of_occurrences']:.0f}%)" for t in e["top_tokens"])]
                for e in r["experts"]]
        out.append(table(rows, ["expert", "tokens", "share", "most routed [tokens] (count, % of that token)"], "rrrl"))
        out.append("co-firing most: " + ", ".join(f"{p['pair'][0]}+{p['pair'][1]} {p['tokens']}"
                                                  for p in r["cofire_top"]) + "\n")
    return "\n".join(out).rstrip()


def write_heatmap(path, reports, cfg, title=""):
    """Load share per expert and layer, each cell labelled with its percentage when the grid is small."""
    import numpy as np

    from ..pictures import pyplot
    plt = pyplot()
    share = np.array([[e["share"] for e in r["experts"]] for r in reports.values()])   # [layers, E]
    L, E = share.shape
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * E + 2.5), max(4.0, 0.45 * L + 2.0)))
    im = ax.imshow(share, aspect="auto", cmap="viridis", vmin=0)
    if L * E <= 400:
        for il in range(L):
            for e in range(E):
                light = share[il, e] < 0.6 * share.max()
                ax.text(e, il, f"{100 * share[il, e]:.0f}", ha="center", va="center", fontsize=9,
                        color="white" if light else "black")
    ax.set_xlabel("expert")
    ax.set_ylabel("layer")
    ax.set_xticks(range(0, E, max(1, E // 32)))                        # <= 32 expert labels
    ax.set_yticks(range(L), [str(il) for il in reports])
    ax.set_title(f"{title}\nload share per expert, % (balanced: {100 / cfg.n_expert:.1f}%)", fontsize=10)
    fig.colorbar(im, ax=ax, label="share of the top-k slots")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_page(path, reports, cfg, source):
    import html

    from ..token_text import visible
    parts = [f"<!doctype html><meta charset='utf-8'><title>experts: {html.escape(str(source))}</title>",
             "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:right}"
             "td.t{text-align:left;font-family:monospace}</style>",
             f"<h1>{html.escape(str(source))}</h1><p>{cfg.n_expert_used} of {cfg.n_expert} experts per token</p>"]
    for il, r in reports.items():
        parts.append(f"<h2>layer {il}</h2><p>{r['n_tokens']} tokens; load CV {r['cv']:.3f}; router entropy "
                     f"{r['router_entropy']:.3f} nats ({100 * r['router_entropy_frac']:.0f}% of log E)</p>")
        parts.append("<table><tr><th>expert<th>tokens<th>share<th>most routed tokens</tr>")
        for e in r["experts"]:
            toks = " ".join(f"{html.escape(visible(t['text']))}&nbsp;{t['count']}" for t in e["top_tokens"])
            parts.append(f"<tr><td>{e['expert']}<td>{e['tokens']}<td>{100 * e['share']:.1f}%<td class=t>{toks}</tr>")
        parts.append("</table>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(parts))
