"""The table in docs/mlp-compression.md: SmolLM2-135M pruned at keep 1.0 / 0.9 / 0.75 / 0.5 by
both criteria, with parameters, file sizes and held-out perplexity (ffnlab and llama.cpp).

    python bench/prune_sweep.py [--data /work/shared/data/tinyshakespeare.txt] [--out sweep.json]

Calibration: the first --split characters of the file; evaluation: the rest (held out).
Each pruned model is written as a GGUF (MLP tensors q8_0, everything else copied), loaded back
by ffnlab and by llama.cpp (llama-cpp-python), and scored on the same chunks. A q4_1 copy is
written too, for its size only. Scores are computed once per criterion and reused across keeps,
so this is `ffnlab prune ... --eval` for 7 models without recalibrating.
"""
import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

import ffnlab
from ffnlab.evaluation.activations import context_windows
from ffnlab.evaluation.perplexity import RunningNLL, chunk_nll, paired_ratio, perplexity, text_chunks
from ffnlab.formats.load import default_model_path
from ffnlab.pruning.gguf_rewrite import write_pruned_gguf
from ffnlab.pruning.prune import activation_scores, alignment, kept_width, select_units, weight_scores


def llama_cpp_ppl(path, chunks, threads):
    """The same chunks through llama.cpp, scored with llama-perplexity's convention."""
    import llama_cpp
    n_ctx = chunks.shape[1]
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, logits_all=True, n_threads=threads, verbose=False)
    acc = RunningNLL()
    for c in chunks:
        llm.reset()
        llm.eval(c.tolist())
        acc.add(chunk_nll(np.array(llm.scores[:n_ctx])[None], c[None]))
    return acc.ppl, acc.ppl_stderr


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="/work/shared/data/tinyshakespeare.txt", help="UTF-8 text")
    ap.add_argument("--split", type=int, default=1_000_000, help="characters used for calibration; the rest is held out")
    ap.add_argument("--ctx", type=int, default=256, help="calibration window and perplexity chunk length")
    ap.add_argument("--calib-chunks", type=int, default=16, help="calibration windows")
    ap.add_argument("--eval-chunks", type=int, default=8, help="perplexity chunks")
    ap.add_argument("--keeps", default="1.0,0.9,0.75,0.5", help="comma-separated keep fractions")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    ap.add_argument("--out", default="prune_sweep.json", help="results (JSON), rewritten after every row")
    ap.add_argument("--table", metavar="JSON", help="only print the markdown table of an earlier run's results")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            print(markdown(json.load(f)))
        return

    text = open(args.data, encoding="utf-8").read()
    calib, held_out = text[:args.split], text[args.split:]
    src = default_model_path()
    model = ffnlab.load(src)
    cfg = model.config
    chunks = text_chunks(model, held_out, args.ctx, args.eval_chunks)
    rows, res = [], {"model": src, "data": args.data, "split": args.split, "ctx": args.ctx,
                     "eval_chunks": len(chunks), "tokens_scored": int(len(chunks) * (args.ctx - args.ctx // 2 - 1))}
    log("baseline")
    base = perplexity(model, chunks, 4, keep_nll=True)
    lc = llama_cpp_ppl(src, chunks, args.threads)
    rows.append({"by": "original", "keep": 1.0, "d_ff": cfg.d_ff, "params": model.n_params,
                 "mlp_params": cfg.n_layer * 3 * cfg.d_model * cfg.d_ff, "bytes_q8_0": None, "bytes": os.path.getsize(src),
                 "ppl": base.ppl, "ppl_stderr": base.ppl_stderr, "ratio": 1.0, "ratio_stderr": 0.0,
                 "llama_cpp_ppl": lc[0], "llama_cpp_stderr": lc[1], "seconds": base.seconds})
    log("baseline", base.ppl, lc)

    cw = context_windows(model.tokenizer.encode(calib, add_bos=False), args.ctx, bos_id=None, max_windows=args.calib_chunks)
    t0 = time.perf_counter()
    act, n_calib = activation_scores(model, cw, 4)
    log(f"activation scores on {n_calib} tokens in {time.perf_counter() - t0:.0f} s")
    scores = {"activation": act, "weight": weight_scores(model.params, cfg)}
    from scipy.stats import spearmanr
    rho = [float(spearmanr(scores["activation"][il], scores["weight"][il]).statistic) for il in range(cfg.n_layer)]
    res.update(calib_tokens=n_calib, spearman_weight_vs_activation=rho)

    tmp = tempfile.mkdtemp(prefix="prune-sweep-")
    for by in ("activation", "weight"):
        for keep in (float(k) for k in args.keeps.split(",")):
            if keep == 1.0 and by == "weight":
                continue                                             # the same model as activation at 1.0
            n_keep = kept_width(cfg.d_ff, keep)
            idx = select_units(scores[by], n_keep)
            out = os.path.join(tmp, f"{by}-{keep}.gguf")
            rep = write_pruned_gguf(src, out, idx, "q8_0")
            q41 = write_pruned_gguf(src, out + ".q4_1", idx, "q4_1")
            os.unlink(out + ".q4_1")
            pruned = ffnlab.load(out)
            r = perplexity(pruned, chunks, 4, keep_nll=True)
            ratio, ratio_se = paired_ratio(r, base)
            lc = llama_cpp_ppl(out, chunks, args.threads)
            os.unlink(out)
            kept_share = float(np.mean(np.take_along_axis(scores[by], idx, 1).sum(1) / scores[by].sum(1)))
            rows.append({"by": by, "keep": keep, "d_ff": n_keep, "alignment": alignment(n_keep),
                         "params": rep["params_after"], "mlp_params": cfg.n_layer * 3 * cfg.d_model * n_keep,
                         "bytes_q8_0": rep["bytes_after"], "bytes": q41["bytes_after"], "score_kept": kept_share,
                         "ppl": r.ppl, "ppl_stderr": r.ppl_stderr, "ratio": ratio, "ratio_stderr": ratio_se,
                         "llama_cpp_ppl": lc[0], "llama_cpp_stderr": lc[1], "seconds": r.seconds})
            log(by, keep, n_keep, r.ppl, f"{ratio - 1:+.2%} +/- {ratio_se:.2%}", lc)
            res["rows"] = rows
            with open(args.out, "w") as f:
                json.dump(res, f, indent=1)
            del pruned
    res["rows"] = rows
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print(markdown(res))


def markdown(res):
    lines = ["| criterion | keep | d_ff | MLP params | all params | file, MLP q8_0 | file, MLP q4_1 | PPL (ffnlab) | "
             "vs original, paired | PPL (llama.cpp) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        orig = r["by"] == "original"
        q8 = f"{r['bytes_q8_0'] / 1e6:.1f} MB" if r["bytes_q8_0"] else "-"
        q41 = f"{r['bytes'] / 1e6:.1f} MB" + (" (the Q4_1 file)" if orig else "")
        if orig:
            delta = "-"
        elif r["ratio"] < 2:
            delta = f"{r['ratio'] - 1:+.1%} ± {r['ratio_stderr']:.1%}"
        else:
            delta = f"×{r['ratio']:.3g} ± {r['ratio_stderr']:.2g}"
        ppl = lambda p, e: f"{p:.2f} ± {e:.2f}" if p < 1000 else f"{p:.3g} ± {e:.2g}"   # noqa: E731
        lines.append(f"| {r['by']} | {r['keep']} | {r['d_ff']} | {r['mlp_params'] / 1e6:.2f} M | {r['params'] / 1e6:.2f} M | "
                     f"{q8} | {q41} | {ppl(r['ppl'], r['ppl_stderr'])} | {delta} | "
                     f"{ppl(r['llama_cpp_ppl'], r['llama_cpp_stderr'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
