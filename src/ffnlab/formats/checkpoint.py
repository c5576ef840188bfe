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

import json
import os

import numpy as np

from ..config import ConfigError, ModelConfig
from ..errors import ModelFileError

FORMAT = "ffnlab-checkpoint"
VERSION = 1
META_FILE = "ffnlab.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"


def is_checkpoint(path) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, META_FILE))


def read_meta(path) -> dict:
    f = os.path.join(path, META_FILE)
    try:
        with open(f, encoding="utf-8") as fh:
            meta = json.load(fh)
    except FileNotFoundError:
        raise ModelFileError(f"{path}: not an ffnlab checkpoint (no {META_FILE})") from None
    except (OSError, ValueError) as e:
        raise ModelFileError(f"{f}: unreadable checkpoint metadata ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFileError(f"{f}: format is {meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}")
    if meta.get("version") != VERSION:
        raise ModelFileError(f"{f}: checkpoint version {meta.get('version')!r}, this ffnlab reads version {VERSION}")
    return meta


def read_config(path, meta=None) -> ModelConfig:
    meta = meta or read_meta(path)
    try:
        return ModelConfig.from_dict(meta["config"])
    except (KeyError, TypeError) as e:
        raise ModelFileError(f"{os.path.join(path, META_FILE)}: missing or malformed 'config' ({e})") from None
    except ConfigError as e:
        raise ModelFileError(f"{os.path.join(path, META_FILE)}: {e}") from None


def read_weights(path, cfg: ModelConfig) -> dict:
    """model.safetensors -> {GGUF name: float32 array}, checked against param_shapes(cfg)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from ..model.params import param_shapes

    f = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(f):
        raise ModelFileError(f"{path}: checkpoint has no {WEIGHTS_FILE}")
    try:
        arrays = load_file(f)
    except (SafetensorError, OSError, ValueError) as e:
        raise ModelFileError(f"{f}: unreadable safetensors file ({e})") from None
    want = param_shapes(cfg)
    for name, shape in want.items():
        if name not in arrays:
            raise ModelFileError(f"{f}: tensor {name} is missing (expected shape {list(shape)})")
        if tuple(arrays[name].shape) != tuple(shape):
            raise ModelFileError(f"{f}: tensor {name} has shape {list(arrays[name].shape)}, expected {list(shape)}")
    extra = sorted(set(arrays) - set(want))
    if extra:
        raise ModelFileError(f"{f}: unexpected tensor {extra[0]} for this config")
    return {n: np.ascontiguousarray(arrays[n], dtype=np.float32) for n in want}


def read_tokenizer(path, meta=None):
    from ..training.data import byte_tokenizer, tokenizer_from_json

    meta = meta or read_meta(path)
    tmeta = meta.get("tokenizer") or {}
    f = os.path.join(path, TOKENIZER_FILE)
    if os.path.isfile(f):
        try:
            with open(f, encoding="utf-8") as fh:
                return tokenizer_from_json(fh.read(), tmeta)
        except Exception as e:   # tokenizers raises its own Exception type for bad JSON
            raise ModelFileError(f"{f}: unreadable tokenizer ({e})") from None
    if tmeta.get("kind") == "byte":
        return byte_tokenizer()
    raise ModelFileError(f"{path}: checkpoint has no {TOKENIZER_FILE} (tokenizer kind {tmeta.get('kind')!r})")


def load_checkpoint(path):
    """-> (ModelConfig, {GGUF name: float32 array}, Tokenizer)"""
    meta = read_meta(path)
    cfg = read_config(path, meta)
    return cfg, read_weights(path, cfg), read_tokenizer(path, meta)
