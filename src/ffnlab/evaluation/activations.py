"""Stream token windows through the model and hand each layer's MLP activation to a callback.

The activation node is the tensor that enters ffn_down, named as llama.cpp names it:
ffn_gelu-L / ffn_relu-L (dense MLP: act(up x)) or ffn_swiglu-L / ffn_geglu-L (gated MLP:
act(gate x) * up x). Unit i of it is MLP hidden unit i: row i of up (and gate), column i of down.

Memory stays bounded on long texts: one batch of windows is in flight at a time, the tracer is
fresh per batch, and each activation array is dropped as soon as the callback has seen it.
Only the layers up to the deepest one asked for are run, and the LM head only on the last
position (its logits are not needed).
"""
import re

import numpy as np

from ..model.ffn import FFN_KINDS


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
