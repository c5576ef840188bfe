"""A model whose weights stay in their GGUF blocks against the same file dequantized at load.

The two paths run the same float32 arithmetic on the same weight values (QuantTensor's
dequantize() is gguf-py's bit for bit, tests/unit/test_quant_kernels.py); they differ only in the
order of the float32 sums inside each product (blocks of 32 in the kernels, BLAS's order in the
float path). Each product then differs by ~sqrt(n) * eps32 ~ 1.4e-6 of its size (n = 512, random
rounding), compounded over two layers of seven products, attention and the norms: relative to
the largest logit we see 1e-7..1.7e-5 and bound it by 4e-5 (the random models' logits reach ~25,
so that is ~1e-3 absolute; on SmolLM2 tests/engines/test_real_models.py holds the absolute 1e-4).
"""
import os
import subprocess
import sys
import tracemalloc

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from models import tiny_gguf
from quant_blocks import fill_random_blocks

import ffnlab
from ffnlab.model.params import param_shapes
from ffnlab.model.weights import model_weights
from ffnlab.quant import QuantTensor
from ffnlab.quant import blocks as quant_blocks
from ffnlab.quant import layout as quant_layout

from quant_models import SHAPE, quant_model


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                                   "F16", "BF16"])
def test_quantized_forward_matches_the_dequantized_one(tmp_path, qtype):
    path = quant_model(tmp_path, qtype)
    q, f = ffnlab.load(path), ffnlab.load(path, dequantize=True)
    assert isinstance(q.params["blk.0.ffn_up.weight"], QuantTensor)
    assert isinstance(f.params["blk.0.ffn_up.weight"], np.ndarray)
    ids = np.array([0, 5, 70, 200, 9, 33, 101, 7, 64, 3])
    want = f.forward(ids)                                            # [T, vocab]
    tol = 4e-5 * np.abs(want).max()
    assert np.abs(q.forward(ids) - want).max() <= tol               # prefill: tiles through BLAS
    kv = q.new_cache()
    steps = [q.forward_last(ids[:1], kv)] + [q.forward_last(ids[i:i + 1], kv) for i in range(1, len(ids))]
    assert np.abs(np.stack(steps) - want).max() <= tol              # decode: the matvec kernels, one token at a time


def test_load_maps_the_blocks_without_copying_them(tmp_path):
    path = quant_model(tmp_path, "Q4_K")
    m = ffnlab.load(path)
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        w = m.params[t.name]
        if len(t.shape) == 2:
            assert isinstance(w, QuantTensor) and w.qtype == T.Q4_K
            assert not w.data.flags.owndata and not w.data.flags.writeable    # a read-only view of the mapped file
            np.testing.assert_array_equal(w.data.reshape(-1), t.data.reshape(-1))


def test_training_refuses_quantized_weights_with_one_line(tmp_path):
    from ffnlab.ops.linear import linear_backward
    w = ffnlab.load(quant_model(tmp_path, "Q8_0")).params["blk.0.ffn_up.weight"]
    with pytest.raises(TypeError, match="dequantize=True"):
        linear_backward(np.ones((1, 512), np.float32), np.ones((1, 256), np.float32), w)


def test_a_product_never_makes_a_float32_copy_of_a_weight_matrix(tmp_path, monkeypatch):
    """tracemalloc sees every NumPy allocation. Loading allocates the packed blocks
    (quant/packed.py: Q4_0 as 16 code bytes and a float32 scale per 32 weights, 0.625 bytes a
    weight against float32's 4) and nothing else of a matrix's size; an 8-token prefill and 4
    decoding steps then allocate less than a float32 copy of the smallest block matrix
    (attention 1024 x 1024 x 4 bytes = 4.2 MB; FFN 16.8 MB): the activations come to ~1.6 MB and
    a prefill tile is one 64-row group, 64 x 4096 x 4 bytes = 1 MB for ffn_down. The embedding
    (258 rows, 1.06 MB as float32) is read row by row: test_quant_kernels checks w[ids]."""
    monkeypatch.setenv("FFNLAB_PACK_CACHE_MB", "0")                  # pack at load (not mapped from the cache)
    monkeypatch.setattr(quant_blocks, "TILE_BYTES", 1 << 17)        # 128 KB prefill tiles
    monkeypatch.setattr(quant_layout, "PACKED_TILE_BYTES", 1 << 17)  # packed: one 64-row group per tile
    path = quant_model(tmp_path, "Q4_0", d_model=1024, d_ff=4096, n_head=8, n_kv_head=8)
    shapes = {n: s for n, s in param_shapes(ffnlab.load(path).config).items() if n.startswith("blk.") and len(s) == 2}
    smallest = min(int(np.prod(s)) for s in shapes.values()) * 4
    weights = sum(int(np.prod(s)) for s in shapes.values())
    tracemalloc.start()
    m = ffnlab.load(path)
    _, load_peak = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    base, _ = tracemalloc.get_traced_memory()
    m.generate(list(range(2, 10)), n_predict=4, temp=0)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    packed = sum(w.packed.nbytes for n, w in m.params.items() if n in shapes)
    assert packed <= 0.625 * weights * 1.01, f"{packed / weights:.3f} packed bytes per weight"   # + the row padding
    assert load_peak < packed + 0.5 * smallest, f"load peak {load_peak / 1e6:.2f} MB, packed {packed / 1e6:.2f} MB"
    assert peak - base < smallest, f"peak {(peak - base) / 1e6:.2f} MB traced, a float32 matrix is {smallest / 1e6:.2f} MB"


RSS_SCRIPT = """
import resource, sys, numpy as np, ffnlab
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
m = ffnlab.load(sys.argv[1])
m.generate(list(range(2, 34)), n_predict=4, temp=0)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
"""


def test_peak_resident_memory_stays_near_the_file_size(tmp_path):
    """Peak RSS of a fresh process that loads a model and generates, measured by the kernel:
    the blocks (34 MB of Q4_0) plus working memory, far below the 257 MB float32 weights."""
    path = quant_model(tmp_path, "Q4_0", d_model=1024, d_ff=4096, n_head=8, n_kv_head=8, n_layer=4)
    f32 = sum(int(np.prod(s)) for s in param_shapes(ffnlab.load(path).config).values()) * 4
    grown = int(subprocess.run([sys.executable, "-c", RSS_SCRIPT, path], capture_output=True, text=True,
                               check=True, env=os.environ).stdout.split()[-1])
    size = os.path.getsize(path)
    assert grown < size + 40e6, f"RSS grew {grown / 1e6:.0f} MB for a {size / 1e6:.0f} MB file ({f32 / 1e6:.0f} MB as float32)"


def test_a_type_without_a_kernel_is_dequantized_at_load_with_one_line(tmp_path, capsys):
    """IQ4_NL: gguf-py dequantizes it, ffnlab has no kernel for it; the rest stays in blocks."""
    path = tiny_gguf(tmp_path / "iq.gguf", tensor_types={"blk.0.ffn_up.weight": T.IQ4_NL,
                                                        "blk.1.ffn_up.weight": T.IQ4_NL,
                                                        "blk.0.ffn_down.weight": T.Q8_0}, **SHAPE)
    m = ffnlab.load(path)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "IQ4_NL" in ln]
    assert len(lines) == 1 and "blk.0.ffn_up.weight" in lines[0] and "no kernel" in lines[0], lines
    assert isinstance(m.params["blk.0.ffn_up.weight"], np.ndarray)           # zero blocks -> zeros
    assert not m.params["blk.0.ffn_up.weight"].any()
    assert isinstance(m.params["blk.0.ffn_down.weight"], QuantTensor)


def test_q_and_k_are_stacked_when_v_has_another_type(tmp_path):
    """Gemma 3's Q4_K_M has Q5_0 q and k beside a Q8_0 or Q6_K v: q and k are then one stacked
    product ("qk"), which gives each row exactly the sums of the separate products (a row's dot
    product does not depend on the rows beside it), prompt and one-token decode alike."""
    from ffnlab.config import ModelConfig
    from models import TINY
    cfg = dict(SHAPE)
    matrices = [n for n, s in param_shapes(ModelConfig(**{**TINY, **cfg})).items() if len(s) == 2]
    types = {n: T.Q8_0 if n.endswith("attn_v.weight") else T.Q5_0 for n in matrices}
    path = fill_random_blocks(tiny_gguf(tmp_path / "qk.gguf", tensor_types=types, **cfg))
    stacked, apart = ffnlab.load(path), ffnlab.load(path)
    n_layer = stacked.config.n_layer
    layers = stacked.weights().layers
    assert len(layers) == n_layer and all([parts for _, parts in L.qkv] == ["qk", "v"] for L in layers)
    for il, L in enumerate(layers):
        stack = L.qkv[0][0]
        assert L.q is stacked.params[f"blk.{il}.attn_q.weight"] and L.q.stack is stack and L.k.stack is stack
    apart._weights = model_weights(apart.params, apart.config)      # no stacks: q and k multiplied apart
    assert all(len(L.qkv) == 3 for L in apart.weights().layers)
    ids = np.array([0, 5, 70, 200, 9, 33, 101, 7, 64, 3])
    assert np.array_equal(stacked.forward(ids), apart.forward(ids))
    kv_s, kv_a = stacked.new_cache(), apart.new_cache()
    for i in range(len(ids)):
        assert np.array_equal(stacked.forward_last(ids[i:i + 1], kv_s), apart.forward_last(ids[i:i + 1], kv_a))
