"""ffnlab.trace and `ffnlab trace`: the eval-callback line format, values, layouts, dump, check-finite.

References: llama.cpp's printer (common/debug.cpp) is quoted as its printf format string and
applied with Python's % operator; the value block is written out by hand from the same C loop;
the GLU node is recomputed from the traced gate and up. Real-model node order against llama.cpp
is in test_trace_llamacpp.py.
"""
import json
import math

import numpy as np
import pytest

import ffnlab
from export_helpers import GPT2, LLAMA, config, lively_params
from ffnlab.cli.main import main
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.tracing import NonFiniteError, Node
from ffnlab.tracing.dump import load_dump
from ffnlab.tracing.format import ggml_line, ggml_sum, logical_line, values_block
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

# llama.cpp common/debug.cpp, common_debug_cb_eval:
#   LOG("%s: %24s = (%s) %10s(%s{%s}, %s}) = {%s}\n", __func__, t->name, ggml_type_name(t->type),
#       ggml_op_desc(t), src0->name, ne(src0), src1 ? src1_str : "", ne(t));   src1_str = "%s{%s}"
LLAMA_CPP_FORMAT = "%s: %24s = (%s) %10s(%s{%s}, %s}) = {%s}"


def test_ggml_line_is_llama_eval_callback_printf():
    node = Node("ffn_up-0", "MUL_MAT", (2, 3072), "float32", [("blk.0.ffn_up.weight", (3072, 768)), ("ffn_norm-0", (2, 768))])
    want = LLAMA_CPP_FORMAT % ("common_debug_cb_eval", "ffn_up-0", "f32", "MUL_MAT", "blk.0.ffn_up.weight",
                               "768, 3072, 1, 1", "ffn_norm-0{768, 2, 1, 1}", "3072, 2, 1, 1")
    assert ggml_line(node) == want
    # llama-eval-callback's example, modulo the printf padding
    assert " ".join(ggml_line(node).split()[1:]) == \
        "ffn_up-0 = (f32) MUL_MAT(blk.0.ffn_up.weight{768, 3072, 1, 1}, ffn_norm-0{768, 2, 1, 1}}) = {3072, 2, 1, 1}"


def test_ggml_line_with_one_source_keeps_llama_cpps_empty_brace():
    node = Node("norm-0", "RMS_NORM", (2, 576), "float32", [("embd", (2, 576))])
    assert ggml_line(node) == LLAMA_CPP_FORMAT % ("common_debug_cb_eval", "norm-0", "f32", "RMS_NORM", "embd",
                                                  "576, 2, 1, 1", "", "576, 2, 1, 1")


def test_logical_layout_prints_numpy_shapes():
    node = Node("ffn_up-0", "MUL_MAT", (2, 3072), "float32", [("blk.0.ffn_up.weight", (3072, 768)), ("ffn_norm-0", (2, 768))])
    assert logical_line(node).startswith("ffn_up-0 [2, 3072] = (f32) MUL_MAT(blk.0.ffn_up.weight [3072, 768], ffn_norm-0 [2, 768])")


def test_values_block_follows_llama_cpps_loop():
    # ne = {7, 8, 1, 1}: dim 0 has 7 > 2*3 entries (prints 3, "...", 3), dim 1 has 8 rows (3, "...", 3)
    a = np.arange(56, dtype=np.float32).reshape(8, 7)

    def row(r):
        v = [f"{float(x):12.4f}" for x in a[r]]
        return "            [" + ", ".join(v[:3]) + ",    ..., " + ", ".join(v[4:]) + "  ],\n"
    want = ("    [\n        [\n" + row(0) + row(1) + row(2) + "            ..., \n" + row(5) + row(6) + row(7)
            + "        ],\n    ]\n" + f"    sum = {float(a.sum()):f}\n")
    assert values_block(a) == want


def test_printed_sum_is_a_float32_running_sum():
    a = np.array([1e8] + [1.0] * 1000, dtype=np.float32)
    acc = np.float32(0)
    for x in a:                             # C: float sum = 0; sum += v;
        acc = np.float32(acc + x)
    assert ggml_sum(a) == float(acc) == 1e8  # each +1 is below float32's spacing at 1e8
    assert float(a.sum(dtype=np.float64)) == 1e8 + 1000


# --- the Python API on a small random model ----------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    cfg = config(LLAMA)
    return ffnlab.Model(cfg, lively_params(cfg))


def test_trace_api_returns_named_arrays(tiny):
    ids = np.array([3, 14, 15, 92, 65])
    plain = tiny.forward(ids)
    with ffnlab.trace(tiny, filter="ffn_") as t:
        traced = tiny.forward(ids)
    assert not tiny.hooks                                   # detached afterwards
    assert np.array_equal(plain, traced)                    # the tracer only observes
    gate, up = t["ffn_gate-0"], t["ffn_up-0"]
    assert gate.shape == (5, LLAMA["d_ff"])
    silu = gate / (1 + np.exp(-gate.astype(np.float64)))
    np.testing.assert_allclose(t["ffn_swiglu-0"], silu * up, rtol=1e-5, atol=1e-6)
    assert all(n.startswith("ffn_") for n in t.names())
    assert t.names()[:6] == ["ffn_inp-0", "ffn_norm-0", "ffn_gate-0", "ffn_up-0", "ffn_swiglu-0", "ffn_out-0"]


def test_filter_is_anchored_like_tensor_filter(tiny):
    with ffnlab.trace(tiny, filter="norm", keep=False) as t:
        tiny.forward(np.array([1, 2]))
    names = set(t.names())
    assert "norm-0" in names and "norm" in names
    assert not any(n.startswith(("attn_norm", "ffn_norm", "result_norm")) for n in names)


def test_node_lookup_by_op(tiny):
    with ffnlab.trace(tiny, filter="Qcur-0") as t:
        tiny.forward(np.array([1, 2, 3]))
    assert [n.op for n in t.nodes] == ["MUL_MAT", "RESHAPE", "ROPE"]
    assert t.node("Qcur-0", "MUL_MAT").shape == (3, LLAMA["d_model"])
    assert t["Qcur-0"] is t.node("Qcur-0", "ROPE").array     # a repeated name gives its last node


def test_check_finite_names_the_first_bad_node_and_its_inputs(tiny, monkeypatch):
    w = tiny.params["blk.1.ffn_up.weight"].copy()
    w[5, 7] = np.inf
    monkeypatch.setitem(tiny.params, "blk.1.ffn_up.weight", w)
    with pytest.raises(NonFiniteError) as e, np.errstate(all="ignore"):
        with ffnlab.trace(tiny, check_finite=True, keep=False):
            tiny.forward(np.array([1, 2, 3]))
    assert e.value.node.name == "ffn_up-1" and e.value.node.op == "MUL_MAT"
    inputs = dict(e.value.inputs)
    assert inputs["blk.1.ffn_up.weight"]["inf"] == 1
    assert inputs["ffn_norm-1"]["inf"] == inputs["ffn_norm-1"]["nan"] == 0
    assert "first non-finite node: ffn_up-1 (MUL_MAT)" in e.value.report()[0]


# --- the CLI on a small GPT-2 GGUF ------------------------------------------------------------

def write_gguf(path, base, poison=None):
    cfg = config(base)
    p = lively_params(cfg)
    if poison:
        p[poison][0, 0] = np.inf
    tok = byte_tokenizer()
    export_gguf(cfg, p, tok, tokenizer_meta(tok, "byte"), str(path))
    return str(path)


@pytest.fixture(scope="module")
def gpt2_gguf(tmp_path_factory):
    return write_gguf(tmp_path_factory.mktemp("gguf") / "gpt2.gguf", GPT2)


def run_cli(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_trace_prints_every_node_in_eval_callback_format(gpt2_gguf, capsys):
    rc, out, _ = run_cli(["trace", "-m", gpt2_gguf, "-p", "How are"], capsys)
    assert rc == 0
    lines = out.splitlines()
    model = ffnlab.load(gpt2_gguf, progress=False)
    with ffnlab.trace(model, keep=False) as t:
        model.forward(model.tokenizer.encode("How are"))
    assert lines == [ggml_line(n) for n in t.nodes]
    T = len(model.tokenizer.encode("How are"))
    assert f"ffn_gelu-0 = (f32)       GELU(ffn_up_b-0{{256, {T}, 1, 1}}, }}) = {{256, {T}, 1, 1}}" in out


def test_cli_trace_values_layout_and_filter(gpt2_gguf, capsys):
    rc, out, _ = run_cli(["trace", "-m", gpt2_gguf, "-p", "How are", "--filter", "ffn_up-0", "--values",
                          "--layout", "logical"], capsys)
    assert rc == 0
    assert out.startswith("ffn_up-0 [7, 256] = (f32) MUL_MAT(blk.0.ffn_up.weight [256, 64], ffn_norm-0 [7, 64])\n")
    assert out.count("sum = ") == 1
    assert out.count("            [") == 6 and out.count("            ..., \n") == 1   # 7 rows: 3, ..., 3
    assert out.count(",    ..., ") == 6                                                   # 256 columns: 3, ..., 3


def test_cli_trace_json_and_dump_hold_the_same_arrays(gpt2_gguf, tmp_path, capsys):
    d = tmp_path / "dump"
    rc, out, _ = run_cli(["trace", "-m", gpt2_gguf, "-p", "How are", "--filter", "ffn_|l_out", "--json",
                          "--dump", str(d)], capsys)
    assert rc == 0
    doc = json.loads(out)
    index, arrays = load_dump(d)
    assert [n["name"] for n in doc["nodes"]] == [n["name"] for n in index["nodes"]]
    assert index["ids"] == doc["ids"] and len(doc["ids"]) == 7
    for rec, entry, a in zip(doc["nodes"], index["nodes"], arrays):
        assert list(a.shape) == rec["shape"] == entry["shape"]
        assert rec["sum"] == ggml_sum(a)
        assert entry["inputs"][0]["name"] == rec["srcs"][0]["name"]
    gelu = arrays[[n["name"] for n in index["nodes"]].index("ffn_gelu-0")]
    up_b = arrays[[n["name"] for n in index["nodes"]].index("ffn_up_b-0")]
    x = up_b.astype(np.float64)
    np.testing.assert_allclose(gelu, 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                               rtol=1e-5, atol=1e-6)


def test_cli_check_finite_stops_at_the_poisoned_matmul(tmp_path, capsys):
    path = write_gguf(tmp_path / "inf.gguf", GPT2, poison="blk.1.ffn_up.weight")
    rc, out, err = run_cli(["trace", "-m", path, "-p", "How are", "--check-finite", "--filter", "l_out"], capsys)
    assert rc == 1 and err == ""
    assert out.splitlines()[0].startswith("common_debug_cb_eval:                  l_out-0")   # layer 0 printed
    assert "first non-finite node: ffn_up-1 (MUL_MAT) holds" in out
    assert "input blk.1.ffn_up.weight: [256, 64]" in out and "inf 1" in out
    assert "input ffn_norm-1: [7, 64]" in out and "l_out-1" not in out


def test_cli_check_finite_passes_a_clean_model(gpt2_gguf, capsys):
    rc, out, _ = run_cli(["trace", "-m", gpt2_gguf, "-p", "Hi", "--check-finite", "--filter", "x^"], capsys)
    assert rc == 0 and out.startswith("every node is finite (")


def test_cli_trace_rejects_a_bad_regex_in_one_line(gpt2_gguf, capsys):
    rc, out, err = run_cli(["trace", "-m", gpt2_gguf, "-p", "Hi", "--filter", "ffn_(("], capsys)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and "--filter 'ffn_((' is not a valid regex" in err
