"""Tolerances for comparing two float32 computations of the same math, from error analysis.

Two float32 forwards that differ only in summation order (a batch of windows vs one window, a
packed q/k/v product vs three, the one-token decode path vs the batched forward, another CPU's
BLAS blocking) round differently. A dot product of n terms carries at most about n * eps/2 times
the sum of its terms' magnitudes (Higham's gamma_n bound), and through a few layers of a small
model the terms stay of the order of the output itself. So the bound scales with the longest
reduction and the output's largest magnitude, never with one element's own size: an element near
zero still carries the rounding of its large terms.
"""
import numpy as np

EPS32 = float(np.finfo(np.float32).eps)      # 2^-23; unit roundoff eps/2 = 2^-24


def f32_atol(cfg, values, factor=2) -> float:
    """Absolute bound for |a - b| where a and b are float32 results of the same math on config cfg,
    summed in different orders. factor 2: each side has its own rounding error."""
    n = max(cfg.d_model, cfg.d_ff, getattr(cfg, "n_ctx", 0) or 0)
    return factor * n * EPS32 / 2 * float(np.abs(values).max())
