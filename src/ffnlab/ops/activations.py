"""Pointwise activations of the FFN: GELU (exact erf and tanh approximation), ReLU, SiLU.

Each backward takes the forward's input x (not its output) and returns dL/dx = dy * f'(x).
"""
import math
from typing import Callable, NamedTuple

import numpy as np

from . import fastmath, train_kernels

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)   # 0.7978845608...
GELU_TANH_COEF = 0.044715                   # from Hendrycks & Gimpel; GPT-2, Gemma and ggml use it
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _compiled(kernel, *xs, consts=()):
    """kernel(each of xs flat, out flat, *consts) -> out, shaped as xs[-1]; a strided x (the gate half of a
    [gate, up] product) is copied to C order first"""
    xs = [np.ascontiguousarray(x) for x in xs]
    out = np.empty_like(xs[-1])
    kernel(*(x.reshape(-1) for x in xs), out.reshape(-1), *consts)
    return out


def _float32_pair(dy, x):
    """dy, x of one shape, both float32, not empty: the compiled backward applies"""
    return x.dtype == np.float32 and dy.dtype == np.float32 and x.size and dy.shape == x.shape


GELU_TANH_CONSTS = (np.float32(SQRT_2_OVER_PI), np.float32(GELU_TANH_COEF))


# --- GELU, exact: x * Phi(x), Phi the standard normal CDF ---------------------------------
GELU_CONSTS = (np.float32(INV_SQRT_2), np.float32(INV_SQRT_2PI))


def gelu_forward(x):
    """[...] -> [...]. float32: one compiled pass (ops/train_kernels.py), gelu_forward_numpy's bits"""
    if x.dtype == np.float32 and x.size:
        return _compiled(train_kernels.gelu_into, x, consts=GELU_CONSTS[:1])
    return gelu_forward_numpy(x)


def gelu_backward(dy, x):
    """dy, x: [...] -> dx = dy (Phi(x) + x phi(x)). float32: one compiled pass (ops/train_kernels.py),
    held to gelu_backward_numpy within float32 error analysis"""
    if _float32_pair(dy, x):
        return _compiled(train_kernels.gelu_backward_into, dy, x, consts=GELU_CONSTS)
    return gelu_backward_numpy(dy, x)


def _cdf_numpy(x):
    """Phi(x) = 0.5 (1 + erf(x / sqrt 2)), in x's dtype, on one scratch array"""
    from scipy.special import erf  # NumPy has no erf; scipy's is correctly rounded in float64 (imported
    # here: scipy.special is ~14 MB and 0.4 s of import that only exact-GELU models need)
    c = np.multiply(x, INV_SQRT_2, dtype=x.dtype)
    erf(c, out=c)
    c += 1.0
    c *= 0.5
    return c


def gelu_forward_numpy(x):
    y = _cdf_numpy(x)
    y *= x
    return y


def gelu_backward_numpy(dy, x):
    # d/dx x Phi(x) = Phi(x) + x phi(x)
    g = np.multiply(x, x, dtype=x.dtype)
    g *= -0.5
    np.exp(g, out=g)
    g *= INV_SQRT_2PI                                       # phi(x)
    g *= x
    g += _cdf_numpy(x)
    g *= dy
    return g


# --- GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ------------
# In place on one or two scratch arrays: on training-size activations every fresh temporary
# costs page faults as well as a pass over memory, and the naive expressions make ~20 of them.
def _gelu_tanh_inner(x, x2):
    """tanh(sqrt(2/pi) (x + 0.044715 x^3)), computed as sqrt(2/pi) x (1 + 0.044715 x^2); x2 = x*x"""
    t = x2 * GELU_TANH_COEF
    t += 1.0
    t *= x
    t *= SQRT_2_OVER_PI
    return np.tanh(t, out=t)


def gelu_tanh_forward(x):
    if x.dtype == np.float32 and x.size:         # x sigmoid(2u), one compiled pass (ops/fastmath.py)
        return _compiled(fastmath.gelu_tanh_into, x, consts=GELU_TANH_CONSTS)
    y = _gelu_tanh_inner(x, x * x)              # t
    y += 1.0
    y *= x
    y *= 0.5                                     # 0.5 x (1 + t)
    return y


def gelu_tanh_backward(dy, x):
    """dy, x: [...] -> dx = dy * gelu_tanh'(x). float32: one compiled pass (ops/train_kernels.py,
    held to gelu_tanh_backward_numpy within float32 error analysis)"""
    if _float32_pair(dy, x):
        return _compiled(train_kernels.gelu_tanh_backward_into, dy, x, consts=GELU_TANH_CONSTS)
    return gelu_tanh_backward_numpy(dy, x)


def gelu_tanh_backward_numpy(dy, x):
    # d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) inner',  inner' = sqrt(2/pi) (1 + 3 * 0.044715 x^2)
    x2 = x * x
    t = _gelu_tanh_inner(x, x2)
    x2 *= 3.0 * GELU_TANH_COEF * SQRT_2_OVER_PI
    x2 += SQRT_2_OVER_PI
    x2 *= x                                      # x inner'
    g = t * t
    np.subtract(1.0, g, out=g)                   # 1 - t^2
    g *= x2
    g += t
    g += 1.0
    g *= 0.5
    g *= dy
    return g


# --- ReLU --------------------------------------------------------------------------------
def relu_forward(x):
    return np.maximum(x, 0)


def relu_backward(dy, x):
    return dy * (x > 0)   # subgradient 0 at x == 0, as PyTorch


# --- SiLU (swish): x * sigmoid(x) ---------------------------------------------------------
def sigmoid(x):
    """1 / (1 + e^-x), a new array. For x below about -88 (float32) e^-x overflows to inf and the
    result is 1/inf = 0, the correct limit, so the overflow is expected and not reported.
    float32: ops/fastmath.py's compiled e^x (NumPy's is scalar libm on AVX2, 10x slower)."""
    if x.dtype == np.float32 and x.size:
        return _compiled(fastmath.sigmoid_into, x)
    s = np.negative(x)
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    np.reciprocal(s, out=s)
    return s


def silu_forward(x):
    y = sigmoid(x)
    y *= x
    return y


def silu_backward(dy, x):
    """dy, x: [...] -> dx. float32: one compiled pass (ops/train_kernels.py), bit for bit
    silu_backward_numpy's steps"""
    if _float32_pair(dy, x):
        return _compiled(train_kernels.silu_backward_into, dy, x)
    return silu_backward_numpy(dy, x)


def silu_backward_numpy(dy, x):
    # d/dx x s(x) = s (1 + x (1 - s))
    s = sigmoid(x)
    g = np.subtract(1.0, s, dtype=s.dtype)
    g *= x
    g += 1.0
    g *= s
    g *= dy
    return g


def glu_backward(dh, act, up, gate, name):
    """h = act(gate) * up: dh, and the forward's act(gate), up, gate -> d up, d gate. float32 SiLU or
    GELU (tanh form): one compiled pass (ops/train_kernels.py), the values of the steps below"""
    if name in ("silu", "gelu_tanh") and all(a.dtype == np.float32 and a.flags.c_contiguous and a.shape == dh.shape
                                             for a in (dh, act, up, gate)) and dh.size:
        dup, dgate = np.empty_like(dh), np.empty_like(dh)
        train_kernels.glu_backward_into(dh.reshape(-1), act.reshape(-1), up.reshape(-1), gate.reshape(-1),
                                        dup.reshape(-1), dgate.reshape(-1), name == "gelu_tanh", *GELU_TANH_CONSTS)
        return dup, dgate
    return dh * act, ACTIVATIONS[name].backward(dh * up, gate)


class Activation(NamedTuple):
    forward: Callable                 # x -> y
    backward: Callable                # (dy, x) -> dx
    op: str                           # the ggml op as llama.cpp's eval callback prints it


ACTIVATIONS = {
    "gelu": Activation(gelu_forward, gelu_backward, "GELU_ERF"),
    "gelu_tanh": Activation(gelu_tanh_forward, gelu_tanh_backward, "GELU"),
    "relu": Activation(relu_forward, relu_backward, "RELU"),
    "silu": Activation(silu_forward, silu_backward, "SILU"),
}
