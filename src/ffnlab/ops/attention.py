"""Causal scaled-dot-product attention with multiple heads and grouped-query KV heads.

Layouts follow llama.cpp's tensors with the axis order reversed (numpy is row-major, ggml's
ne[0] is the fastest axis):
  q   [B, T, H, hd]      (ggml Qcur {hd, H, T})
  k,v [B, S, Hkv, hd]    (S = keys in the cache, S >= T)
  kq  [B, H, T, S]       (ggml kq {S, T, H}): raw scores q.k, not yet scaled or masked
  out [B, H, T, hd]      (ggml kqv {hd, T, H})
Query head h reads KV head h // (H / Hkv), as ggml's broadcasting mul_mat does.
"""
import numpy as np

from . import train_kernels
from .matmul import batched_matmul
from .softmax import softmax_backward, softmax_forward


def causal_mask(q_pos, k_pos, window=0):
    """q_pos: [T], k_pos: [S] -> bool [T, S], True where query t may attend key s.

    Causal: a key at a later position is invisible. Sliding window (Gemma 3 local layers):
    a key more than window-1 positions back is invisible too.
    """
    q_pos = np.asarray(q_pos)[:, None]
    k_pos = np.asarray(k_pos)[None, :]
    allowed = k_pos <= q_pos
    if window:
        allowed &= (q_pos - k_pos) < window
    return allowed


def _group(x, n_kv):
    """[B, T, H, hd] -> [B, Hkv, G, T, hd] with G = H / Hkv query heads per KV head"""
    B, T, H, hd = x.shape
    return x.reshape(B, T, n_kv, H // n_kv, hd).transpose(0, 2, 3, 1, 4)


def _rows_contiguous(a):
    """a with each [S, hd] matrix made of contiguous rows (copied only if it is not already):
    numpy hands a batched matmul to BLAS only then; a [B, S, Hkv, hd] tensor seen head-major
    has rows Hkv*hd apart, a head-major KV cache already has them hd apart."""
    if a.strides[-1] == a.itemsize and a.strides[-2] == a.shape[-1] * a.itemsize:
        return a
    return np.ascontiguousarray(a)


def attention_scores(q, k):
    """q: [B, T, H, hd], k: [B, S, Hkv, hd] -> kq [B, H, T, S], the raw scores q.k (not scaled or masked)"""
    B, T, H, hd = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    qg = _group(q, Hkv).reshape(B, Hkv, (H // Hkv) * T, hd)   # [B, Hkv, G*T, hd]
    kh = _rows_contiguous(k.transpose(0, 2, 1, 3))            # [B, Hkv, S, hd]
    return batched_matmul(qg, kh.swapaxes(-1, -2)).reshape(B, H, T, S)     # [B, H, T, S]


def attention_probs(kq, scale, allowed):
    """kq: [B, H, T, S] raw scores, allowed: [T, S] bool from causal_mask or None -> probs [B, H, T, S]

    Masked scores are set to -inf, not 0, before the softmax: exp(-inf) = 0 gives a future
    key exactly zero weight, while a 0 score would still give it weight exp(0)/Z.
    float32: scale, mask and softmax in one compiled pass per row (ops/train_kernels.py), bit for
    bit attention_probs_numpy's steps.
    """
    if kq.dtype == np.float32 and kq.size and kq.ndim == 4 and (allowed is None or allowed.shape == kq.shape[-2:]):
        B, H, T, S = kq.shape
        probs = np.empty(kq.shape, np.float32)
        train_kernels.masked_softmax_rows(np.ascontiguousarray(kq).reshape(B * H, T, S), scale, allowed,
                                          probs.reshape(B * H, T, S))
        return probs
    return attention_probs_numpy(kq, scale, allowed)


def attention_probs_numpy(kq, scale, allowed):
    """attention_probs in NumPy's steps: scale, mask, softmax_forward"""
    scores = kq * np.asarray(scale, dtype=kq.dtype)            # scaled copy; kq itself stays raw for tracing
    if allowed is not None:                                    # None: every key visible (one new token, no window)
        # a masked copy (where=): twice as fast as boolean-index assignment scores[:, :, ~allowed]
        np.copyto(scores, -np.inf, where=~allowed)
    return softmax_forward(scores)


def attention_mix(probs, v):
    """probs: [B, H, T, S], v: [B, S, Hkv, hd] -> out [B, H, T, hd], each query's weighted sum of values"""
    B, H, T, S = probs.shape
    Hkv, hd = v.shape[2], v.shape[3]
    vt = _rows_contiguous(v.transpose(0, 2, 1, 3))            # [B, Hkv, S, hd]
    if Hkv == H and probs.dtype == v.dtype:
        # written token-major: the [B, H, T, hd] result is a view of a [B, T, H, hd] buffer, so the
        # heads merged side by side ([B, T, H*hd], the output projection's input) need no copy
        out = np.empty((B, T, H, hd), probs.dtype)
        batched_matmul(probs, vt, out=out.transpose(0, 2, 1, 3))
        return out.transpose(0, 2, 1, 3)
    return batched_matmul(probs.reshape(B, Hkv, (H // Hkv) * T, S), vt).reshape(B, H, T, hd)


def attention_forward(q, k, v, scale, allowed):
    """allowed: [T, S] bool from causal_mask, or None -> out [B, H, T, hd], cache (kq [B, H, T, S], probs [B, H, T, S])"""
    kq = attention_scores(q, k)
    probs = attention_probs(kq, scale, allowed)
    return attention_mix(probs, v), (kq, probs)


def attention_backward(dout, q, k, v, probs, scale, capped=None):
    """dout: [B, H, T, hd] -> dq [B, T, H, hd], dk, dv [B, S, Hkv, hd]

    capped: [B, H, T, S] tanh(scale*q.k / c) when the scores were soft-capped (Gemma 2):
    score = c*tanh(z/c) has derivative 1 - tanh^2 in z = scale*q.k."""
    B, T, H, hd = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    pg = probs.reshape(B, Hkv, G * T, S)
    dg = dout.reshape(B, Hkv, G * T, hd)
    vt = v.transpose(0, 2, 1, 3)                                # [B, Hkv, S, hd]
    dq, dk, dv = (np.empty(a.shape, np.result_type(dout, a)) for a in (q, k, v))   # token-major: [B, T|S, h, hd]
    heads = (lambda a: a.transpose(0, 2, 1, 3))                 # [B, T, h, hd] -> [B, h, T, hd] view
    batched_matmul(pg.transpose(0, 1, 3, 2), dg, out=heads(dv))              # [B, Hkv, S, hd]
    dprobs = batched_matmul(dg, vt.transpose(0, 1, 3, 2))       # [B, Hkv, G*T, S]
    # masked entries have prob 0 -> grad 0
    if capped is None and dprobs.dtype == np.float32 and pg.dtype == np.float32 and type(scale) in (float, np.float32):
        dscores = np.empty(dprobs.shape, np.float32)            # the softmax backward and the scale in one pass
        train_kernels.softmax_backward_rows(dprobs.reshape(-1, S), np.ascontiguousarray(pg).reshape(-1, S),
                                            dscores.reshape(-1, S), scale)
    else:
        dscores = softmax_backward(dprobs, pg)
        if capped is not None:
            dscores *= 1.0 - np.square(capped.reshape(dscores.shape))
        dscores *= scale
    qg = _group(q, Hkv).reshape(B, Hkv, G * T, hd)
    kk = k.transpose(0, 2, 1, 3)                                # [B, Hkv, S, hd]
    batched_matmul(dscores.transpose(0, 1, 3, 2), qg, out=heads(dk))         # [B, Hkv, S, hd]
    if G == 1:
        batched_matmul(dscores, kk, out=heads(dq))              # [B, H, T, hd]
    else:
        dqg = batched_matmul(dscores, kk)                       # [B, Hkv, G*T, hd]
        dq[...] = dqg.reshape(B, Hkv, G, T, hd).transpose(0, 3, 1, 2, 4).reshape(B, T, H, hd)
    return dq, dk, dv
