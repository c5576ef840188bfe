"""Presets: published config.json values, counted exactly, addressable by alias and repo id.

Reference: Hugging Face transformers builds each model from the same config.json on the meta
device (no memory) and counts its parameters; and, for the best-known models, the exact totals
published for them.
"""
import subprocess
import sys
import warnings

import pytest

from ffnlab.analysis.params import param_counts
from ffnlab.analysis.presets import PRESETS, find_preset, get_preset, preset_config
from ffnlab.errors import UsageError
from ffnlab.formats.hf_config import hf_extra_params

pytestmark = pytest.mark.slow

# exact totals as published (HF model pages' safetensors parameter count; BERT: BertModel, with pooler)
PUBLISHED = {
    "gpt2": 124_439_808,
    "bert-base": 109_482_240,
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,          # mixtures of experts: active counts in test_moe_sizing.py
    "qwen3-30b-a3b": 30_532_122_624,
    "olmoe-1b-7b": 6_919_161_856,
    "gemma2-2b": 2_614_341_888,
    "gemma2-9b": 9_241_705_984,
    # Pythia: the "Total Params" column of Biderman et al. 2023, Table 1 (untied embed_in / embed_out)
    "pythia-70m": 70_426_624, "pythia-160m": 162_322_944, "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632, "pythia-1.4b": 1_414_647_808, "pythia-2.8b": 2_775_208_960,
    "pythia-6.9b": 6_857_302_016, "pythia-12b": 11_846_072_320,
    "olmo2-7b": 7_298_617_344,
    # HF model pages' safetensors counts (Llama 3.2 1B/3B and Qwen3 0.6B tie the LM head to the table)
    "llama3.1-8b": 8_030_261_248, "llama3.2-1b": 1_235_814_400, "llama3.2-3b": 3_212_749_824,
    "qwen3-0.6b": 596_049_920, "qwen3-8b": 8_190_735_360, "phi3-mini-4k": 3_821_079_552,
    "mistral-7b-v0.3": 7_248_023_552,
}

EXPECTED_ALIASES = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "llama2-7b", "llama2-13b",
                    "llama2-70b", "llama3-8b", "llama3-70b", "llama3.1-405b", "mistral-7b", "qwen2.5-0.5b",
                    "qwen2.5-7b", "gemma2-2b", "gemma3-270m", "smollm2-135m", "smollm2-360m", "smollm2-1.7b",
                    "tinyllama-1.1b", "phi3-mini-4k", "mixtral-8x7b", "qwen3-30b-a3b", "olmoe-1b-7b",
                    "gemma2-9b", "pythia-70m", "pythia-160m", "pythia-410m", "pythia-1b", "pythia-1.4b",
                    "pythia-2.8b", "pythia-6.9b", "pythia-12b", "olmo2-7b", "llama3.1-8b", "llama3.2-1b",
                    "llama3.2-3b", "mistral-7b-v0.3", "qwen3-0.6b", "qwen3-8b"}


def _total(alias):
    cfg, p = preset_config(alias)
    return param_counts(cfg, hf_extra_params(p.hf))["total"]


def test_every_requested_preset_exists_with_a_source():
    assert {p.alias for p in PRESETS} == EXPECTED_ALIASES
    for p in PRESETS:
        assert p.source == f"https://huggingface.co/{p.repo}/blob/main/config.json"


@pytest.mark.parametrize("alias", sorted(PUBLISHED))
def test_total_equals_published_count(alias):
    assert _total(alias) == PUBLISHED[alias]


def test_every_preset_total_equals_transformers_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    warnings.filterwarnings("ignore")
    for p in PRESETS:
        hf_cfg = transformers.AutoConfig.for_model(**p.hf)
        with torch.device("meta"):
            model = (transformers.BertModel(hf_cfg) if p.hf["model_type"] == "bert"
                     else transformers.AutoModelForCausalLM.from_config(hf_cfg))
        n = sum(t.numel() for t in model.parameters())
        assert _total(p.alias) == n, p.alias


def test_alias_and_repo_id_name_the_same_preset():
    assert find_preset("llama3-8b") is find_preset("meta-llama/Meta-Llama-3-8B")
    assert find_preset("GPT2") is find_preset("openai-community/gpt2")
    a, _ = preset_config("llama3-8b")
    b, _ = preset_config("meta-llama/Meta-Llama-3-8B")
    assert a == b


def test_published_widths_of_llama3_8b_and_gpt2():
    cfg, _ = preset_config("llama3-8b")
    assert (cfg.d_model, cfg.d_ff, cfg.n_head, cfg.n_kv_head, cfg.n_layer) == (4096, 14336, 32, 8, 32)
    gpt2, _ = preset_config("gpt2")
    assert (gpt2.d_model, gpt2.d_ff, gpt2.ffn) == (768, 3072, "gelu_tanh")    # n_inner None -> 4*n_embd


def test_unknown_preset_suggests_the_closest_names():
    with pytest.raises(UsageError) as e:
        get_preset("llama3-8bb")
    assert "did you mean llama3-8b" in str(e.value)


def test_unknown_preset_on_the_command_line_is_one_line_and_exit_1():
    r = subprocess.run([sys.executable, "-m", "ffnlab.cli.main", "compare", "gemma3-27m"],
                       capture_output=True, text=True)
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "gemma3-270m" in r.stderr and "Traceback" not in r.stderr


# --- the config.json reader the presets go through ------------------------------------------------

def test_gpt2_n_inner_none_means_4x_and_gelu_new_is_tanh_gelu():
    from ffnlab.formats.hf_config import config_from_hf
    cfg = config_from_hf({"model_type": "gpt2", "n_embd": 96, "n_layer": 2, "n_head": 4, "n_inner": None,
                          "n_positions": 64, "vocab_size": 100, "activation_function": "gelu_new"})
    assert (cfg.d_ff, cfg.ffn, cfg.norm, cfg.positions, cfg.fused_qkv) == (384, "gelu_tanh", "layernorm", "learned", True)


def test_multimodal_gemma3_reads_its_text_config_and_layer_types():
    from ffnlab.formats.hf_config import config_from_hf
    text = dict(get_preset("gemma3-270m").hf)
    text.pop("sliding_window_pattern")
    text["layer_types"] = (["sliding_attention"] * 5 + ["full_attention"]) * 3
    cfg = config_from_hf({"model_type": "gemma3", "text_config": text})
    ref, _ = preset_config("gemma3-270m")
    assert cfg.sliding_window_pattern == 6 and cfg.to_dict() == {**ref.to_dict(), "name": cfg.name}


def test_missing_config_field_names_the_field_and_the_file():
    from ffnlab.config import ConfigError
    from ffnlab.formats.hf_config import config_from_hf
    hf = dict(get_preset("llama2-7b").hf)
    del hf["intermediate_size"]
    with pytest.raises(ConfigError, match=r"my/config.json: missing field 'intermediate_size'"):
        config_from_hf(hf, "my/config.json")
