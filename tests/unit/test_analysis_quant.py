"""Weights under ggml quantization: block layouts and llama-quantize's per-tensor recipe.

References: the bits per weight ggml's block structs give (Q4_0: 32 weights in 16 bytes of
nibbles + an fp16 scale = 4.5 bits; Q6_K: 256 weights in 210 bytes = 6.5625 bits), and
llama.cpp's own output: the real Gemma 3 Q4_K_M and SmolLM2 Q4_1 files (tests/engines/test_inspect.py).
"""
import pytest

from ffnlab.analysis.presets import preset_config
from ffnlab.analysis.quant import bits_per_weight, check_quant, recipe_type, tensor_bytes, weights_bytes
from ffnlab.analysis.source import planned_tensors
from ffnlab.errors import UsageError


@pytest.mark.parametrize("typ,bpw", [("F32", 32), ("F16", 16), ("BF16", 16), ("Q8_0", 8.5), ("Q4_0", 4.5),
                                     ("Q4_1", 5.0), ("Q5_0", 5.5), ("Q4_K", 4.5), ("Q5_K", 5.5),
                                     ("Q6_K", 6.5625), ("Q3_K", 3.4375), ("Q2_K", 2.625)])
def test_bits_per_weight_from_ggml_block_layouts(typ, bpw):
    assert bits_per_weight(typ) == bpw


def test_tensor_bytes_counts_whole_blocks_per_row():
    assert tensor_bytes("Q4_0", (4096, 14336)) == 4096 * 14336 // 32 * 18
    assert tensor_bytes("Q6_K", (14336, 4096)) == 14336 * 4096 // 256 * 210
    with pytest.raises(UsageError):
        tensor_bytes("Q4_K", (640, 2048))                      # 640 is not a multiple of 256


def test_q4_k_m_gives_q6_k_to_output_and_to_use_more_bits_layers():
    cfg, _ = preset_config("llama3-8b")                       # 32 layers: layers 0-3, 28-31 and 6, 9, ..., 27
    more = [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    for il in range(32):
        want = "Q6_K" if il in more else "Q4_K"
        assert recipe_type(f"blk.{il}.attn_v.weight", (4096, 1024), "Q4_K_M", cfg) == want
        assert recipe_type(f"blk.{il}.ffn_down.weight", (14336, 4096), "Q4_K_M", cfg) == want
        assert recipe_type(f"blk.{il}.ffn_up.weight", (4096, 14336), "Q4_K_M", cfg) == "Q4_K"
    assert recipe_type("output.weight", (4096, 128256), "Q4_K_M", cfg) == "Q6_K"
    assert recipe_type("token_embd.weight", (4096, 128256), "Q4_K_M", cfg) == "Q4_K"      # untied
    assert recipe_type("output.weight", (4096, 128256), "Q8_0", cfg) == "Q8_0"
    assert recipe_type("output.weight", (4096, 128256), "Q4_0", cfg) == "Q6_K"
    assert recipe_type("blk.0.attn_norm.weight", (4096,), "Q4_K_M", cfg) == "F32"


def test_70b_llama_gets_q5_k_attn_v():
    cfg, _ = preset_config("llama2-70b")
    assert recipe_type("blk.20.attn_v.weight", (8192, 1024), "Q4_K_M", cfg) == "Q5_K"   # not a more-bits layer
    assert recipe_type("blk.5.attn_v.weight", (8192, 1024), "Q3_K_M", cfg) == "Q5_K"


def test_rows_that_do_not_split_into_256_blocks_fall_back():
    cfg, _ = preset_config("gemma3-270m")                      # d_model 640
    assert recipe_type("blk.2.ffn_up.weight", (640, 2048), "Q4_K_M", cfg) == "Q5_0"
    assert recipe_type("blk.0.attn_v.weight", (640, 256), "Q4_K_M", cfg) == "Q8_0"        # Q6_K -> Q8_0
    assert recipe_type("token_embd.weight", (640, 262144), "Q4_K_M", cfg) == "Q8_0"      # tied head
    assert recipe_type("blk.0.ffn_up.weight", (640, 2048), "Q5_K_M", cfg) == "Q5_1"


def test_weights_bytes_of_a_recipe_sum_the_tensors():
    cfg, _ = preset_config("smollm2-135m")
    tensors = [(t.name, t.ne) for t in planned_tensors(cfg)]
    f16 = weights_bytes(tensors, "F16", cfg)
    n_matrix = sum(t.n_elements for t in planned_tensors(cfg) if len(t.ne) == 2)
    n_vector = sum(t.n_elements for t in planned_tensors(cfg) if len(t.ne) == 1)
    assert f16["bytes"] == 2 * n_matrix + 4 * n_vector


def test_unknown_quant_type_is_a_usage_error():
    assert check_quant("q4_k_m") == "Q4_K_M"
    assert check_quant("IQ4_NL") == "IQ4_NL"
    with pytest.raises(UsageError, match="Q4_KM"):
        check_quant("Q4_KM")
