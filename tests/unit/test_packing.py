"""Packed q/k/v and gate/up projections (inference speed) give the unpacked model's logits, and a
params entry replaced after packing makes the model fall back to the separate matmuls (and put
back, use the stack again)."""
import numpy as np

from ffnlab import Model, ModelConfig
from ffnlab.model.packing import BLAS_THREADED_MIN, pack
from ffnlab.model.params import init_params
from tolerances import f32_atol

CFG = ModelConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=64, ffn="swiglu", vocab_size=50, n_ctx=16)


def test_packed_logits_match_unpacked():
    ids = np.array([3, 1, 4, 1, 5, 9, 2, 6])
    plain = Model(CFG, init_params(CFG, seed=1))
    fast = Model(CFG, init_params(CFG, seed=1), pack_weights=True)
    assert sorted(fast.weights().stacks) == sorted((il, k) for il in range(CFG.n_layer)
                                                   for k in ("qkv", "attn_output", "gate_up"))
    for L in fast.weights().layers:                                  # the records read the stacks
        assert [parts for _, parts in L.qkv] == ["qkv"] and L.gate_up is not None
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
    buf, view = fast.weights().layers[0].wo_padded, fast.weights().layers[0].wo
    assert buf.shape == (800, 576) and buf.size >= BLAS_THREADED_MIN and not buf[576:].any()
    assert view.shape == (576, 576) and np.array_equal(view, plain.params["blk.0.attn_output.weight"])
    kv = fast.new_cache(n_ctx=4)
    fast.forward_last([1, 2], kv)
    want = plain.forward([1, 2, 3])[-1]
    np.testing.assert_allclose(fast.forward_last([3], kv), want, rtol=0, atol=f32_atol(cfg, want))
    small = Model(CFG, init_params(CFG, seed=4), pack_weights=True)     # 32 x 32: far below, not padded
    assert small.weights().layers[0].wo_padded.shape == (32, 32)


def test_replaced_tensor_disables_its_pack():
    ids = np.array([1, 2, 3, 4])
    fast = Model(CFG, init_params(CFG, seed=3), pack_weights=True)
    view = fast.params["blk.1.ffn_up.weight"]
    fast.params["blk.1.ffn_up.weight"] = view * 2.0                  # a new array, not a view of the pack
    assert fast.weights().layers[1].gate_up is None and fast.weights().layers[0].gate_up is not None
    plain = Model(CFG, {k: np.array(v) for k, v in fast.params.items()})
    want = plain.forward(ids)
    np.testing.assert_allclose(fast.forward(ids), want, rtol=0, atol=f32_atol(CFG, want))   # tests/reference/tolerances.py
    kv, kv_plain = fast.new_cache(), plain.new_cache()                # the one-token step reads the records too
    for t in ids:
        step, want = fast.forward_last([t], kv), plain.forward_last([t], kv_plain)
        np.testing.assert_allclose(step, want, rtol=0, atol=f32_atol(CFG, want))
    fast.params["blk.1.ffn_up.weight"] = view                        # put back: the stack serves again
    assert fast.weights().layers[1].gate_up is not None
