"""llama.cpp's LoRA adapter GGUF, and a GGUF with an adapter merged into its weights.

An adapter GGUF (convert_lora_to_gguf.py writes them; llama.cpp's llama_adapter_lora_init reads):
    general.architecture   the base model's (llama.cpp refuses an adapter of another arch)
    general.type = "adapter", adapter.type = "lora", adapter.lora.alpha = alpha
    blk.N.attn_q.weight.lora_a   ne [in, r]  (numpy [r, in], as PEFT's lora_A)
    blk.N.attn_q.weight.lora_b   ne [r, out] (numpy [out, r], as PEFT's lora_B)
llama.cpp checks a.ne[0] == W.ne[0], b.ne[1] == W.ne[1], a.ne[1] == b.ne[0], and scales B A by
alpha / r (r = b.ne[0]) times the scale the adapter is loaded with (build_lora_mm).
The rows of q/k's B follow the base GGUF's rows: llama.cpp's llama files hold q/k permuted, so an
adapter trained on an HF-ordered llama (ffnlab's "neox" pairing) gets convert_hf_to_gguf.py's
permutation, as the weights do.
"""
import os

import numpy as np

from ..errors import ModelFileError, UsageError


def _permuted(cfg, weight):
    """the heads of B's rows to permute between ffnlab's order and the GGUF's, or None"""
    kind = weight.split(".")[2]
    if cfg.arch == "llama" and cfg.rope_pairing == "neox" and kind in ("attn_q", "attn_k"):
        return cfg.n_head if kind == "attn_q" else cfg.n_kv_head
    return None


def write_gguf_lora(out, cfg, adapters, alpha):
    """adapters {blk.L.x.weight.lora_a/b: array} (the model's row order) -> OUT, an adapter GGUF (F32)."""
    from .export_gguf import neox_to_normal_rows
    from .gguf_write import finish_atomically, writer_class
    tmp = out + f".tmp-{os.getpid()}"
    w = writer_class()(tmp, cfg.arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", float(alpha))
    for name in sorted(adapters, key=_order):
        a = np.ascontiguousarray(adapters[name], np.float32)
        heads = _permuted(cfg, name.rsplit(".", 1)[0])
        if heads and name.endswith(".lora_b"):
            a = neox_to_normal_rows(a, heads)
        w.add_tensor(name, a)
    finish_atomically(w, tmp, out)


def _order(name):
    """layer by layer, then by tensor name: the order llama.cpp's converter writes"""
    parts = name.split(".")
    return (int(parts[1]), ".".join(parts[2:]))


def read_gguf_lora(path, cfg, params):
    """-> adapters {blk.L.x.weight.lora_a/b: float32} in the model's row order, {weight: alpha / r}, r, alpha"""
    import gguf

    from .export_hf import normal_to_neox_rows
    from .gguf_meta import get_key, open_gguf
    from .peft import check_adapters
    r = open_gguf(path)
    for key, want in (("general.type", "adapter"), ("adapter.type", "lora")):
        if key not in r.fields or str(get_key(r, key, path)) != want:
            raise ModelFileError(f"{path}: {key} is not {want!r} (not a llama.cpp LoRA adapter)")
    arch = str(get_key(r, "general.architecture", path))
    if arch != cfg.arch:
        raise ModelFileError(f"{path}: an adapter for architecture {arch!r}, the model is {cfg.arch!r} "
                             f"(an adapter for another model)")
    alpha = float(get_key(r, "adapter.lora.alpha", path)) if "adapter.lora.alpha" in r.fields else 0.0
    adapters = {}
    for t in r.tensors:
        if not t.name.endswith((".lora_a", ".lora_b")):
            raise ModelFileError(f"{path}: tensor {t.name} is not a .lora_a / .lora_b")
        shape = tuple(int(n) for n in reversed(t.shape))
        adapters[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
    if not adapters:
        raise ModelFileError(f"{path}: no LoRA tensors")
    check_adapters(params, adapters, path)
    scale, ranks = {}, set()
    for bn in [n for n in adapters if n.endswith(".lora_b")]:
        weight = bn[:-len(".lora_b")]
        heads = _permuted(cfg, weight)
        if heads:
            adapters[bn] = normal_to_neox_rows(adapters[bn], heads)
        rank = adapters[bn].shape[1]
        ranks.add(rank)
        scale[weight] = alpha / rank if alpha else 1.0        # llama.cpp: no alpha means scale 1
    return adapters, scale, (ranks.pop() if len(ranks) == 1 else sorted(ranks)), alpha


def write_merged_gguf(src, out, merged: dict):
    """A copy of the GGUF src with the tensors in merged (name -> float32 [out, in]) written as F32
    (W + scale * B A) and every other tensor and metadata key copied as it is."""
    from .gguf_meta import get_key, open_gguf
    from .gguf_write import copy_fields, finish_atomically, writer_class
    if os.path.abspath(out) == os.path.abspath(src):
        raise UsageError(f"{out}: refusing to overwrite the base model")
    reader = open_gguf(src)
    tmp = out + f".tmp-{os.getpid()}"
    w = writer_class()(tmp, get_key(reader, "general.architecture", src))
    copy_fields(reader, w)
    for t in reader.tensors:
        if t.name in merged:
            w.add_tensor(t.name, np.ascontiguousarray(merged[t.name], np.float32))
        else:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    finish_atomically(w, tmp, out)
