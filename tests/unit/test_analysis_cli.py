"""The sizing commands end to end: JSON keys, small GGUF / config.json inputs, and bad input.

Bad input must give one line naming the file / field / flag, and exit 1 (never a traceback).
"""
import json

import pytest

from ffnlab.cli.main import main
from ffnlab.config import ModelConfig
from ffnlab.model.params import count_params, init_params

TINY = ModelConfig(arch="llama", n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=160, ffn="swiglu",
                   vocab_size=96, n_ctx=128, tie_embeddings=False)


def write_gguf(path, cfg=TINY, skip_key=None):
    """A small F32 llama GGUF written with gguf.GGUFWriter; skip_key leaves one metadata key out."""
    import gguf

    w = gguf.GGUFWriter(str(path), cfg.arch)
    keys = {f"{cfg.arch}.block_count": cfg.n_layer, f"{cfg.arch}.context_length": cfg.n_ctx,
            f"{cfg.arch}.embedding_length": cfg.d_model, f"{cfg.arch}.feed_forward_length": cfg.d_ff,
            f"{cfg.arch}.attention.head_count": cfg.n_head, f"{cfg.arch}.attention.head_count_kv": cfg.n_kv_head}
    for k, v in keys.items():
        if k != skip_key:
            w.add_uint32(k, v)
    if skip_key != f"{cfg.arch}.attention.layer_norm_rms_epsilon":
        w.add_float32(f"{cfg.arch}.attention.layer_norm_rms_epsilon", cfg.norm_eps)
    params = init_params(cfg, seed=0)
    for name, a in params.items():
        w.add_tensor(name, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return count_params(params)


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys, *argv):
    rc, out, err = run(capsys, *argv)
    assert rc != 0 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# --- JSON interfaces ------------------------------------------------------------------------------

def test_analyze_json_has_the_documented_keys(capsys):
    rc, out, _ = run(capsys, "analyze", "llama3-8b", "--quant", "Q4_K_M,Q8_0", "--json")
    r = json.loads(out)
    p, f, m = r["params"], r["flops_per_token"], r["memory"]
    for k in ("total", "embedding", "attention", "mlp", "norm", "lm_head", "mlp_share"):
        assert isinstance(p[k], (int, float)), k
    assert p["total"] == 8_030_261_248
    assert f["forward"] > 0 and f["training"] == 3 * f["forward"]
    assert set(m["weights_bytes"]) == {"Q4_K_M", "Q8_0"}
    assert m["kv_cache_bytes"] == 2 * 32 * 2048 * 1024 * 2
    assert m["mlp_activation_bytes"]["gate"] == 58_720_256 and m["mlp_activation_bytes"]["dtype"] == "f16"
    assert all(isinstance(v, int) for v in (m["kv_cache_bytes"], m["mlp_activation_bytes"]["gate"], *m["weights_bytes"].values()))


def test_inspect_json_of_a_written_gguf(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    n = write_gguf(path)
    rc, out, _ = run(capsys, "inspect", str(path), "--json")
    r = json.loads(out)
    assert rc == 0 and r["params_in_file"] == r["params_from_config"] == n
    v = r["ffn_view"]
    assert (v["hidden_size"], v["intermediate_size"]) == (64, 160)
    assert v["ffn_up_weight_shape"] == [64, 160] and v["ffn_down_weight_shape"] == [160, 64]
    assert r["model"]["ffn"] == "swiglu" and r["model"]["n_kv_head"] == 2 and not r["model"]["tie_embeddings"]


def test_analyze_of_a_gguf_reports_the_exact_file_bytes(tmp_path, capsys):
    path = tmp_path / "tiny.gguf"
    n = write_gguf(path)
    rc, out, _ = run(capsys, "analyze", str(path), "--json", "--seq-len", "64")
    r = json.loads(out)
    assert r["params"]["total"] == n
    assert r["memory"]["weights_bytes"]["file"] == 4 * n                      # every tensor F32


def test_an_hf_directory_sizes_like_its_preset(tmp_path, capsys):
    from ffnlab.analysis.presets import get_preset
    (tmp_path / "config.json").write_text(json.dumps(get_preset("qwen2.5-0.5b").hf))
    rc, out, _ = run(capsys, "compare", str(tmp_path), "qwen2.5-0.5b", "--json")
    a, b = json.loads(out)
    assert a["params_total"] == b["params_total"] == 494_032_768 and a["mlp_params"] == b["mlp_params"]


def test_compare_table_has_the_mlp_columns(capsys):
    rc, out, _ = run(capsys, "compare", "llama2-70b", "gpt2")
    assert rc == 0
    assert "56,371,445,760" in out and "704,643,072" in out and "MLP share" in out


def test_text_reports_render(capsys):
    for argv in (("analyze", "gemma3-270m", "--seq-len", "4096", "--kv-dtype", "q8_0"), ("inspect", "llama3-8b"),
                 ("compare", "--list")):
        rc, out, err = run(capsys, *argv)
        assert rc == 0 and err == "" and out


# --- bad input ------------------------------------------------------------------------------------

def test_gguf_missing_a_required_key(tmp_path, capsys):
    path = tmp_path / "nokey.gguf"
    write_gguf(path, skip_key="llama.feed_forward_length")
    err = one_line_error(capsys, "inspect", str(path))
    assert "llama.feed_forward_length" in err and str(path) in err


def test_not_a_gguf_and_truncated_gguf(tmp_path, capsys):
    bad = tmp_path / "text.gguf"
    bad.write_text("hello")
    assert "not a GGUF" in one_line_error(capsys, "inspect", str(bad))
    good = tmp_path / "tiny.gguf"
    write_gguf(good)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    assert "truncated" in one_line_error(capsys, "analyze", str(cut))
    assert "no such file" in one_line_error(capsys, "inspect", str(tmp_path / "missing.gguf"))


def test_config_json_missing_a_field_names_it(tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "intermediate_size": 11008, "num_attention_heads": 32,
                               "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 4096}))
    err = one_line_error(capsys, "analyze", str(cfg))
    assert "'hidden_size'" in err and str(cfg) in err
    cfg.write_text("{not json")
    assert "not valid JSON" in one_line_error(capsys, "inspect", str(cfg))


@pytest.mark.parametrize("argv,needle", [
    (("analyze", "gpt2", "--seq-len", "-5"), "--seq-len"),
    (("analyze", "gpt2", "--tp", "0"), "--tp"),
    (("analyze", "gpt2", "--tp", "2,x"), "--tp"),
    (("analyze", "gpt2", "--batch", "0"), "--batch"),
    (("analyze", "gpt2", "--quant", "Q4_KM"), "Q4_KM"),
    (("analyze", "gpt2", "--kv-dtype", "int3"), "--kv-dtype"),
    (("analyze", "gpt2", "--lora-rank", "-1"), "--lora-rank"),
    (("analyze", "gpt2", "--lora-targets", "qq"), "qq"),
    (("compare",), "at least one"),
    (("inspect", "llama9-8b"), "did you mean"),
])
def test_nonsense_flags_give_one_line(capsys, argv, needle):
    assert needle in one_line_error(capsys, *argv)
