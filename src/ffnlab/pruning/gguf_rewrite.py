"""Write a pruned copy of a GGUF file: same metadata, same tensors, narrower MLPs.

    write_pruned_gguf(src, out, keep_idx, qtype)   keep_idx: [n_layer, n_keep] units kept per layer

What changes:
  {arch}.feed_forward_length        -> n_keep
  blk.L.ffn_up / ffn_gate (.weight, .bias)   keep rows keep_idx[L]
  blk.L.ffn_down.weight             keeps columns keep_idx[L]
Everything else -- every metadata key (tokenizer, chat template, general.file_type, ...), every
other tensor, the tensor order -- is copied; untouched tensors are copied as their raw bytes,
so they stay byte-identical whatever their type (SmolLM2's Q8_0 token_embd and Q4_1 attention).

Types. By default (qtype None) every pruned tensor keeps its source type; with qtype (f32, f16,
q8_0, q4_0, q4_1, q5_0, q5_1; quantized with gguf.quants.quantize) every pruned matrix is written
as that type. Quant blocks run along a row, so:
  - up/gate rows are whole rows of the original: when the type written is the source's own, the
    kept rows' bytes are copied exactly (any type, K-quants included); otherwise they are
    dequantized and re-encoded;
  - ffn_down's rows lose columns, so they are dequantized, cut and re-encoded; their new length
    n_keep must be a multiple of the block size (32), which is why prune rounds to 32. A source
    type gguf-py cannot write (the K-quants: Q4_K, Q6_K, ...) or whose blocks the new width does
    not fill becomes the closest type that can (closest_type(): at least the source's bits per
    weight, unless that would make the tensor bigger than the source's); `conversions` says so.
    With an explicit qtype, a row that does not fill whole blocks is written as f16
    (`fallbacks`).
Biases stay f32, as llama.cpp's converter writes them.
"""
import os
import re

import numpy as np

from ..errors import UsageError

TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")     # what encode() writes


def _bits(t) -> float:
    """bits per weight of a ggml type"""
    import gguf
    block, size = gguf.GGML_QUANT_SIZES[t]
    return 8 * size / block


def closest_type(src_type, n_rows, n_cols, src_bytes) -> str:
    """The type (a TYPES name) an [n_rows, n_cols] cut of a src_type tensor is written as by
    default: the source type when encode() can write it at this width; else the writable type with
    the fewest bits per weight at or above the source's (no precision lost), unless that makes the
    tensor bigger than the source's src_bytes -- then the most bits that fit in them."""
    import gguf
    name = src_type.name.lower()
    fits = [t for t in TYPES if n_cols % gguf.GGML_QUANT_SIZES[_qtype(t)][0] == 0]
    if name in fits:
        return name
    by_bits = sorted(fits, key=lambda t: _bits(_qtype(t)))
    at_least = [t for t in by_bits if _bits(_qtype(t)) >= _bits(src_type)]
    small_enough = [t for t in by_bits if n_rows * n_cols * _bits(_qtype(t)) / 8 <= src_bytes]
    if at_least and at_least[0] in small_enough:
        return at_least[0]
    return small_enough[-1] if small_enough else by_bits[0]
_FFN = re.compile(r"^blk\.(\d+)\.ffn_(up|gate|down)\.(weight|bias)$")


def _qtype(name):
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType[name.upper()]


def encode(a, qtype):
    """float32 [rows, cols] -> (array for GGUFWriter.add_tensor, raw_dtype, type name written)."""
    import gguf

    if qtype == "f32":
        return np.ascontiguousarray(a, dtype=np.float32), None, "f32"
    if qtype == "f16":
        return np.ascontiguousarray(a, dtype=np.float16), None, "f16"
    t = _qtype(qtype)
    block = gguf.GGML_QUANT_SIZES[t][0]
    if a.shape[-1] % block:
        return np.ascontiguousarray(a, dtype=np.float16), None, "f16"
    return gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), t), t, qtype


def write_pruned_gguf(src, out, keep_idx, qtype=None):
    """-> report dict (types written, conversions, fallbacks, bytes and parameter counts before/after).
    qtype None: each tensor keeps its source type (closest_type())."""
    import gguf

    from ..formats.gguf_write import copy_fields, finish_atomically, writer_class
    from ..formats.gguf_meta import get_key, open_gguf

    if qtype is not None and qtype not in TYPES:
        raise UsageError(f"--type must be one of {', '.join(TYPES)}, got {qtype!r}")
    d = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(d):
        raise UsageError(f"{out}: the directory {d} does not exist")
    if os.path.abspath(out) == os.path.abspath(src):
        raise UsageError(f"{out}: refusing to overwrite the source model")
    reader = open_gguf(src)
    arch = get_key(reader, "general.architecture", src)
    d_ff = int(get_key(reader, f"{arch}.feed_forward_length", src))
    keep_idx = np.asarray(keep_idx)
    n_keep = int(keep_idx.shape[1])
    tmp = out + f".tmp-{os.getpid()}"
    w = writer_class()(tmp, arch)
    copy_fields(reader, w, f"{arch}.feed_forward_length", n_keep)
    written, conversions, fallbacks, params_before, params_after = {}, [], [], 0, 0
    for t in reader.tensors:
        params_before += int(t.n_elements)
        m = _FFN.match(t.name)
        if m is None:                                                  # untouched: raw bytes, same type
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            params_after += int(t.n_elements)
            continue
        il, part, kind = int(m.group(1)), m.group(2), m.group(3)
        idx = keep_idx[il]
        shape = tuple(int(n) for n in reversed(t.shape))               # numpy [out, in]
        if kind == "bias":
            if part == "down":                                         # [d_model]: the output side, untouched
                w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
                params_after += int(t.n_elements)
                continue
            a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)[idx].astype(np.float32)   # [n_keep]
            data, raw, name = a, None, "f32"
        elif part in ("up", "gate") and (qtype is None or t.tensor_type == _qtype(qtype)):
            data, raw = np.ascontiguousarray(t.data[idx]), t.tensor_type   # whole rows: exact bytes
            name = t.tensor_type.name.lower()
        else:
            a = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)            # [d_ff, d_model] / [d_model, d_ff]
            a = a[idx] if part in ("up", "gate") else a[:, idx]
            want = qtype or closest_type(t.tensor_type, a.shape[0], a.shape[1], int(t.n_bytes))
            if qtype is None and want != t.tensor_type.name.lower():
                conversions.append((t.name, t.tensor_type.name, want))
            data, raw, name = encode(a, want)
            if name != want:
                fallbacks.append(f"{t.name}: rows of {a.shape[-1]} do not fill {want} blocks, written as {name}")
        w.add_tensor(t.name, data, raw_dtype=raw)
        params_after += int(t.n_elements) // d_ff * n_keep                # one axis of every FFN tensor is d_ff
        written[t.name] = name
    finish_atomically(w, tmp, out)
    return {"types": written, "conversions": conversions, "fallbacks": fallbacks, "params_before": params_before, "params_after": params_after,
            "bytes_before": os.path.getsize(src), "bytes_after": os.path.getsize(out)}
