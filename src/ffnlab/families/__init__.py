"""One module per family, and the registry every reader, exporter and tracer consults.

    fam = family("phi3")            # by GGUF architecture (ModelConfig.arch)
    fam = hf_family("mistral")      # by transformers model_type -> the llama family
    fam.hf_tensors, fam.gguf_target, fam.graph.q_scaled, ...   (families/record.py)

A new family is one module here that defines FAMILY (a record.Family), named in FAMILIES below; formats/, model/, tracing/ read its fields and name no architecture themselves. Pure data:
nothing of ffnlab is imported here (families sit below model/, formats/ and cli/).
"""
from . import bert, gemma2, gemma3, gpt2, gptneox, granite, llama, moe, olmo2, phi3, qwen2, qwen3, smollm3
from .record import Family, Graph, HFFields, HFTensors, Refuse

# registration order: the order messages list the supported families in
FAMILIES = {f.arch: f for f in (gpt2.FAMILY, llama.FAMILY, qwen2.FAMILY, qwen3.FAMILY, phi3.FAMILY, gemma2.FAMILY,
                                gemma3.FAMILY, gptneox.FAMILY, olmo2.FAMILY, moe.QWEN2MOE, moe.QWEN3MOE, moe.OLMOE,
                                granite.FAMILY, smollm3.FAMILY, bert.FAMILY)}
_BY_HF_TYPE = {t: f for f in FAMILIES.values() for t in f.hf_types}
_NO_FAMILY = Family(arch="", runnable=False, hf_hooks="")      # a config of no known family (custom presets)

__all__ = ["FAMILIES", "Family", "Graph", "HFFields", "HFTensors", "Refuse", "family", "gguf_archs", "hf_family",
           "hf_field_lists", "hf_types", "runnable_archs"]


def family(arch) -> Family:
    """The family of a GGUF architecture / ModelConfig.arch; an empty record for one ffnlab does not know."""
    return FAMILIES.get(arch, _NO_FAMILY)


def hf_family(model_type):
    """The family a transformers model_type is read as, or None."""
    return _BY_HF_TYPE.get(model_type)


def runnable_archs() -> tuple:
    """Every architecture ffnlab runs (checkpoints, GGUF files)."""
    return tuple(a for a, f in FAMILIES.items() if f.runnable)


def gguf_archs() -> tuple:
    """The general.architecture values formats/gguf_meta.py reads."""
    return runnable_archs()


def hf_types(runnable_only=False) -> tuple:
    """Every transformers model_type formats/hf_config.py reads."""
    return tuple(t for f in FAMILIES.values() if f.runnable or not runnable_only for t in f.hf_types)


def hf_field_lists() -> dict:
    """{model_type: record.HFFields} of the dense families (the MoE ones: formats/hf_moe.py)."""
    return {t: lists for f in FAMILIES.values() for t, lists in f.hf_fields.items()}
