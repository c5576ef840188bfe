"""ops/ggml_decode.attend1, one token's attention in ggml mode, against the general ggml ops it
stands for, on every path's lane width: KQ and KQV as ggml_vec_dot_f16 (ggml_math.vec_dot_f16
over the f16-rounded operands, KQV's rows padded with zeros to 64 cells) and ggml's softmax
(ggml_math._soft_max_row). attend1 runs a row's dots side by side; the bits must not move.
Then against float64 attention, with a bound from the f16 roundings."""
import numpy as np
import pytest

from ffnlab.ops import ggml_decode, ggml_math
from ffnlab.quant.blocks import F16_TABLE


def reference(q, K, V, n, lo, scale, lanes):
    """the dot-by-dot ggml computation: q [H, hd] float32, K / V [Hkv, n_ctx, hd] float16"""
    H, hd = q.shape
    Hkv = K.shape[0]
    S = n + 1
    pad = S + (-S % 64)
    acc = np.empty(64, np.float32)
    out = np.empty((H, hd), np.float32)
    scratch = np.empty(3 * S, np.int32)
    for h in range(H):
        g = h // (H // Hkv)
        qh = q[h].astype(np.float16).astype(np.float32)                # mul_mat's src1 in f16
        kf = K[g, :S].astype(np.float32)
        kq = np.array([ggml_math.vec_dot_f16(kf[t], qh, lanes, acc) for t in range(S)], np.float32)
        w = kq * np.float32(scale)
        w[:lo] = -np.inf
        p = np.empty(S, np.float32)
        ggml_math._soft_max_row(w, p, lanes, scratch)
        p16 = np.zeros(pad, np.float32)
        p16[:S] = p.astype(np.float16).astype(np.float32)
        vcol = np.zeros(pad, np.float32)
        for j in range(hd):
            vcol[:S] = V[g, :S, j].astype(np.float32)
            out[h, j] = ggml_math.vec_dot_f16(vcol, p16, lanes, acc)
    return out


@pytest.mark.parametrize("lanes", [16, 8, 1])
@pytest.mark.parametrize("H, Hkv, hd, n, lo", [(9, 3, 64, 95, 0), (4, 1, 256, 40, 0), (2, 2, 80, 130, 7),
                                                (8, 2, 64, 0, 0), (3, 3, 32, 63, 60)])
def test_attend1_is_the_dot_by_dot_computation(lanes, H, Hkv, hd, n, lo):
    rng = np.random.default_rng(n + hd + lanes)
    n_ctx = n + 5
    K = (rng.standard_normal((Hkv, n_ctx, hd)) * 2).astype(np.float16)
    V = rng.standard_normal((Hkv, n_ctx, hd)).astype(np.float16)
    q = (rng.standard_normal((H, hd)) * 2).astype(np.float32)
    scale = 1.0 / np.sqrt(hd)
    out = np.empty((H, hd), np.float32)
    ggml_decode.attend1(q, K.view(np.uint16), V.view(np.uint16), F16_TABLE, n, lo, scale, out, lanes)
    want = reference(q, K, V, n, lo, scale, lanes)
    assert np.array_equal(out.view(np.uint32), want.view(np.uint32))
    # and the attention it computes: float64 softmax(q k / sqrt(hd)) v over positions lo..n.
    # q and p are rounded to f16 (relative 2^-11 each); the scores reach |q.k| scale <= ~ a few,
    # so the probabilities move by ~ 2^-11 (1 + |score|) relatively, and the output, an average
    # of |v| <= ~4, by the sum of those: 4 * 2^-11 * (2 + max |score|) bounds every element.
    g = np.arange(H) // (H // Hkv)
    k64, v64 = K[g, lo:n + 1].astype(np.float64), V[g, lo:n + 1].astype(np.float64)
    s = np.einsum("hd,hsd->hs", q.astype(np.float64), k64) * scale
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    exact = np.einsum("hs,hsd->hd", p, v64)
    bound = 4 * 2.0 ** -11 * (2 + np.abs(s).max()) * max(1.0, np.abs(v64).max())
    assert np.abs(out - exact).max() <= bound
