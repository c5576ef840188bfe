"""Every compiled kernel against gguf-py: gguf.quants.dequantize, then a float64 product.

Shapes include a single row, a row count that is not a multiple of the kernels' row block
(ROWS_PER_TASK = 16) and one that spans several tiles. Error bound of a float32 product of
length n (each partial sum rounds once per add, in any order): |y - y64| <= n * eps32 * sum|w x|,
with the block minima added where a kernel factors them out (see quant_blocks.offset_bound).
"""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from quant_blocks import offset_bound, random_blocks

from ffnlab.ops.linear import linear_forward
from ffnlab.quant import KERNEL_TYPES, QuantTensor
from ffnlab.quant import tensor as quant_tensor

EPS32 = np.finfo(np.float32).eps
TYPES = [t.name for t in KERNEL_TYPES]
SHAPES = [(1, 512), (37, 512), (64, 768)]        # [out, in]: one row; rows past the 4-row and 16-row blocks; in = whole 256-blocks


def make(qtype, rows, n, seed=0):
    rng = np.random.default_rng(seed)
    data = random_blocks(T[qtype], rows, n, rng)
    ref = gguf.quants.dequantize(data, T[qtype]).reshape(rows, n).astype(np.float64)   # [rows, n]
    return QuantTensor(data, T[qtype], (rows, n)), ref, data


def bound(qtype, data, ref, x):
    """n * eps32 * sum_j (|w_j| + |block min_j|) |x_j| per output, + a denormal-size floor"""
    mag = (np.abs(ref) + offset_bound(T[qtype], data, ref.shape[1])) @ np.abs(x.T).astype(np.float64)
    return ref.shape[1] * EPS32 * mag + 1e-30


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_is_gguf_bit_for_bit(qtype):
    w, ref, _ = make(qtype, 37, 512)
    np.testing.assert_array_equal(w.dequantize(), ref.astype(np.float32))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matvec_matches_float64_product(qtype, shape):
    w, ref, data = make(qtype, *shape)
    x = np.random.default_rng(1).normal(0, 1, shape[1]).astype(np.float32)
    y = linear_forward(x, w)                                          # [out]
    assert y.shape == (shape[0],) and y.dtype == np.float32
    err = np.abs(y - ref @ x.astype(np.float64))
    assert (err <= bound(qtype, data, ref, x[None])[:, 0]).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("qtype", TYPES)
def test_tiled_matmul_matches_float64_product(qtype, monkeypatch):
    monkeypatch.setattr(quant_tensor, "TILE_BYTES", 16 * 4 * 768)   # 16-row tiles: 64 rows take four
    w, ref, data = make(qtype, 64, 768)
    x = np.random.default_rng(2).normal(0, 1, (2, 5, 768)).astype(np.float32)
    y = linear_forward(x, w, np.ones(64, np.float32))                 # [2, 5, 768] -> [2, 5, 64]
    assert y.shape == (2, 5, 64)
    x2 = x.reshape(10, 768)
    err = np.abs(y.reshape(10, 64) - (x2.astype(np.float64) @ ref.T + 1))
    assert (err <= bound(qtype, data, ref, x2).T + 2 * EPS32).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "F16"])
def test_row_lookup_reads_the_rows_asked_for(qtype):
    w, ref, _ = make(qtype, 37, 512)
    ids = np.array([[3, 0, 36], [3, 5, 1]])
    np.testing.assert_array_equal(w[ids], ref[ids].astype(np.float32))             # [2, 3, 512]
    np.testing.assert_array_equal(w[7], ref[7].astype(np.float32))
    np.testing.assert_array_equal(w[5:9].dequantize(), ref[5:9].astype(np.float32))


def test_a_quant_tensor_never_becomes_a_float_array_silently():
    w, _, _ = make("Q4_0", 4, 256)
    with pytest.raises(TypeError, match="dequantize"):
        np.asarray(w)


def test_blocks_that_do_not_fill_the_shape_are_refused():
    _, _, data = make("Q4_0", 4, 256)
    with pytest.raises(ValueError, match="needs"):
        QuantTensor(data[:3], T.Q4_0, (4, 256))
    with pytest.raises(ValueError, match="whole number"):
        QuantTensor(data, T.Q4_K, (4, 100))
