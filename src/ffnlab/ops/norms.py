"""LayerNorm and RMSNorm over the feature (last) axis.

Both return the normalized-but-unscaled x_hat too: llama.cpp names it `norm-L` before the
weight multiply (`attn_norm-L`, `ffn_norm-L`), and the backward needs it.
"""
import numpy as np

from .fastmath import rms_norm_rows
from .train_kernels import PAIRWISE_MAX, layer_norm_rows, norm_backward_rows

_NO_W = np.zeros(0, np.float32)


def layernorm_forward(x, w, b, eps):
    """x: [..., D], w/b: [D] -> y: [..., D], cache (x_hat, rstd)

    Two-pass variance (mean first, then mean of squared deviations): E[x^2] - E[x]^2
    cancels catastrophically in float32 when |mean| >> std.
    float32: one compiled pass per row (ops/train_kernels.py), bit for bit layernorm_forward_numpy's
    steps with NumPy's own pairwise sums (NumPy's eight passes, each a fresh temporary, were the
    largest elementwise cost of a GPT-2 training step's forward)
    """
    if _compiled_forward(x, w, b, eps):
        D = x.shape[-1]
        y, x_hat, rstd = layer_norm_rows(x.reshape(-1, D), w, b, eps)
        return y.reshape(x.shape), (x_hat.reshape(x.shape), rstd.reshape(*x.shape[:-1], 1))
    return layernorm_forward_numpy(x, w, b, eps)


def _compiled_forward(x, w, b, eps):
    """float32 arrays of one layout and an eps NumPy adds in float32 (a Python float or a float32;
    a float64 scalar would promote the variance to float64), rows of up to PAIRWISE_MAX:
    layer_norm_rows applies"""
    return (x.dtype == np.float32 and x.size and x.flags.c_contiguous and type(eps) in (float, np.float32)
            and x.shape[-1] <= PAIRWISE_MAX
            and w is not None and w.dtype == np.float32 and w.shape == x.shape[-1:]
            and (b is None or (b.dtype == np.float32 and b.shape == w.shape)))


def layernorm_forward_numpy(x, w, b, eps):
    mean = x.mean(axis=-1, keepdims=True)                 # [..., 1]
    xc = x - mean                                         # [..., D]
    var = (xc * xc).mean(axis=-1, keepdims=True)          # [..., 1]
    rstd = 1.0 / np.sqrt(var + eps)                       # [..., 1]
    x_hat = xc
    x_hat *= rstd                                         # [..., D] in place: xc is ours
    y = x_hat * w
    if b is not None:
        y += b
    return y, (x_hat, rstd)


def _compiled_backward(dy, w, x_hat, rstd):
    """float32 arrays of one layout: ops/train_kernels.py's norm_backward_rows applies"""
    return (dy.dtype == np.float32 and x_hat.dtype == np.float32 and rstd.dtype == np.float32 and dy.size
            and dy.shape == x_hat.shape and rstd.size * dy.shape[-1] == dy.size
            and (w is None or (w.dtype == np.float32 and w.shape == dy.shape[-1:])))


def _rows_backward(dy, w, x_hat, rstd, center):
    D = dy.shape[-1]
    dx, dw, db = norm_backward_rows(np.ascontiguousarray(dy).reshape(-1, D), np.ascontiguousarray(x_hat).reshape(-1, D),
                                    np.ascontiguousarray(rstd).reshape(-1), w, center)
    return dx.reshape(dy.shape), dw, db


def layernorm_backward(dy, w, cache, has_bias=True):
    """dy: [..., D] -> dx: [..., D], dw: [D], db: [D]. float32: one compiled pass per row, its sums in
    float64 (ops/train_kernels.py, held to layernorm_backward_numpy)"""
    x_hat, rstd = cache
    if _compiled_backward(dy, w, x_hat, rstd):
        dx, dw, db = _rows_backward(dy, w, x_hat, rstd, True)
        return dx, dw, (db if has_bias else None)
    return layernorm_backward_numpy(dy, w, cache, has_bias)


def layernorm_backward_numpy(dy, w, cache, has_bias=True):
    x_hat, rstd = cache
    D = x_hat.shape[-1]
    lead = tuple(range(dy.ndim - 1))
    dw = (dy * x_hat).sum(axis=lead)                      # [D]
    db = dy.sum(axis=lead) if has_bias else None          # [D]
    g = dy * w                                            # dL/dx_hat
    # dx = rstd * (g - mean(g) - x_hat * mean(g * x_hat))
    c = (g * x_hat).sum(axis=-1, keepdims=True) / D       # [..., 1] mean(g * x_hat)
    g -= g.mean(axis=-1, keepdims=True)                   # g is ours: update it in place into dx
    g -= x_hat * c
    g *= rstd
    return g, dw, db


def rmsnorm_forward(x, w, eps):
    """x: [..., D], w: [D] or None -> y: [..., D], cache (x_hat, rstd)"""
    if x.dtype == np.float32 and x.size and (w is None or w.dtype == np.float32):
        # one compiled pass per row (a Gemma 3 layer has six of these norms: ~0.15 ms each in
        # NumPy's five passes for 100 tokens, ~0.03 compiled); the sum of squares in float64
        x2 = np.ascontiguousarray(x).reshape(-1, x.shape[-1])             # q/k norms read a strided slice
        x_hat = np.empty(x2.shape, np.float32)
        y = np.empty(x2.shape, np.float32) if w is not None else x_hat
        rstd = np.empty(x2.shape[0], np.float32)
        rms_norm_rows(x2, w if w is not None else _NO_W, np.float32(eps), x_hat, y, rstd)
        x_hat = x_hat.reshape(x.shape)
        return (y.reshape(x.shape) if w is not None else x_hat), (x_hat, rstd.reshape(*x.shape[:-1], 1))
    # sum of squares as a dot product per row: one call instead of square + mean (np.mean's
    # Python wrapper, and einsum's, are most of an RMSNorm's cost when a token is decoded)
    ms = np.vecdot(x, x)[..., None] / x.shape[-1]        # [..., 1] mean square
    rstd = 1.0 / np.sqrt(ms + eps)                        # [..., 1]
    x_hat = x * rstd                                      # [..., D]
    y = x_hat * w if w is not None else x_hat
    return y, (x_hat, rstd)


def rmsnorm_backward(dy, w, cache):
    """dy: [..., D] -> dx: [..., D], dw: [D]. float32: one compiled pass per row, as layernorm_backward"""
    x_hat, rstd = cache
    if _compiled_backward(dy, w, x_hat, rstd):
        dx, dw, _ = _rows_backward(dy, w, x_hat, rstd, False)
        return dx, (dw if w is not None else None)
    return rmsnorm_backward_numpy(dy, w, cache)


def rmsnorm_backward_numpy(dy, w, cache):
    x_hat, rstd = cache
    D = x_hat.shape[-1]
    lead = tuple(range(dy.ndim - 1))
    dw = (dy * x_hat).sum(axis=lead) if w is not None else None
    g = dy * w if w is not None else dy.copy()            # dL/dx_hat, ours to update in place
    # dx = rstd * (g - x_hat * mean(g * x_hat))
    c = (g * x_hat).sum(axis=-1, keepdims=True) / D       # [..., 1]
    g -= x_hat * c
    g *= rstd
    return g, dw
