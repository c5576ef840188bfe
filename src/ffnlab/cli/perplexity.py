"""`ffnlab perplexity`: perplexity of a model on a text file, scored like llama.cpp's llama-perplexity."""
import json
import sys

COMMAND = "perplexity"
HELP = "perplexity on a text file, chunked and scored like llama.cpp's llama-perplexity"


def add_arguments(p):
    from .common import add_lora_arguments, add_model_argument, count_or_all, positive
    add_model_argument(p)
    add_lora_arguments(p)
    p.add_argument("--data", required=True, help="UTF-8 text file to score")
    p.add_argument("--ctx", type=positive("--ctx"), default=512,
                   help="chunk length in tokens; the second half of each chunk is scored (default 512, as llama.cpp)")
    p.add_argument("--batch", type=positive("--batch"), default=4,
                   help="chunks evaluated together in one [B, ctx] forward (default 4)")
    p.add_argument("--chunks", type=count_or_all("--chunks"), default=-1, help="score at most this many chunks; -1 = all (default)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    from .scaleout import add_scale_arguments
    add_scale_arguments(p, "chunks", "a multiple of --batch; default --batch: one forward per unit")


def progress_callback(n_chunk, label="perplexity", stream=None):
    """-> on_batch(done, running) that shows a bar with the running PPL on a terminal, and
    llama-perplexity's `[chunk]ppl,` trail otherwise; on_batch.end() ends an unfinished trail's line
    (a failure's message then starts a line of its own)."""
    from ..progress import Progress
    stream = stream or sys.stderr
    bar = Progress(n_chunk, label, stream=stream)
    state = {"open": False}

    def on_batch(done, running):
        if bar.enabled:
            bar.update(done - bar.n, f"PPL {running.ppl:.4f}")
            if done >= n_chunk:
                bar.close()
            return
        if not state["open"]:
            stream.write(f"{label}: ")
        state["open"] = done < n_chunk
        stream.write(f"[{done}]{running.ppl:.4f}," + ("\n" if done >= n_chunk else ""))
        stream.flush()

    def end():
        if state["open"]:
            stream.write("\n")
            state["open"] = False
        bar.close()
    on_batch.end = end
    return on_batch


def run(args):
    from ..evaluation.perplexity import PerplexityResult, RunningNLL, text_chunks
    from ..evaluation.shards import check_shard, perplexity_merge, perplexity_shard, perplexity_units
    from ..runtime.executor import ModelSpec, Task, execute
    from ..threads import threads
    from ..training.data import read_text
    from .common import load_model
    from ..runtime.executor import file_digest
    from .scaleout import backend, finish, output_dir

    text = read_text(args.data)
    shard = args.shard or args.batch
    check_shard(shard, args.batch)
    model = load_model(args)
    chunks = text_chunks(model, text, args.ctx, args.chunks, args.data)
    n_chunk = len(chunks)
    first = args.ctx // 2
    print(f"perplexity: {n_chunk} chunks of {args.ctx} tokens, scoring positions {first + 1}..{args.ctx - 1} of each "
          f"({args.ctx - first - 1} tokens per chunk), BOS {'replaces the first token' if model.tokenizer.add_bos else 'not added'}, "
          f"batch {args.batch}", file=sys.stderr)
    # a unit is `shard` chunks; the merge adds each batch's sums in chunk order: one pass's figure
    units = perplexity_units(chunks, shard)
    spec = ModelSpec.from_args(args)
    key = {"model": spec.path, "lora": spec.lora, "lora_scale": spec.lora_scale, "arith": spec.arith,
           "data": file_digest(args.data), "ctx": args.ctx, "batch": args.batch, "chunks": args.chunks, "shard": shard}
    out = output_dir(args, "perplexity", key, units)
    where = backend(args, model)                                      # a cluster that does not answer: one line, now
    trail = progress_callback(n_chunk)
    try:
        outcome = execute(Task(spec, perplexity_shard, {"batch": args.batch}), units, perplexity_merge,
                          (RunningNLL(), 0), out=out, backend=where, label="perplexity", progress=False,
                          on_merged=lambda _n, acc: trail(acc[1], acc[0]))
    finally:
        trail.end()
    code, summary = finish(outcome, len(units))
    if code:
        if args.json:
            print(json.dumps({"model": model.source, "data": args.data, "executor": summary}))
        return code
    acc = outcome.merged[0]
    dt = outcome.seconds
    r = PerplexityResult(ppl=acc.ppl, ppl_stderr=acc.ppl_stderr, nll=acc.mean, tokens_scored=acc.count,
                         tokens_evaluated=n_chunk * args.ctx, n_chunks=n_chunk, n_ctx=args.ctx,
                         bos=bool(model.tokenizer.add_bos and model.tokenizer.bos_id is not None), seconds=dt,
                         tokens_per_s=outcome.tokens / dt if dt > 0 else float("inf"))
    if args.json:
        print(json.dumps({"model": model.source, "data": args.data, "threads": threads(), **r.to_dict(),
                          "executor": summary}))
    else:
        print(f"PPL = {r.ppl:.4f} +/- {r.ppl_stderr:.5f}")
        print(f"tokens scored: {r.tokens_scored} ({r.n_chunks} chunks x {args.ctx - first - 1}), "
              f"tokens evaluated: {r.tokens_evaluated} in {r.seconds:.1f} s ({r.tokens_per_s:.1f} tokens/s, {threads()} thread{'s' if threads() != 1 else ''})"
              + (f"; {outcome.resumed} of {len(units)} units read from {args.out}" if outcome.resumed else ""))
    return 0
