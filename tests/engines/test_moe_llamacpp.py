"""Mixture-of-experts GGUF files that ffnlab writes, run by llama.cpp (llama-cpp-python).

For each family a tiny random transformers model (tests/reference/hf_moe_models.py's families, byte-sized
vocabulary) is loaded from its HF directory, exported to an F32 GGUF with the byte tokenizer, and
run by llama.cpp on the same ids, its graph observed through the eval callback
(tracing/llamacpp.py), with the KV cache in f32 so that only the engines' arithmetic differs:
  - llama.cpp's logits equal transformers' within 2e-2 absolute (logits of magnitude ~7; measured
    ~3e-5: float32 sums in another order);
  - ffnlab reading that GGUF back gives transformers' logits within 1e-4 (test_hf_dirs' bound);
  - every node both engines name, in order, has the same name, op and shape: ffn_moe_logits ...
    ffn_moe_out, Qwen2-MoE's ffn_shexp* nodes (as test_trace_llamacpp.py checks the dense graphs);
  - the MoE nodes' values agree (rtol 1e-3 of each node's scale; top-k indices exactly).
  - every FFN node's sources have llama.cpp's names (the shared expert's own tensors among them).
"""
import numpy as np
import pytest

import ffnlab
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from ffnlab.tracing.llamacpp import capture, ffnlab_only, is_auto_name, is_kv_node  # noqa: E402
from hf_moe_models import COMMON, FAMILIES, randomize  # noqa: E402

pytestmark = pytest.mark.slow

IDS = [3, 17, 250, 9, 42, 0, 101, 7, 200, 64]
GGUF_FAMILIES = {"mixtral": {}, "qwen2_moe": {}, "qwen3_moe": {"attention_bias": False},
                 "olmoe": {"attention_bias": False, "num_key_value_heads": 4}}


@pytest.fixture(scope="module", params=list(GGUF_FAMILIES))
def exported(request, tmp_path_factory):
    family = request.param
    cls, kw = FAMILIES[family]
    cfg = getattr(transformers, cls)(**{**COMMON, "vocab_size": 256, **kw, **GGUF_FAMILIES[family]})
    model = randomize(transformers.AutoModelForCausalLM.from_config(cfg))
    d = tmp_path_factory.mktemp(family)
    model.save_pretrained(d / "hf", safe_serialization=True)
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    m = ffnlab.load(str(d / "hf"), progress=False)
    tok = byte_tokenizer()
    path = export_gguf(m.config, m.params, tok, tokenizer_meta(tok, "byte"), str(d / "moe.gguf"))
    return family, ref, path, capture(path, IDS, kv_f32=True)


def sequence(nodes):
    """(name, op, ne), kq's and kq_soft_max's key axis replaced by a marker: llama.cpp pads its
    KV cache to 256 cells (test_trace_llamacpp.py)."""
    out = []
    for n in nodes:
        ne = tuple(n.ne)
        if n.name.split("-")[0] in ("kq", "kq_soft_max"):
            assert ne[0] in (len(IDS), 256), (n.name, ne)
            ne = ("keys",) + ne[1:]
        out.append((n.name, n.op, ne))
    return out


def test_llama_cpp_runs_the_export_with_transformers_logits(exported):
    family, ref, path, nodes = exported
    theirs = [n for n in nodes if n.name == "result_output"][-1].array
    assert np.abs(ref).max() > 1.0
    err = np.abs(theirs - ref).max()
    assert err <= 2e-2, f"{family}: max |llama.cpp - transformers| = {err:.2e}"
    back = ffnlab.load(path, progress=False)
    assert back.config.ffn == "moe"
    assert np.abs(back.forward(IDS) - ref).max() <= 1e-4


def test_moe_node_names_ops_and_shapes_match_llama_cpp_in_order(exported):
    family, _, path, theirs = exported
    model = ffnlab.load(path, progress=False)
    with ffnlab.trace(model, keep=True) as t:
        model.forward(np.array(IDS))
    mine = sequence([n for n in t.nodes if not ffnlab_only(n.name, model.config.arch)])
    ref = sequence([n for n in theirs if not is_auto_name(n.name) and not is_kv_node(n)])
    moe = [x for x in ref if x[0].startswith(("ffn_moe", "ffn_shexp"))]
    assert {x[0].rsplit("-", 1)[0] for x in moe} >= {"ffn_moe_logits", "ffn_moe_probs", "ffn_moe_argsort",
                                                     "ffn_moe_topk", "ffn_moe_weights", "ffn_moe_gate", "ffn_moe_up",
                                                     "ffn_moe_swiglu", "ffn_moe_down", "ffn_moe_weighted",
                                                     "ffn_moe_out"}
    assert mine == ref


def test_moe_node_values_match_llama_cpp(exported):
    family, _, path, theirs = exported
    model = ffnlab.load(path, progress=False)
    with ffnlab.trace(model, keep=True) as t:
        model.forward(np.array(IDS))
    ref = {n.name: n.array for n in theirs if n.name.startswith(("ffn_moe", "ffn_shexp")) and n.array is not None}
    assert ref
    for n in t.nodes:
        if n.name not in ref:
            continue
        got, want = np.asarray(n.array), ref[n.name].reshape(np.asarray(n.array).shape)
        if n.name.startswith(("ffn_moe_argsort", "ffn_moe_topk")):
            k = got.shape[-1] if n.name.startswith("ffn_moe_topk") else FAMILIES[family][1]["num_experts_per_tok"]
            assert np.array_equal(got[..., :k], want[..., :k]), n.name
        else:
            err = np.abs(got - want).max() / max(np.abs(want).max(), 1e-30)
            assert err <= 1e-3, f"{family} {n.name}: relative error {err:.2e}"


def test_ffn_node_sources_are_llama_cpps(exported):
    """Each FFN node reads the tensors and nodes llama.cpp's reads, by name: the experts' stacked
    weights, the normalised expert weights where the family normalises them, the k experts' views
    that ffn_moe_out adds, and the shared expert's own ffn_gate_shexp / ffn_up_shexp / ffn_down_shexp
    (Qwen2-MoE), not the dense FFN's names."""
    family, _, path, theirs = exported
    model = ffnlab.load(path, progress=False)
    with ffnlab.trace(model, keep=False) as t:
        model.forward(np.array(IDS))

    def ffn(nodes):
        # a source that is a view of a named node is named as that node ("ffn_moe_probs-0 (reshaped)");
        # llama.cpp's unnamed nodes are left out: ffn_shexp_gate is its silu(z) / z, src0 silu(z) "node_N",
        # where ffnlab computes sigmoid(z) from z
        return [(n.name, tuple(s[0].split(" (")[0] for s in n.srcs if not s[0].startswith("node_"))) for n in nodes
                if n.name.startswith("ffn_") and n.name.rsplit("-", 1)[0] != "ffn_inp"]   # ffn_inp: the residual
    mine = ffn([n for n in t.nodes if not ffnlab_only(n.name, model.config.arch)])
    ref = ffn([n for n in theirs if not is_auto_name(n.name) and not is_kv_node(n)])
    assert len(mine) >= 11 * model.config.n_layer
    assert [a for a, b in zip(mine, ref) if a != b] == [] and len(mine) == len(ref), \
        [(a, b) for a, b in zip(mine, ref) if a != b][:8]
