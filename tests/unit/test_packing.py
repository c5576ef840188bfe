"""Packed q/k/v and gate/up projections (inference speed) give the unpacked model's logits, and a
params entry replaced after packing makes the model fall back to the separate matmuls."""
import numpy as np

from ffnlab import Model, ModelConfig
from ffnlab.model.packing import BLAS_THREADED_MIN, pack, packed
from ffnlab.model.params import init_params
from tolerances import f32_atol

CFG = ModelConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=64, ffn="swiglu", vocab_size=50, n_ctx=16)


def test_packed_logits_match_unpacked():
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    plain = Model(CFG, init_params(CFG, seed=1))
    fast = Model(CFG, init_params(CFG, seed=1), pack_weights=True)
    assert sorted(fast.packs) == sorted((il, k) for il in range(CFG.n_layer) for k in ("qkv", "attn_output", "gate_up"))
    want = plain.forward(ids)
    np.testing.assert_allclose(fast.forward(ids), want, rtol=0, atol=f32_atol(CFG, want))   # tests/reference/tolerances.py


def test_pack_keeps_tensor_values_and_shares_memory():
    p = init_params(CFG, seed=2)
    before = {k: v.copy() for k, v in p.items()}
    packs = pack(p, CFG)
    for k in p:
        assert np.array_equal(p[k], before[k]), k
    buf, views = packs[(0, "gate_up")]
    assert views[0] is p["blk.0.ffn_gate.weight"] and views[1] is p["blk.0.ffn_up.weight"]
    assert np.shares_memory(p["blk.0.ffn_gate.weight"], buf) and np.shares_memory(p["blk.0.ffn_up.weight"], buf)
    assert buf.flags.f_contiguous and p["blk.0.ffn_down.weight"].flags.c_contiguous   # tall: column-major


def test_padded_matrix_runs_on_the_threshold_and_keeps_its_values():
    """A matrix under BLAS_THREADED_MIN but within 1.5x of it gets zero rows up to it (so OpenBLAS
    splits its gemv across threads); the params entry stays the real rows, and decoding gives
    the unpadded model's logits."""
    cfg = ModelConfig(n_layer=1, d_model=576, n_head=9, n_kv_head=3, d_ff=64, ffn="swiglu", vocab_size=50, n_ctx=8)
    plain = Model(cfg, init_params(cfg, seed=4))
    fast = Model(cfg, init_params(cfg, seed=4), pack_weights=True)
    buf, (view,) = fast.packs[(0, "attn_output")]
    assert buf.shape == (800, 576) and buf.size >= BLAS_THREADED_MIN and not buf[576:].any()
    assert view.shape == (576, 576) and np.array_equal(view, plain.params["blk.0.attn_output.weight"])
    kv = fast.new_cache(n_ctx=4)
    fast.forward_last([1, 2], kv)
    want = plain.forward([1, 2, 3])[-1]
    np.testing.assert_allclose(fast.forward_last([3], kv), want, rtol=0, atol=f32_atol(cfg, want))
    small = Model(CFG, init_params(CFG, seed=4), pack_weights=True)     # 32 x 32: far below, not padded
    assert small.packs[(0, "attn_output")][0].shape == (32, 32)


def test_replaced_tensor_disables_its_pack():
    ids = np.array([1, 2, 3, 4])
    fast = Model(CFG, init_params(CFG, seed=3), pack_weights=True)
    new_up = fast.params["blk.1.ffn_up.weight"] * 2.0            # a new array, not a view of the pack
    fast.params["blk.1.ffn_up.weight"] = new_up
    names = ("blk.1.ffn_gate.weight", "blk.1.ffn_up.weight")
    assert packed(fast.packs, fast.params, 1, "gate_up", names) is None
    plain = Model(CFG, {k: np.array(v) for k, v in fast.params.items()})
    want = plain.forward(ids)
    np.testing.assert_allclose(fast.forward(ids), want, rtol=0, atol=f32_atol(CFG, want))   # tests/reference/tolerances.py
