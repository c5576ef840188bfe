"""Perplexity exactly as llama.cpp's llama-perplexity computes it.

The convention (tools/perplexity/perplexity.cpp, perplexity(), llama.cpp as vendored by
llama-cpp-python 0.3.36):
  1. The whole text is tokenized once, with the model's BOS if its vocab adds one
     (common_tokenize(ctx, text, add_special=true)).
  2. Chunk i is tokens[i*n_ctx : (i+1)*n_ctx]; n_chunk = len(tokens) // n_ctx (capped by --chunks);
     the tail that does not fill a chunk is not used. Each chunk is evaluated on its own
     (the KV cache is cleared between chunks), so chunks can run side by side as a batch.
  3. If the vocab adds BOS, the chunk's first token is *replaced* by BOS for the evaluation
     (no token is inserted; the chunk stays n_ctx long).
  4. Only the second half is scored: with first = n_ctx // 2, the logits at positions
     first .. n_ctx-2 predict tokens first+1 .. n_ctx-1. That is n_ctx - first - 1 targets per
     chunk (255 for n_ctx = 512); the first half is context only, so every scored token sees
     at least n_ctx/2 tokens of context and the BOS swap never touches a target.
  5. nll_i = -(logit[target] - max - log(sum(exp(logit - max)))), summed in double.
     PPL = exp(mean nll). Its standard error is the delta method on the standard error of the
     mean nll: PPL * sqrt((E[nll^2] - E[nll]^2) / (count - 1)).
llama-perplexity refuses texts under 2*n_ctx tokens; ffnlab needs one full chunk (the numbers
for the chunks both score are the same).
"""
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..errors import DataError, UsageError


@dataclass
class PerplexityResult:
    ppl: float               # exp(mean nll)
    ppl_stderr: float        # standard error of ppl (llama-perplexity's "+/-")
    nll: float               # mean negative log-likelihood per scored token, nats
    tokens_scored: int       # n_chunks * (n_ctx - n_ctx//2 - 1)
    tokens_evaluated: int    # n_chunks * n_ctx: every token the model ran on
    n_chunks: int
    n_ctx: int
    bos: bool                # first token of each chunk replaced by BOS
    seconds: float
    tokens_per_s: float      # tokens_evaluated / seconds
    nlls: np.ndarray = field(default=None, repr=False)   # [n_chunks, scored per chunk], when asked for

    def to_dict(self):
        d = asdict(self)
        d.pop("nlls")
        return d


def paired_ratio(after, before):
    """PPL(after) / PPL(before) on the same tokens, and its standard error: exp of the mean
    per-token nll difference (delta method). Pairing removes the variance the two runs share --
    which tokens are hard -- so it resolves differences far below either PPL's own +/-."""
    d = (after.nlls - before.nlls).ravel()
    r = float(np.exp(d.mean()))
    return r, r * float(d.std() / np.sqrt(max(len(d) - 1, 1)))


def first_scored(n_ctx):
    """llama-perplexity's `first`: positions before it are context only."""
    return n_ctx // 2


def make_chunks(ids, n_ctx, n_chunks=-1, bos_id=None):
    """ids: [N] -> [n_chunk, n_ctx]: consecutive chunks, the first token of each replaced by bos_id
    (when the model adds BOS)."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids) // n_ctx
    if n_chunks is not None and n_chunks >= 0:
        n = min(n, n_chunks)
    chunks = ids[: n * n_ctx].reshape(n, n_ctx).copy()                 # [n_chunk, n_ctx]
    if bos_id is not None:
        chunks[:, 0] = bos_id
    return chunks


def chunk_nll(logits, chunks):
    """logits: [B, T, V], chunks: [B, T] -> nll [B, T - T//2 - 1] (float64), the scored half."""
    B, T, _ = logits.shape
    first = first_scored(T)
    out = np.empty((B, T - first - 1))
    for b in range(B):                                                 # one row at a time: [T/2, V] in float64
        lg = logits[b, first:T - 1].astype(np.float64)                 # [T/2 - 1, V] predicts tokens first+1..T-1
        lg -= lg.max(axis=-1, keepdims=True)
        target = lg[np.arange(len(lg)), chunks[b, first + 1:]]
        out[b] = np.log(np.exp(lg).sum(axis=-1)) - target
    return out


class RunningNLL:
    """Sums of nll and nll^2 in double, as llama-perplexity keeps them."""

    def __init__(self):
        self.count, self.sum, self.sum2 = 0, 0.0, 0.0

    def add(self, nll):
        nll = np.asarray(nll, dtype=np.float64).ravel()
        self.count += nll.size
        self.sum += float(nll.sum())
        self.sum2 += float((nll * nll).sum())

    @property
    def mean(self):
        return self.sum / self.count

    @property
    def ppl(self):
        return float(np.exp(self.mean))

    @property
    def ppl_stderr(self):
        if self.count < 2:
            return float("nan")
        var = self.sum2 / self.count - self.mean ** 2                 # biased variance of nll_i
        return self.ppl * float(np.sqrt(max(var, 0.0) / (self.count - 1)))


def check_ctx(n_ctx, cfg, source=""):
    if n_ctx < 3:
        raise UsageError(f"--ctx must be at least 3 (the second half of each chunk is scored), got {n_ctx}")
    if n_ctx > cfg.n_ctx:
        raise UsageError(f"--ctx {n_ctx} is longer than the model's context length {cfg.n_ctx}"
                         + (f" ({source})" if source else ""))


def text_chunks(model, text, n_ctx, n_chunks=-1, data_name="the data"):
    """text -> [n_chunk, n_ctx] ids with llama-perplexity's tokenization and BOS rule."""
    check_ctx(n_ctx, model.config, model.source)
    tok = model.tokenizer
    if tok is None:
        raise UsageError(f"{model.source}: the model has no tokenizer, so it cannot read text")
    ids = tok.encode(text)                                             # BOS first iff the vocab adds one
    if len(ids) < n_ctx:
        raise DataError(f"{data_name}: {len(ids)} tokens, fewer than one chunk of --ctx {n_ctx}")
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    return make_chunks(ids, n_ctx, n_chunks, bos)


def perplexity(model, chunks, batch=4, on_batch=None, keep_nll=False):
    """chunks: [n_chunk, n_ctx] -> PerplexityResult. Runs `batch` chunks per forward ([B, n_ctx] ids).
    on_batch(chunks_done, running: RunningNLL) is called after each batch (progress).
    keep_nll: keep every scored token's nll in result.nlls (for paired comparisons)."""
    n_chunk, n_ctx = chunks.shape
    if batch < 1:
        raise UsageError(f"--batch must be at least 1, got {batch}")
    acc = RunningNLL()
    kept = []
    t0 = time.perf_counter()
    for i in range(0, n_chunk, batch):
        ids = chunks[i:i + batch]                                      # [B, n_ctx]
        logits = model.forward(ids)                                   # [B, n_ctx, vocab]
        nll = chunk_nll(logits, ids)                                   # [B, n_ctx - n_ctx//2 - 1]
        acc.add(nll)
        if keep_nll:
            kept.append(nll)
        del logits
        if on_batch is not None:
            on_batch(min(i + batch, n_chunk), acc)
    dt = time.perf_counter() - t0
    tok = model.tokenizer
    return PerplexityResult(ppl=acc.ppl, ppl_stderr=acc.ppl_stderr, nll=acc.mean, tokens_scored=acc.count,
                            tokens_evaluated=n_chunk * n_ctx, n_chunks=n_chunk, n_ctx=n_ctx,
                            bos=bool(tok is not None and tok.add_bos and tok.bos_id is not None),
                            seconds=dt, tokens_per_s=n_chunk * n_ctx / dt if dt > 0 else float("inf"),
                            nlls=np.concatenate(kept) if keep_nll else None)
