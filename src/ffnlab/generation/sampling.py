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


def most_likely(logits, k):
    """The ids of the k largest logits, most likely first, ties by lower id (all ids when k <= 0):
    the first k of a stable descending argsort, found in O(vocab) with a partition instead of
    sorting the whole vocabulary (~7 ms for 49,152 logits, more than a third of a decode step)."""
    if k <= 0 or k >= len(logits):
        return np.argsort(-logits, kind="stable")
    kth = np.partition(logits, len(logits) - k)[len(logits) - k]   # the k-th largest value
    above = np.flatnonzero(logits > kth)
    ties = np.flatnonzero(logits == kth)[:k - len(above)]           # lowest ids first, as a stable sort keeps them
    ids = np.concatenate([above, ties])
    return ids[np.argsort(-logits[ids], kind="stable")]


def sample(logits, params: SamplingParams, rng, recent=()):
    """logits: [vocab] -> token id"""
    logits = apply_repeat_penalty(np.asarray(logits, dtype=np.float64), recent[-params.repeat_last_n:] if params.repeat_last_n else (), params.repeat_penalty)
    if params.temp <= 0:
        return int(np.argmax(logits))
    order = most_likely(logits, params.top_k)                    # candidates, most likely first
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
