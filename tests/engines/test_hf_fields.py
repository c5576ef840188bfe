"""Every field of each dense family's transformers config class is used, listed as irrelevant, or
refused with a line naming it (formats/hf_fields.py).

The fields come from transformers itself (the config class's dataclass fields plus what its
to_dict() writes), so a field a new transformers release adds fails here until it is sorted. A
refused field is set to a value ffnlab does not compute and config_from_hf must raise ConfigError
naming it; a used field must appear in ffnlab's reader (formats/hf_config.py) so the list cannot
claim a field nobody reads (or in its family module, families/<arch>.py).
"""
import dataclasses
import importlib
import inspect
import pkgutil

import pytest

import ffnlab.families
from ffnlab.config import ConfigError
from ffnlab.formats import hf_config, hf_families, hf_fields
from ffnlab.formats.hf_config import config_from_hf

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

FAMILIES = sorted(hf_fields.FAMILIES)
SMALL = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def class_fields(model_type) -> set:
    cls = getattr(transformers, hf_fields.FAMILIES[model_type].config_class)
    names = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    return names | set(cls().to_dict())


def small_config(model_type) -> dict:
    cls = getattr(transformers, hf_fields.FAMILIES[model_type].config_class)
    return cls(**SMALL).to_dict()


@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_field_is_sorted(model_type):
    missing = sorted(class_fields(model_type) - hf_fields.family_fields(model_type))
    assert not missing, f"{model_type}: fields neither used, irrelevant nor refused: {missing}"


@pytest.mark.parametrize("model_type", FAMILIES)
def test_lists_are_disjoint_and_name_real_fields(model_type):
    fam = hf_fields.FAMILIES[model_type]
    irrelevant = set(hf_fields.COMMON_IRRELEVANT) | set(fam.irrelevant)
    assert not set(fam.used) & irrelevant and not set(fam.used) & set(fam.refused)
    assert not irrelevant & set(fam.refused)
    rope_keys = {"partial_rotary_factor"}                       # refused keys may live in rope_parameters
    extra = set(fam.used) | set(fam.irrelevant) | set(fam.refused)      # partial_rotary_factor: Phi-3 uses it
    assert extra - class_fields(model_type) <= rope_keys


@pytest.mark.parametrize("model_type", FAMILIES)
def test_used_fields_are_read(model_type):
    """Each used field's name is read by the HF config reader's source (a string it looks up), or
    by a family module's hf_keys / hf_config_extra (families/)."""
    src = inspect.getsource(hf_config) + inspect.getsource(hf_families) + "".join(
        inspect.getsource(importlib.import_module(f"ffnlab.families.{m.name}"))
        for m in pkgutil.iter_modules(ffnlab.families.__path__))
    unread = [f for f in hf_fields.FAMILIES[model_type].used if f'"{f}"' not in src]
    assert not unread, f"{model_type}: listed as used but never read: {unread}"


@pytest.mark.parametrize("model_type", FAMILIES)
def test_default_config_loads(model_type):
    cfg = config_from_hf(small_config(model_type), "config.json")
    assert cfg.n_layer == 2 and cfg.d_model == 64


REFUSED = [(t, f) for t in FAMILIES for f in hf_fields.FAMILIES[t].refused]


@pytest.mark.parametrize("model_type,name", REFUSED)
def test_refused_field_names_itself(model_type, name):
    d = small_config(model_type)
    bad = hf_fields.FAMILIES[model_type].refused[name].bad
    if name in d:
        d[name] = bad
    else:
        d["rope_parameters"] = {**d.get("rope_parameters", {}), name: bad}
    with pytest.raises(ConfigError) as e:
        config_from_hf(d, "dir/config.json")
    msg = str(e.value)
    assert name in msg and msg.startswith("dir/config.json:") and "\n" not in msg
