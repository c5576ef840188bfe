"""Compiled kernels of the sparse decode: a TopK dictionary touches k of its N latents per token.

Latent activations are kept as CSR rows (sparsity.Sparse): row b holds the latents `idx[ptr[b]:ptr[b+1]]`
with values `val[...]`. Dense, the decode `acts @ W_dec` reads all N rows of W_dec for every token;
sparse, it reads k of them, so a 576 -> 16384 dictionary at k = 32 does 1/512 of the dense work.

Every kernel is written so its result does not depend on the thread count: each output row is summed
by one thread in a fixed order (rows of a token's output: over its entries in CSR order; rows of a
latent's gradient: over the tokens in ascending order, through the CSC transpose `by_latent`). No
fastmath: the sums run in the order written, as the NumPy twins in tests/model/test_features_ops.py.
"""
import numpy as np
from numba import njit, prange

FLAGS = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


@njit(parallel=True, **FLAGS)
def sparse_decode(ptr, idx, val, W, out):
    """out[b] += sum over row b's entries (CSR order) of val * W[idx]: [B, N] sparse @ [N, d] -> [B, d]"""
    B, d = out.shape
    for b in prange(B):
        for e in range(ptr[b], ptr[b + 1]):
            v, j = val[e], idx[e]
            for c in range(d):
                out[b, c] += v * W[j, c]


# out[j] += sum over latent j's entries (token b, value v), b ascending, of v * x[b]: sparse.T @ x,
# [N, B] @ [B, d] -> [N, d] (the decoder's gradient, the encoder's transposed): the same loop over the
# CSC of the activations (sparsity.by_latent: lptr, lrows, lval) and x [B, d]
latent_outer = sparse_decode


@njit(parallel=True, **FLAGS)
def dots_on_support(ptr, idx, g, W, out):
    """out[e] = g[b] . W[idx[e]] for each entry e of row b: the rows of g @ W.T on the support only"""
    B, d = g.shape
    for b in prange(B):
        for e in range(ptr[b], ptr[b + 1]):
            j = idx[e]
            s = np.float32(0.0)
            for c in range(d):
                s += g[b, c] * W[j, c]
            out[e] = s
