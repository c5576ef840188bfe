"""The family registry (src/ffnlab/families/): one record per family, consulted by every reader,
exporter and tracer, and the only place that names an architecture.

  - the registry is consistent: one family per HF model_type, and the runnable lists the readers
    print are the registry's;
  - every family's HF tensor renames are one-to-one and read back (formats/hf.py gguf_name);
  - every family's GGUF keys (gguf_keys, gguf_flags) survive an export to GGUF and the read back,
    and its HF fields (hf_keys, hf_config_extra) an export to config.json and the read back;
  - no module outside families/ names an architecture (a quoted arch or model_type), beyond the
    occurrences listed in ALLOWED with why: a new family adds no string anywhere else.
"""
import collections
import dataclasses
import pathlib
import re

import pytest

from ffnlab import families
from ffnlab.config import RUNNABLE_ARCHS, ModelConfig
from ffnlab.formats import gguf_meta, hf_config
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.formats.export_hf import hf_config as hf_config_json
from ffnlab.formats.export_hf import hf_family as hf_export_type
from ffnlab.formats.hf import gguf_name
from ffnlab.training.data import byte_tokenizer, tokenizer_meta
from block_checks import random_params

SRC = pathlib.Path(families.__file__).parent.parent
NEW = ("granite", "smollm3")          # added as one module each: named nowhere else


def test_one_family_per_model_type_and_arch():
    seen = collections.Counter(t for f in families.FAMILIES.values() for t in f.hf_types)
    assert [t for t, n in seen.items() if n > 1] == []
    assert all(a == f.arch for a, f in families.FAMILIES.items())
    for f in families.FAMILIES.values():
        assert all(families.hf_family(t) is f for t in f.hf_types)


def test_the_readers_lists_are_the_registrys():
    assert RUNNABLE_ARCHS == families.runnable_archs() == gguf_meta.ARCHS
    assert set(hf_config.SUPPORTED) == {t for f in families.FAMILIES.values() for t in f.hf_types}
    assert set(NEW) <= set(RUNNABLE_ARCHS)


@pytest.mark.parametrize("arch", [a for a, f in families.FAMILIES.items() if f.hf_tensors is not None])
def test_hf_tensor_renames_are_one_to_one_and_read_back(arch):
    t = families.family(arch).hf_tensors
    assert len(set(t.top.values())) == len(t.top) and len(set(t.block.values())) == len(t.block)
    layer = t.layers.replace("\\", "")
    for hf, gguf in t.block.items():
        assert gguf_name(f"{t.prefix}{layer}.3.{hf}.weight", arch) == f"blk.3.{gguf}.weight"
    for hf, gguf in t.top.items():
        assert gguf_name(t.prefix + hf, arch) == gguf
    assert gguf_name(f"{t.prefix}{layer}.0.rotary_emb.inv_freq", arch) is None


def _llama_shaped(arch, **kw):
    return ModelConfig(arch=arch, n_layer=4, d_model=32, n_head=4, n_kv_head=2, d_ff=64, ffn="swiglu", norm="rmsnorm",
                       positions="rope", rope_pairing="neox", vocab_size=256, n_ctx=32, tie_embeddings=False, **kw)


# a config of each family whose field maps carry more than Llama's, its family's flags set off their defaults
ROUND_TRIP = {
    "granite": _llama_shaped("granite", embedding_multiplier=3.0, residual_multiplier=0.25, attn_scale=0.125,
                             logits_scaling=2.5),
    "smollm3": _llama_shaped("smollm3", no_rope_layer_step=4),
    "gptneox": ModelConfig(arch="gptneox", n_layer=2, d_model=32, n_head=2, d_ff=128, ffn="gelu", ffn_bias=True,
                           attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="rope",
                           rope_pairing="neox", rope_dim=8, parallel_residual=False, vocab_size=256, n_ctx=32,
                           tie_embeddings=False),
    "olmo2": _llama_shaped("olmo2", pre_norm=False, post_attn_norm=True, post_ffn_norm=True, qk_norm=True,
                           qk_norm_full=True),
}


def _family_fields(cfg):
    """The config fields a family's own maps and flags decide."""
    f = families.family(cfg.arch)
    return set(f.gguf_keys) | set(f.gguf_flags) | set(f.hf_keys) | set(f.hf_flags) | {"no_rope_layer_step"}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_gguf_field_map_round_trips(name, tmp_path):
    cfg = ROUND_TRIP[name]
    tok = byte_tokenizer()
    path = export_gguf(cfg, random_params(cfg), tok, tokenizer_meta(tok, "byte"), str(tmp_path / "m.gguf"))
    back = gguf_meta.config_from_gguf(gguf_meta.open_gguf(path), path)
    assert back.arch == cfg.arch
    for f in _family_fields(cfg):
        assert getattr(back, f) == pytest.approx(getattr(cfg, f), rel=1e-7), f     # GGUF keeps float32


@pytest.mark.parametrize("name", list(ROUND_TRIP))
def test_hf_field_map_round_trips(name):
    cfg = ROUND_TRIP[name]
    tok = byte_tokenizer()
    d = hf_config_json(cfg, hf_export_type(cfg), tok)
    back = hf_config.config_from_hf(d, "x/config.json")
    assert back.arch == cfg.arch
    for f in _family_fields(cfg) | {"n_layer", "d_model", "n_head", "n_kv_head", "d_ff", "norm_eps"}:
        assert getattr(back, f) == getattr(cfg, f), f


def test_a_nope_layer_step_is_a_per_layer_rope_mask():
    cfg = dataclasses.replace(ROUND_TRIP["smollm3"], n_layer=8)
    assert [cfg.uses_rope(il) for il in range(8)] == [True, True, True, False] * 2
    assert families.smollm3.no_rope_step([1, 1, 1, 0, 1, 1, 1, 0], 8) == 4
    assert families.smollm3.no_rope_step([1, 0, 1, 1], 4) is None
    assert families.smollm3.no_rope_step([1] * 5, 5) == 0


# -- no architecture named outside families/ ------------------------------------------------------
# {(file under src/ffnlab, quoted name): count, why}. Everything here is either not an architecture
# (a tokenizer's pre-tokenizer or model name, an installed model's name, a preset's published
# config.json), or family-specific reading logic still written in formats/ against the family's
# own fields (Gemma's llama.cpp rules, GPT-NeoX's config class, the MoE tables, the Llama-shaped
# HF classes' per-class fields), each a candidate for its family module.
_PRESET = "a preset's published config.json (its model_type), data not logic"
_TOKENIZER = "a tokenizer's name (tokenizer.ggml.model / .pre, a peft or cache label), not an architecture"
_MOE = "formats/hf_moe.py and gguf_moe.py: the MoE families' tables, not yet in families/moe.py"
_GEMMA = "llama.cpp's and transformers' Gemma rules (softcaps, windows, 27B scale), not yet in families/gemma*.py"
_NEOX = "GPT-NeoX's own config class and qkv layout (formats/hf_families.py, gguf_families.py)"
_LLAMA_HF = "the Llama-shaped HF classes' per-class config.json fields (formats/export_hf_llama.py, hf_config.py)"
_GPT2 = "GPT-2's own HF layout and export (learned positions, Conv1D, fused c_attn)"
ALLOWED = {
    ("analysis/presets.py", n): (k, _PRESET) for n, k in (
        ("bert", 1), ("gemma2", 1), ("gemma3_text", 1), ("gpt2", 2), ("gpt_neox", 1), ("llama", 2), ("mistral", 2),
        ("mixtral", 1), ("olmo2", 1), ("olmoe", 1), ("phi3", 1), ("qwen2", 2), ("qwen3", 1), ("qwen3_moe", 1),
        ("gemma3", 1))}
ALLOWED.update({
    ("analysis/quant.py", "llama"): (1, "Llama 2 70B's published quant mix (llama-quantize's rule for 80 layers)"),
    ("analysis/source.py", "bert"): (1, "BERT's extra parameters in the sizing tools"),
    ("cli/ablate.py", "llama"): (1, "the toy model the ablation command trains"),
    ("experiments/config.py", "llama"): (1, "the toy model the claims' experiments train"),
    ("training/presets.py", "llama"): (1, "a training preset's architecture"),
    ("training/presets.py", "gpt2"): (1, "a training preset's architecture"),
    ("config.py", "llama"): (1, "ModelConfig's default arch"),
    ("formats/installed.py", "gemma3"): (4, "the installed Gemma 3 270M's short name"),
    ("formats/gguf_tokenizer.py", "gpt2"): (5, _TOKENIZER), ("formats/gguf_tokenizer.py", "llama"): (4, _TOKENIZER),
    ("formats/gguf_tokenizer.py", "qwen2"): (1, _TOKENIZER), ("formats/peft.py", "gpt2"): (2, _TOKENIZER),
    ("formats/tokenizer_cache.py", "gpt2"): (2, _TOKENIZER), ("formats/export_gguf.py", "qwen2"): (1, _TOKENIZER),
    ("formats/export_gguf.py", "gpt2"): (7, _GPT2), ("formats/export_gguf.py", "llama"): (1, "PLAIN: the default target"),
    ("formats/export_hf.py", "gpt2"): (5, _GPT2), ("formats/export_hf.py", "llama"): (1, _LLAMA_HF),
    ("formats/export_hf.py", "mixtral"): (1, _MOE), ("formats/export_hf.py", "olmoe"): (1, _MOE),
    ("formats/export_hf.py", "qwen2_moe"): (1, _MOE), ("formats/export_hf.py", "qwen3_moe"): (1, _MOE),
    ("formats/export_hf_llama.py", "llama"): (5, _LLAMA_HF), ("formats/export_hf_llama.py", "mistral"): (2, _LLAMA_HF),
    ("formats/export_hf_llama.py", "phi3"): (3, _LLAMA_HF), ("formats/export_hf_llama.py", "qwen2"): (1, _LLAMA_HF),
    ("formats/export_hf_llama.py", "qwen3"): (3, _LLAMA_HF),
    ("formats/gguf_families.py", "gemma2"): (3, _GEMMA), ("formats/gguf_families.py", "gptneox"): (7, _NEOX),
    ("formats/gguf_families.py", "olmo2"): (5, "llama.cpp's olmo2 graph's hard-coded fields"),
    ("formats/gguf_lora.py", "llama"): (1, "a LoRA adapter's GGUF architecture field"),
    ("formats/gguf_meta.py", "gemma2"): (5, _GEMMA), ("formats/gguf_meta.py", "gemma3"): (2, _GEMMA),
    ("formats/gguf_moe.py", "llama"): (5, _MOE), ("formats/gguf_moe.py", "olmoe"): (5, _MOE),
    ("formats/gguf_moe.py", "qwen2moe"): (8, _MOE), ("formats/gguf_moe.py", "qwen3moe"): (5, _MOE),
    ("formats/hf_config.py", "bert"): (3, "BERT's config class (sizing only)"),
    ("formats/hf_config.py", "gemma2"): (3, _GEMMA), ("formats/hf_config.py", "gemma3"): (2, _GEMMA),
    ("formats/hf_config.py", "gemma3_text"): (2, _GEMMA), ("formats/hf_config.py", "gpt2"): (2, _GPT2),
    ("formats/hf_config.py", "gpt_neox"): (1, _NEOX), ("formats/hf_config.py", "phi3"): (1, "Phi-3's partial rotary"),
    ("formats/hf_config.py", "qwen2"): (3, "Qwen's use_sliding_window / max_window_layers"),
    ("formats/hf_config.py", "qwen3"): (3, "Qwen's use_sliding_window / max_window_layers"),
    ("formats/hf_families.py", "gemma2"): (4, _GEMMA), ("formats/hf_families.py", "gptneox"): (7, _NEOX),
    ("formats/hf_families.py", "olmo2"): (2, "Olmo2Config's export (hidden_act) and q/k norms"),
    ("formats/hf_moe.py", "llama"): (1, _MOE), ("formats/hf_moe.py", "mixtral"): (12, _MOE),
    ("formats/hf_moe.py", "olmoe"): (11, _MOE), ("formats/hf_moe.py", "qwen2_moe"): (9, _MOE),
    ("formats/hf_moe.py", "qwen2moe"): (1, _MOE), ("formats/hf_moe.py", "qwen3_moe"): (9, _MOE),
    ("formats/hf_moe.py", "qwen3moe"): (1, _MOE),
    ("generation/chat_templates.py", "gemma2"): (1, "the chat template each family's models use"),
    ("generation/chat_templates.py", "gemma3"): (1, "the chat template each family's models use"),
    ("generation/chat_templates.py", "phi3"): (3, "the chat template each family's models use"),
    ("generation/chat_templates.py", "qwen2"): (1, "the chat template each family's models use"),
    ("generation/chat_templates.py", "qwen2moe"): (1, "the chat template each family's models use"),
    ("generation/chat_templates.py", "qwen3"): (1, "the chat template each family's models use"),
    ("generation/chat_templates.py", "qwen3moe"): (1, "the chat template each family's models use"),
    ("tracing/hf.py", "gemma2"): (1, "transformers' GGUF reader leaves Gemma 2's softcaps unset"),
    ("tracing/hf.py", "gpt2"): (4, "transformers' GGUF reader leaves GPT-2's n_positions at 1024; GPT-2 has no RoPE"),
    ("tracing/hf.py", "olmo2"): (1, "OLMo 2's module layout (no input_layernorm, whole-projection q/k norms)"),
    ("tracing/hf.py", "qwen3"): (1, "Qwen3's per-head q/k norms run before HF's transpose"),
})


def architecture_strings():
    """{(file, name): count} of quoted architecture / model_type strings outside families/."""
    names = set(families.FAMILIES) | {t for f in families.FAMILIES.values() for t in f.hf_types}
    quoted = re.compile(r"""["'](%s)["']""" % "|".join(sorted(names, key=len, reverse=True)))
    found = collections.Counter()
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC).as_posix()
        if rel.startswith("families/"):
            continue
        for m in quoted.finditer(path.read_text(encoding="utf-8")):
            found[(rel, m.group(1))] += 1
    return found


def test_no_module_outside_families_names_an_architecture():
    found = architecture_strings()
    extra = {k: n for k, n in found.items() if n > ALLOWED.get(k, (0, ""))[0]}
    assert not extra, f"architecture names outside src/ffnlab/families/ (put them in the family's module): {extra}"
    assert not [k for k in found if k[1] in NEW]


def test_the_allowed_list_has_no_stale_entries():
    found = architecture_strings()
    stale = {k: (n, found.get(k, 0)) for k, (n, _) in ALLOWED.items() if found.get(k, 0) < n}
    assert not stale, f"ALLOWED counts above what the code holds (lower them): {stale}"
