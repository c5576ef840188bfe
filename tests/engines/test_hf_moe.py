"""Mixture-of-experts HF directories (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) against transformers.

Each test builds a tiny random model with transformers' from_config, re-draws every weight with
a wide spread (norm weights 0.5..1.5, nonzero q/k/v/o biases where the family has them, the
router large enough that the top-k choice is decisive), saves it with save_pretrained (the hub's
per-expert tensors) and compares ffnlab's float32 logits with transformers' forward: <= 1e-4
absolute, as tests/engines/test_hf_dirs.py does for the dense families.
"""
import numpy as np
import pytest

import ffnlab
from ffnlab.config import ConfigError
from ffnlab.errors import ModelFileError
from ffnlab.formats.hf_config import config_from_hf
from ffnlab.formats.hf_moe import IRRELEVANT, REFUSED, USED

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_moe_models import COMMON, FAMILIES, randomize  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
IDS = [3, 17, 250, 9, 42, 0, 101, 7, 299, 64, 5, 12, 77, 180]


def build(family, seed=0):
    cls, kw = FAMILIES[family]
    cfg = getattr(transformers, cls)(**COMMON, **kw)
    return randomize(transformers.AutoModelForCausalLM.from_config(cfg), seed)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_moe_dir_logits_match_transformers(family, tmp_path):
    model = build(family)
    model.save_pretrained(tmp_path, safe_serialization=True)
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    m = ffnlab.load(str(tmp_path), progress=False)
    assert m.config.ffn == "moe" and m.config.n_expert == FAMILIES[family][1].get(
        "num_local_experts", FAMILIES[family][1].get("num_experts"))
    ours = m.forward(IDS)
    assert np.abs(ref).max() > 1.0
    err = np.abs(ours - ref).max()
    assert err <= TOL, f"{family}: max |ffnlab - transformers| = {err:.2e}"
    # the KV-cache decode path gives the same logits
    kv = m.new_cache()
    steps = np.stack([m.forward_last([t], kv) for t in IDS])
    assert np.abs(steps - ref).max() <= TOL


@pytest.mark.parametrize("cls", ["MixtralConfig", "Qwen2MoeConfig", "Qwen3MoeConfig", "OlmoeConfig"])
def test_every_config_field_is_used_known_irrelevant_or_refused(cls):
    fields = set(getattr(transformers, cls)().to_dict())
    unaccounted = fields - set(USED) - set(IRRELEVANT) - set(REFUSED)
    assert not unaccounted, f"{cls}: fields neither used, irrelevant nor refused: {sorted(unaccounted)}"


def hf_dict(family, **over):
    cls, kw = FAMILIES[family]
    d = getattr(transformers, cls)(**COMMON, **kw).to_dict()
    d.update(over)
    return d


@pytest.mark.parametrize("family,over,msg", [
    ("mixtral", {"num_experts_per_tok": 7}, r"'num_experts_per_tok' = 7 exceeds 'num_local_experts' = 6"),
    ("qwen2_moe", {"decoder_sparse_step": 2}, r"'decoder_sparse_step' = 2"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, r"'mlp_only_layers' = \[1\]"),
    ("qwen2_moe", {"use_sliding_window": True}, r"'use_sliding_window' = true"),
    ("mixtral", {"sliding_window": 16}, r"'sliding_window' = 16"),
    ("olmoe", {"clip_qkv": 8.0}, r"'clip_qkv' = 8.0"),
    ("olmoe", {"hidden_act": "gelu"}, r"'hidden_act' = 'gelu'"),
])
def test_fields_that_change_the_math_are_refused(family, over, msg):
    with pytest.raises(ConfigError, match=msg):
        config_from_hf(hf_dict(family, **over), "x/config.json")


def test_a_missing_expert_is_named(tmp_path):
    from safetensors.numpy import load_file, save_file
    build("mixtral").save_pretrained(tmp_path, safe_serialization=True)
    f = tmp_path / "model.safetensors"
    t = load_file(f)
    del t["model.layers.1.block_sparse_moe.experts.4.w3.weight"]
    save_file(t, f)
    with pytest.raises(ModelFileError, match=r"no weights for expert 4 of blk.1.ffn_up_exps.weight"):
        ffnlab.load(str(tmp_path), progress=False)


@pytest.mark.parametrize("family", ["mixtral", "qwen2_moe", "qwen3_moe", "olmoe"])
def test_export_hf_writes_what_transformers_loads(family, tmp_path):
    """HF dir -> ffnlab -> export_hf -> transformers.from_pretrained: the logits ffnlab computes."""
    from ffnlab.formats.export_hf import export_hf
    from ffnlab.training.data import byte_tokenizer
    build(family).save_pretrained(tmp_path / "src", safe_serialization=True)
    m = ffnlab.load(str(tmp_path / "src"), progress=False)
    export_hf(m.config, m.params, byte_tokenizer(), str(tmp_path / "out"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()
    assert type(back).__name__ == {"mixtral": "MixtralForCausalLM", "qwen2_moe": "Qwen2MoeForCausalLM",
                                   "qwen3_moe": "Qwen3MoeForCausalLM", "olmoe": "OlmoeForCausalLM"}[family]
    with torch.no_grad():
        ref = back(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(m.forward(IDS) - ref).max() <= TOL


def test_a_switch_style_model_has_no_hf_class():
    from ffnlab.errors import UsageError
    from ffnlab.formats.export_hf import hf_family
    from moe_models import moe_config
    with pytest.raises(UsageError, match=r"MixtralForCausalLM\): expert_norm=False"):
        hf_family(moe_config(K=1, norm=False))
    assert hf_family(moe_config(K=2, norm=True)) == "mixtral"
