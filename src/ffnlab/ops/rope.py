"""Rotary position embedding (RoPE), in both pairings.

Dimension pair i (i < head_dim/2) of a head is rotated by angle pos * theta^(-2i/head_dim).
  normal: pairs are adjacent, (x[2i], x[2i+1])        -- llama.cpp LLAMA rope; llama-arch GGUF
          files have their Q/K rows permuted by the converter so that this pairing is right.
  neox:   pairs are half a head apart, (x[i], x[i+d/2]) -- HF rotate_half, llama.cpp NEOX rope.
The same rotation with the angle negated is the exact inverse, which is the backward.
Partial rotary (GPT-NeoX's rotary_pct, llama.cpp's n_rot < head_dim): angles for n_rot dims
(theta^(-2i/n_rot)) rotate the first n_rot dims of each head; the others pass through unchanged.
"""
import numpy as np

from .fastmath import rope_rows


def rope_angles(pos, head_dim, theta, scale=1.0, freq_factors=()):
    """pos: [T] -> cos, sin: [T, head_dim/2] (float64, cast by the caller)

    scale: linear scaling, positions divided by it; freq_factors: [hd/2] divisors of each
    frequency (Llama 3.x, llama.cpp's rope_freqs.weight), () for none."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # [hd/2]
    if len(freq_factors):
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)
    ang = (np.asarray(pos, dtype=np.float64) / scale)[:, None] * inv_freq[None, :]   # [T, hd/2]
    return np.cos(ang), np.sin(ang)


def _split(x, pairing):
    if pairing == "normal":
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def rope_forward(x, cos, sin, pairing="normal"):
    """x: [..., T, H, hd], cos/sin: [T, n_rot/2] -> [..., T, H, hd]; n_rot < hd rotates x[..., :n_rot] only"""
    n_rot = 2 * cos.shape[-1]
    if x.dtype == np.float32 and x.ndim >= 3 and x.size and pairing in ("normal", "neox"):
        # one compiled pass (a prefill's q and k: ~0.25 ms a layer in NumPy's passes, ~0.02 here)
        x4 = np.ascontiguousarray(x).reshape(-1, *x.shape[-3:])              # [B, T, H, hd]
        out = np.empty(x4.shape, np.float32)
        rope_rows(x4, np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin, np.float32),
                  pairing == "neox", out)
        return out.reshape(x.shape)
    if n_rot < x.shape[-1]:                                 # partial rotary: the tail passes through
        out = np.empty_like(x)
        out[..., n_rot:] = x[..., n_rot:]
        out[..., :n_rot] = rope_forward(np.ascontiguousarray(x[..., :n_rot]), cos, sin, pairing)
        return out
    if pairing == "normal" and x.strides[-1] == x.itemsize:
        # an adjacent pair (x0, x1) is the complex number x0 + i x1, and rotating it by the
        # angle is multiplying by cos + i sin: (x0 cos - x1 sin) + i (x0 sin + x1 cos).
        # One complex multiply instead of six real ones (decoding calls this once per layer).
        cplx = np.result_type(x.dtype, np.complex64)
        rot = np.empty(cos.shape, cplx)                     # [T, hd/2]
        rot.real, rot.imag = cos, sin
        return (x.view(cplx) * rot[:, None, :]).view(x.dtype)
    c = cos[:, None, :].astype(x.dtype, copy=False)         # [T, 1, hd/2] broadcast over heads
    s = sin[:, None, :].astype(x.dtype, copy=False)
    x0, x1 = _split(x, pairing)
    out = np.empty_like(x)
    y0, y1 = _split(out, pairing)                           # views into out: written in place
    np.multiply(x0, c, out=y0)
    y0 -= x1 * s                                            # x0 cos - x1 sin
    np.multiply(x0, s, out=y1)
    y1 += x1 * c                                            # x0 sin + x1 cos
    return out


def rope_backward(dy, cos, sin, pairing="normal"):
    """The transpose of a rotation is the rotation by -angle."""
    return rope_forward(dy, cos, -sin, pairing)
