"""Stream token windows through the model and hand each layer's MLP activation to a callback.

The activation node is the tensor that enters ffn_down, named as llama.cpp names it:
ffn_gelu-L / ffn_relu-L (dense MLP: act(up x)) or ffn_swiglu-L / ffn_geglu-L (gated MLP:
act(gate x) * up x). Unit i of it is MLP hidden unit i: row i of up (and gate), column i of down.

Memory stays bounded on long texts: one batch of windows is in flight at a time, the tracer is
fresh per batch, and each activation array is dropped as soon as the callback has seen it.
Only the layers up to the deepest one asked for are run, and the LM head only on the last
position (its logits are not needed).

Corpus scans score only tokens with context (context_windows): a window's first tokens have
little or nothing before them, and a model without BOS (SmolLM2) treats the first one as an
attention sink with outlier activations, so cutting a corpus into back-to-back windows would rank
chunking artefacts as a unit's top examples. The windows overlap instead: each scored token has at
least `min_context` text tokens before it in its own window, BOS and the first `min_context`
positions of a window are never scored, and every text token past the corpus's first `min_context`
is scored exactly once.
"""
import dataclasses
import re

import numpy as np

from ..errors import UsageError
from ..model.ffn import FFN_KINDS
from . import DEFAULT_MIN_CONTEXT  # noqa: F401 (the scans' default; evaluation/__init__.py says why it lives there)


def activation_node(cfg):
    """'ffn_swiglu', 'ffn_geglu', 'ffn_gelu' or 'ffn_relu' for this config's MLP."""
    return FFN_KINDS[cfg.ffn].node


def token_windows(ids, n_ctx, bos_id=None, max_windows=-1):
    """ids: text tokens (no BOS) -> (windows, starts): consecutive windows of n_ctx tokens, each
    starting with BOS when bos_id is given (then n_ctx - 1 text tokens); the last may be shorter.
    starts[i] is the index in ids of window i's first text token."""
    step = n_ctx - (1 if bos_id is not None else 0)
    windows, starts = [], []
    for s in range(0, len(ids), step):
        if 0 <= max_windows <= len(windows):
            break
        w = list(ids[s:s + step])
        windows.append(np.array(([bos_id] if bos_id is not None else []) + w, dtype=np.int64))
        starts.append(s)
    return windows, starts




@dataclasses.dataclass
class ContextWindows:
    """Overlapping windows over a corpus; window i scores its positions from scored_from[i] on."""
    windows: list           # [T_i] int64 ids each: BOS (when given) + text tokens
    starts: list            # index in the text of window i's first text token
    scored_from: list       # position in window i (BOS counted) of its first scored token
    lead: int               # 1 when each window starts with BOS, else 0

    def positions(self, first, B, T):
        """-> ([B, T] index in the text of each position of windows first..first+B-1, -1 for BOS;
        [B, T] bool, True where scored). Windows of one batch share the length T."""
        i = range(first, first + B)
        pos = np.array([self.starts[k] for k in i])[:, None] + np.arange(T) - self.lead   # [B, T]
        if self.lead:
            pos[:, 0] = -1
        scored = np.arange(T)[None, :] >= np.array([self.scored_from[k] for k in i])[:, None]
        return pos, scored

    @property
    def n_scored(self):
        return sum(len(w) - f for w, f in zip(self.windows, self.scored_from))


def context_windows(ids, n_ctx, min_context=DEFAULT_MIN_CONTEXT, bos_id=None, max_windows=-1) -> ContextWindows:
    """ids: text tokens (no BOS) -> windows of n_ctx positions (BOS first when bos_id is given) that
    overlap by min_context text tokens, so every text token from index min_context on is scored in
    exactly one window, with at least min_context text tokens of its own window before it.
    The last window is moved back to end at the text's end (a full window, more context, equal
    lengths for batching) and scores only what the one before it did not; a text shorter than one
    window gets one shorter window. max_windows >= 0 stops after that many windows."""
    lead = 1 if bos_id is not None else 0
    span = n_ctx - lead                                          # text tokens per window
    if not 0 <= min_context < span:
        raise UsageError(f"--min-context {min_context} must be below the window's {span} text tokens "
                         f"(--ctx {n_ctx}{' less BOS' if lead else ''})")
    out = ContextWindows([], [], [], lead)
    n, start, scored = len(ids), 0, min_context                  # scored: first text index not yet scored
    while scored < n and not 0 <= max_windows <= len(out.windows):
        start = max(0, min(start, n - span))                     # the last window ends at the text's end
        w = ids[start:start + span]
        out.windows.append(np.array(([bos_id] if lead else []) + list(w), dtype=np.int64))
        out.starts.append(start)
        out.scored_from.append(lead + scored - start)
        scored = start + len(w)
        start = scored - min_context
    return out


def batches(windows, batch):
    """-> (first window index, [B, T] ids): runs of equal-length windows, `batch` at a time."""
    i = 0
    while i < len(windows):
        j = i + 1
        while j < len(windows) and j - i < batch and len(windows[j]) == len(windows[i]):
            j += 1
        yield i, np.stack(windows[i:j])
        i = j


def stream_activations(model, windows, layers, batch, on_acts, on_batch=None):
    """Runs the windows through the model, `batch` at a time, and calls
    on_acts(layer, acts [B, T, d_ff] float32, first window index) for each layer in `layers`.
    on_batch(windows done) after each batch."""
    from ..tracing import Tracer

    cfg = model.config
    node = activation_node(cfg)
    want = {f"{node}-{il}": il for il in layers}
    pattern = re.compile("^(" + "|".join(re.escape(n) for n in want) + ")$")
    done = 0
    for first, ids in batches(windows, batch):
        B, T = ids.shape

        def take(n, first=first, B=B, T=T):
            acts = n.array.reshape(B, T, -1)                          # the tracer drops a batch axis of 1
            n.array = None                                            # free it: the tracer keeps its nodes
            on_acts(want[n.name], acts, first)

        # deeper blocks would not change these nodes: the first max(layers) + 1 run
        model.forward(ids, hooks=Tracer(filter=pattern, keep=True, on_node=take), last_only=True,
                      n_layer=max(layers) + 1)
        done += B
        if on_batch is not None:
            on_batch(done)
