"""`ffnlab neurons`: what makes a layer's MLP hidden units fire, on a text file."""
import json
import sys

COMMAND = "neurons"
HELP = "MLP hidden units of one layer: their top-activating text windows, histograms, an HTML browser"


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


def write_histograms(path, reports, node):
    """One panel per unit: counts (log scale) over the streaming histogram's bins."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(reports)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, r in zip(axes.flat, reports):
        e = r["hist"]["edges"]
        ax.stairs(r["hist"]["counts"], e, fill=True)
        ax.set_yscale("log")
        ax.set_title(f"unit {r['unit']}  mean|a| {r['mean_abs']:.3g}", fontsize=9)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"{node}: activation histograms", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def scan_units(args, model, text):
    """The layer's scan as units of --shard windows (runtime/corpus.py) -> (NeuronScan or None, Outcome, units):
    the merged scan is the single pass's (evaluation/neurons.py scan_layer) -- the same sums, the same top-k."""
    import numpy as np
    from ..evaluation.activations import activation_node, token_windows
    from ..evaluation.neurons import NeuronScan
    from ..runtime.corpus import NeuronAccumulator, check_shard, neuron_merge, neuron_shard, neuron_units
    from ..runtime.executor import ModelSpec, Task, execute
    from .scaleout import backend, file_digest, output_dir

    shard = args.shard or 16 * args.batch
    check_shard(shard, args.batch)
    tok, d_ff, bins = model.tokenizer, model.config.d_ff, 64
    ids = np.array(tok.encode(text, add_bos=False), dtype=np.int64)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    windows, starts = token_windows(ids, args.ctx, bos, args.max_windows)
    units = neuron_units(windows, starts, shard)
    spec = ModelSpec.from_args(args)
    params = {"layer": args.layer, "lead": 1 if bos is not None else 0, "k": args.top, "bins": bins, "batch": args.batch}
    key = {"model": spec.path, "arith": spec.arith, "data": file_digest(args.data), "ctx": args.ctx,
           "max_windows": args.max_windows, "shard": shard, **params}
    outcome = execute(Task(spec, neuron_shard, params), units, neuron_merge, NeuronAccumulator(d_ff, args.top, bins),
                      out=output_dir(args, "neurons", key, units), backend=backend(args, model),
                      label=f"layer {args.layer}")
    if outcome.merged is None:
        return None, outcome, len(units)
    acc = outcome.merged
    scan = NeuronScan(args.layer, f"{activation_node(model.config)}-{args.layer}", ids, len(windows), acc.top,
                      acc.stats, acc.hist)
    scan.ranking = np.argsort(-acc.stats.mean_abs, kind="stable")
    return scan, outcome, len(units)


def run(args):
    from ..errors import DataError
    from ..evaluation.neurons import unit_report, window_text
    from ..training.data import read_text
    from .common import load_model
    from .scaleout import finish

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
    units = [args.neuron] if args.neuron is not None else [int(u) for u in scan.ranking[:args.units]]
    reports = [unit_report(scan, tok, u) for u in units]
    if args.json:
        from ..threads import threads
        print(json.dumps({"model": model.source, "threads": threads(), "data": args.data, "layer": args.layer, "node": scan.node,
                          "d_ff": model.config.d_ff, "n_tokens": scan.n_tokens, "n_windows": scan.n_windows,
                          "units": reports, "executor": summary}, ensure_ascii=False))
    else:
        print(f"{scan.node}: {model.config.d_ff} units, {scan.n_tokens} tokens in {scan.n_windows} windows of "
              f"<= {args.ctx}; units ranked by mean |a|, windows by |a| of the [[token]]")
        for r in reports:
            print(f"\nunit {r['unit']} (rank {r['rank'] + 1})  mean|a| {r['mean_abs']:.4g}  mean {r['mean']:.4g}  "
                  f"std {r['std']:.4g}  max {r['max']:.4g}  min {r['min']:.4g}")
            for w in r["windows"]:
                print(f"  {w['value']:+9.4g}  {window_text(w)}")
    if args.html:
        from ..evaluation.neurons_html import write_page
        write_page(args.html, scan, tok, model.source)
        print(f"wrote {args.html} ({len(scan.ranking)} units)", file=sys.stderr)
    if args.hist:
        write_histograms(args.hist, reports, scan.node)
        print(f"wrote {args.hist}", file=sys.stderr)
    return 0
