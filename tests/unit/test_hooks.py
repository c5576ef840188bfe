"""ffnlab.hooks: editing named nodes (model/hooks.py, interventions/api.py).

The references: the same forward with nothing attached (an identity hook must not change a bit),
a model whose weights make the edit (zeroing ffn_out-L is zeroing layer L's down projection),
and the full recomputation of a sequence (a hooked generation with the KV cache must pick the
same tokens as recomputing every prefix without it).
"""
import dataclasses

import numpy as np
import pytest

import ffnlab
from ffnlab.errors import UsageError
from ffnlab.generation import SamplingParams
from ffnlab.model import Model
from ffnlab.interventions import node_names
from block_checks import CONFIGS, random_params

IDS = np.array([3, 7, 1, 9, 4, 2, 8])


def model(arch, **changes):
    cfg = dataclasses.replace(CONFIGS[arch], **changes)
    return Model(cfg, random_params(cfg))


@pytest.mark.parametrize("arch", list(CONFIGS))
@pytest.mark.parametrize("identity", ["none", "same", "copy"])
def test_identity_hook_on_every_node_leaves_logits_bit_identical(arch, identity):
    m = model(arch)
    plain = m.forward(IDS)
    kv = m.new_cache()
    plain_last = [m.forward_last(IDS[:5], kv), m.forward_last(IDS[5:6], kv)]
    fn = {"none": lambda v, n, p: None, "same": lambda v, n, p: v, "copy": lambda v, n, p: v.copy()}[identity]
    seen = []
    with ffnlab.hooks(m, {".*": lambda v, n, p: (seen.append(n), fn(v, n, p))[1]}):
        hooked = m.forward(IDS)
        kv = m.new_cache()
        hooked_last = [m.forward_last(IDS[:5], kv), m.forward_last(IDS[5:6], kv)]
    assert len(set(seen)) == len(node_names(m))                 # every node went through the hook
    assert np.array_equal(plain, hooked)
    # forward_last: unhooked, the prompt's last block runs for its last position alone
    # (model/transformer.py), and the one-token step takes the fast path; hooked, the general path
    # runs every position. Same math, other kernels (a one-row product is BLAS's gemv): float32 rounding
    for a, b in zip(hooked_last, plain_last):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max())


# GPT-NeoX's parallel residual has two ffn_out-L nodes, as llama.cpp names them (the FFN's output, then
# that plus the block input): zeroing the name zeroes both; test_parallel_residual_has_two_ffn_out_nodes
@pytest.mark.parametrize("arch", [a for a in CONFIGS if not CONFIGS[a].parallel_residual])
def test_zeroing_ffn_out_is_zeroing_the_down_projection(arch):
    L = 1
    m = model(arch)
    p0 = dict(m.params)
    for name in (f"blk.{L}.ffn_down.weight", f"blk.{L}.ffn_down.bias"):
        if name in p0:
            p0[name] = np.zeros_like(p0[name])
    want = Model(m.config, p0).forward(IDS)
    with ffnlab.hooks(m, {f"ffn_out-{L}": lambda v, n, p: np.zeros_like(v)}):
        got = m.forward(IDS)
    assert np.array_equal(got, want)
    assert not np.array_equal(got, m.forward(IDS))              # and it did change something


def test_parallel_residual_has_two_ffn_out_nodes():
    """llama.cpp's gptneox graph: ffn_out = ffn(ffn_norm(x)), ffn_out = ffn_out + x, l_out = ffn_out + attn_out."""
    m = model("gptneox")
    with ffnlab.trace(m) as t:
        m.forward(IDS)
    L = 1
    outs = [n for n in t.nodes if n.name == f"ffn_out-{L}"]
    assert len(outs) == 2
    inp = t[f"l_out-{L - 1}"]
    # each node is one float32 addition of the other two: it rounds by at most eps32/2 of its own size
    def one_add(total, a, b):
        np.testing.assert_allclose(total, a + b, rtol=0, atol=np.finfo(np.float32).eps * np.abs(a + b).max())
    one_add(outs[1].array, outs[0].array, inp)
    one_add(t[f"l_out-{L}"], outs[1].array, t[f"attn_out-{L}"])


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_steering_gives_the_same_tokens_with_the_kv_cache_and_recomputed(arch):
    m = model(arch)
    d = m.config.d_model
    vec = (3.0 * np.random.default_rng(7).normal(size=d)).astype(np.float32)
    calls = []

    def steer(value, name, positions):
        calls.append(list(positions))
        return value + vec                                       # [T, d_model] + [d_model]

    prompt, n = [5, 11, 2], 8
    greedy = SamplingParams(temp=0)
    plain = m.generate(prompt, n, greedy).ids
    with ffnlab.hooks(m, {"l_out-0": steer}):
        cached = m.generate(prompt, n, greedy).ids               # prefill, then one token per step
        assert calls[0] == [0, 1, 2] and calls[1] == [3]          # the decode steps were hooked too
        recomputed = []
        for _ in range(n):                                       # every prefix in full, no cache
            recomputed.append(int(np.argmax(m.forward(np.array(prompt + recomputed))[-1])))
    assert cached == recomputed
    assert cached != plain                                       # the steering vector mattered


def test_hooks_and_trace_combine_the_trace_sees_the_edit():
    m = model("llama")
    with ffnlab.trace(m, filter="ffn_out-1|l_out-1") as t, ffnlab.hooks(m, {"ffn_out-1": lambda v, n, p: 0 * v}):
        m.forward(IDS)
    assert not t["ffn_out-1"].any()
    with ffnlab.trace(m, filter="ffn_inp-1") as t0:
        m.forward(IDS)
    assert np.array_equal(t["l_out-1"], t0["ffn_inp-1"])         # l_out = ffn_inp + 0
    assert not m.hooks                                           # both detached


def test_regex_patterns_match_in_full_and_positions_are_absolute():
    m = model("llama")
    seen = {}
    with ffnlab.hooks(m, {r"ffn_(up|gate)-\d+": lambda v, n, p: seen.update({n: (v.shape, list(p))})}):
        kv = m.new_cache()
        m.forward_last(IDS[:4], kv)
    assert sorted(seen) == ["ffn_gate-0", "ffn_gate-1", "ffn_up-0", "ffn_up-1"]   # not ffn_up_b, not ffn_out
    assert seen["ffn_up-0"] == ((4, m.config.d_ff), [0, 1, 2, 3])


@pytest.mark.parametrize("fns,msg", [
    ({"ffn_ot-1": lambda v, n, p: None}, "hook pattern 'ffn_ot-1' matches no node"),
    ({"ffn_out-9": lambda v, n, p: None}, "matches no node"),
    ({"ffn_(": lambda v, n, p: None}, "is not a regular expression"),
    ({"ffn_out-1": 3}, "is not callable"),
])
def test_bad_patterns_are_one_line(fns, msg):
    m = model("llama")
    with pytest.raises(UsageError, match=msg.replace("(", r"\(")) as e:
        with ffnlab.hooks(m, fns):
            pass
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("fn,msg", [
    (lambda v, n, p: v[:, :3], r"the hook on ffn_out-1 returned an array of shape \(7, 3\) float32; expected \(7, 32\) float32"),
    (lambda v, n, p: v.astype(np.float64), "float64; expected"),
    (lambda v, n, p: [0.0] * 32, "returned a list; expected None or an array"),
])
def test_a_hook_returning_the_wrong_shape_or_dtype_is_one_line(fn, msg):
    m = model("llama")
    with pytest.raises(UsageError, match=msg) as e, ffnlab.hooks(m, {"ffn_out-1": fn}):
        m.forward(IDS)
    assert "\n" not in str(e.value)


# --- the node table (model/nodes.py): a hook call that only names its node --------------------
def traced_nodes(m, ids=IDS):
    with ffnlab.trace(m) as t:
        m.forward(ids)
    return {(n.name, n.op): [s for s, _ in n.srcs] for n in t.nodes}


def test_first_of_sources_follow_the_bias_the_block_has():
    """ffn_gelu reads ffn_up_b where the up bias exists and ffn_up where it does not; the GLU
    reads the gate and up nodes as the block emitted them."""
    with_b = traced_nodes(model("gpt2"))
    without_b = traced_nodes(model("gpt2", ffn_bias=False, attn_bias=False, attn_out_bias=False))
    assert with_b[("ffn_gelu-0", "GELU")] == ["ffn_up_b-0"]
    assert without_b[("ffn_gelu-0", "GELU")] == ["ffn_up-0"]
    assert with_b[("ffn_down-0", "MUL_MAT")] == ["blk.0.ffn_down.weight", "ffn_gelu-0"]
    assert without_b[("ffn_out-0", "MUL_MAT")] == ["blk.0.ffn_down.weight", "ffn_gelu-0"]
    gated = traced_nodes(model("llama"))
    assert gated[("ffn_swiglu-1", "SWIGLU")] == ["ffn_gate-1", "ffn_up-1"]
    assert gated[("kq_soft_max-1", "SOFT_MAX")] == ["kq-1", "attn_inp_kq_mask"]
    capped = traced_nodes(model("gemma2"))
    assert capped[("kq_soft_max-0", "SOFT_MAX")] == ["kq_scaled_2-0", "attn_inp_kq_mask"]


def test_gelu_node_takes_its_op_from_the_ffn_kind():
    """ffn_gelu is GELU_ERF for the exact GELU and GELU for the tanh form (kinds.py), as llama.cpp
    prints ggml_gelu_erf and ggml_gelu."""
    ops = {op for name, op in traced_nodes(model("gpt2", ffn="gelu")) if name == "ffn_gelu-0"}
    assert ops == {"GELU_ERF"}
    ops = {op for name, op in traced_nodes(model("gpt2", ffn="gelu_tanh")) if name == "ffn_gelu-0"}
    assert ops == {"GELU"}


def test_a_lora_adapted_product_is_an_add_after_its_delta():
    """llama.cpp's build_lora_mm names base + scale * B A x: the node is an ADD, the base
    product alone (no adapter) a MUL_MAT."""
    from ffnlab.training.lora import attach, init_adapters
    m = model("llama")
    adapters = init_adapters(m.params, m.config, ["attn_q", "ffn_down"], 2)
    nodes = traced_nodes(Model(m.config, attach(m.params, adapters, 2.0)))
    assert ("Qcur-0", "ADD") in nodes and ("Qcur-0", "MUL_MAT") not in nodes
    assert ("ffn_out-1", "ADD") in nodes and ("ffn_out-1", "MUL_MAT") not in nodes
    assert nodes[("Qcur_lora_scaled-0", "SCALE")] == ["Qcur_lora_b-0"]
    assert ("Kcur-0", "MUL_MAT") in nodes and ("ffn_up-0", "MUL_MAT") in nodes


def test_a_node_missing_from_the_table_must_give_its_op():
    from ffnlab.model.hooks import Hooks
    from ffnlab.tracing.tracer import Tracer
    hook = Hooks(Tracer()).point(0, np.arange(2))
    with pytest.raises(KeyError, match="no_such_node"):
        hook("no_such_node", np.zeros((1, 2, 3), np.float32))
    x = hook("no_such_node", np.zeros((1, 2, 3), np.float32), "SCALE", ("ffn_out",))   # op and srcs given
    assert x.shape == (1, 2, 3)
