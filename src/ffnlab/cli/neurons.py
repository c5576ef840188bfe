"""`ffnlab neurons`: what makes a layer's MLP hidden units fire, on a text file."""
import json
import sys

COMMAND = "neurons"
HELP = "MLP hidden units of one layer: their top-activating text windows, histograms, an HTML browser"


def add_min_context_argument(p):
    from ..evaluation import DEFAULT_MIN_CONTEXT
    from .common import nonneg
    p.add_argument("--min-context", type=nonneg("--min-context"), default=DEFAULT_MIN_CONTEXT, metavar="N",
                   help="score only tokens with at least N tokens before them in their window; windows overlap by "
                        f"N so every later token is scored once (default {DEFAULT_MIN_CONTEXT}; docs/neurons.md)")


def add_arguments(p):
    from .common import add_model_argument, count_or_all, positive, refuse_together
    add_model_argument(p)
    p.add_argument("--layer", type=int, required=True, help="block index L (its activation node ffn_swiglu-L / "
                                                             "ffn_geglu-L / ffn_gelu-L is recorded)")
    p.add_argument("--data", required=True, help="UTF-8 text file to stream through the model")
    p.add_argument("--top", type=positive("--top"), default=5, help="text windows kept per unit, by |activation| (default 5)")
    p.add_argument("--neuron", type=int, default=None, help="show this unit only (default: the most active units)")
    p.add_argument("--units", type=positive("--units"), default=10,
                   help="without --neuron: how many units to list, ranked by mean |activation| (default 10)")
    p.add_argument("--ctx", type=positive("--ctx"), default=128, help="window length in tokens (default 128)")
    add_min_context_argument(p)
    p.add_argument("--batch", type=positive("--batch"), default=4, help="windows per forward (default 4)")
    p.add_argument("--max-windows", type=count_or_all("--max-windows"), default=-1, help="stop after this many windows; -1 = the whole file (default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--html", metavar="OUT.html", help="write one self-contained page to browse every unit")
    p.add_argument("--hist", metavar="OUT.png", help="write a histogram of the listed units' activations (PNG)")
    from .scaleout import add_scale_arguments
    add_scale_arguments(p, "windows", "a multiple of --batch; default 16 batches")
    refuse_together(p, "--neuron", "--units", "--neuron shows one unit, --units ranks the most active ones")


def check_layer(args, cfg, source):
    from ..errors import UsageError
    from .common import refuse_moe
    refuse_moe(cfg, source, "neurons")
    if not 0 <= args.layer < cfg.n_layer:
        raise UsageError(f"--layer {args.layer} is out of range: {source} has {cfg.n_layer} layers (0..{cfg.n_layer - 1})")
    if args.neuron is not None and not 0 <= args.neuron < cfg.d_ff:
        raise UsageError(f"--neuron {args.neuron} is out of range: layer {args.layer} has d_ff = {cfg.d_ff} units "
                         f"(0..{cfg.d_ff - 1})")
    if args.ctx > cfg.n_ctx:
        raise UsageError(f"--ctx {args.ctx} is longer than the model's context length {cfg.n_ctx} ({source})")


def check_min_context(args):
    from ..errors import UsageError
    if args.min_context >= args.ctx - 1:
        raise UsageError(f"--min-context {args.min_context} leaves nothing to score in a window of --ctx {args.ctx} "
                         f"(it must be below --ctx - 1)")


def write_histograms(path, reports, node, title=""):
    """One panel per unit: counts (log scale) over the streaming histogram's bins, the x axis over
    the unit's own [min, max] (the bins span a power of two around 0, often far wider), negative
    bins blue and positive red, as the HTML page shades them."""
    from matplotlib.patches import Patch

    from ..pictures import pyplot
    plt = pyplot()
    n = len(reports)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 2.6 * rows + 0.6), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, r in zip(axes.flat, reports):
        e, c = r["hist"]["edges"], r["hist"]["counts"]
        colors = ["#c0392b" if lo >= 0 else "#2c6fbb" for lo in e[:-1]]
        ax.bar(e[:-1], c, width=[hi - lo for lo, hi in zip(e[:-1], e[1:])], align="edge", color=colors)
        ax.set_yscale("log")
        lo, hi = r["min"], r["max"]
        pad = 0.05 * (hi - lo) or 0.5
        ax.set_xlim(lo - pad, hi + pad)
        ax.axvline(0, color="#555", lw=0.6)
        ax.set_title(f"unit {r['unit']}  mean|a| {r['mean_abs']:.3g}", fontsize=9)
        ax.set_xlabel("activation", fontsize=7)
        ax.tick_params(labelsize=7)
    axes.flat[0].set_ylabel("tokens (log)", fontsize=7)
    fig.legend(handles=[Patch(color="#2c6fbb", label="a < 0"), Patch(color="#c0392b", label="a >= 0")],
               loc="upper right", fontsize=8, ncol=2, frameon=False)
    fig.suptitle(f"{title}{node}: activation histograms of the scored tokens", fontsize=10, x=0.02, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scan_units(args, model, text):
    """The layer's scan as units of --shard windows (evaluation/shards.py) -> (NeuronScan or None, Outcome, units):
    the merged scan is the single pass's (evaluation/neurons.py scan_layer) -- the same sums, the same top-k."""
    import numpy as np
    from ..evaluation.activations import activation_node, context_windows
    from ..evaluation.neurons import NeuronScan
    from ..evaluation.shards import NeuronAccumulator, check_shard, neuron_merge, neuron_shard, neuron_units
    from ..runtime.executor import ModelSpec, Task, execute
    from ..runtime.executor import file_digest
    from .scaleout import backend, output_dir

    shard = args.shard or 16 * args.batch
    check_shard(shard, args.batch)
    tok, d_ff, bins = model.tokenizer, model.config.d_ff, 64
    ids = np.array(tok.encode(text, add_bos=False), dtype=np.int64)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    cw = context_windows(ids, args.ctx, args.min_context, bos, args.max_windows)
    units = neuron_units(cw, shard)
    spec = ModelSpec.from_args(args)
    params = {"layer": args.layer, "k": args.top, "bins": bins, "batch": args.batch}
    key = {"model": spec.path, "arith": spec.arith, "data": file_digest(args.data), "ctx": args.ctx,
           "max_windows": args.max_windows, "min_context": args.min_context, "shard": shard, **params}
    outcome = execute(Task(spec, neuron_shard, params), units, neuron_merge, NeuronAccumulator(d_ff, args.top, bins),
                      out=output_dir(args, "neurons", key, units), backend=backend(args, model),
                      label=f"layer {args.layer}")
    if outcome.merged is None:
        return None, outcome, len(units)
    acc = outcome.merged
    scan = NeuronScan(args.layer, f"{activation_node(model.config)}-{args.layer}", ids, len(cw.windows), acc.top,
                      acc.stats, acc.hist)
    scan.ranking = np.argsort(-acc.stats.mean_abs, kind="stable")
    return scan, outcome, len(units)


def run(args):
    from ..errors import DataError
    from ..evaluation.neurons import unit_report, window_text
    from ..pictures import check_page, check_png, model_label, written
    from ..training.data import read_text
    from .common import load_model
    from .scaleout import finish

    check_min_context(args)                            # every check on the flags before the model loads
    check_png(args.hist, "--hist")
    check_page(args.html, "--html")
    text = read_text(args.data)
    model = load_model(args)
    check_layer(args, model.config, model.source)
    if model.tokenizer is None:
        raise DataError(f"{model.source}: the model has no tokenizer, so it cannot read {args.data}")
    tok = model.tokenizer
    scan, outcome, n_units = scan_units(args, model, text)
    code, summary = finish(outcome, n_units)
    if code:
        if args.json:
            print(json.dumps({"model": model.source, "data": args.data, "layer": args.layer, "executor": summary}))
        return code
    if scan.n_tokens == 0:
        raise DataError(f"{args.data}: {len(scan.ids)} tokens, none with --min-context {args.min_context} tokens "
                        f"before it; give a longer text or a smaller --min-context")
    units = [args.neuron] if args.neuron is not None else [int(u) for u in scan.ranking[:args.units]]
    reports = [unit_report(scan, tok, u) for u in units]
    if args.json:
        from ..threads import threads
        print(json.dumps({"model": model.source, "threads": threads(), "data": args.data, "layer": args.layer, "node": scan.node,
                          "d_ff": model.config.d_ff, "n_tokens": scan.n_tokens, "n_windows": scan.n_windows,
                          "min_context": args.min_context, "units": reports, "executor": summary}, ensure_ascii=False))
    else:
        print(f"{scan.node}: {model.config.d_ff} units, {scan.n_tokens} tokens scored in {scan.n_windows} windows of "
              f"<= {args.ctx} (each with >= {args.min_context} tokens of context); units ranked by mean |a|, "
              f"windows by |a| of the [[token]]")
        for r in reports:
            print(f"\nunit {r['unit']} (rank {r['rank'] + 1})  mean|a| {r['mean_abs']:.4g}  mean {r['mean']:.4g}  "
                  f"std {r['std']:.4g}  max {r['max']:.4g}  min {r['min']:.4g}")
            for w in r["windows"]:
                print(f"  {w['value']:+9.4g}  {window_text(w)}")
    sys.stdout.flush()                                 # the text stands whatever happens to the files
    if args.html:
        from ..evaluation.neurons_html import write_page
        with written(args.html, "--html"):
            write_page(args.html, scan, tok, model.source)
        print(f"wrote {args.html} ({len(scan.ranking)} units)", file=sys.stderr)
    if args.hist:
        with written(args.hist, "--hist"):
            write_histograms(args.hist, reports, scan.node, f"{model_label(model)}, {args.data}: ")
        print(f"wrote {args.hist}", file=sys.stderr)
    return 0
