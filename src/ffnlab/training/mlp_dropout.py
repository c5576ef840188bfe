"""Dropout inside the MLP, for training: Dropout(p) on the hidden activation, the input of ffn_down.

    y = down(drop(act(up x)))            drop(h) = h * mask / (1 - p),  mask ~ Bernoulli(1 - p)

as T5's DenseReluDense and the MLP of the write-ups place it (between the two projections).
The down weight of every layer becomes a DroppedInput: an ops/linear.py ComposedWeight over the
same float32 array, so the model code is unchanged, the optimizer still updates that array in
place, and evaluation (training off) is the plain product.

The masks come from a Generator seeded by (seed, 3, step, layer): a resumed run draws the masks
the uninterrupted run drew, without checkpointing another RNG state, and the batch order (seeded
by (seed, 1)) is the same with and without dropout, so runs with and without it pair by seed.
"""
import numpy as np

from ..ops.linear import ComposedWeight


class DroppedInput(ComposedWeight):
    """A trainable weight W [out, in] whose input is dropped out in training forwards."""

    def __init__(self, w, p, seed, layer):
        self.w, self.p, self.seed, self.layer = w, float(p), int(seed), int(layer)
        self.training = False
        self.step = 0
        self.mask = None              # the last training forward's mask / (1 - p), for its backward

    shape = property(lambda self: tuple(self.w.shape))
    dtype = property(lambda self: self.w.dtype)
    ndim = 2

    def _dropped(self, x2, new):
        if not (self.training and self.p > 0):
            return x2
        if new:                                                         # a weight is used once per forward
            rng = np.random.default_rng([self.seed, 3, self.step, self.layer])
            keep = rng.random(x2.shape) >= self.p                       # [N, in]
            self.mask = keep.astype(x2.dtype) / np.asarray(1.0 - self.p, x2.dtype)
        return x2 * self.mask

    def forward(self, x2, hook=None):
        return self._dropped(x2, True) @ self.w.T                       # [N, in] @ [in, out] -> [N, out]

    def backward(self, dy2, x2):
        """dy2: [N, out] -> dx [N, in], dW [out, in]"""
        xd = self._dropped(x2, False)                                   # [N, in]
        dx = dy2 @ self.w                                               # [N, out] @ [out, in]
        if self.training and self.p > 0:
            dx *= self.mask
        return dx, dy2.T @ xd                                           # [out, N] @ [N, in]


def attach(params, cfg, p, seed) -> dict:
    """-> a params dict whose ffn_down weights are DroppedInputs over the same arrays."""
    out = dict(params)
    for il in range(cfg.n_layer):
        name = f"blk.{il}.ffn_down.weight"
        out[name] = DroppedInput(params[name], p, seed, il)
    return out


def set_step(params, step, training=True):
    """Masks for 1-based step `step` (training=True), or the plain product (evaluation)."""
    for v in params.values():
        if isinstance(v, DroppedInput):
            v.step, v.training = step, training
