"""Mistral (sliding window), Llama 3.x (llama3 RoPE scaling), Qwen3 (per-head q/k norms) and Phi-3
(fused qkv with grouped-query heads, fused gate_up) from HF directories: logits equal transformers'.

Each model is a tiny random transformers 5 model (from_config; tests/reference/hf_dense_models.py's randomize
re-draws every weight: norm weights around 1, nonzero biases, matrices with std 0.25, so logits are
O(1-10)) saved with save_pretrained. 22 tokens run past every sliding window (8), so a window or
a frequency factor that is ignored changes the logits: each
test also checks that the feature moves HF's own logits by far more than the tolerance.

Tolerance 1e-4 absolute on logits of magnitude ~10: both sides are float32; the sums are at most
96 long (d_ff) and the softmax/norm rounding is ~1e-7 relative per op, so a correct port differs by
~1e-5 (what is measured); a wrong mask or frequency differs by > 0.1.
"""
import numpy as np
import pytest

import ffnlab
from ffnlab.config import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_dense_models import randomize  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
IDS = [int(i) for i in np.random.default_rng(0).integers(0, 300, 22)]
COMMON = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64)


def hf_logits(model):
    with torch.no_grad():
        return model(torch.tensor([IDS])).logits[0].numpy()


def check(model, path):
    """save model to path, load it with ffnlab -> (ffnlab Model, HF logits)"""
    model.save_pretrained(path, safe_serialization=True)
    ref = hf_logits(model)
    m = ffnlab.load(str(path), progress=False)
    ours = m.forward(IDS)
    assert np.abs(ref).max() > 1.0
    err = np.abs(ours - ref).max()
    assert err <= TOL, f"max |ffnlab - transformers| = {err:.2e}"
    return m, ref


def moved(a, b):
    """The feature under test changes HF's logits by far more than TOL (else the test cannot fail)."""
    assert np.abs(a - b).max() > 100 * TOL


def mistral(window, seed=1):
    return randomize(transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=window)), seed)


def test_mistral_sliding_window_every_layer(tmp_path):
    m, ref = check(mistral(8), tmp_path)
    assert m.config.sliding_window == 8 and all(m.config.is_sliding(il) for il in range(2))
    moved(ref, hf_logits(mistral(None)))


def test_mistral_window_in_the_kv_cache_path(tmp_path):
    """Generation's one-token path slices the cache to the window as the batched forward masks it."""
    m, ref = check(mistral(8), tmp_path)
    kv = m.new_cache(n_ctx=len(IDS))
    steps = [m.forward_last(IDS[:4], kv)] + [m.forward_last([t], kv) for t in IDS[4:]]
    assert np.abs(np.stack(steps) - ref[3:]).max() <= TOL


def qwen3(seed=2, **kw):
    cfg = transformers.Qwen3Config(**COMMON, head_dim=16, **kw)
    return randomize(transformers.Qwen3ForCausalLM(cfg), seed)


def test_qwen3_qk_norm_and_attention_bias(tmp_path):
    m, _ = check(qwen3(attention_bias=True), tmp_path)
    c = m.config
    assert c.arch == "qwen3" and c.qk_norm and not c.qk_norm_full and c.attn_bias and c.attn_out_bias
    assert not c.sliding_window


def test_qwen3_use_sliding_window_from_layer_zero(tmp_path):
    m, ref = check(qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=0), tmp_path)
    assert m.config.sliding_window == 8 and m.config.sliding_window_pattern == 0
    moved(ref, hf_logits(qwen3(use_sliding_window=False, sliding_window=8, max_window_layers=0)))


def test_qwen3_window_off_unless_use_sliding_window(tmp_path):
    """Qwen2.5/3 hub configs carry sliding_window with use_sliding_window false: full attention."""
    m, _ = check(qwen3(use_sliding_window=False, sliding_window=8, max_window_layers=0), tmp_path)
    assert m.config.sliding_window == 0


def test_qwen_window_from_max_window_layers_on(tmp_path):
    """max_window_layers=1 of 2: layer 0 attends fully, layer 1 slides."""
    m, ref = check(qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=1), tmp_path)
    assert m.config.sliding_window_start == 1 and [m.config.is_sliding(il) for il in range(2)] == [False, True]
    moved(ref, hf_logits(qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=0)))
    moved(ref, hf_logits(qwen3(use_sliding_window=False)))


def test_layer_types_out_of_order_are_refused(tmp_path):
    """Sliding then full layers: no max_window_layers describes it."""
    import json
    qwen3(use_sliding_window=True, sliding_window=8, max_window_layers=1).save_pretrained(tmp_path)
    f = tmp_path / "config.json"
    d = json.loads(f.read_text())
    d["layer_types"] = ["sliding_attention", "full_attention"]
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="layer_types"):
        ffnlab.load(str(tmp_path), progress=False)


def phi3(seed=3, **kw):
    cfg = transformers.Phi3Config(**COMMON, pad_token_id=0, bos_token_id=0, eos_token_id=0, **kw)
    return randomize(transformers.Phi3ForCausalLM(cfg), seed)


def test_phi3_fused_qkv_with_grouped_heads_and_fused_gate_up(tmp_path):
    m, _ = check(phi3(), tmp_path)
    c = m.config
    assert c.arch == "phi3" and c.fused_qkv and (c.n_head, c.n_kv_head) == (4, 2)
    assert m.params["blk.0.attn_qkv.weight"].shape == (64 + 2 * 32, 64)
    assert m.params["blk.0.ffn_gate.weight"].shape == m.params["blk.0.ffn_up.weight"].shape == (96, 64)


def test_phi3_sliding_window(tmp_path):
    m, ref = check(phi3(sliding_window=8), tmp_path)
    assert m.config.sliding_window == 8
    moved(ref, hf_logits(phi3()))


def test_phi3_partial_rotary(tmp_path):
    """partial_rotary_factor 0.5: the first 8 of 16 dims of each head rotate (rope_dim 8)."""
    rope = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    m, ref = check(phi3(rope_parameters=rope), tmp_path)
    assert m.config.rope_dim == 8 and m.config.n_rot == 8
    moved(ref, hf_logits(phi3()))


def test_phi3_partial_rotary_out_of_range_is_refused(tmp_path):
    phi3().save_pretrained(tmp_path)
    import json
    f = tmp_path / "config.json"
    d = json.loads(f.read_text())
    d["rope_parameters"]["partial_rotary_factor"] = 1.5
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="partial_rotary_factor"):
        ffnlab.load(str(tmp_path), progress=False)


LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=32)


def llama(rope, seed=4):
    return randomize(transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_parameters=rope)), seed)


def test_llama3_rope_scaling(tmp_path):
    """original_max_position_embeddings 32 puts head_dim 16's eight frequencies (wavelengths 6.3,
    19.9, 62.8, ... with base 10000) in all three bands: kept (< 32/4), interpolated, divided by 8 (> 32)."""
    m, ref = check(llama(LLAMA3), tmp_path)
    f = np.array(m.config.rope_freq_factors)
    assert f.min() == 1.0 and f.max() == 8.0 and ((f > 1) & (f < 8)).any()
    moved(ref, hf_logits(llama(dict(rope_type="default", rope_theta=10000.0))))


def test_llama3_factors_equal_transformers_inv_freq():
    """Our divisors applied to the plain frequencies give transformers' own llama3 inv_freq."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ffnlab.config import llama3_freq_factors
    cfg = transformers.LlamaConfig(**{**COMMON, "hidden_size": 512, "num_attention_heads": 4},
                                   rope_parameters={**LLAMA3, "rope_theta": 500000.0,
                                                    "original_max_position_embeddings": 8192})
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    hd = 128
    plain = 500000.0 ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ours = plain / np.array(llama3_freq_factors(hd, 500000.0, 8.0, 1.0, 4.0, 8192))
    # torch computes in float32: pow, a division and the band's blend are a handful of roundings of
    # eps32/2 each (pow within an ulp or two), so 16 eps32 relative bounds them against our float64
    np.testing.assert_allclose(ours, inv.double().numpy(), rtol=16 * np.finfo(np.float32).eps)


def test_unknown_rope_type_is_refused(tmp_path):
    llama(dict(rope_type="default", rope_theta=10000.0)).save_pretrained(tmp_path)
    import json
    f = tmp_path / "config.json"
    d = json.loads(f.read_text())
    d["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    f.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="rope_type 'yarn'"):
        ffnlab.load(str(tmp_path), progress=False)
