"""`ffnlab prune`: structured pruning of MLP hidden units -> a smaller GGUF that llama.cpp runs."""
import json
import os
import sys

COMMAND = "prune"
HELP = "drop the least important MLP hidden units of every layer and write a smaller GGUF"


# pruning.gguf_rewrite.TYPES, what its encode() writes (tests/engines/test_startup.py holds the two equal):
# importing that module here would load NumPy for `ffnlab prune --help`
TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def add_arguments(p):
    from .common import add_model_argument, count_or_all, needs, positive, refuse_together
    from .neurons import add_min_context_argument
    add_model_argument(p)
    p.add_argument("--keep", type=float, required=True,
                   help="fraction of MLP hidden units to keep per layer, in (0, 1]; rounded to a multiple of 32")
    p.add_argument("--by", choices=["activation", "weight"], default="activation",
                   help="importance: mean |activation| on --calib text, or ||up_i||*||gate_i||*||down_:,i|| (default activation)")
    p.add_argument("--calib", help="UTF-8 calibration text (needed for --by activation)")
    p.add_argument("--out", required=True, help="output .gguf file")
    p.add_argument("--type", choices=TYPES, default=None,
                   help="type of the pruned MLP tensors (default: each tensor's own type, or the closest type "
                        "gguf-py can write at the new width, said in the report); other tensors are copied byte "
                        "for byte")
    p.add_argument("--eval", help="held-out UTF-8 text: perplexity before and after, llama-perplexity's convention")
    p.add_argument("--ctx", type=positive("--ctx"), default=256, help="calibration window / perplexity chunk length (default 256)")
    p.add_argument("--calib-chunks", type=count_or_all("--calib-chunks"), default=16, help="calibration windows of --ctx tokens; -1 = all (default 16)")
    p.add_argument("--eval-chunks", type=count_or_all("--eval-chunks"), default=8, help="perplexity chunks; -1 = all (default 8)")
    p.add_argument("--batch", type=positive("--batch"), default=4, help="windows per forward (default 4)")
    add_min_context_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    refuse_together(p, "--by=weight", "--calib", "weight importance reads no text")
    refuse_together(p, "--by=weight", "--calib-chunks", "weight importance reads no text")
    refuse_together(p, "--by=weight", "--min-context", "weight importance reads no text")
    needs(p, "--eval-chunks", "--eval", "the chunks are of --eval's text")


def _check(args):
    from ..errors import UsageError
    if not 0.0 < args.keep <= 1.0:
        raise UsageError(f"--keep must be in (0, 1], got {args.keep}")
    if args.by == "activation" and not args.calib:
        raise UsageError("--by activation needs --calib FILE (text to measure activations on)")


def _conversion_lines(conversions):
    """[(tensor, from, to)] -> one line per (kind, from, to): which source types could not be kept."""
    import re
    from collections import Counter
    groups = Counter((re.sub(r"^blk\.\d+\.", "", n), a, b) for n, a, b in conversions)
    return [f"type: {kind} {a} -> {b} in {n} layers (gguf-py cannot write {a} at the new width; "
            f"{b} is the closest type that can)" for (kind, a, b), n in groups.items()]


def _mb(n):
    return f"{n / 1e6:.2f} MB"


def run(args):
    import numpy as np

    from ..errors import UsageError
    from ..evaluation.activations import context_windows
    from ..evaluation.perplexity import check_ctx, paired_ratio, perplexity, text_chunks
    from ..formats.load import load
    from ..progress import Progress
    from ..pruning.gguf_rewrite import write_pruned_gguf
    from ..pruning.prune import activation_scores, alignment, kept_width, select_units, weight_scores
    from ..training.data import read_text
    from .common import load_model, refuse_moe
    from .perplexity import progress_callback

    _check(args)
    calib = read_text(args.calib) if args.by == "activation" else None
    held_out = read_text(args.eval) if args.eval else None
    model = load_model(args)
    refuse_moe(model.config, model.source, "prune")
    cfg = model.config
    if not (model.source and os.path.isfile(model.source) and model.source.endswith(".gguf")):
        raise UsageError(f"{model.source}: prune copies the metadata of a .gguf model; -m must be a .gguf file")
    check_ctx(args.ctx, cfg, model.source)
    n_keep = kept_width(cfg.d_ff, args.keep)
    if args.by == "activation":
        tok = model.tokenizer
        bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
        cw = context_windows(tok.encode(calib, add_bos=False), args.ctx, args.min_context, bos, args.calib_chunks)
        bar = Progress(len(cw.windows), "calibrating")
        scores, n_tokens = activation_scores(model, cw, args.batch, lambda done: bar.update(done - bar.n))
        bar.close()
    else:
        scores, n_tokens = weight_scores(model.params, cfg), 0
    keep_idx = select_units(scores, n_keep)                                # [n_layer, n_keep]
    kept_share = float(np.mean(np.take_along_axis(scores, keep_idx, 1).sum(1) / scores.sum(1)))
    rep = write_pruned_gguf(model.source, args.out, keep_idx, args.type)
    ffn_before = cfg.n_layer * cfg.d_ff * cfg.d_model * (3 if cfg.gated else 2)
    ffn_after = ffn_before // cfg.d_ff * n_keep
    from ..threads import threads
    result = {"model": model.source, "threads": threads(), "out": args.out, "by": args.by, "keep": args.keep, "calib_tokens": n_tokens,
              "d_ff": cfg.d_ff, "d_ff_after": n_keep, "alignment": alignment(n_keep), "type": args.type or "source",
              "score_kept": kept_share, "mlp_params": ffn_before, "mlp_params_after": ffn_after,
              "params": rep["params_before"], "params_after": rep["params_after"],
              "bytes": rep["bytes_before"], "bytes_after": rep["bytes_after"], "fallbacks": rep["fallbacks"],
              "conversions": [{"tensor": n, "from": a, "to": b} for n, a, b in rep["conversions"]]}
    if held_out is not None:
        chunks = text_chunks(model, held_out, args.ctx, args.eval_chunks, args.eval)
        before = perplexity(model, chunks, args.batch, progress_callback(len(chunks), "PPL before"), keep_nll=True)
        del model
        pruned = load(args.out)
        after = perplexity(pruned, chunks, args.batch, progress_callback(len(chunks), "PPL after"), keep_nll=True)
        ratio, ratio_se = paired_ratio(after, before)
        result["eval"] = {"data": args.eval, "ctx": args.ctx, "n_chunks": before.n_chunks,
                          "tokens_scored": before.tokens_scored, "before": before.to_dict(), "after": after.to_dict(),
                          "ppl_ratio": ratio, "ppl_ratio_stderr": ratio_se}
    if args.json:
        print(json.dumps(result))
        return 0
    al = ", ".join(f"{m}: {'yes' if ok else 'no'}" for m, ok in result["alignment"].items())
    print(f"pruned {args.by}: d_ff {cfg.d_ff} -> {n_keep} per layer ({n_keep / cfg.d_ff:.1%} kept; divisible by {al})")
    if args.by == "activation":
        print(f"calibration: {n_tokens} tokens; kept units carry {kept_share:.1%} of each layer's summed mean |activation|")
    else:
        print(f"kept units carry {kept_share:.1%} of each layer's summed weight score")
    print(f"MLP parameters: {ffn_before:,} -> {ffn_after:,} (-{1 - ffn_after / ffn_before:.1%})")
    print(f"all parameters: {rep['params_before']:,} -> {rep['params_after']:,} "
          f"(-{1 - rep['params_after'] / rep['params_before']:.1%})")
    print(f"file: {_mb(rep['bytes_before'])} -> {_mb(rep['bytes_after'])} "
          f"({(rep['bytes_after'] - rep['bytes_before']) / rep['bytes_before']:+.1%}); MLP tensors "
          f"{'as ' + args.type if args.type else 'in their source types'}, the rest copied byte for byte")
    for line in _conversion_lines(rep["conversions"]):
        print(line)
    for f in rep["fallbacks"]:
        print(f"note: {f}")
    if held_out is not None:
        ev = result["eval"]
        b, a = ev["before"], ev["after"]
        print(f"perplexity on {args.eval} ({b['n_chunks']} chunks of {args.ctx}, {b['tokens_scored']} tokens scored): "
              f"{b['ppl']:.4f} +/- {b['ppl_stderr']:.4f} -> {a['ppl']:.4f} +/- {a['ppl_stderr']:.4f}; "
              f"paired on the same tokens: {ev['ppl_ratio'] - 1:+.2%} +/- {ev['ppl_ratio_stderr']:.2%}")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
