"""Cross-entropy from logits (mean over positions)."""
import numpy as np

from .train_kernels import cross_entropy_backward_rows, cross_entropy_rows


def _compiled(logits, targets):
    """float32 [N, V] with [N] targets: the compiled rows apply (targets outside [0, V) raise, as NumPy's indexing)"""
    if not (logits.dtype == np.float32 and logits.ndim == 2 and logits.size and np.shape(targets) == logits.shape[:1]):
        return False
    if targets.min() < 0 or targets.max() >= logits.shape[1]:
        raise IndexError(f"targets must lie in [0, {logits.shape[1]}), got {targets.min()}..{targets.max()}")
    return True


def cross_entropy_forward(logits, targets):
    """logits: [N, V], targets: [N] int -> loss (scalar), probs [N, V] (the backward needs them).
    float32: one compiled pass per row, the sums in float64 (ops/train_kernels.py, held to
    cross_entropy_forward_numpy)"""
    if _compiled(logits, targets):
        return cross_entropy_rows(np.ascontiguousarray(logits), np.ascontiguousarray(targets, np.int64))
    return cross_entropy_forward_numpy(logits, targets)


def cross_entropy_forward_numpy(logits, targets):
    m = logits.max(axis=-1, keepdims=True)
    shifted = logits - m
    logsumexp = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))   # [N, 1]
    logp = shifted - logsumexp                                         # [N, V] log-probabilities
    n = logits.shape[0]
    loss = -logp[np.arange(n), targets].mean()
    return loss, np.exp(logp)


def cross_entropy_backward(probs, targets, dloss=1.0):
    """-> dlogits [N, V] = (softmax - onehot) / N. float32: one compiled pass, bit for bit
    cross_entropy_backward_numpy's steps"""
    if _compiled(probs, targets):
        return cross_entropy_backward_rows(np.ascontiguousarray(probs), np.ascontiguousarray(targets, np.int64),
                                           dloss / probs.shape[0])
    return cross_entropy_backward_numpy(probs, targets, dloss)


def cross_entropy_backward_numpy(probs, targets, dloss=1.0):
    n = probs.shape[0]
    dlogits = probs.copy()
    dlogits[np.arange(n), targets] -= 1.0
    dlogits *= dloss / n
    return dlogits
