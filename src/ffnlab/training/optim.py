"""AdamW with decoupled weight decay, a warmup + cosine learning-rate schedule, and
gradient-norm clipping -- the same arithmetic as torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_, so a run here and a run in PyTorch give the same losses.
"""
from __future__ import annotations

import math

import numpy as np

from ..model.params import is_norm_or_bias
from ..ops.train_kernels import adamw_update

EMBEDDINGS = ("token_embd.weight", "position_embd.weight")


def decays(name: str, decay_embeddings: bool = False) -> bool:
    """Weight decay pulls weights toward 0. It is for the matrices: a norm scale pulled toward
    0 (instead of its init 1) or a bias pulled toward 0 only fights the model, and a decayed
    embedding row for a rare token shrinks between its rare gradients (GPT-2/nanoGPT practice)."""
    if is_norm_or_bias(name):
        return False
    if name in EMBEDDINGS:
        return decay_embeddings
    return True


class AdamW:
    """params: {name: float32 array}, updated in place by step(grads, lr)."""

    def __init__(self, params, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, decay_embeddings=False):
        self.weight_decay = weight_decay
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.decay = {n: decays(n, decay_embeddings) for n in params}
        self.m = {n: np.zeros_like(p) for n, p in params.items()}   # first moment (mean of grads)
        self.v = {n: np.zeros_like(p) for n, p in params.items()}   # second moment (mean of grad^2)
        self.t = 0                                                    # steps taken

    def step(self, params, grads, lr):
        """float32 tensors: one compiled pass over them all (ops/train_kernels.py's adamw_update), the
        very roundings of the NumPy steps below, in their order (tests/unit/test_train_kernels.py)"""
        self.t += 1
        b1, b2 = self.beta1, self.beta2
        bc1 = 1.0 - b1 ** self.t                        # bias corrections: m and v start at 0,
        bc2_sqrt = math.sqrt(1.0 - b2 ** self.t)        # so early averages are too small by these factors
        step_size = lr / bc1
        compiled = []
        for name, p in params.items():
            g, m, v = grads[name], self.m[name], self.v[name]
            decay = self.decay[name] and self.weight_decay
            if _compiled(p, g, m, v):
                compiled.append((p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1),
                                 1.0 - lr * self.weight_decay if decay else 1.0))
            else:
                self._step_numpy(p, g, m, v, decay, lr, bc2_sqrt, step_size)
        adamw_update(compiled, 1.0 - b1, b2, 1.0 - b2, bc2_sqrt, self.eps, step_size)

    def _step_numpy(self, p, g, m, v, decay, lr, bc2_sqrt, step_size):
        """one tensor's update in NumPy steps (any float dtype)"""
        b1, b2 = self.beta1, self.beta2
        if decay:
            p *= 1.0 - lr * self.weight_decay                     # decoupled: shrink p, not the gradient
        tmp = np.subtract(g, m)                                   # one scratch array per tensor
        tmp *= 1.0 - b1
        m += tmp                                                  # m = b1*m + (1-b1)*g  (torch: lerp)
        np.multiply(g, g, out=tmp)
        tmp *= 1.0 - b2
        v *= b2
        v += tmp                                                  # v = b2*v + (1-b2)*g^2
        np.sqrt(v, out=tmp)
        tmp /= bc2_sqrt
        tmp += self.eps                                           # denom = sqrt(v / bc2) + eps
        np.divide(m, tmp, out=tmp)
        tmp *= step_size
        p -= tmp                                                  # p -= lr/bc1 * m / denom

    # --- checkpointing: moments go to safetensors, scalars to JSON --------------------------
    def state_arrays(self) -> dict:
        return {**{f"adam.m.{n}": a for n, a in self.m.items()}, **{f"adam.v.{n}": a for n, a in self.v.items()}}

    def state_scalars(self) -> dict:
        return {"t": self.t, "weight_decay": self.weight_decay, "betas": [self.beta1, self.beta2], "eps": self.eps}

    def load_state(self, arrays: dict, scalars: dict):
        for n in self.m:
            self.m[n] = np.array(arrays[f"adam.m.{n}"], dtype=self.m[n].dtype)
            self.v[n] = np.array(arrays[f"adam.v.{n}"], dtype=self.v[n].dtype)
        self.t = int(scalars["t"])


def _compiled(p, g, m, v) -> bool:
    """float32 C-contiguous arrays of one shape: their flat views are the arrays themselves"""
    return all(a.dtype == np.float32 and a.flags.c_contiguous and a.shape == p.shape for a in (p, g, m, v))


def clip_grad_norm(grads: dict, max_norm: float) -> float:
    """Scale all gradients together so their global L2 norm is at most max_norm (as
    torch.nn.utils.clip_grad_norm_). Returns the norm before clipping; max_norm <= 0: no clipping."""
    total = math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in grads.values()))
    if max_norm > 0:
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads.values():
                g *= np.float32(coef)
    return total


def lr_at(step: int, max_lr: float, total_steps: int, warmup: int, min_lr_frac: float = 0.1) -> float:
    """Learning rate for step (0-based): linear warmup over `warmup` steps, then cosine decay
    to min_lr_frac * max_lr at the last step."""
    if warmup > 0 and step < warmup:
        return max_lr * (step + 1) / warmup
    min_lr = max_lr * min_lr_frac
    span = max(1, total_steps - warmup - 1)
    progress = min(1.0, (step - warmup) / span)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
