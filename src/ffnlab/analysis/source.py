"""MODEL arguments of the sizing commands: a .gguf, an HF directory, a config.json or a preset.

load_source(name) -> ModelSource: the ModelConfig plus what the source says beyond it (the GGUF
tensor directory, parameters ModelConfig does not model). Only metadata is read.
"""
import os
from dataclasses import dataclass, field

from ..config import ModelConfig
from ..errors import ModelFileError
from ..model.params import param_shapes


@dataclass
class ModelSource:
    label: str                       # what names it in reports: the file name or the preset's repo id
    kind: str                        # "gguf" | "hf" | "preset"
    cfg: ModelConfig
    path: str = ""                   # the file read ("" for presets)
    source: str = ""                 # presets: the config.json the values come from
    tensors: list = field(default_factory=list)   # [TensorInfo]; for non-GGUF sources, as an F16 GGUF would hold
    extra: dict = field(default_factory=dict)     # parameters outside ModelConfig: {component: count}
    file_type: str = ""              # GGUF general.file_type as llama-quantize names it (Q4_K_M, ...)
    metadata: dict = field(default_factory=dict)  # GGUF key/values (arrays as their length) or config.json

    @property
    def is_file(self) -> bool:
        return self.kind == "gguf"

    @property
    def file_params(self) -> int:
        """Elements of all tensors in the file (GGUF) or of the tensor list."""
        return sum(t.n_elements for t in self.tensors)


def load_source(name: str | None) -> ModelSource:
    """name: a file or directory, an installed model (smollm2, gemma3: its real file), a preset
    (alias, short name or HF repo id), or None for the default model."""
    from ..formats.installed import NAMES, installed_models, model_path
    from ..formats.load import default_model_path
    from .presets import find_preset, get_preset

    if name is None:
        name = default_model_path()
    elif name.lower() in NAMES and any(m.name == name.lower() and m.path for m in installed_models()):
        name = model_path(name.lower())
    if os.path.exists(name):
        if os.path.isdir(name) or name.endswith(".json"):
            return _from_hf(name)
        return _from_gguf(name)
    if find_preset(name) is not None:
        return _from_preset(name)
    if name.endswith((".gguf", ".json")) or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelFileError(f"{name}: no such file")      # a path; "org/name" may be a repo id
    get_preset(name)                                     # raises UsageError with the closest names
    raise AssertionError("unreachable")


def source_from_reader(reader, path) -> ModelSource:
    """A ModelSource from an open GGUFReader (lets a caller that already holds one reuse it)."""
    from ..formats.gguf_meta import config_from_gguf, file_type_name, metadata, tensor_infos

    cfg = config_from_gguf(reader, path)
    tensors = tensor_infos(reader)
    expected = param_shapes(cfg)
    extra = {t.name: t.n_elements for t in tensors if t.name not in expected}   # e.g. rope_freqs.weight
    return ModelSource(os.path.basename(path), "gguf", cfg, path=path, tensors=tensors, extra=extra,
                       file_type=file_type_name(reader), metadata=metadata(reader))


def _from_gguf(path) -> ModelSource:
    from ..formats.gguf_meta import open_gguf

    return source_from_reader(open_gguf(path), path)


def _from_hf(path) -> ModelSource:
    from ..formats.hf_config import config_from_hf, hf_extra_params, load_hf_config

    d, cfg_path = load_hf_config(path)
    cfg = config_from_hf(d, cfg_path)
    return ModelSource(cfg.name or os.path.basename(os.path.dirname(os.path.abspath(cfg_path))), "hf", cfg,
                       path=cfg_path, tensors=planned_tensors(cfg, d), extra=hf_extra_params(d), metadata=d)


def _from_preset(name) -> ModelSource:
    from ..formats.hf_config import hf_extra_params
    from .presets import preset_config

    cfg, p = preset_config(name)
    return ModelSource(p.repo, "preset", cfg, source=p.source, tensors=planned_tensors(cfg, p.hf),
                       extra=hf_extra_params(p.hf), metadata=dict(p.hf))


def planned_tensors(cfg, hf: dict | None = None) -> list:
    """The tensors a GGUF of this config holds, typed as convert_hf_to_gguf.py --outtype f16 writes
    them (2-D F16, 1-D F32). BERT's token-type table and pooler are added under their own names."""
    from ..formats.gguf_meta import TensorInfo

    shapes = dict(param_shapes(cfg))
    if hf and hf.get("model_type") == "bert":
        D = cfg.d_model
        shapes["token_types.weight"] = (hf.get("type_vocab_size", 2), D)
        shapes["pooler.weight"] = (D, D)
        shapes["pooler.bias"] = (D,)
    out = []
    for name, shape in shapes.items():
        ne = tuple(reversed(shape))
        n = 1
        for d in shape:
            n *= d
        typ, size = ("F16", 2) if len(shape) >= 2 else ("F32", 4)
        out.append(TensorInfo(name, ne, typ, n, n * size))
    return out
