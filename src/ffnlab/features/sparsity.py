"""The latent activation functions, pre [B, N] -> Sparse, and their backward on the support.

    relu       a = max(pre, 0)                                   (trained with the decoder-norm L1)
    topk       the k largest pre of each token, ReLU'd            (Gao et al. 2024; SAELens TopK)
    batchtopk  the k * B largest ReLU(pre) of the whole batch     (Bussmann et al. 2024); at inference a
               JumpReLU with one threshold for all latents, the running mean of the smallest kept value
    jumprelu   a = pre * H(pre - theta), theta per latent        (Rajamanoharan et al. 2024)

The result is a CSR matrix (Sparse): row b lists the latents on its *support*, the entries a gradient
can flow through. For relu/topk/batchtopk that is the firing latents (a > 0). JumpReLU's threshold has
a pseudo-derivative on a window of width epsilon (the bandwidth) around theta, so its support also holds
the latents with theta - eps/2 < pre <= theta, at value 0:

    d/dtheta JumpReLU(pre) = -(theta / eps) K((pre - theta) / eps)      (the paper's eq. 11)
    d/dtheta H(pre - theta) = -(1 / eps) K((pre - theta) / eps)         (eq. 12, for the L0 loss)
    K(u) = 1 if -1/2 < u < 1/2 else 0                                   (the rectangle kernel)
"""
import dataclasses

import numpy as np


@dataclasses.dataclass
class Sparse:
    """[B, N] activations as CSR rows: row b's entries are ptr[b]:ptr[b+1], latents ascending."""
    ptr: np.ndarray          # [B + 1] int64
    idx: np.ndarray          # [nnz] int64 latent of each entry
    val: np.ndarray          # [nnz] float32 activation (0 for a support entry that does not fire)
    pre: np.ndarray          # [nnz] float32 pre-activation at each entry
    shape: tuple             # (B, N)

    @property
    def rows(self):
        """[nnz] the token (row) of each entry"""
        return np.repeat(np.arange(self.shape[0]), np.diff(self.ptr))

    def dense(self):
        a = np.zeros(self.shape, self.val.dtype)
        a[self.rows, self.idx] = self.val
        return a

    def l0(self):
        """[B] latents firing per token"""
        return np.bincount(self.rows[self.val > 0], minlength=self.shape[0])


def from_mask(pre, mask, val):
    """pre [B, N], mask [B, N] bool (the support), val [B, N] -> Sparse (row-major order: latents ascending)"""
    rows, idx = np.nonzero(mask)
    ptr = np.zeros(pre.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=pre.shape[0]), out=ptr[1:])
    return Sparse(ptr, idx.astype(np.int64), val[rows, idx].astype(pre.dtype), pre[rows, idx], pre.shape)


def by_latent(s: Sparse, val):
    """The CSC transpose of s with per-entry values val -> (lptr [N + 1], rows [nnz], val [nnz]): latent j's
    entries are lptr[j]:lptr[j+1], tokens ascending (a stable sort keeps each latent's rows in order)."""
    order = np.argsort(s.idx, kind="stable")
    lptr = np.zeros(s.shape[1] + 1, np.int64)
    np.cumsum(np.bincount(s.idx, minlength=s.shape[1]), out=lptr[1:])
    return lptr, s.rows[order], np.ascontiguousarray(val[order])


# --- forward -----------------------------------------------------------------------------------
def relu_forward(pre):
    return from_mask(pre, pre > 0, pre)


def topk_mask(pre, k):
    """[B, N] -> [B, N] bool: the k largest entries of each row"""
    top = np.argpartition(-pre, k - 1, axis=1)[:, :k]                         # [B, k] unordered
    mask = np.zeros(pre.shape, bool)
    np.put_along_axis(mask, top, True, axis=1)
    return mask


def topk_forward(pre, k):
    """ReLU of each token's k largest pre-activations (SAELens applies the ReLU after the selection,
    so a token with fewer than k positive pre-activations fires fewer than k latents)."""
    return from_mask(pre, topk_mask(pre, k) & (pre > 0), pre)


def batchtopk_forward(pre, k):
    """The k * B largest ReLU(pre) over the whole batch [B, N] (a token may fire more or fewer than k)."""
    flat = np.maximum(pre, 0).ravel()
    n = min(int(k * pre.shape[0]), flat.size)
    top = np.argpartition(-flat, n - 1)[:n]
    mask = np.zeros(flat.size, bool)
    mask[top] = True
    mask = mask.reshape(pre.shape) & (pre > 0)
    return from_mask(pre, mask, pre)


def jumprelu_forward(pre, threshold, bandwidth):
    """pre * H(pre - theta), theta [N]; the support adds the window theta - eps/2 < pre <= theta
    (bandwidth 0: the inference form, no window)."""
    fires = pre > threshold
    window = np.abs(pre - threshold) < bandwidth / 2
    return from_mask(pre, fires | window, np.where(fires, pre, 0))


def threshold_forward(pre, threshold):
    """BatchTopK at inference: a JumpReLU with one threshold (a scalar or [N])."""
    return from_mask(pre, pre > threshold, pre)


def activate(pre, act, k=None, threshold=None, bandwidth=0.0, train=True):
    """The dictionary's activation by name: pre [B, N] -> Sparse"""
    if act == "relu":
        return relu_forward(pre)
    if act == "topk":
        return topk_forward(pre, k)
    if act == "batchtopk":
        return batchtopk_forward(pre, k) if train else threshold_forward(pre, threshold)
    if act == "jumprelu":
        return jumprelu_forward(pre, threshold, bandwidth if train else 0.0)
    raise ValueError(f"unknown activation {act!r}")


# --- backward ----------------------------------------------------------------------------------
def rectangle(u):
    return ((u > -0.5) & (u < 0.5)).astype(u.dtype)


def jumprelu_backward(dval, s: Sparse, threshold, bandwidth, ste_to_input=False):
    """dval [nnz] (dL/da on the support) -> dpre [nnz], dtheta [N]

    Through the jump: dpre = H(pre - theta) dval; dtheta = -(theta/eps) K((pre - theta)/eps) dval, summed over
    tokens. ste_to_input: also pass the threshold's pseudo-gradient, negated, to pre (Anthropic's variant;
    DeepMind's and SAELens's default: off)."""
    th = threshold[s.idx]
    ste = (th / bandwidth) * rectangle((s.pre - th) / bandwidth) * dval          # [nnz]
    dpre = (s.pre > th) * dval
    if ste_to_input:
        dpre = dpre + ste
    dtheta = -np.bincount(s.idx, weights=ste, minlength=s.shape[1]).astype(dval.dtype)
    return dpre.astype(dval.dtype), dtheta


def step_backward(dstep, s: Sparse, threshold, bandwidth, ste_to_input=False):
    """The L0 loss's H(pre - theta): dstep [nnz] (dL/dH) -> dpre [nnz], dtheta [N] (eq. 12)."""
    th = threshold[s.idx]
    ste = (1.0 / bandwidth) * rectangle((s.pre - th) / bandwidth) * dstep
    dtheta = -np.bincount(s.idx, weights=ste, minlength=s.shape[1]).astype(dstep.dtype)
    dpre = ste.astype(dstep.dtype) if ste_to_input else np.zeros_like(dstep)
    return dpre, dtheta
