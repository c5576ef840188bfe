"""ffnlab verify: node-by-node agreement with llama.cpp and HF transformers on the real models,
and injected faults caught at the node where they happen.

References: llama.cpp (eval callback, same GGUF, same token ids) and transformers (forward hooks
and a recording attention function, same GGUF dequantized to fp32). Tolerances are verify's
defaults (trace/verify.py): a node passes when max|diff| <= rtol * max|reference|.
"""
import functools
import json

import numpy as np
import pytest

import ffnlab
from export_helpers import GPT2, config, lively_params
from ffnlab.cli.main import main
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.model import transformer
from ffnlab.tracing.verify import default_rtol, reference_nodes, summary_lines, verify
from ffnlab.training.data import byte_tokenizer, tokenizer_meta
from models import hf, model_path, ours, prompt_ids

pytestmark = pytest.mark.slow

SHORT = "How are"
FAULT = "The quick brown fox jumps over the lazy dog"


def test_hf_values_go_to_gguf_row_order_like_the_converter():
    """HF's q for one token [heads, hd] -> GGUF order must be what convert_hf_to_gguf's permute()
    does to the weight rows (export_gguf.neox_to_normal_rows), applied to the product."""
    from ffnlab.formats.export_gguf import neox_to_normal_rows
    from ffnlab.tracing.hf import permute_heads
    rng = np.random.default_rng(0)
    H, hd, d = 3, 8, 5
    w_hf, x = rng.normal(size=(H * hd, d)), rng.normal(size=d)
    q_hf = (w_hf @ x).reshape(H, hd)
    q_gguf = (neox_to_normal_rows(w_hf, H) @ x).reshape(H, hd)
    assert np.array_equal(permute_heads(q_hf), q_gguf)


@functools.cache
def reference(name, against, text, f32=False):
    ids = list(prompt_ids(name, text))
    if against == "hf":
        from ffnlab.tracing.hf import capture
        return {(n, op, 0): a for (n, op), a in capture(model_path(name), ids, hf_model=hf(name)).items()}
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
    return reference_nodes("llama.cpp", model_path(name), ids, f32=f32)


def run(name, against, text=SHORT, **kw):
    model = ours(name)
    ids = list(prompt_ids(name, text))
    with np.errstate(all="ignore"):
        return verify(model, ids, against, reference=reference(name, against, text, kw.get("f32", False)), **kw)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
@pytest.mark.parametrize("against", ["llama.cpp", "hf"])
def test_real_model_passes_node_by_node(name, against):
    report = run(name, against)
    assert report.passed, "\n".join(summary_lines(report))
    n_layer = ours(name).config.n_layer
    # llama.cpp computes every ffnlab node but the ffnlab-only names; HF lacks the unscaled norms
    assert len(report.compared) >= (15 if against == "hf" else 20) * n_layer
    worst = max(r.rel for r in report.compared)
    assert worst < default_rtol(against)
    if against == "hf":
        assert worst < 1e-4


def test_smollm2_equals_llama_cpp_on_f32_weights():
    """Without llama.cpp's 8-bit activations and fp16 cache, only summation order is left."""
    report = run("smollm2", "llama.cpp", f32=True)
    assert report.passed and len(report.compared) == 694
    assert max(r.rel for r in report.compared) < 1e-4


@pytest.mark.parametrize("name,against", [("smollm2", "llama.cpp"), ("smollm2", "hf"), ("gemma3", "hf")])
def test_wrong_rope_pairing_is_caught_at_the_rope_node(name, against, monkeypatch):
    model = ours(name)
    monkeypatch.setattr(model.config, "rope_pairing", {"normal": "neox", "neox": "normal"}[model.config.rope_pairing])
    report = run(name, against, FAULT)
    bad = report.first_bad
    assert (bad.name, bad.op) == ("Qcur-0", "ROPE")
    (src, before), _ = report.inputs_of(bad)
    # its input (Qcur-0 RESHAPE; Gemma 3: Qcur_normed-0 after the q norm) was still right
    assert (src, before.op) == (("Qcur_normed-0", "MUL") if name == "gemma3" else ("Qcur-0", "RESHAPE"))
    assert before.ok
    assert "FAIL: first node out of tolerance: Qcur-0 (ROPE)" in "\n".join(summary_lines(report))


def test_unmasked_attention_is_caught_at_the_softmax(monkeypatch):
    monkeypatch.setattr(transformer, "causal_mask", lambda q, k, window=0: np.ones((len(q), len(k)), bool))
    report = run("smollm2", "hf", FAULT)
    bad = report.first_bad
    assert (bad.name, bad.op) == ("kq_soft_max-0", "SOFT_MAX")
    assert dict(report.inputs_of(bad))["kq-0"].ok                      # the raw scores were right


def test_tracer_leaves_real_model_logits_bit_identical():
    model = ours("smollm2")
    ids = np.array(prompt_ids("smollm2", FAULT))
    plain = model.forward(ids)
    with ffnlab.trace(model) as t:
        traced = model.forward(ids)
    assert np.array_equal(plain, traced)
    assert np.array_equal(t["result_output"], plain)


# --- the CLI on a small GPT-2 GGUF ------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt2_gguf(tmp_path_factory):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
    cfg = config(GPT2)
    tok = byte_tokenizer()
    return export_gguf(cfg, lively_params(cfg), tok, tokenizer_meta(tok, "byte"),
                       str(tmp_path_factory.mktemp("gguf") / "gpt2.gguf"))


def test_cli_verify_prints_a_table_and_passes(gpt2_gguf, capsys):
    rc = main(["verify", "-m", gpt2_gguf, "-p", SHORT, "--against", "llama.cpp"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "node " in out and "max|diff|" in out and "cosine" in out
    assert out.rstrip().endswith("PASS")
    assert "\nffn_gelu-1 " in out and "\nresult_output " in out


def test_cli_verify_fails_with_the_first_bad_node(gpt2_gguf, capsys):
    rc = main(["verify", "-m", gpt2_gguf, "-p", SHORT, "--against", "llama.cpp", "--rtol", "1e-7", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["passed"] is False
    bad = doc["first_bad"]
    first_fail = next(n for n in doc["nodes"] if n["ok"] is False)
    assert bad["name"] == first_fail["name"] and bad["rel"] > 1e-7
    assert all(n["ok"] for n in doc["nodes"][:first_fail["index"]] if n["ok"] is not None)


def test_cli_verify_rejects_f32_for_hf(gpt2_gguf, capsys):
    rc = main(["verify", "-m", gpt2_gguf, "-p", SHORT, "--against", "hf", "--f32"])
    err = capsys.readouterr().err
    assert rc == 1 and err.strip() == "ffnlab verify: error: --f32 applies to --against llama.cpp only"


@pytest.fixture(scope="module")
def gpt2_gguf_for_hf(tmp_path_factory):
    pytest.importorskip("transformers")
    cfg = config(GPT2)
    tok = byte_tokenizer()
    return export_gguf(cfg, lively_params(cfg), tok, tokenizer_meta(tok, "byte"),
                       str(tmp_path_factory.mktemp("gguf") / "gpt2.gguf"))


def test_cli_verify_against_hf_maps_gpt2_node_by_node(gpt2_gguf_for_hf, capsys):
    """transformers loads ffnlab's GPT-2 export (n_positions taken from the file, not its default
    1024) and every GPT-2 node with an HF module boundary is compared: the fused qkv and its views,
    attention inside, the biased LayerNorms and the GELU MLP."""
    rc = main(["verify", "-m", gpt2_gguf_for_hf, "-p", SHORT, "--against", "hf", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["passed"] is True
    compared = {n["name"] for n in doc["nodes"] if n["ok"] is not None}
    for il in (0, 1):
        for node in ("attn_norm", "wqkv_b", "Qcur", "Kcur", "Vcur", "kq", "kq_soft_max", "kqv", "kqv_out",
                     "attn_out", "ffn_inp", "ffn_norm", "ffn_up_b", "ffn_gelu", "ffn_out", "l_out"):
            assert f"{node}-{il}" in compared
    assert {"embd", "pos_embd", "inpL", "result_norm", "result_output"} <= compared
