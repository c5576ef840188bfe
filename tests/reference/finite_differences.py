"""Central finite differences for the gradient checks, and the bound they are held to
(tests/model/test_gradcheck.py's docstring derives FD_TOL)."""
import numpy as np


FD_TOL = 1e-6
EPS = 1e-6


def numerical_grad(loss, x, eps=EPS):
    """Central differences of the scalar loss() with respect to every entry of x (perturbed in place)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        orig = flat[i]
        flat[i] = orig + eps
        plus = loss()
        flat[i] = orig - eps
        minus = loss()
        flat[i] = orig
        gflat[i] = (plus - minus) / (2 * eps)
    return g
