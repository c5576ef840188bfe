"""Token sampling, in llama.cpp's sampler-chain order:
repeat penalty -> top-k -> top-p -> min-p -> temperature -> draw (greedy when temp <= 0)."""
from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    temp: float = 0.8              # <= 0: greedy (argmax)
    top_k: int = 40                # keep the k most likely tokens; <= 0: all
    top_p: float = 0.95            # keep the smallest set with cumulative probability >= top_p; 1.0: off
    min_p: float = 0.05            # drop tokens with p < min_p * p_max; 0: off
    repeat_penalty: float = 1.0    # > 1 discourages the last repeat_last_n tokens; 1.0: off
    repeat_last_n: int = 64
    seed: int = -1                 # -1: a random seed


def apply_repeat_penalty(logits, recent, penalty):
    """llama.cpp's rule: a recent token's logit is divided by the penalty if positive, multiplied if negative."""
    if penalty == 1.0 or len(recent) == 0:
        return logits
    logits = logits.copy()
    ids = np.unique(np.asarray(recent))
    vals = logits[ids]
    logits[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
    return logits


def sample(logits, params: SamplingParams, rng, recent=()):
    """logits: [vocab] -> token id"""
    logits = apply_repeat_penalty(np.asarray(logits, dtype=np.float64), recent[-params.repeat_last_n:] if params.repeat_last_n else (), params.repeat_penalty)
    if params.temp <= 0:
        return int(np.argmax(logits))
    order = np.argsort(-logits, kind="stable")                   # candidates, most likely first
    if params.top_k > 0:
        order = order[:params.top_k]
    cand = logits[order]
    p = np.exp(cand - cand[0])
    p /= p.sum()
    if params.top_p < 1.0:
        keep = int(np.searchsorted(np.cumsum(p), params.top_p) + 1)   # smallest prefix reaching top_p
        order, cand, p = order[:keep], cand[:keep], p[:keep]
    if params.min_p > 0:
        keep = p >= params.min_p * p[0]
        order, cand = order[keep], cand[keep]
    z = cand / params.temp
    q = np.exp(z - z.max())
    q /= q.sum()
    return int(order[rng.choice(len(order), p=q)])
