"""Cross-entropy from logits (mean over positions)."""
import numpy as np


def cross_entropy_forward(logits, targets):
    """logits: [N, V], targets: [N] int -> loss (scalar), probs [N, V] (the backward needs them)"""
    m = logits.max(axis=-1, keepdims=True)
    shifted = logits - m
    logsumexp = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))   # [N, 1]
    logp = shifted - logsumexp                                         # [N, V] log-probabilities
    n = logits.shape[0]
    loss = -logp[np.arange(n), targets].mean()
    return loss, np.exp(logp)


def cross_entropy_backward(probs, targets, dloss=1.0):
    """-> dlogits [N, V] = (softmax - onehot) / N"""
    n = probs.shape[0]
    dlogits = probs.copy()
    dlogits[np.arange(n), targets] -= 1.0
    dlogits *= dloss / n
    return dlogits
