"""ffnlab checkpoints (what `ffnlab train` writes): read one back as (ModelConfig, params, Tokenizer).

A checkpoint is a directory:
  ffnlab.json          {"format": "ffnlab-checkpoint", "version": 1, "config": ModelConfig fields,
                        "tokenizer": {"kind": byte|bpe|model, "bos_id", "eos_id", "add_bos", ...}}
  model.safetensors    the weights under their GGUF tensor names, [out, in] float32
  tokenizer.json       the `tokenizers` tokenizer (byte-level ones can be rebuilt without it)
  trainer.json, state-NNNNNN.safetensors   the trainer's resume state (training/checkpoint.py)
Every file is written atomically, so whatever a reader finds is complete.
"""
from __future__ import annotations

import os

import numpy as np

from ..config import RUNNABLE_ARCHS, ConfigError, ModelConfig
from ..errors import ModelFileError
from .jsonfile import field, read_json_object

FORMAT = "ffnlab-checkpoint"
VERSION = 1
META_FILE = "ffnlab.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def is_checkpoint(path) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def read_meta(path) -> dict:
    f = os.path.join(path, META_FILE)
    if not os.path.lexists(f):
        raise ModelFileError(f"{path}: not an ffnlab checkpoint (no {META_FILE})")
    meta = read_json_object(f, "checkpoint metadata", 64 << 20)
    if meta.get("format") != FORMAT:
        raise ModelFileError(f"{f}: format is {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise ModelFileError(f"{f}: checkpoint version {meta.get('version')!r}, this ffnlab reads version {VERSION}")
    return meta


def read_config(path, meta=None) -> ModelConfig:
    meta = meta or read_meta(path)
    f = os.path.join(path, META_FILE)
    try:
        cfg = ModelConfig.from_dict(field(meta, "config", dict, f, error=ModelFileError))
    except (KeyError, TypeError) as e:
        raise ModelFileError(f"{f}: missing or malformed 'config' ({e})") from None
    except ConfigError as e:
        raise ModelFileError(f"{f}: {e}") from None
    if cfg.arch not in RUNNABLE_ARCHS:
        raise ModelFileError(f"{f}: arch {cfg.arch!r} is not one ffnlab runs ({', '.join(RUNNABLE_ARCHS)})")
    return cfg


def read_weights(path, cfg: ModelConfig) -> dict:
    """model.safetensors -> {GGUF name: float32 array}, checked against param_shapes(cfg)."""
    from ..model.params import param_shapes
    from .safetensors_io import read_tensors, safetensors_index

    f = os.path.join(path, WEIGHTS_FILE)
    if not os.path.lexists(f):
        raise ModelFileError(f"{path}: checkpoint has no {WEIGHTS_FILE}")
    index = safetensors_index([f])                      # headers only: checked before any data is read
    want = param_shapes(cfg)
    for name, shape in want.items():
        if name not in index:
            raise ModelFileError(f"{f}: tensor {name} is missing (expected shape {list(shape)})")
        if tuple(index[name].shape) != tuple(shape):
            raise ModelFileError(f"{f}: tensor {name} has shape {list(index[name].shape)}, expected {list(shape)}")
    extra = sorted(set(index) - set(want))
    if extra:
        raise ModelFileError(f"{f}: unexpected tensor {extra[0]} for this config")
    return {e.name: np.ascontiguousarray(a, dtype=np.float32) for e, a in read_tensors(index[n] for n in want)}


def read_tokenizer(path, meta=None):
    from .tokenizer import byte_tokenizer, tokenizer_from_json

    meta = meta or read_meta(path)
    mf = os.path.join(path, META_FILE)
    tmeta = field(meta, "tokenizer", dict, mf, {}, error=ModelFileError)
    _check_tokenizer_meta(tmeta, f"{mf}: tokenizer")
    f = os.path.join(path, TOKENIZER_FILE)
    if os.path.lexists(f):
        from .hf_tokenizer import read_tokenizer_json
        tok = tokenizer_from_json(read_tokenizer_json(f).to_str(), tmeta)
        tok.template_source = f"{mf}: tokenizer.chat_template"
        for key in ("bos_id", "eos_id"):
            if tmeta.get(key) is not None and tmeta[key] >= tok.vocab_size:
                raise ModelFileError(f"{mf}: tokenizer {key} {tmeta[key]} is outside the vocabulary of {tok.vocab_size}")
        return tok
    if tmeta.get("kind") == "byte":
        return byte_tokenizer()
    raise ModelFileError(f"{path}: checkpoint has no {TOKENIZER_FILE} (tokenizer kind {tmeta.get('kind')!r})")


def _check_tokenizer_meta(tmeta, where):
    """The tokenizer facts ffnlab.json keeps: ids are integers, flags booleans, the template a string."""
    for key, kind in (("kind", str), ("bos_id", int), ("eos_id", int), ("add_bos", bool), ("add_eos", bool),
                      ("chat_template", str)):
        field(tmeta, key, kind, where, None, lo=0 if kind is int else None, error=ModelFileError)


def load_checkpoint(path):
    """-> (ModelConfig, {GGUF name: float32 array}, Tokenizer)"""
    from .tokenizer import check_vocab
    meta = read_meta(path)
    cfg = read_config(path, meta)
    tok = read_tokenizer(path, meta)                    # checked before the weights are read
    check_vocab(tok, cfg.vocab_size, os.path.join(path, TOKENIZER_FILE), os.path.join(path, META_FILE))
    return cfg, read_weights(path, cfg), tok
