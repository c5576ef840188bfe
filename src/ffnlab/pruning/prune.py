"""Structured neuron pruning of the MLP: keep the most important hidden units of every layer.

Hidden unit i of layer L is row i of ffn_up (and ffn_gate, and of their biases) and column i of
ffn_down; dropping it removes d_model * (3 if gated else 2) weights and never changes the shapes
the rest of the model sees. Every layer keeps the same width (a GGUF has one feed_forward_length),
rounded to a multiple of 32 so the new ffn_down rows still fill whole quant blocks (Q8_0, Q4_0,
Q4_1, Q5_x pack 32 weights per block along a row).

Two importance scores per unit, larger = keep:
  activation  mean |h_i| over calibration text, h the activation node that enters ffn_down
              (ffn_swiglu: silu(gate x) * up x; ffn_geglu; ffn_gelu: gelu(up x)). Streamed with a
              tracer callback that adds per-unit sums, so memory does not grow with the text.
  weight      ||up_i|| * ||gate_i|| * ||down_:,i|| (no gate for a dense MLP): a data-free proxy for
              the same thing -- for unit-norm input, |up_i . x| <= ||up_i||, the gate's output
              grows with ||gate_i|| (silu/gelu are ~linear for large inputs), and the unit writes
              h_i * down_:,i into the residual stream.
"""
import dataclasses

import numpy as np

from ..errors import UsageError
from ..quant import floats

BLOCK = 32                 # weights per quant block along a row (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1)


def kept_width(d_ff, keep):
    """keep * d_ff rounded to the nearest multiple of 32 (at least 32, at most d_ff); keep 1.0 -> d_ff."""
    if not 0.0 < keep <= 1.0:
        raise UsageError(f"--keep must be in (0, 1], got {keep}")
    if keep == 1.0:
        return d_ff
    n = int(round(keep * d_ff / BLOCK)) * BLOCK
    largest = d_ff - d_ff % BLOCK if d_ff >= BLOCK else d_ff            # a multiple of 32 that fits in d_ff
    return max(min(BLOCK, largest), min(n, largest))


def alignment(n):
    """{64: True, 128: False, 256: False}: which GEMM / quant-friendly sizes divide n."""
    return {m: n % m == 0 for m in (32, 64, 128, 256)}


def ffn_names(il, gated):
    b = f"blk.{il}."
    return {k: b + f"ffn_{k}.weight" for k in (("up", "gate", "down") if gated else ("up", "down"))}


def weight_scores(params, cfg):
    """-> [n_layer, d_ff]: ||up_i|| * ||gate_i|| * ||down_:,i|| per unit."""
    out = np.empty((cfg.n_layer, cfg.d_ff))
    for il in range(cfg.n_layer):
        n = ffn_names(il, cfg.gated)
        s = np.linalg.norm(floats(params[n["up"]]).astype(np.float64), axis=1)          # [d_ff] rows of up
        if cfg.gated:
            s *= np.linalg.norm(floats(params[n["gate"]]).astype(np.float64), axis=1)   # [d_ff] rows of gate
        s *= np.linalg.norm(floats(params[n["down"]]).astype(np.float64), axis=0)       # [d_ff] columns of down
        out[il] = s
    return out


def activation_scores(model, cw, batch=4, on_batch=None):
    """cw: evaluation/activations.py's context_windows over the calibration text -> [n_layer, d_ff]:
    mean |activation| of every unit over the scored tokens (each text token once, with its
    min_context tokens of context; never BOS or a window's first positions, whose attention-sink
    outliers would rank units by the cut), and the number of tokens it averaged."""
    from ..evaluation.activations import stream_activations

    cfg = model.config
    sums = np.zeros((cfg.n_layer, cfg.d_ff))

    def on_acts(il, acts, first):                                     # acts [B, T, d_ff]
        _, scored = cw.positions(first, *acts.shape[:2])             # [B, T] bool
        sums[il] += np.abs(acts[scored]).sum(axis=0, dtype=np.float64)   # [n scored, d_ff] -> [d_ff]

    stream_activations(model, cw.windows, list(range(cfg.n_layer)), batch, on_acts, on_batch)
    return sums / max(cw.n_scored, 1), cw.n_scored


def select_units(scores, n_keep):
    """scores [n_layer, d_ff] -> [n_layer, n_keep]: the n_keep highest-scoring units per layer, in
    their original order (so keep = 1.0 is the identity)."""
    top = np.argsort(-scores, axis=1, kind="stable")[:, :n_keep]
    return np.sort(top, axis=1)


def prune_params(params, cfg, keep_idx):
    """-> (params, cfg) with only the units keep_idx [n_layer, n_keep] of every MLP. Biases of
    up/gate lose the same rows; ffn_down's bias (d_model) is untouched."""
    out = dict(params)
    for il, idx in enumerate(keep_idx):
        b = f"blk.{il}."
        for k in ("up", "gate"):
            for kind in ("weight", "bias"):
                name = b + f"ffn_{k}.{kind}"
                if name in out:
                    out[name] = np.ascontiguousarray(out[name][idx])          # [d_ff, ...] -> [n_keep, ...]
        out[b + "ffn_down.weight"] = np.ascontiguousarray(out[b + "ffn_down.weight"][:, idx])   # [d_model, n_keep]
    return out, dataclasses.replace(cfg, d_ff=int(keep_idx.shape[1]))

