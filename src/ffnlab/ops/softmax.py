"""Softmax over the last axis, numerically stable."""
import numpy as np

from . import fastmath, train_kernels


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
    """dy, y: [..., N] -> dx: [..., N];  dx = y * (dy - sum(dy * y)). float32: one compiled pass
    per row, the sum in float64 (ops/train_kernels.py, held to softmax_backward_numpy)"""
    if dy.dtype == np.float32 and y.dtype == np.float32 and y.size and dy.shape == y.shape:
        N = y.shape[-1]
        dx = np.empty(y.shape, np.float32)
        train_kernels.softmax_backward_rows(np.ascontiguousarray(dy).reshape(-1, N),
                                            np.ascontiguousarray(y).reshape(-1, N), dx.reshape(-1, N))
        return dx
    return softmax_backward_numpy(dy, y)


def softmax_backward_numpy(dy, y):
    dx = dy * y
    s = dx.sum(axis=-1, keepdims=True)            # [..., 1]
    np.subtract(dy, s, out=dx)
    dx *= y
    return dx
