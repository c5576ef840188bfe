"""Every compiled kernel against gguf-py: gguf.quants.dequantize, then a float64 product.

Each test runs twice: on the blocks as they lie in the file (kernels.py's row kernels) and packed
row-interleaved (quant/packed.py, what a loaded model multiplies by). Shapes include a single row,
row counts that are not a multiple of the kernels' row blocks (ROWS_PER_TASK = 16, packed.R = 64)
and matrices that span several tiles. Error bound of a float32 product of
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
from ffnlab.quant import gemm, packed
from ffnlab.quant import blocks as quant_blocks
from ffnlab.quant import layout as quant_layout

EPS32 = np.finfo(np.float32).eps
TYPES = [t.name for t in KERNEL_TYPES]
SHAPES = [(1, 512), (37, 512), (64, 768), (130, 256)]   # [out, in]: one row; rows past the 4-, 16- and 64-row blocks


@pytest.fixture(params=["blocks", "packed"])
def layout(request):
    return request.param


def make(qtype, rows, n, seed=0, layout="blocks"):
    rng = np.random.default_rng(seed)
    data = random_blocks(T[qtype], rows, n, rng)
    ref = gguf.quants.dequantize(data, T[qtype]).reshape(rows, n).astype(np.float64)   # [rows, n]
    w = QuantTensor(data, T[qtype], (rows, n))
    if layout == "packed":
        w.pack()
    return w, ref, data


def bound(qtype, data, ref, x):
    """n * eps32 * sum_j (|w_j| + |block min_j|) |x_j| per output, + a denormal-size floor"""
    mag = (np.abs(ref) + offset_bound(T[qtype], data, ref.shape[1])) @ np.abs(x.T).astype(np.float64)
    return ref.shape[1] * EPS32 * mag + 1e-30


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantize_is_gguf_bit_for_bit(qtype, layout):
    w, ref, _ = make(qtype, 130, 512, layout=layout)
    np.testing.assert_array_equal(w.dequantize(), ref.astype(np.float32))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matvec_matches_float64_product(qtype, shape, layout):
    w, ref, data = make(qtype, *shape, layout=layout)
    x = np.random.default_rng(1).normal(0, 1, shape[1]).astype(np.float32)
    y = linear_forward(x, w)                                          # [out]
    assert y.shape == (shape[0],) and y.dtype == np.float32
    err = np.abs(y - ref @ x.astype(np.float64))
    assert (err <= bound(qtype, data, ref, x[None])[:, 0]).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q6_K"])
@pytest.mark.parametrize("shape", [(37, 512), (130, 256)])
def test_i8_matvec_widths_agree_bit_for_bit(qtype, shape):
    """packed.matvec_i8's 256- and 512-bit group kernels sum each row in the same order: the same
    float32 values, both within the float64 bound (both run on any CPU with AVX-512; the 512-bit one
    is skipped without it)"""
    from ffnlab.quant import simd
    w, ref, data = make(qtype, *shape, layout="packed")
    x = np.random.default_rng(3).normal(0, 1, shape[1]).astype(np.float32)
    P = w.packed
    ys = []
    for wide in ([False, True] if simd.HAS_AVX512 else [False]):
        y = np.empty(P.qs.shape[0] * packed.R, np.float32)
        packed.matvec_i8(P.qs, P.d, x, y, wide)
        err = np.abs(y[:shape[0]] - ref @ x.astype(np.float64))
        assert (err <= bound(qtype, data, ref, x[None])[:, 0]).all(), f"wide={wide}: max err {err.max():.3g}"
        ys.append(y[:shape[0]])
    for y in ys[1:]:
        np.testing.assert_array_equal(y, ys[0])


@pytest.mark.parametrize("qtype", TYPES)
def test_tiled_matmul_matches_float64_product(qtype, layout, monkeypatch):
    monkeypatch.setattr(quant_blocks, "TILE_BYTES", 16 * 4 * 768)   # 16-row tiles: 130 rows take nine
    monkeypatch.setattr(quant_layout, "PACKED_TILE_BYTES", 16 * 4 * 768)   # packed: one 64-row group each
    w, ref, data = make(qtype, 130, 768, layout=layout)
    x = np.random.default_rng(2).normal(0, 1, (2, 5, 768)).astype(np.float32)
    y = linear_forward(x, w, np.ones(130, np.float32))                # [2, 5, 768] -> [2, 5, 130]
    assert y.shape == (2, 5, 130)
    x2 = x.reshape(10, 768)
    err = np.abs(y.reshape(10, 130) - (x2.astype(np.float64) @ ref.T + 1))
    assert (err <= bound(qtype, data, ref, x2).T + 2 * EPS32).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_0", "Q6_K"])
@pytest.mark.parametrize("T", [7, 40])
@pytest.mark.parametrize("wide", [False, True])
def test_tiled_matmul_on_two_threads_matches_float64_product(qtype, T, wide, monkeypatch):
    """The packed prefill path on two threads: every tile, and every part of the tokens a tile
    is split into, computed once into its own place (130 rows: three row groups, the last partial;
    40 tokens: one tile of the three groups in two parts of 20 tokens, a part being at least two
    register tiles of tokens, 6 or 10). Both products: 512-bit (a block of 32 rows x 256
    positions dequantized into L1 at a time) and 256-bit (a whole tile dequantized, then multiplied)."""
    import numba
    from ffnlab import threads
    from ffnlab.quant import gemm, simd
    from ffnlab.quant.packed import tiling
    if wide and not simd.HAS_AVX512:
        pytest.skip("no AVX-512 on this CPU")
    monkeypatch.setattr(simd, "HAS_AVX512", wide)
    monkeypatch.setattr(gemm, "HAS_AVX512", wide)
    tiling.cache_clear()                                               # its parts depend on the tile's width
    monkeypatch.setattr(threads, "threads", lambda: 2)
    n_threads = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        w, ref, data = make(qtype, 130, 768, layout="packed")
        assert w.packed.tile_groups() == 3                                   # 3 groups of 64 rows x 768 x 4 bytes < 1 MB
        assert tiling(3, 3, T, 2) == {7: (2, 1), 40: (3, 2)}[T]
        x = np.random.default_rng(3).normal(0, 1, (T, 768)).astype(np.float32)
        y = w.matmul(x)                                               # [T, 130]
    finally:
        numba.set_num_threads(n_threads)
        tiling.cache_clear()
    err = np.abs(y - x.astype(np.float64) @ ref.T)
    assert (err <= bound(qtype, data, ref, x).T).all(), f"max err {err.max():.3g}"


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "F16"])
def test_row_lookup_reads_the_rows_asked_for(qtype, layout):
    w, ref, _ = make(qtype, 130, 512, layout=layout)
    ids = np.array([[3, 0, 129], [3, 5, 1]])
    np.testing.assert_array_equal(w[ids], ref[ids].astype(np.float32))             # [2, 3, 512]
    np.testing.assert_array_equal(w[7], ref[7].astype(np.float32))
    np.testing.assert_array_equal(w[5:9].dequantize(), ref[5:9].astype(np.float32))
    np.testing.assert_array_equal(w[64:130].dequantize(), ref[64:130].astype(np.float32))   # whole groups: packed views


@pytest.mark.parametrize("qtype", ["Q4_0", "Q5_K", "Q6_K"])
def test_stacked_parts_give_the_parts_products(qtype):
    """q/k/v stacked into one packed matrix (model/packing.py): one product gives each part's
    rows, and each part still multiplies alone through its view of the stacked layout."""
    parts = [make(qtype, rows, 512, seed=s) for s, rows in enumerate((128, 64, 37))]
    stacked = QuantTensor.stacked([w for w, _, _ in parts])
    assert stacked is not None and stacked.shape == (229, 512)
    ref = np.concatenate([r for _, r, _ in parts])
    x = np.random.default_rng(3).normal(0, 1, 512).astype(np.float32)
    data = np.concatenate([d.reshape(d.shape[0], -1) for _, _, d in parts])
    err = np.abs(stacked.matvec(x) - ref @ x.astype(np.float64))
    assert (err <= bound(qtype, data, ref, x[None])[:, 0]).all()
    np.testing.assert_array_equal(stacked.dequantize(), ref.astype(np.float32))
    for w, r, _ in parts:
        np.testing.assert_array_equal(w.dequantize(), r.astype(np.float32))
    assert QuantTensor.stacked([make(qtype, 37, 512)[0], make(qtype, 64, 512)[0]]) is None   # 37 rows: not whole groups


def test_packing_gives_back_only_a_read_only_file_mapping(tmp_path):
    """release_pages drops a read-only file mapping's pages (they read back the same bytes) and
    refuses anything else: MADV_DONTNEED on the process's own memory would zero it."""
    from ffnlab.quant.pages import release_pages
    _, _, data = make("Q4_0", 64, 4096)
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    assert release_pages(raw) == 0                                      # our own memory: untouched
    path = tmp_path / "blocks.bin"
    raw.tofile(path)
    mapped = np.memmap(path, mode="r")
    assert int(mapped.sum(dtype=np.int64)) == int(raw.sum(dtype=np.int64))   # pages read in
    assert release_pages(mapped) > 0
    np.testing.assert_array_equal(mapped, raw)                           # read again from the file


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


@pytest.mark.parametrize("qtype", [t.name for t in KERNEL_TYPES if int(t) in packed.PACKED_TYPES])
def test_both_strip_dequantizations_are_gguf_bit_for_bit(qtype):
    """quant/packed.py's strips in 512-bit registers (AVX-512) and in 256-bit halves: gguf-py's
    values exactly, whichever this CPU runs (both compile on any x86-64 with AVX2)"""
    w, ref, _ = make(qtype, 130, 512, layout="packed")
    P = w.packed
    G = P.qs.shape[0]
    want = np.zeros((G * packed.R, 512), np.float32)
    want[:130] = ref
    for wide in (True, False):
        out = np.empty((4 * G, 512, gemm.STRIP), np.float32)
        if P.kind == "nib":
            packed._dequant_nib(P.qs, P.qh, P.d, P.m, np.float32(P.zero), P.qh.shape[0] > 0, P.m.shape[0] > 0, 0, G,
                                out, wide)
        else:
            packed.dequant_i8_strips(P.qs, P.d, 0, G, out, wide)
        np.testing.assert_array_equal(gemm.strips_to_rows(out), want, err_msg=f"wide={wide}")


def test_work_counter_hands_out_every_item_once():
    """quant/simd.py fetch_add, the counter Packed.matmul's threads draw items from: on two
    threads drawing 10,000 items, every item is drawn exactly once"""
    import numba
    from numba import njit, prange
    from ffnlab.quant import simd

    @njit(parallel=True)
    def draw(n_items, workers, seen):
        counter = np.zeros(1, np.int64)
        for _ in prange(workers):
            i = simd.fetch_add(counter, 0, 1)
            while i < n_items:
                seen[i] += 1
                i = simd.fetch_add(counter, 0, 1)

    seen = np.zeros(10_000, np.int64)
    draw(10_000, min(2, numba.get_num_threads()), seen)
    assert np.all(seen == 1)                         # a counter copied per thread would draw each item twice


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_half_scale_types_keep_the_files_bytes(qtype):
    """Their d (and m) are the file's halves, kept as their 16 bits: the packed copy is exactly as
    large as the file's blocks (128 rows: whole groups), and dequantizes to gguf-py's values
    (the bit-for-bit test above); the K-quants' scales are products and stay float32."""
    w, _, data = make(qtype, 128, 512, layout="packed")
    assert w.packed.d.dtype == np.uint16 and w.packed.nbytes == data.nbytes
    k, _, _ = make("Q4_K", 128, 512, layout="packed")
    assert k.packed.d.dtype == np.float32
