"""Softmax over the last axis, numerically stable."""
import numpy as np

from . import fastmath


def softmax_forward(x):
    """[..., N] -> [..., N]. Subtracting the row max keeps exp() <= 1: without it, logits
    around 90 overflow float32 to inf and the row becomes nan. Rows that are all -inf
    (fully masked) would give nan either way; callers never produce them (causal rows always
    see their own position). float32: ops/fastmath.py's compiled rows (NumPy's exp is scalar
    libm on AVX2, 10x slower)."""
    m = x.max(axis=-1, keepdims=True)
    e = x - m
    if e.dtype == np.float32 and e.size:          # e^ and the sums compiled (NumPy's exp is scalar here)
        fastmath.exp_normalize_rows(e.reshape(-1, e.shape[-1]))
        return e
    np.exp(e, out=e)                              # in place: one temporary, not two
    e /= e.sum(axis=-1, keepdims=True)            # in place: e is ours (attention rows are large)
    return e


def softmax_backward(dy, y):
    """dy, y: [..., N] -> dx: [..., N];  dx = y * (dy - sum(dy * y))"""
    dx = dy * y
    s = dx.sum(axis=-1, keepdims=True)            # [..., 1]
    np.subtract(dy, s, out=dx)
    dx *= y
    return dx
