"""Causal tracing (Meng et al. 2022, ROME): where does the model recall a fact about a subject?

1. clean run: the prompt as it is; clean_p = p(target) at the last position.
2. corrupt runs: Gaussian noise (K x the embedding std, one draw per sample, the same draw in
   every run, as ROME's fixed-seed generator) added to the subject tokens' embeddings;
   corrupt_p = p(target) averaged over the samples.
3. restored runs: the corrupt runs with one state put back to its clean value, at one position:
     hidden  the block output l_out-L (the residual stream after layer L)
     mlp     ffn_out of the W layers centred on L (ROME's window: L - W//2 .. L + ceil(W/2) - 1)
     attn    attn_out of the same window
   The result is p(target) with that state restored, for every layer and position.

As in ROME, the clean run is row 0 of the same batch and restoring copies its row; here each
forward also holds every position's restored samples (1 + T * samples rows), so one forward per
layer and kind covers the whole prompt, and every forward has that shape. The LM head runs once
per distinct final state, so a restored row equal to the clean one gets the clean logits. The mean over samples is taken as
p_1 + mean(p_s - p_1): exactly p_1 when every sample agrees (restoring the last layer's state at
the last position gives clean_p to the last bit).
"""
import numpy as np

from ..errors import UsageError
from ..model.hooks import Editor
from ..progress import Progress
from .common import as_float

KINDS = {"hidden": "l_out", "mlp": "ffn_out", "attn": "attn_out"}


def subject_range(tokens, text, subject):
    """tokens: the prompt's tokens as decoded strings -> (first, last) token indices covering subject."""
    whole = "".join(tokens)
    at = whole.find(subject)
    if at < 0:
        raise UsageError(f"--subject {subject!r} does not occur in the prompt {text!r}")
    ends = np.cumsum([len(t) for t in tokens])                       # end offset of each token
    first = int(np.searchsorted(ends, at, side="right"))
    last = int(np.searchsorted(ends, at + len(subject) - 1, side="right"))
    return first, last


def window_layers(il, n_layer, window):
    return range(max(0, il - window // 2), min(n_layer, il - (-window // 2)))


def embedding_std(model):
    """The std of the embedding output the noise is added to: the token table's, times Gemma's
    sqrt(d_model) (the noise goes on inp_scaled) or Granite's multiplier (on embd, after it)."""
    cfg = model.config
    std = float(as_float(model.params["token_embd.weight"]).astype(np.float64).std())
    if cfg.embed_scale:
        std *= np.sqrt(cfg.d_model)
    if cfg.embedding_multiplier:
        std *= cfg.embedding_multiplier
    return std


def _probs(logits, target):
    """logits [B, vocab] float32 -> p(target) per row, float64 softmax"""
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e[:, target] / e.sum(axis=-1)


def _mean(p):
    """mean of the samples, shifted by the first: exact when they are all equal"""
    return float(p[0] + np.mean(p - p[0]))


def causal_trace(model, ids, first, last, target=None, noise=3.0, samples=10, window=10, seed=0):
    """ids: [T]; subject tokens first..last (inclusive) -> {"target_id", "clean_p", "corrupt_p",
    "hidden", "mlp", "attn" ([n_layer][T]), "noise_std"}"""
    cfg = model.config
    T, S, L = len(ids), samples, cfg.n_layer
    sigma = noise * embedding_std(model)
    eps = (sigma * np.random.default_rng(seed).standard_normal((S, last - first + 1, cfg.d_model)))
    embed_node = "inp_scaled" if cfg.embed_scale else "embd"

    def noised(value, name, positions):                              # rows 1..: sample s = (row - 1) % S
        value = value.copy()
        n = value.shape[0] - 1
        value[1:, first:last + 1] += eps[np.arange(n) % S].astype(value.dtype)
        return value

    def run(rows, restore):
        final = {}

        def keep(value, name, positions):
            final["y"] = value[:, -1]                                 # [rows, d_model] the final norm's output
        fns = {embed_node: noised, **restore, "result_norm": keep}
        model.forward(np.tile(ids, (rows, 1)), hooks=Editor(fns), last_only=True)
        # the head once per distinct final state: a GEMM may round two equal rows differently (they
        # fall in different tiles), and a restored row equal to the clean one must score as it does
        u, inv = np.unique(final["y"], axis=0, return_inverse=True)
        return model.head_logits(u)[inv.reshape(-1)]                  # [rows, vocab]

    rows = 1 + T * S                                                  # row 1 + t*S + s: position t restored
    # every forward has the same rows, so row 0 (clean) is the same computation in all of them
    base = run(rows, {})
    if target is None:
        target = int(np.argmax(base[0]))                              # the clean prediction, as ROME
    p = _probs(base, target)
    out = {"target_id": target, "clean_p": float(p[0]), "corrupt_p": _mean(p[1:1 + S]), "noise_std": sigma}
    r_rows = 1 + np.arange(T * S)
    r_pos = np.repeat(np.arange(T), S)
    # the noise draw of row 1 + t*S + s must be sample s: (row - 1) % S
    assert np.array_equal((r_rows - 1) % S, np.tile(np.arange(S), T))

    def restore(value, name, positions):
        value = value.copy()
        value[r_rows, r_pos] = value[0, r_pos]
        return value

    bar = Progress(len(KINDS) * L, "causal trace")
    for kind, node in KINDS.items():
        grid = np.zeros((L, T))
        for il in range(L):
            bar.update(1, f"{kind} layer {il}")
            layers = [il] if kind == "hidden" else window_layers(il, L, window)
            p = _probs(run(rows, {f"{node}-{j}": restore for j in layers}), target)
            grid[il] = [_mean(p[1 + t * S:1 + (t + 1) * S]) for t in range(T)]
        out[kind] = grid.tolist()
    bar.close()
    return out
