"""Pointwise activations of the FFN: GELU (exact erf and tanh approximation), ReLU, SiLU.

Each backward takes the forward's input x (not its output) and returns dL/dx = dy * f'(x).
"""
import math

import numpy as np
from scipy.special import erf  # NumPy has no erf; scipy's is correctly rounded in float64

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)   # 0.7978845608...
GELU_TANH_COEF = 0.044715                   # from Hendrycks & Gimpel; GPT-2, Gemma and ggml use it
INV_SQRT_2 = 1.0 / math.sqrt(2.0)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


# --- GELU, exact: x * Phi(x), Phi the standard normal CDF ---------------------------------
def gelu_forward(x):
    """[...] -> [...]"""
    return (0.5 * x * (1.0 + erf(x * INV_SQRT_2))).astype(x.dtype, copy=False)


def gelu_backward(dy, x):
    cdf = 0.5 * (1.0 + erf(x * INV_SQRT_2))                 # Phi(x)
    pdf = INV_SQRT_2PI * np.exp(-0.5 * x * x)               # phi(x)
    return (dy * (cdf + x * pdf)).astype(x.dtype, copy=False)


# --- GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) ------------
def gelu_tanh_forward(x):
    inner = SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x * x * x)
    return 0.5 * x * (1.0 + np.tanh(inner))


def gelu_tanh_backward(dy, x):
    inner = SQRT_2_OVER_PI * (x + GELU_TANH_COEF * x * x * x)
    t = np.tanh(inner)
    dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_TANH_COEF * x * x)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner)


# --- ReLU --------------------------------------------------------------------------------
def relu_forward(x):
    return np.maximum(x, 0)


def relu_backward(dy, x):
    return dy * (x > 0)   # subgradient 0 at x == 0, as PyTorch


# --- SiLU (swish): x * sigmoid(x) ---------------------------------------------------------
def sigmoid(x):
    # exp of a non-positive number only, so large |x| never overflows
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(x.dtype, copy=False)


def silu_forward(x):
    return x * sigmoid(x)


def silu_backward(dy, x):
    s = sigmoid(x)
    return dy * (s * (1.0 + x * (1.0 - s)))


ACTIVATIONS = {
    # name: (forward, backward, ggml op name as llama.cpp's eval callback prints it)
    "gelu": (gelu_forward, gelu_backward, "GELU_ERF"),
    "gelu_tanh": (gelu_tanh_forward, gelu_tanh_backward, "GELU"),
    "relu": (relu_forward, relu_backward, "RELU"),
    "silu": (silu_forward, silu_backward, "SILU"),
}
