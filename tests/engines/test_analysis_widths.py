"""SwiGLU width, alignment / tensor parallelism, and LoRA parameter counts.

References: the intermediate_size values Meta published (they come out of Llama's width rule),
and LoRA adapters attached to real transformers models by module name, counted by PyTorch.
"""
import warnings

import pytest

from ffnlab.analysis.alignment import alignment_report
from ffnlab.analysis.lora import lora_params, parse_targets
from ffnlab.analysis.params import param_counts
from ffnlab.analysis.presets import preset_config
from ffnlab.analysis.swiglu_width import llama_ffn_width, swiglu_width_report
from ffnlab.config import ModelConfig
from ffnlab.errors import UsageError

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("alias,multiple_of,multiplier", [("llama2-7b", 256, None), ("llama2-13b", 256, None),
                                                          ("llama2-70b", 4096, 1.3), ("llama3-8b", 1024, 1.3),
                                                          ("llama3-70b", 4096, 1.3)])
def test_llama_width_rule_reproduces_published_intermediate_size(alias, multiple_of, multiplier):
    cfg, _ = preset_config(alias)
    assert llama_ffn_width(cfg.d_model, multiple_of, multiplier) == cfg.d_ff


def test_llama3_8b_is_1_3x_the_equal_parameter_width():
    cfg, _ = preset_config("llama3-8b")
    r = swiglu_width_report(cfg)
    assert r["equal_param_width"] == 11008
    assert r["equal_param_width_exact"] == pytest.approx(8 * 4096 / 3)
    assert r["ratio_to_equal_param"] == pytest.approx(14336 / 11008)
    assert round(r["ratio_to_equal_param"], 1) == 1.3
    assert 3 * 4096 * r["equal_param_width_exact"] == pytest.approx(r["dense_4x_params"])


def test_tensor_parallel_splits():
    llama, _ = preset_config("llama3-8b")                 # 32 heads, 8 KV heads, d_ff 14336
    tp = alignment_report(llama, (1, 8, 16, 3))["tensor_parallel"]
    assert tp["8"]["even"] and tp["8"]["d_ff_per_gpu"] == 1792
    assert tp["16"]["kv_heads_replicated"] and not tp["16"]["kv_heads"] and tp["16"]["even"]
    assert not tp["3"]["heads"] and not tp["3"]["even"]
    qwen, _ = preset_config("qwen2.5-0.5b")               # 14 heads, 2 KV heads
    assert not alignment_report(qwen, (4,))["tensor_parallel"]["4"]["heads"]


def test_alignment_of_widths():
    g, _ = preset_config("gemma3-270m")                   # d_model 640 = 5 * 128
    a = alignment_report(g)["divisible"]
    assert a["d_model"] == {"64": True, "128": True, "256": False}
    assert a["d_ff"] == {"64": True, "128": True, "256": True}


def _torch_lora_count(model, rank, module_suffixes):
    """Attach A [r, in] and B [out, r] to every Linear/Conv1D whose name ends with a suffix; count them."""
    import torch
    n = 0
    for name, mod in model.named_modules():
        if any(name.endswith(s) for s in module_suffixes) and hasattr(mod, "weight"):
            w = mod.weight
            # nn.Linear stores [out, in]; GPT-2's Conv1D stores [in, out] and has nf = out
            out_f, in_f = (w.shape[1], w.shape[0]) if hasattr(mod, "nf") else (w.shape[0], w.shape[1])
            mod.lora_A = torch.nn.Parameter(torch.zeros(rank, in_f))
            mod.lora_B = torch.nn.Parameter(torch.zeros(out_f, rank))
            n += mod.lora_A.numel() + mod.lora_B.numel()
    return n


def test_lora_count_matches_adapters_on_a_transformers_llama():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    warnings.filterwarnings("ignore")
    hf = dict(model_type="llama", hidden_size=64, intermediate_size=176, num_attention_heads=8,
              num_key_value_heads=2, num_hidden_layers=3, vocab_size=100, max_position_embeddings=64)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf))
    from ffnlab.formats.hf_config import config_from_hf
    cfg = config_from_hf(hf)
    targets = parse_targets("q_proj,v_proj,down_proj,gate_proj")
    r = lora_params(cfg, 8, targets, param_counts(cfg)["total"])
    assert r["total"] == _torch_lora_count(model, 8, ("q_proj", "v_proj", "down_proj", "gate_proj"))
    assert r["mlp"] == 3 * 8 * ((64 + 176) + (176 + 64)) and r["attention"] == r["total"] - r["mlp"]


def test_lora_on_gpt2_uses_the_fused_c_attn():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    warnings.filterwarnings("ignore")
    hf = dict(model_type="gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=32, vocab_size=100)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf))
    from ffnlab.formats.hf_config import config_from_hf
    cfg = config_from_hf(hf)
    r = lora_params(cfg, 4, parse_targets("q,v,o,up,down"), param_counts(cfg)["total"])
    assert r["targets"] == ["o", "qkv", "up", "down"]
    assert r["total"] == _torch_lora_count(model, 4, ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"))


def test_lora_percent_and_dense_model_without_gate():
    cfg = ModelConfig(arch="gpt2", n_layer=2, d_model=32, n_head=2, d_ff=128, ffn="gelu", vocab_size=50, n_ctx=16)
    r = lora_params(cfg, 2, parse_targets("gate,up"), 10_000)
    assert r["skipped"] == ["gate"] and r["total"] == 2 * 2 * (32 + 128)
    assert r["percent_of_model"] == pytest.approx(100 * r["total"] / 10_000)
    with pytest.raises(UsageError):
        parse_targets("q,wq_bogus")
