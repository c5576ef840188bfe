"""PEFT LoRA adapter directories: adapter_config.json + adapter_model.safetensors.

PEFT names each adapter by the HF module it wraps, without the adapter's name:
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight     A [r, in]
    base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight     B [out, r]
and scales B A by lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). ffnlab keeps adapters
under llama.cpp's names (blk.0.attn_q.weight.lora_a / .lora_b) with q/k rows in the model's own
order; a GGUF llama's q/k rows are permuted (convert_hf_to_gguf.py), so B of q and k is
permuted back to HF's rotate_half order here, as export_hf.py does for the weights.

ffnlab_adapter.json beside them records the base model (path and config) ffnlab trained it on.
"""
import json
import math
import os
import re

import numpy as np

from ..errors import ModelFileError
from .jsonfile import field, read_json_object

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
FFNLAB_FILE = "ffnlab_adapter.json"
PREFIX = "base_model.model."

_LLAMA = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
          "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
          "ffn_down": "mlp.down_proj"}
_GPT2 = {"attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}


def hf_module(cfg, weight):
    """blk.L.attn_q.weight -> model.layers.L.self_attn.q_proj (GPT-2: transformer.h.L.attn.c_attn)"""
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", weight)
    table, top = (_GPT2, "transformer.h") if cfg.arch == "gpt2" else (_LLAMA, "model.layers")
    return f"{top}.{m.group(1)}.{table[m.group(2)]}"


def _rows(cfg, weight, b, to_hf):
    """B's rows of q/k between the model's order and HF's (only a GGUF llama's differ)"""
    from .export_gguf import neox_to_normal_rows
    from .export_hf import normal_to_neox_rows
    kind = weight.split(".")[2]
    if cfg.rope_pairing != "normal" or cfg.positions != "rope" or kind not in ("attn_q", "attn_k"):
        return b
    heads = cfg.n_head if kind == "attn_q" else cfg.n_kv_head
    return (normal_to_neox_rows if to_hf else neox_to_normal_rows)(b, heads)


def peft_tensors(cfg, adapters) -> dict:
    """{blk.L.x.weight.lora_a/b: array} -> {PEFT key: float32 array}"""
    out = {}
    for name, a in adapters.items():
        weight, part = name.rsplit(".", 1)
        if part == "lora_b":
            a = _rows(cfg, weight, a, to_hf=True)
        out[f"{PREFIX}{hf_module(cfg, weight)}.lora_{part[-1].upper()}.weight"] = np.ascontiguousarray(a, np.float32)
    return out


def adapter_config(cfg, tensors, r, alpha, dropout, base_model) -> dict:
    """PEFT's LoraConfig fields for a plain LoRA (no rsLoRA, DoRA, bias or per-module ranks)."""
    modules = sorted({hf_module(cfg, f"blk.0.{t}.weight").rsplit(".", 1)[-1] for t in tensors})
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model, "r": r,
            "lora_alpha": alpha, "lora_dropout": dropout, "target_modules": modules, "bias": "none",
            "fan_in_fan_out": cfg.arch == "gpt2", "use_rslora": False, "use_dora": False, "inference_mode": True,
            "init_lora_weights": True, "modules_to_save": None, "rank_pattern": {}, "alpha_pattern": {}}


def adapter_files(cfg, adapters, tensors, r, alpha, dropout, base_model, source_cfg) -> dict:
    """-> {file name: bytes} of an adapter directory"""
    from safetensors.numpy import save
    conf = adapter_config(cfg, tensors, r, alpha, dropout, base_model)
    mine = {"format": "ffnlab-lora", "base_model": base_model, "config": source_cfg, "targets": tensors}
    return {CONFIG_FILE: (json.dumps(conf, indent=1) + "\n").encode(),
            WEIGHTS_FILE: save(peft_tensors(cfg, adapters), metadata={"format": "pt"}),
            FFNLAB_FILE: (json.dumps(mine, indent=1) + "\n").encode()}


def check_adapters(params, adapters, where):
    """Every adapter pair names a weight of the model and fits its shape, or ModelFileError."""
    for an in (n for n in adapters if n.endswith(".lora_a")):
        w, bn = an[:-len(".lora_a")], an[:-1] + "b"
        if w not in params:
            raise ModelFileError(f"{where}: adapter for {w}, which the model does not have (an adapter for another model?)")
        if bn not in adapters:
            raise ModelFileError(f"{where}: {an} has no {bn}")
        a, b = adapters[an], adapters[bn]
        out, n = params[w].shape
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != n or b.shape[0] != out or a.shape[0] != b.shape[1]:
            raise ModelFileError(f"{where}: adapter of {w} has A {list(a.shape)} and B {list(b.shape)}; the model's "
                                 f"weight [{out}, {n}] needs A [r, {n}] and B [{out}, r] (an adapter for another model?)")


def is_adapter_dir(path):
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, CONFIG_FILE))


def read_adapter_config(path) -> dict:
    f = os.path.join(path, CONFIG_FILE)
    if not os.path.isdir(path):
        raise ModelFileError(f"{path}: not a directory (a LoRA adapter is a PEFT directory with {CONFIG_FILE})")
    if not os.path.isfile(f):
        raise ModelFileError(f"{path}: no {CONFIG_FILE} (not a PEFT adapter directory)")
    conf = read_json_object(f, "adapter config")
    if field(conf, "peft_type", str, f, error=ModelFileError) != "LORA":
        raise ModelFileError(f"{f}: peft_type is {conf['peft_type']!r}; ffnlab reads LORA adapters")
    field(conf, "r", int, f, lo=1, error=ModelFileError)
    field(conf, "lora_alpha", (int, float), f, lo=0, error=ModelFileError)
    # fields that change the math: each one is either computed (use_rslora) or refused
    for key, plain in (("use_dora", False), ("bias", "none"), ("modules_to_save", None),
                       ("rank_pattern", {}), ("alpha_pattern", {})):
        if conf.get(key, plain) not in (plain, None, [] if plain is None else plain):
            raise ModelFileError(f"{f}: field {key!r} is {conf[key]!r}; ffnlab computes plain LoRA ({key}={plain!r})")
    return conf


def read_adapter(path, cfg, params):
    """-> adapters {blk.L.x.weight.lora_a/b: float32 array} in the model's row order,
    scale {blk.L.x.weight: alpha / r}, adapter_config dict. ModelFileError names the key or
    the field that does not fit the model."""
    from .safetensors_io import read_tensors, safetensors_index
    from .hf_names import gguf_name
    conf = read_adapter_config(path)
    f = os.path.join(path, WEIGHTS_FILE)
    if not os.path.isfile(f):
        raise ModelFileError(f"{path}: no {WEIGHTS_FILE} (ffnlab never unpickles adapter_model.bin)")
    index = safetensors_index([f])
    adapters = {}
    for key, (e, a) in zip(index, read_tensors(index.values())):
        m = re.fullmatch(r"base_model\.model\.(.+)\.lora_([AB])(?:\.\w+)?\.weight", key)
        name = gguf_name(m.group(1) + ".weight", cfg.arch) if m else None
        if name is None:
            raise ModelFileError(f"{f}: tensor {key} is not a LoRA A/B of a module ffnlab knows "
                                 f"(expected {PREFIX}model.layers.L.self_attn.q_proj.lora_A.weight, ...)")
        if name not in params:
            raise ModelFileError(f"{f}: tensor {key} adapts {name}, which the model does not have (an adapter for "
                                 f"another model?)")
        adapters[f"{name}.lora_{m.group(2).lower()}"] = np.array(a, np.float32)
    check_adapters(params, adapters, f)
    r, alpha = conf["r"], conf["lora_alpha"]
    scale = {}
    for an in [n for n in adapters if n.endswith(".lora_b")]:
        weight = an[:-len(".lora_b")]
        adapters[an] = _rows(cfg, weight, adapters[an], to_hf=False)
        rank = adapters[an].shape[1]
        if rank != r:
            raise ModelFileError(f"{f}: {an} has rank {rank}, {CONFIG_FILE} says r={r}")
        scale[weight] = alpha / (math.sqrt(r) if conf.get("use_rslora") else r)
    if not adapters:
        raise ModelFileError(f"{f}: no LoRA tensors")
    return adapters, scale, conf
