"""Gemma 2, GPT-NeoX/Pythia and OLMo 2 HF directories against transformers (formats/hf_families.py).

Each test builds a tiny random model with transformers' from_config, re-draws every weight with a
wide spread (norm weights 0.5..1.5, nonzero biases where the family has them), saves it with
save_pretrained and compares ffnlab's float32 logits with transformers' float32 forward on 14
tokens, longer than Gemma 2's sliding window of 4 and with softcaps small enough to bend the
scores. Bound 1e-4 absolute, as tests/engines/test_hf_dirs.py: both sides are float32 forwards of the same
math in another summation order; logits are O(1..10), reductions ~100 long, so each side's error is
~ 100 * 6e-8 * 10 = 6e-5 at worst and typically far less.
"""
import numpy as np
import pytest

import ffnlab
from ffnlab.config import ConfigError
from ffnlab.formats.hf_config import config_from_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_family_models import randomize  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
VOCAB = 300
IDS = [3, 17, 250, 9, 42, 0, 101, 7, 299, 64, 5, 12, 77, 180]
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
              max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
FAMILIES = {
    # query_pre_attn_scalar != head_dim, both softcaps small enough to matter, window 4 < 14 tokens
    "gemma2": ("Gemma2Config", dict(intermediate_size=96, num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=32,
                                    sliding_window=4, attn_logit_softcapping=3.0, final_logit_softcapping=6.0)),
    "gemma2_bias": ("Gemma2Config", dict(intermediate_size=96, num_key_value_heads=2, head_dim=16, sliding_window=5,
                                         attention_bias=True, attn_logit_softcapping=None,
                                         rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                                         final_logit_softcapping=None, tie_word_embeddings=False)),
    "pythia": ("GPTNeoXConfig", dict(intermediate_size=128, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                             "partial_rotary_factor": 0.25})),
    "gpt_neox_sequential": ("GPTNeoXConfig", dict(intermediate_size=96, use_parallel_residual=False,
                                                  rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                                                   "partial_rotary_factor": 0.5},
                                                  tie_word_embeddings=True, hidden_act="gelu_new")),
    "pythia_linear_rope": ("GPTNeoXConfig", dict(intermediate_size=128, rope_parameters={
        "rope_type": "linear", "factor": 3.0, "rope_theta": 1e4, "partial_rotary_factor": 0.5})),
    "olmo2": ("Olmo2Config", dict(intermediate_size=96, num_key_value_heads=2)),
    "olmo2_bias": ("Olmo2Config", dict(intermediate_size=96, num_key_value_heads=4, attention_bias=True,
                                       tie_word_embeddings=True)),
}


def build(family, seed=0):
    cls, kw = FAMILIES[family]
    cfg = getattr(transformers, cls)(**COMMON, **kw)
    return randomize(transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager"), seed)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (directory, transformers' logits [T, vocab])"""
    out = {}
    for family in FAMILIES:
        model = build(family)
        d = tmp_path_factory.mktemp(family)
        model.save_pretrained(d, safe_serialization=True)
        with torch.no_grad():
            out[family] = (str(d), model(torch.tensor([IDS])).logits[0].numpy())
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dir_logits_match_transformers(family, saved):
    path, ref = saved[family]
    m = ffnlab.load(path, progress=False)
    ours = m.forward(IDS)
    assert np.abs(ref).max() > 1.0
    err = np.abs(ours - ref).max()
    assert err <= TOL, f"{family}: max |ffnlab - transformers| = {err:.2e}"
    kv = m.new_cache()                                   # the KV-cache decode path gives the same logits
    steps = np.stack([m.forward_last([t], kv) for t in IDS])
    assert np.abs(steps - ref).max() <= TOL


def test_the_flags_each_family_sets(saved):
    g = ffnlab.load(saved["gemma2"][0], progress=False).config
    assert (g.attn_softcap, g.final_logit_softcap, g.sliding_window, g.sliding_window_pattern) == (3.0, 6.0, 4, 2)
    assert g.attn_scale == pytest.approx(32 ** -0.5) and g.is_sliding(0) and not g.is_sliding(1)
    n = ffnlab.load(saved["pythia"][0], progress=False).config
    assert (n.parallel_residual, n.rope_dim, n.head_dim, n.norm, n.ffn) == (True, 4, 16, "layernorm", "gelu")
    o = ffnlab.load(saved["olmo2"][0], progress=False).config
    assert (o.pre_norm, o.post_attn_norm, o.post_ffn_norm, o.qk_norm_full) == (False, True, True, True)


def hf_dict(family, **over):
    cls, kw = FAMILIES[family]
    d = getattr(transformers, cls)(**COMMON, **kw).to_dict()
    d.update(over)
    return d


@pytest.mark.parametrize("family,over,msg", [
    ("gemma2", {"use_bidirectional_attention": True}, r"'use_bidirectional_attention' = True"),
    ("gemma2", {"layer_types": ["full_attention"] * 3}, r"'layer_types' = \['full_attention'"),
    ("pythia", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.1}},
     r"'partial_rotary_factor' = 0.1 .*odd"),
    ("pythia", {"hidden_act": "silu"}, r"'hidden_act' = 'silu'"),
])
def test_fields_that_change_the_math_are_refused(family, over, msg):
    with pytest.raises(ConfigError, match=msg):
        config_from_hf(hf_dict(family, **over), "x/config.json")


def test_pythia_legacy_rotary_fields():
    """Pythia's hub config.json (transformers 4) says rotary_pct / rotary_emb_base at the top level."""
    d = hf_dict("pythia")
    del d["rope_parameters"]
    d.update(rotary_pct=0.5, rotary_emb_base=2000)
    cfg = config_from_hf(d, "x/config.json")
    assert (cfg.rope_dim, cfg.rope_theta) == (8, 2000.0)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_hf_loads_in_transformers_with_the_same_logits(family, saved, tmp_path):
    """ffnlab's HF export of the loaded model: transformers loads it and computes ffnlab's logits
    (and the original model's), within the same 1e-4."""
    from ffnlab.formats.export_hf import export_hf
    from ffnlab.training.data import byte_tokenizer
    path, ref = saved[family]
    m = ffnlab.load(path, progress=False)
    export_hf(m.config, m.params, byte_tokenizer(), str(tmp_path / "out"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = back(torch.tensor([IDS])).logits[0].numpy()
    err = np.abs(theirs - m.forward(IDS)).max()
    assert err <= TOL, f"{family}: max |transformers(export) - ffnlab| = {err:.2e}"
    assert np.abs(theirs - ref).max() <= TOL
    assert ffnlab.load(str(tmp_path / "out"), progress=False).config == m.config
