"""Token embedding plus (optionally) learned positions."""
import numpy as np


def embedding_forward(ids, wte, wpe=None, pos=None):
    """ids: [T] int, wte: [V, D], wpe: [n_ctx, D] or None, pos: [T] int -> [T, D]"""
    x = wte[ids]                                     # gather rows: [T] -> [T, D] (a copy)
    if wpe is not None:
        x += wpe[pos]                                # [T, D]
    return x


def embedding_backward(dx, ids, vocab_size, pos=None, n_ctx=None):
    """dx: [T, D] -> dwte: [V, D], dwpe: [n_ctx, D] or None. Repeated ids accumulate (np.add.at)."""
    dwte = np.zeros((vocab_size, dx.shape[-1]), dtype=dx.dtype)
    np.add.at(dwte, ids, dx)
    dwpe = None
    if pos is not None:
        dwpe = np.zeros((n_ctx, dx.shape[-1]), dtype=dx.dtype)
        np.add.at(dwpe, pos, dx)
    return dwte, dwpe
