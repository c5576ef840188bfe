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


def progress_callback(n_chunk, label="perplexity", stream=None):
    """-> on_batch(done, running) that shows a bar with the running PPL on a terminal, and
    llama-perplexity's `[chunk]ppl,` trail otherwise."""
    from ..progress import Progress
    stream = stream or sys.stderr
    bar = Progress(n_chunk, label, stream=stream)
    if not bar.enabled:
        stream.write(f"{label}: ")

    def on_batch(done, running):
        if bar.enabled:
            bar.update(done - bar.n, f"PPL {running.ppl:.4f}")
            if done >= n_chunk:
                bar.close()
            return
        stream.write(f"[{done}]{running.ppl:.4f}," + ("\n" if done >= n_chunk else ""))
        stream.flush()
    return on_batch


def run(args):
    from ..evaluation.perplexity import perplexity, text_chunks
    from ..threads import threads
    from ..training.data import read_text
    from .common import load_model

    text = read_text(args.data)
    model = load_model(args)
    chunks = text_chunks(model, text, args.ctx, args.chunks, args.data)
    n_chunk = len(chunks)
    first = args.ctx // 2
    print(f"perplexity: {n_chunk} chunks of {args.ctx} tokens, scoring positions {first + 1}..{args.ctx - 1} of each "
          f"({args.ctx - first - 1} tokens per chunk), BOS {'replaces the first token' if model.tokenizer.add_bos else 'not added'}, "
          f"batch {args.batch}", file=sys.stderr)
    r = perplexity(model, chunks, args.batch, progress_callback(n_chunk))
    if args.json:
        print(json.dumps({"model": model.source, "data": args.data, "threads": threads(), **r.to_dict()}))
    else:
        print(f"PPL = {r.ppl:.4f} +/- {r.ppl_stderr:.5f}")
        print(f"tokens scored: {r.tokens_scored} ({r.n_chunks} chunks x {args.ctx - first - 1}), "
              f"tokens evaluated: {r.tokens_evaluated} in {r.seconds:.1f} s ({r.tokens_per_s:.1f} tokens/s, {threads()} thread{'s' if threads() != 1 else ''})")
    return 0
