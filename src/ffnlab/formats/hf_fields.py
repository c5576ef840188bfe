"""Every config.json field of each dense family, sorted into three lists.

A transformers config class has a few dozen fields. For ffnlab to be right it is not enough to
read the ones it knows: a field it silently ignores may change the logits (Mistral's
sliding_window did). So each family lists each field of its transformers 5 config class as
  used        read by hf_config.py into ModelConfig
  irrelevant  cannot change a forward pass's logits (a label, an output option, dropout, init), with why
  refused     changes the math in a way ffnlab does not implement: a value other than the accepted
              ones raises ConfigError naming the field (refuse_unsupported below, called by config_from_hf)
tests/engines/test_hf_fields.py enumerates the classes (LlamaConfig, ...) and holds these lists to them. Each
family module (families/<arch>.py) holds its lists in hf_fields. The MoE families keep theirs in hf_moe.py.
"""
from ..config import ConfigError
from ..families import hf_field_lists
from ..families.hf_common import COMMON_IRRELEVANT

FAMILIES = hf_field_lists()              # {model_type: HFFields}, each family module's hf_fields


def refuse_unsupported(d, model_type, path):
    """Raise ConfigError naming the first refused field of `model_type` whose value ffnlab does not
    compute (top-level, or inside rope_parameters / rope_scaling)."""
    fam = FAMILIES.get(model_type)
    if fam is None:
        return
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    scaling = d.get("rope_scaling") if isinstance(d.get("rope_scaling"), dict) else {}
    for name, r in fam.refused.items():
        for where, src in (("", d), ("rope_parameters.", rope), ("rope_scaling.", scaling)):
            if name in src and not r.ok(src[name]):
                raise ConfigError(f"{path}: field '{where}{name}' = {src[name]!r:.60}: {r.why}")


def family_fields(model_type) -> set:
    """Every field a family's lists name (the test compares it with the config class)."""
    fam = FAMILIES[model_type]
    return set(fam.used) | set(COMMON_IRRELEVANT) | set(fam.irrelevant) | set(fam.refused)
