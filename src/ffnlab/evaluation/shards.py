"""Corpus scans as work units: a shard is a contiguous run of whole batches, so the merge of the
shards in order adds the same numbers in the same order as one pass over the corpus.

perplexity: a shard is a run of llama-perplexity chunks ([n, n_ctx] ids); its result is each
  batch's nll count, sum and sum of squares, which the merge adds into one RunningNLL batch by
  batch -- the float64 additions of evaluation/perplexity.py's single pass, bit for bit.
neurons: a shard is a run of windows (evaluation/activations.py context_windows); its result
  is the shard's top-k tokens per unit, each batch's per-unit sums, max/min, and a histogram. The
  merge keeps the k largest |a| of [kept | shard] per unit (the single pass keeps the same set),
  adds the sums batch by batch, and brings two histograms to the wider range (pairs of bins merge,
  as StreamingHistogram does when its range doubles) before adding the counts.
experts: a shard is a run of windows; its result is each layer's routing counts (integers, added)
  and each batch's router-entropy sum (added batch by batch).
"""
import numpy as np

from ..errors import UsageError
from ..runtime.executor import Unit, shard_ranges


def check_shard(shard, batch):
    """--shard must hold whole batches: a batch split across units would run as two smaller
    forwards, whose float32 products need not equal the one [batch, T] forward's."""
    if shard % batch:
        raise UsageError(f"--shard {shard} must be a multiple of --batch {batch}: a unit runs whole batches, so "
                         f"the merged sums are those of one pass")


# --- perplexity --------------------------------------------------------------------------------
def perplexity_units(chunks, shard):
    """chunks: [n_chunk, n_ctx] -> units of `shard` chunks each."""
    n_ctx = chunks.shape[1]
    return [Unit(f"chunks-{s:07d}", chunks[s:e], (e - s) * n_ctx) for s, e in shard_ranges(len(chunks), shard)]


def perplexity_shard(model, params, chunks):
    """chunks: [n, n_ctx] -> {counts, sums, sum2: [n_batch]}: each batch's RunningNLL."""
    from .perplexity import RunningNLL, chunk_nll
    batch = params["batch"]
    counts, sums, sum2 = [], [], []
    for i in range(0, len(chunks), batch):
        ids = chunks[i:i + batch]                                      # [B, n_ctx]
        logits = model.forward(ids)                                   # [B, n_ctx, vocab]
        b = RunningNLL()
        b.add(chunk_nll(logits, ids))                                  # [B, n_ctx - n_ctx//2 - 1]
        del logits
        counts.append(b.count)
        sums.append(b.sum)
        sum2.append(b.sum2)
    return {"counts": np.array(counts, dtype=np.int64), "sums": np.array(sums), "sum2": np.array(sum2),
            "chunks": int(len(chunks))}


def perplexity_merge(acc, r):
    """acc: (RunningNLL, chunks merged) <- one shard's batches, in order."""
    nll, n = acc
    for c, s, s2 in zip(r["counts"], r["sums"], r["sum2"]):
        nll.count += int(c)
        nll.sum += float(s)                                            # the single pass's `sum += batch sum`
        nll.sum2 += float(s2)
    return nll, n + r["chunks"]


# --- neurons -----------------------------------------------------------------------------------
def context_units(cw, shard):
    """ContextWindows (activations.context_windows) -> units of `shard` windows each: the windows with
    what positions() needs, so a worker scores exactly the positions the single pass scores."""
    return [Unit(f"windows-{s:07d}", {"windows": cw.windows[s:e], "starts": list(cw.starts[s:e]),
                                      "scored_from": list(cw.scored_from[s:e]), "lead": cw.lead},
                 sum(len(w) for w in cw.windows[s:e])) for s, e in shard_ranges(len(cw.windows), shard)]


def _windows(payload):
    from .activations import ContextWindows
    return ContextWindows(payload["windows"], payload["starts"], payload["scored_from"], payload["lead"])


neuron_units = context_units


def neuron_shard(model, params, payload):
    """One shard's windows -> the layer's TopK / per-batch UnitStats sums / histogram, as arrays."""
    from .activations import stream_activations
    from .neurons import TopK, UnitStats, StreamingHistogram

    layer, d_ff = params["layer"], model.config.d_ff
    cw = _windows(payload)
    top, hist = TopK(d_ff, params["k"]), StreamingHistogram(d_ff, params["bins"])
    per_batch = []                                                    # one UnitStats per batch, in order
    lo, hi = np.full(d_ff, np.inf), np.full(d_ff, -np.inf)

    def on_acts(_layer, acts, first):                                  # as evaluation/neurons.py scan_layer
        nonlocal lo, hi
        B, T, _ = acts.shape
        pos, scored = cw.positions(first, B, T)                        # [B, T] text index, [B, T] bool
        top.update(acts, pos, scored)
        text_acts = acts[scored]                                       # [N, d_ff] scored tokens only
        st = UnitStats(d_ff)
        st.update(text_acts)
        per_batch.append(st)
        lo, hi = np.minimum(lo, st.min), np.maximum(hi, st.max)
        hist.update(text_acts)

    stream_activations(model, cw.windows, [layer], params["batch"], on_acts)
    return {"top_score": top.score, "top_value": top.value, "top_pos": top.pos, "top_ctx": top.ctx,
            "n": np.array([s.n for s in per_batch], dtype=np.int64),
            "sum_abs": np.stack([s.sum_abs for s in per_batch]),      # [n_batch, d_ff]
            "sum": np.stack([s.sum for s in per_batch]), "sum2": np.stack([s.sum2 for s in per_batch]),
            "min": lo, "max": hi, "hist_R": hist.R, "hist_counts": _narrowest(hist.counts),
            "windows": len(payload["windows"])}


def _narrowest(counts):
    """Integer counts in the narrowest unsigned type that holds them. A shard's [d_ff, bins] histogram
    is the largest part of its result (int64: 786 KB of 1.6 MB at SmolLM2's width), and no count
    exceeds the shard's tokens: 2 bytes each for shards up to 65,535 tokens. The merge adds them as int64."""
    return counts.astype(np.min_scalar_type(int(counts.max()) if counts.size else 0))


class NeuronAccumulator:
    """The single pass's TopK, UnitStats and StreamingHistogram, filled shard by shard."""

    def __init__(self, d_ff, k, bins):
        from .neurons import TopK, UnitStats, StreamingHistogram
        self.top, self.stats, self.hist = TopK(d_ff, k), UnitStats(d_ff), StreamingHistogram(d_ff, bins)
        self.n_windows = 0


def _widen(counts, R, target):
    """counts [d, nb] over [-R, R] -> over [-target, target] (target = R * 2^j), merging pairs of
    bins per doubling: StreamingHistogram's own regrid, so every count lands in an exact bin."""
    counts, R = counts.copy(), R.copy()
    nb = counts.shape[1]
    while np.any(grow := (R > 0) & (R < target)):
        c = counts[grow]
        merged = np.zeros_like(c)
        merged[:, nb // 4: 3 * nb // 4] = c.reshape(len(c), nb // 2, 2).sum(axis=2)
        counts[grow] = merged
        R[grow] *= 2
    return counts


def neuron_merge(acc, r):
    top, st, hist = acc.top, acc.stats, acc.hist
    # top-k: the k largest |a| of [kept | shard] per unit (TopK.update's own selection)
    all_score = np.concatenate([top.score, r["top_score"]], axis=1)   # [d_ff, 2k]
    keep = np.argpartition(-all_score, top.k - 1, axis=1)[:, :top.k]
    for name, new in (("value", r["top_value"]), ("pos", r["top_pos"]), ("ctx", r["top_ctx"])):
        both = np.concatenate([getattr(top, name), new], axis=1)
        setattr(top, name, np.take_along_axis(both, keep.reshape(keep.shape + (1,) * (both.ndim - 2)), axis=1))
    top.score = np.take_along_axis(all_score, keep, axis=1)
    # sums: batch by batch, the single pass's additions in its order
    for i in range(len(r["n"])):
        st.n += int(r["n"][i])
        st.sum_abs += r["sum_abs"][i]
        st.sum += r["sum"][i]
        st.sum2 += r["sum2"][i]
    st.max, st.min = np.maximum(st.max, r["max"]), np.minimum(st.min, r["min"])
    # histogram: both on the wider range, then add
    R = np.where(hist.R == 0, r["hist_R"], np.maximum(hist.R, r["hist_R"]))
    hist.counts = _widen(hist.counts, hist.R, R) + _widen(r["hist_counts"].astype(np.int64), r["hist_R"], R)
    hist.R = R
    acc.n_windows += r["windows"]
    return acc


# --- experts -----------------------------------------------------------------------------------
window_units = context_units


def experts_shard(model, params, payload):
    """One shard's windows -> per layer: routing counts (integers) and each batch's entropy sum."""
    from .experts import LayerRouting, route_batch
    from .activations import batches

    cfg, cw = model.config, _windows(payload)
    layers = [LayerRouting(cfg.n_expert, cfg.n_expert_used, cfg.vocab_size) for _ in range(cfg.n_layer)]
    entropy = [[] for _ in layers]                                   # [layer][batch] the batch's entropy sum
    for first, w in batches(cw.windows, params["batch"]):
        for L in layers:
            L.entropy_sum = 0.0                                        # 0.0 + x = x: the batch's own sum
        _, scored = cw.positions(first, *w.shape)
        route_batch(model, w, layers, scored.reshape(-1))
        for il, L in enumerate(layers):
            entropy[il].append(L.entropy_sum)
    out = {"windows": len(cw.windows), "n_tokens": [L.n_tokens for L in layers]}
    for il, L in enumerate(layers):
        out.update({f"counts_{il}": L.counts, f"cofire_{il}": L.cofire, f"by_token_{il}": L.by_token,
                    f"totals_{il}": L.token_totals, f"entropy_{il}": np.array(entropy[il])})
    return out


def experts_merge(layers, r):
    """layers: [LayerRouting] <- one shard: integer counts added, entropy sums batch by batch."""
    for il, L in enumerate(layers):
        L.counts += r[f"counts_{il}"]
        L.cofire += r[f"cofire_{il}"]
        L.by_token += r[f"by_token_{il}"]
        L.token_totals += r[f"totals_{il}"]
        for e in r[f"entropy_{il}"]:
            L.entropy_sum += float(e)                                  # the single pass's `+= batch sum`
        L.n_tokens += int(r["n_tokens"][il])
    return layers
