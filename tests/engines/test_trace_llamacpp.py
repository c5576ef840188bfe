"""Acceptance: ffnlab's named nodes are llama.cpp's, name for name, in order, with the same op and shape.

The reference is llama.cpp itself (llama-cpp-python 0.3.x), its graph observed through the eval
callback (trace/llamacpp.py) with flash attention off and logits for every token, on the same
token ids. Compared: every node both engines name. Excepted on llama.cpp's side: names it makes
up (views, permutes, reshapes, copies: "... (view)"; unnamed "node_N") and the KV-cache stores.
Excepted on ffnlab's side: the nodes it names where llama.cpp has a node_N (ffnlab_only()).
kq and kq_soft_max have n_kv columns in llama.cpp: the KV cache is padded to 256 cells, so
n_kv = 256 for these prompts, against ffnlab's S = T keys.
"""
import numpy as np
import pytest

import ffnlab
from export_helpers import GPT2, config, lively_params
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.tracing.format import eval_callback_line, ggml_line
from ffnlab.tracing.verify import keyed
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
from ffnlab.tracing.llamacpp import capture, ffnlab_only, is_auto_name, is_kv_node  # noqa: E402
from llamacpp_nodes import sequence  # noqa: E402
from models import model_path, ours  # noqa: E402

pytestmark = pytest.mark.slow

PROMPT = "How are"


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    cfg = config(GPT2)
    tok = byte_tokenizer()
    path = tmp_path_factory.mktemp("gpt2") / "gpt2.gguf"
    return export_gguf(cfg, lively_params(cfg), tok, tokenizer_meta(tok, "byte"), str(path))


def load(name, gpt2_path):
    return ffnlab.load(gpt2_path, progress=False) if name == "gpt2" else ours(name)


def both(model, path):
    ids = model.tokenizer.encode(PROMPT)
    with ffnlab.trace(model, keep=False) as t:
        model.forward(np.array(ids))
    theirs = capture(path, ids, keep=lambda name: False)
    return ids, t.nodes, theirs


@pytest.mark.parametrize("name", ["smollm2", "gemma3", "gpt2"])
def test_named_nodes_match_llama_cpp_in_order(name, gpt2_path):
    model = load(name, gpt2_path)
    path = gpt2_path if name == "gpt2" else model_path(name)
    ids, ours_nodes, theirs = both(model, path)
    T = len(ids)
    mine = sequence([n for n in ours_nodes if not ffnlab_only(n.name, model.config.arch)], T)
    ref = sequence([n for n in theirs if not is_auto_name(n.name) and not is_kv_node(n)], T)
    assert len(mine) > 20 * model.config.n_layer
    assert mine == ref
    # what was excepted on llama.cpp's side is only views, copies, cache stores and node_N
    dropped = {n.op for n in theirs if is_auto_name(n.name) or is_kv_node(n)}
    assert dropped <= {"VIEW", "PERMUTE", "RESHAPE", "CONT", "SET_ROWS", "GET_ROWS", "MUL_MAT", "ADD", "SCALE"}


def test_ffnlab_only_nodes_are_llama_cpps_node_n(gpt2_path):
    """Where ffnlab names a node llama.cpp leaves unnamed, llama.cpp has an unnamed node with
    the same op and shape in the same place (checked on Gemma 3: q scale and output projection)."""
    model = ours("gemma3")
    ids, ours_nodes, theirs = both(model, model_path("gemma3"))
    named = [n for n in theirs if not is_kv_node(n) and "(" not in n.name]
    for i, n in enumerate(ours_nodes[:60]):
        if ffnlab_only(n.name, "gemma3"):
            prev = ours_nodes[i - 1]
            j = next(j for j, m in enumerate(named) if (m.name, m.op) == (prev.name, prev.op))
            following = [m for m in named[j + 1:] if not m.name.startswith("cache_")][0]
            assert following.name.startswith("node_") and following.op == n.op and following.ne == n.ne


def test_eval_callback_lines_are_llama_cpps_lines_for_smollm2():
    """A diff of `ffnlab trace` against llama.cpp's printer shows only the padded key axis of
    kq / kq_soft_max / kqv's V view, and the last layer's inputs (llama.cpp's out_ids rows)."""
    model = ours("smollm2")
    ids, ours_nodes, theirs = both(model, model_path("smollm2"))
    mine = [ggml_line(n) for n in ours_nodes]
    ref = [eval_callback_line(n.name, n.type, n.op, n.srcs, n.ne) for n in theirs
           if not is_auto_name(n.name) and not is_kv_node(n)]
    assert len(mine) == len(ref)
    last = model.config.n_layer - 1
    differ = {a.split("=")[0].split()[-1] for a, b in zip(mine, ref) if a != b}
    assert differ == {f"{k}-{il}" for il in range(model.config.n_layer) for k in ("kq", "kq_soft_max", "kqv")} \
        | {f"ffn_inp-{last}"}


def test_gpt2_values_match_llama_cpp_including_strided_qkv_views(gpt2_path):
    """The tiny GPT-2 GGUF is F32, so llama.cpp does not round activations: every node agrees
    to its fp16 KV cache and fp16 GELU table. Qcur/Kcur/Vcur are non-contiguous views into
    wqkv_b in llama.cpp and are read through their strides."""
    from ffnlab.tracing.verify import compare
    model = ffnlab.load(gpt2_path, progress=False)
    ids = model.tokenizer.encode(PROMPT)
    ref = keyed([(n.name, n.op, n.array) for n in capture(gpt2_path, ids)
                 if not is_auto_name(n.name) and not is_kv_node(n) and n.array is not None])
    with ffnlab.trace(model) as t:
        model.forward(np.array(ids))
    report = compare(t.nodes, ref, "llama.cpp", rtol=2e-3)
    assert report.passed, report.first_bad
    views = [r for r in report.compared if r.op == "VIEW"]
    assert [r.name for r in views] == ["Qcur-0", "Vcur-0", "Kcur-0", "Qcur-1", "Vcur-1", "Kcur-1"]
    assert max(r.rel for r in views if r.name.endswith("-0")) < 1e-5    # layer 0: before any fp16 rounding
    assert len(report.compared) == len(t.nodes) - 2 * model.config.n_layer   # all but attn_out_w, attn_out
