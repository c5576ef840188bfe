"""Every weight layout (quant/layout.py) answers the same questions with gguf-py's own values:
its groups as views, a tile of groups dequantized (as rows and transposed), rows looked up, its
size; for every type each layout holds, rows that do not fill the last 64-row group included.
The reference is gguf.quants.dequantize of the same blocks, compared exactly."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from ffnlab.quant import ggml_int8, ggml_int8_k, ggml_packed, ggml_packed_k, packed, simd
from ffnlab.quant.blocks import KERNEL_TYPES, Blocks, table_for
from ffnlab.quant.layout import R, Layout
from ffnlab.quant.types import TYPES
from quant_blocks import random_blocks

ROWS, N = 100, 512                     # two groups, the second one 36 rows


def f32_pack(qtype, data):
    return packed.pack(int(qtype), data, table_for(qtype), N)


def ggml_float_pack(qtype, data):
    return ggml_packed.pack(int(qtype), data, table_for(qtype), N, int8=False)


def ggml_int8_pack(qtype, data):
    return ggml_packed.pack(int(qtype), data, table_for(qtype), N, int8=True)


def file_blocks(qtype, data):
    return Blocks(qtype, data, table_for(qtype), N)


# (how it is made, the types it takes, the layout it makes): every layout, every type
MAKERS = [(file_blocks, [int(t) for t in KERNEL_TYPES], Blocks),
          (f32_pack, [t for t, r in TYPES.items() if r.layout], packed.Packed),
          (ggml_float_pack, [t for t, r in TYPES.items() if r.ggml_layout == "block32"], ggml_packed.Block32),
          (ggml_float_pack, [t for t, r in TYPES.items() if r.ggml_layout == "k"], ggml_packed_k.KPacked),
          (ggml_int8_pack, [t for t, r in TYPES.items() if r.ggml_layout == "block32"], ggml_int8.LanePacked),
          (ggml_int8_pack, [t for t, r in TYPES.items() if r.ggml_layout == "k"], ggml_int8_k.LaneKPacked)]
CASES = [(make, qtype, kind) for make, types, kind in MAKERS for qtype in types]


@pytest.mark.parametrize("make, qtype, kind", CASES,
                         ids=[f"{m.__name__}-{T(q).name}" for m, q, _ in CASES])
def test_every_layout_dequantizes_to_gguf_values(make, qtype, kind):
    if make is ggml_int8_pack and not simd.HAS_AVX2:
        pytest.skip("the lane layouts are made on CPUs with AVX2 only (ggml_packed.INT8)")
    data = random_blocks(qtype, ROWS, N, np.random.default_rng(int(qtype)))
    ref = gguf.quants.dequantize(data, T(qtype)).reshape(ROWS, N)
    P = make(qtype, data)
    assert isinstance(P, Layout) and type(P) is kind
    assert (P.rows, P.n, P.n_groups) == (ROWS, N, 2) and P.nbytes > 0

    scratch = (lambda size: np.empty(size, np.float32))
    rows = P.dequant_rows(0, 2, scratch)                                # [2 R, N]
    np.testing.assert_array_equal(rows[:ROWS], ref)
    np.testing.assert_array_equal(rows[ROWS:], 0)                      # the last group's padding rows
    t = np.empty((N, 2 * R), np.float32)
    P.dequant_t(0, 2, t)
    np.testing.assert_array_equal(t.T, rows)

    ids = np.array([0, 63, 64, 99, 7])
    out = np.empty((len(ids), N), np.float32)
    P.lookup(ids, out)
    np.testing.assert_array_equal(out, ref[ids])

    second = P.groups(1, 2)                                            # views of the second group
    assert type(second) is kind and (second.rows, second.n_groups) == (ROWS - R, 1)
    np.testing.assert_array_equal(second.dequant_rows(0, 1, scratch)[:ROWS - R], ref[R:])
    # a packed layout's groups are whole (the last one padded); the file's blocks hold its rows only
    assert second.nbytes * (2 if kind is not Blocks else ROWS) == P.nbytes * (1 if kind is not Blocks else ROWS - R)
    assert all(np.shares_memory(getattr(second, a), getattr(P, a))
               for a in kind.ARRAYS if getattr(P, a).size)


# the products each layout has: its arithmetic's (quant/layout.py's table; Block32 is a Packed, so it
# keeps Packed's float32 product); the other raises
PRODUCTS = {Blocks: ("mul", "mul_q8"), packed.Packed: ("mul",), ggml_packed.Block32: ("mul", "mul_q8"),
            ggml_packed_k.KPacked: ("mul_q8",), ggml_int8.LanePacked: ("mul_q8",), ggml_int8_k.LaneKPacked: ("mul_q8",)}


@pytest.mark.parametrize("kind", list(PRODUCTS), ids=[k.__name__ for k in PRODUCTS])
def test_every_layout_has_its_arithmetics_products(kind):
    for name in ("mul", "mul_q8"):
        overridden = getattr(kind, name) is not getattr(Layout, name)
        assert overridden == (name in PRODUCTS[kind]), (kind.__name__, name)
    if "mul" not in PRODUCTS[kind]:
        with pytest.raises(NotImplementedError, match="no float32 product"):
            Layout.mul(object.__new__(kind), np.zeros((1, N), np.float32))
