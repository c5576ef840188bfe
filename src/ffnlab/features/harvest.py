"""The model's activations at a dictionary's sites, through the public hooks, into a bounded shuffled buffer.

    transcoder, skip-transcoder   input ffn_norm-L (what the MLP reads), target ffn_out-L (what it adds)
    sae                           input = target = any node, default l_out-L (the residual after block L)

The corpus streams as overlapping context windows (evaluation/activations.py context_windows): each text
token is taken once, with at least min_context tokens of its own window before it, so the first positions
of a window (BOS, SmolLM2's attention sink with its outlier activations) never enter the training data.
Only the first L + 1 blocks run. A Tracer with an on_node callback hands each site's array over and drops
it, so nothing else of the forward is kept.

ActivationBuffer (SAELens's mixing buffer, in the spirit): rows go in as the model makes them and come out as
batches drawn at random from everything held; its capacity in rows follows from a memory flag, never from
the corpus length. Its state (rows held, the cursor into the corpus, the draw's RNG) goes into a checkpoint,
so a resumed run draws the very batches an uninterrupted one would.
"""
import re

import numpy as np

from ..errors import UsageError


def sites(kind, layer, site=None):
    """-> (input node, target node) of a dictionary of this kind at this layer"""
    if kind == "sae":
        s = site or f"l_out-{layer}"
        return s, s
    if site is not None:
        raise UsageError(f"--site names an SAE's node; a {kind} reads ffn_norm-{layer} and predicts ffn_out-{layer}")
    return f"ffn_norm-{layer}", f"ffn_out-{layer}"


def check_sites(model, nodes, named_by="--site"):
    """Each node must be one the model's forward names (interventions.node_names) -> its layer (-1 outside blocks).
    named_by: where the nodes came from (a flag, a file's field), the start of the message."""
    from ..interventions import node_names
    names = node_names(model)
    n_layer = model.config.n_layer
    for n in nodes:
        if n not in names:
            near = sorted({re.sub(r"-\d+$", "-L", m) for m in names})
            m = re.fullmatch(r"(.+)-(\d+)", n)
            why = (f"layer {m.group(2)} is out of range, 0..{n_layer - 1}"
                   if m and f"{m.group(1)}-L" in near else
                   f"node names: {', '.join(near)}; L is the layer 0..{n_layer - 1}")
            raise UsageError(f"{named_by} {n} is not a node of {model.source} ({why})")
    m = re.search(r"-(\d+)$", nodes[-1])
    return int(m.group(1)) if m else model.config.n_layer - 1


def dictionary_for(model, dirpath, loaded=None):
    """DIR (features/saelens_io.py) checked against the model it is to be used with -> (params, DictConfig,
    cfg dict, input node, target node). One line each: no site named, another vocabulary, a site that is not
    a node of this model, widths that do not fit the sites. loaded: saelens_io.load(dirpath), if already read."""
    from ..interventions.api import node_shapes
    from . import saelens_io
    p, cfg, d = loaded or saelens_io.load(dirpath)
    ours = d.get("ffnlab") if isinstance(d.get("ffnlab"), dict) else {}
    meta = d.get("metadata") if isinstance(d.get("metadata"), dict) else {}
    in_node = ours.get("site_in") or meta.get("hook_name")
    out_node = ours.get("site_out") or meta.get("hook_name_out") or in_node
    in_field = "ffnlab.site_in" if ours.get("site_in") else "metadata.hook_name"      # for the messages
    out_field = ("ffnlab.site_out" if ours.get("site_out") else "metadata.hook_name_out" if meta.get("hook_name_out")
                 else in_field)
    if not isinstance(in_node, str) or not isinstance(out_node, str):
        raise UsageError(f"{dirpath}/cfg.json names no site (ffnlab.site_in or metadata.hook_name with ffnlab's node "
                         f"names, e.g. ffn_norm-5)")
    if ours.get("n_vocab") is not None and ours["n_vocab"] != model.config.vocab_size:
        raise UsageError(f"{dirpath} was trained on another model (vocabulary {ours['n_vocab']}, {model.source} has "
                         f"{model.config.vocab_size})")
    check_sites(model, [in_node], f"{dirpath}/cfg.json: {in_field}")
    check_sites(model, [out_node], f"{dirpath}/cfg.json: {out_field}")
    shapes = node_shapes(model)
    if shapes[in_node][-1] != cfg.d_in or shapes[out_node][-1] != cfg.d_out:
        raise UsageError(f"{dirpath}/cfg.json: d_in {cfg.d_in} / d_out {cfg.d_out} do not fit {model.source}'s "
                         f"{in_node} ({shapes[in_node][-1]}) / {out_node} ({shapes[out_node][-1]})")
    return p, cfg, d, in_node, out_node


def blocks_for(node):
    """-> the blocks a forward runs to reach node: L + 1 for NAME-L, None (all) for a node outside the blocks"""
    m = re.search(r"-(\d+)$", node)
    return int(m.group(1)) + 1 if m else None


def capture(model, ids, nodes, copy=False, **forward):
    """ids [B, T] through model.forward(ids, **forward) -> ({node: its value [B, T, d]}, the forward's output).
    A Tracer hands each named node over and drops it, so nothing else of the forward is kept; copy: a copy
    of each value rather than the traced array."""
    from ..tracing import Tracer
    B, T = ids.shape
    got = {}

    def take(n):
        got[n.name] = n.array.reshape(B, T, -1).copy() if copy else n.array.reshape(B, T, -1)
        n.array = None
    pattern = re.compile("^(" + "|".join(re.escape(n) for n in nodes) + ")$")
    out = model.forward(ids, hooks=Tracer(filter=pattern, keep=True, on_node=take), **forward)
    return got, out


def stream_rows(model, windows, in_node, out_node, batch, first=0):
    """Runs windows[first:] through the model `batch` windows at a time ->
    yields (next window index, x [R, d_in] float32, y [R, d_out] float32): the scored positions' rows."""
    from ..evaluation.activations import batches
    ws = windows.windows[first:]
    for i, ids in batches(ws, batch):
        B, T = ids.shape
        got, _ = capture(model, ids, (in_node, out_node), last_only=True, n_layer=blocks_for(out_node))
        _, scored = windows.positions(first + i, B, T)                         # [B, T] bool
        x = np.ascontiguousarray(got[in_node][scored], dtype=np.float32)
        y = np.ascontiguousarray(got[out_node][scored], dtype=np.float32)
        yield first + i + B, x, y


class ActivationBuffer:
    """Up to `capacity` rows of (x, y); batches are drawn uniformly without replacement from what it holds."""

    def __init__(self, capacity, d_in, d_out, seed):
        self.x = np.empty((capacity, d_in), np.float32)
        self.y = np.empty((capacity, d_out), np.float32)
        self.n = 0
        self.rng = np.random.default_rng(seed)

    @classmethod
    def rows_for(cls, mb, d_in, d_out):
        """capacity in rows of a buffer of `mb` MiB"""
        return int(mb * 2 ** 20) // (4 * (d_in + d_out))

    @property
    def capacity(self):
        return self.x.shape[0]

    def room(self):
        return self.capacity - self.n

    def add(self, x, y):
        r = min(len(x), self.room())
        self.x[self.n:self.n + r], self.y[self.n:self.n + r] = x[:r], y[:r]
        self.n += r
        return r

    def draw(self, B):
        """B rows at random, removed (the last rows move into their places) -> (x [B, d_in], y [B, d_out])"""
        pick = np.sort(self.rng.choice(self.n, B, replace=False))
        x, y = self.x[pick], self.y[pick]                                  # fancy indexing: copies
        tail = np.arange(self.n - B, self.n)
        holes = pick[pick < self.n - B]                                    # picked rows below the tail
        movers = tail[~np.isin(tail, pick)]                                # unpicked rows of the tail
        self.x[holes], self.y[holes] = self.x[movers], self.y[movers]
        self.n -= B
        return x, y

    def state(self):
        """-> (arrays, scalars); the arrays are views of the buffer (no copy of it): write them before the next draw"""
        return {"x": self.x[:self.n], "y": self.y[:self.n]}, {"rng": self.rng.bit_generator.state}

    def load(self, arrays, scalars):
        n = len(arrays["x"])
        self.x[:n], self.y[:n] = arrays["x"], arrays["y"]
        self.n = n
        self.rng.bit_generator.state = scalars["rng"]


class ArrayHarvest:
    """Rows already in memory (x [R, d_in], y [R, d_out]) as a source of shuffled batches: the buffer, its draws
    and its state, for training on saved activations (the benchmarks, the comparison with SAELens, the tests)."""

    def __init__(self, x, y, buffer):
        self.x, self.y, self.buffer = x, y, buffer
        self.cursor, self.epoch = 0, 0

    def fill(self):
        while self.buffer.room() > 0:
            if self.cursor >= len(self.x):
                self.cursor, self.epoch = 0, self.epoch + 1
            r = self.buffer.add(self.x[self.cursor:], self.y[self.cursor:])
            self.cursor += r

    def next_batch(self, B):
        """-> (x [B, d_in], y [B, d_out]), refilling first, so each draw sees a full buffer"""
        self.fill()
        return self.buffer.draw(B)

    def state(self):
        arrays, scalars = self.buffer.state()
        return {"buffer.x": arrays["x"], "buffer.y": arrays["y"]}, {**scalars, "cursor": self.cursor,
                                                                    "epoch": self.epoch}

    def load(self, arrays, scalars):
        self.buffer.load({"x": arrays["buffer.x"], "y": arrays["buffer.y"]}, scalars)
        self.cursor, self.epoch = int(scalars["cursor"]), int(scalars["epoch"])


class Harvest(ArrayHarvest):
    """The corpus as an endless, resumable source of shuffled batches: window cursor + epoch + buffer.
    Rows that did not fit in the buffer wait in `pending` (part of the state, bounded by one forward's rows)."""

    def __init__(self, model, windows, in_node, out_node, buffer, batch_windows):
        self.model, self.windows, self.in_node, self.out_node = model, windows, in_node, out_node
        self.buffer, self.batch_windows = buffer, batch_windows
        self.cursor, self.epoch = 0, 0
        self.pending = (np.empty((0, buffer.x.shape[1]), np.float32), np.empty((0, buffer.y.shape[1]), np.float32))

    def fill(self):
        """until the buffer is full: pending rows first, then more windows (wrapping to a new epoch)"""
        while self.buffer.room() > 0:
            if len(self.pending[0]):
                r = self.buffer.add(*self.pending)
                self.pending = (self.pending[0][r:], self.pending[1][r:])
                continue
            if self.cursor >= len(self.windows.windows):
                self.cursor, self.epoch = 0, self.epoch + 1
            nxt, x, y = next(stream_rows(self.model, self.windows, self.in_node, self.out_node,
                                         self.batch_windows, self.cursor))
            self.cursor = nxt
            self.pending = (x, y)

    def state(self):
        arrays, scalars = super().state()
        return {**arrays, "pending.x": self.pending[0], "pending.y": self.pending[1]}, scalars

    def load(self, arrays, scalars):
        super().load(arrays, scalars)
        self.pending = (np.array(arrays["pending.x"]), np.array(arrays["pending.y"]))
