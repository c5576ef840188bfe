"""The neuron view: which text makes each MLP hidden unit of one layer fire (Geva et al. 2021,
"Transformer Feed-Forward Layers Are Key-Value Memories").

The text streams through the model in overlapping windows (evaluation/activations.py's
context_windows: a token is scored only with at least --min-context tokens before it, so a
window's first token, an attention sink with outlier activations, never ranks); for the layer's
activation node (ffn_swiglu-L, ffn_geglu-L, ffn_gelu-L: the [T, d_ff] tensor that enters ffn_down)
every unit keeps, in fixed-size arrays updated once per batch:
  - its top-K tokens by |activation|, with the unit's activation on the tokens around each one
    (TopK: the per-unit "heap" is a [d_ff, K] array merged with np.argpartition),
  - sums for mean |a|, mean, std, and max/min (UnitStats),
  - a histogram whose range doubles when a value falls outside it (StreamingHistogram).
Memory is O(d_ff * K * window) however long the text is; only the token ids of the text are kept.
Units are ranked by mean |activation| -- the score `ffnlab prune --by activation` keeps (prune
averages over every calibration token, a window's first tokens included).
"""
from dataclasses import dataclass, field

import numpy as np

BEFORE, AFTER = 12, 4          # tokens of context shown before / after a unit's top token


class TopK:
    """Per unit, the k tokens with the largest |activation| seen so far."""

    def __init__(self, d_ff, k, before=BEFORE, after=AFTER):
        self.k, self.offsets = k, np.arange(-before, after + 1)            # [W]
        self.score = np.full((d_ff, k), -np.inf)                          # [d_ff, k] |a|
        self.value = np.zeros((d_ff, k), dtype=np.float32)                # [d_ff, k] signed a
        self.pos = np.full((d_ff, k), -1, dtype=np.int64)                 # [d_ff, k] index in the text's tokens
        self.ctx = np.full((d_ff, k, len(self.offsets)), np.nan, dtype=np.float32)  # [d_ff, k, W] a around it

    def update(self, acts, pos, scored=None):
        """acts: [B, T, d_ff]; pos: [B, T] index of each token in the text, -1 for BOS; scored: [B, T]
        bool, False for the positions that are only context (never ranked, but their activations show
        around a ranked token); None: every text token is ranked."""
        B, T, d_ff = acts.shape
        flat = acts.reshape(B * T, d_ff)                                  # [N, d_ff]
        score = np.abs(flat).astype(np.float64)
        score[pos.ravel() < 0] = -np.inf
        if scored is not None:
            score[~scored.ravel()] = -np.inf
        kk = min(self.k, B * T)
        cand = np.argpartition(-score, kk - 1, axis=0)[:kk].T             # [d_ff, kk] best flat rows per unit
        units = np.arange(d_ff)[:, None]                                  # [d_ff, 1]
        c_score = score[cand, units]                                      # [d_ff, kk]
        b, t = cand // T, cand % T
        tt = t[..., None] + self.offsets                                  # [d_ff, kk, W] positions in the window
        inside = (tt >= 0) & (tt < T)
        ttc = np.clip(tt, 0, T - 1)
        ctx = acts[b[..., None], ttc, units[..., None]].astype(np.float32)   # [d_ff, kk, W]
        ctx[~inside | (pos[b[..., None], ttc] < 0)] = np.nan              # outside this window, or BOS
        all_score = np.concatenate([self.score, c_score], axis=1)         # [d_ff, k + kk]
        keep = np.argpartition(-all_score, self.k - 1, axis=1)[:, :self.k]   # [d_ff, k] columns of [old | new]

        def merged(old, new):                                          # [d_ff, k(, W)] + [d_ff, kk(, W)] -> kept
            both = np.concatenate([old, new], axis=1)
            return np.take_along_axis(both, keep.reshape(keep.shape + (1,) * (both.ndim - 2)), axis=1)

        self.value = merged(self.value, flat[cand, units])
        self.pos = merged(self.pos, pos[b, t])
        self.ctx = merged(self.ctx, ctx)
        self.score = np.take_along_axis(all_score, keep, axis=1)

    def sorted(self, unit):
        """-> [(value, text position, ctx [W])] of one unit, largest |a| first, unfilled slots dropped."""
        order = np.argsort(-self.score[unit], kind="stable")
        return [(float(self.value[unit, j]), int(self.pos[unit, j]), self.ctx[unit, j])
                for j in order if self.score[unit, j] > -np.inf]


class UnitStats:
    """Per-unit running sums (float64) for mean |a|, mean, std, and max / min."""

    def __init__(self, d_ff):
        self.n = 0
        self.sum_abs, self.sum, self.sum2 = (np.zeros(d_ff) for _ in range(3))
        self.max = np.full(d_ff, -np.inf)
        self.min = np.full(d_ff, np.inf)

    def update(self, a):
        """a: [N, d_ff] activations of N text tokens"""
        a64 = a.astype(np.float64)
        self.n += len(a)
        self.sum_abs += np.abs(a64).sum(axis=0)
        self.sum += a64.sum(axis=0)
        self.sum2 += (a64 * a64).sum(axis=0)
        self.max = np.maximum(self.max, a64.max(axis=0))
        self.min = np.minimum(self.min, a64.min(axis=0))

    @property
    def mean_abs(self):
        return self.sum_abs / max(self.n, 1)

    @property
    def mean(self):
        return self.sum / max(self.n, 1)

    @property
    def std(self):
        return np.sqrt(np.maximum(self.sum2 / max(self.n, 1) - self.mean ** 2, 0.0))


class StreamingHistogram:
    """Per unit, `bins` equal bins over [-R, R] (symmetric around 0, so the range can grow):
    when a value falls outside, R doubles and each pair of bins merges into one, which keeps
    every earlier count in an exact bin of the new grid."""

    def __init__(self, d_ff, bins=64):
        assert bins % 4 == 0, "the bins double by merging pairs around the centre"
        self.bins = bins
        self.R = np.zeros(d_ff)                                            # [d_ff] 0 until the first data
        self.counts = np.zeros((d_ff, bins), dtype=np.int64)               # [d_ff, bins]

    def update(self, a):
        """a: [N, d_ff]"""
        d_ff, nb = self.counts.shape
        peak = np.abs(a).max(axis=0).astype(np.float64)                   # [d_ff]
        new = self.R == 0
        self.R[new] = 2.0 ** np.ceil(np.log2(np.maximum(peak[new], 1e-30)))   # first range: a power of 2 >= peak
        while np.any(grow := peak > self.R):                              # double until every value fits
            c = self.counts[grow]                                          # old bin k -> new bin nb/4 + k//2
            merged = np.zeros_like(c)
            merged[:, nb // 4: 3 * nb // 4] = c.reshape(len(c), nb // 2, 2).sum(axis=2)
            self.counts[grow] = merged
            self.R[grow] *= 2
        width = 2 * self.R / nb                                           # [d_ff]
        idx = np.clip(np.floor((a + self.R) / width).astype(np.int64), 0, nb - 1)   # [N, d_ff]
        flat = idx + np.arange(d_ff) * nb                                 # bin id in the [d_ff * nb] table
        self.counts += np.bincount(flat.ravel(), minlength=d_ff * nb).reshape(d_ff, nb)

    def edges(self, unit):
        return np.linspace(-self.R[unit], self.R[unit], self.bins + 1)


@dataclass
class NeuronScan:
    """Everything `ffnlab neurons` reports about one layer."""
    layer: int
    node: str                    # e.g. "ffn_swiglu-3"
    ids: np.ndarray              # the text's token ids (no BOS)
    n_windows: int
    top: TopK
    stats: UnitStats
    hist: StreamingHistogram
    ranking: np.ndarray = field(default=None)   # units by mean |a|, largest first

    @property
    def n_tokens(self):
        return self.stats.n


def scan_layer(model, text, layer, n_ctx=128, k=5, batch=4, max_windows=-1, bins=64, on_batch=None,
               min_context=None):
    """Streams `text` through the model in overlapping windows of n_ctx tokens -> NeuronScan of block
    `layer`. Only tokens with at least min_context text tokens before them in their window are
    counted or ranked (activations.context_windows: a window's first tokens are chunking artefacts).
    on_batch(windows done, windows in all) reports progress."""
    from .activations import DEFAULT_MIN_CONTEXT, activation_node, context_windows, stream_activations

    tok = model.tokenizer
    ids = np.array(tok.encode(text, add_bos=False), dtype=np.int64)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    cw = context_windows(ids, n_ctx, DEFAULT_MIN_CONTEXT if min_context is None else min_context, bos, max_windows)
    d_ff = model.config.d_ff
    top, stats, hist = TopK(d_ff, k), UnitStats(d_ff), StreamingHistogram(d_ff, bins)

    def on_acts(_layer, acts, first):
        B, T, _ = acts.shape
        pos, scored = cw.positions(first, B, T)                           # [B, T] text index, [B, T] bool
        top.update(acts, pos, scored)
        a = acts[scored]                                                  # [N, d_ff] scored tokens only
        stats.update(a)
        hist.update(a)

    stream_activations(model, cw.windows, [layer], batch, on_acts,
                       on_batch and (lambda done: on_batch(done, len(cw.windows))))
    scan = NeuronScan(layer, f"{activation_node(model.config)}-{layer}", ids, len(cw.windows), top, stats, hist)
    scan.ranking = np.argsort(-stats.mean_abs, kind="stable")
    return scan


def unit_report(scan, tokenizer, unit):
    """-> dict for one unit: stats, histogram, and its top windows (token strings + activations)."""
    st, W = scan.stats, scan.top.offsets
    windows = []
    for value, p, ctx in scan.top.sorted(unit):
        toks, acts = [], []
        for off, a in zip(W, ctx):
            if np.isnan(a):
                continue
            toks.append(int(scan.ids[p + off]))
            acts.append(float(a))
        center = int(np.flatnonzero(W[~np.isnan(ctx)] == 0)[0])
        windows.append({"value": value, "position": p, "center": center, "ids": toks,
                        "tokens": [tokenizer.decode([i]) for i in toks], "acts": acts})
    return {"unit": int(unit), "rank": int(np.flatnonzero(scan.ranking == unit)[0]),
            "mean_abs": float(st.mean_abs[unit]), "mean": float(st.mean[unit]), "std": float(st.std[unit]),
            "max": float(st.max[unit]), "min": float(st.min[unit]),
            "hist": {"edges": scan.hist.edges(unit).tolist(), "counts": scan.hist.counts[unit].tolist()},
            "windows": windows}


def show_token(s):
    """A token's text on one line: newlines and tabs made visible."""
    return s.replace("\n", "\u21b5").replace("\t", "\u21e5").replace("\r", "")


def window_text(w):
    """'...before[[token]]after' for a window dict from unit_report."""
    return "".join(f"[[{show_token(t)}]]" if i == w["center"] else show_token(t) for i, t in enumerate(w["tokens"]))
