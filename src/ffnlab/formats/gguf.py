"""Load a GGUF file: config from the metadata, weights kept in their blocks, tokenizer.

Weight matrices stay as they lie in the memory-mapped file: a quant.QuantTensor over the blocks
(every type quant/blocks.py has kernels for), or a float32 array view for F32. Nothing is read
until a product touches it, and no float32 copy of a quantized matrix is ever made: the kernels
dequantize inside the product. Tensors of other types (the ones gguf-py can dequantize but
ffnlab has no kernel for) and 1-D tensors (norms, biases) become float32 arrays at load, with
one line on stderr naming the quantized ones. dequantize=True gives float32 arrays for every
tensor, as training and gradients need. A tensor whose shape disagrees with what the metadata
implies (e.g. an edited feed_forward_length) is an error naming both.
"""
import os
import sys
import time

import numpy as np

from ..config import ConfigError
from ..errors import ModelFileError
from ..families import family
from ..model import Model
from ..model.params import param_shapes
from ..progress import Progress
from ..quant import KERNEL_TYPES, QuantTensor
from ..quant.pages import release_code, release_pages, trim_heap
from ..model.warmup import warm_up
from .gguf_meta import config_from_gguf, file_type_name, open_gguf, tokenizer_meta
from . import pack_cache, tokenizer_cache
from .gguf_tokenizer import tokenizer_from_gguf

# tensors that change the forward in ways ffnlab does not implement: refused, not ignored,
# because running without them gives plausible but wrong logits
UNSUPPORTED_TENSORS = {}
ROPE_FREQS = "rope_freqs.weight"       # Llama 3.x: RoPE frequency divisors [n_rot/2] -> cfg.rope_freq_factors
VOCAB_TENSORS = ("token_embd.weight", "output.weight")   # [vocab, d_model]: a row per token id


def _gguf_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gguf")
    except PackageNotFoundError:
        return ""


def _ggml_shape(shape):
    return "{" + ", ".join(str(n) for n in reversed(shape)) + "}"


def _tensor(path, t, shape, dtype, dequantize, fallback, arith="f32"):
    """One GGUF tensor -> a QuantTensor over its blocks, a float32 view of an F32 matrix, or
    (dequantize, 1-D, or a type without a kernel) a fresh array of dtype."""
    import gguf

    kernel = t.tensor_type in KERNEL_TYPES and len(shape) == 2
    if kernel and not dequantize:
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            if t.data.size != shape[0] * shape[1]:
                raise ModelFileError(f"{path}: tensor {t.name} (F32) has {t.data.size} values, "
                                     f"its shape {_ggml_shape(shape)} needs {shape[0] * shape[1]}")
            return t.data.reshape(shape)                                  # the mapped file, no copy
        try:
            return QuantTensor(t.data, t.tensor_type, shape, arith)
        except ValueError as e:
            raise ModelFileError(f"{path}: tensor {t.name} ({t.tensor_type.name}): {e}") from None
    if not kernel and len(shape) == 2:
        fallback.append(t)
    try:
        a = gguf.quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        raise ModelFileError(f"{path}: tensor {t.name} has quant type {t.tensor_type.name}, "
                             f"which gguf {_gguf_version()} cannot dequantize") from None
    except (ValueError, IndexError) as e:
        raise ModelFileError(f"{path}: tensor {t.name} ({t.tensor_type.name}) is corrupt: {e}") from None
    if a.size != int(np.prod(shape)):
        raise ModelFileError(f"{path}: tensor {t.name} ({t.tensor_type.name}) holds {a.size} values, "
                             f"its shape {_ggml_shape(shape)} needs {int(np.prod(shape))}")
    # a copy, never a view of the mapped file: reading a norm's few bytes there can map a whole
    # 2 MB huge page of the file (read-only file THP), ~20 MB of SmolLM2's resident memory
    return np.array(a.reshape(shape), dtype=dtype, order="C", copy=True)


def _with_rope_freqs(cfg, factors, path):
    """cfg with Llama 3's frequency divisors from rope_freqs.weight (checked: n_rot/2 finite > 0)."""
    from dataclasses import replace
    try:
        return replace(cfg, rope_freq_factors=tuple(float(x) for x in np.asarray(factors).reshape(-1)))
    except ConfigError as e:
        raise ModelFileError(f"{path}: tensor {ROPE_FREQS}: {e}") from None


def load_gguf(path, dtype=np.float32, progress=None, dequantize=False, arith="f32", warm=True) -> Model:
    """-> Model. dequantize: float arrays of dtype for every tensor (training); otherwise weight
    matrices stay in their blocks (float32 products only, so another dtype implies dequantize).
    warm: compile or load the kernels now (model/warmup.py); False only for its own workers."""
    path = os.fspath(path)
    t0 = time.perf_counter()
    dequantize = dequantize or np.dtype(dtype) != np.float32
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    expected = param_shapes(cfg)
    params, fallback = {}, []
    bar = Progress(len(reader.tensors), "loading", enabled=progress, delay=0.5)   # a big file: minutes
    for t in reader.tensors:
        bar.update(1, t.name)
        if t.name in UNSUPPORTED_TENSORS:
            raise ModelFileError(f"{path}: tensor {t.name} holds {UNSUPPORTED_TENSORS[t.name]}, "
                                 f"which ffnlab does not implement")
        shape = tuple(int(n) for n in reversed(t.shape))          # ggml ne {in, out} -> numpy [out, in]
        if t.name == ROPE_FREQS:                                  # a config value, not a parameter
            cfg = _with_rope_freqs(cfg, _tensor(path, t, shape, np.float32, True, []), path)
            continue
        if family(cfg.arch).graph.fused_gate_up and t.name.endswith(".ffn_up.weight") and shape == (2 * cfg.d_ff, cfg.d_model):
            w = _tensor(path, t, shape, dtype, dequantize, fallback, arith)  # [gate; up] rows, as HF's gate_up_proj
            blk = t.name.removesuffix("ffn_up.weight")
            params[blk + "ffn_gate.weight"], params[blk + "ffn_up.weight"] = w[:cfg.d_ff], w[cfg.d_ff:]
            continue
        if t.name not in expected:
            raise ModelFileError(f"{path}: unexpected tensor {t.name} for a {cfg.arch} model with this metadata")
        if (shape != expected[t.name] and t.name in VOCAB_TENSORS and shape[1:] == expected[t.name][1:]
                and "tokenizer.ggml.tokens" in reader.fields):
            # the tokenizer's ids index these rows: one id per token (llama.cpp refuses the same file)
            raise ModelFileError(f"{path}: tensor {t.name} has {shape[0]} rows but tokenizer.ggml.tokens holds "
                                 f"{cfg.vocab_size} tokens: the tokenizer and the model's vocabulary disagree")
        if shape != expected[t.name]:
            raise ModelFileError(f"{path}: tensor {t.name} has ggml shape {_ggml_shape(shape)} but the metadata "
                                 f"implies {_ggml_shape(expected[t.name])} (d_model={cfg.d_model}, d_ff={cfg.d_ff}, "
                                 f"n_head={cfg.n_head}, n_kv_head={cfg.n_kv_head}, vocab={cfg.vocab_size})")
        params[t.name] = _tensor(path, t, shape, dtype, dequantize, fallback, arith)
    bar.close()
    missing = [n for n in expected if n not in params]
    if missing:
        raise ModelFileError(f"{path}: missing tensor {missing[0]} (expected {len(expected)} tensors for a "
                             f"{cfg.arch} model, {len(missing)} missing)")
    if fallback:
        types = sorted({t.tensor_type.name for t in fallback})
        print(f"{path}: {len(fallback)} weight matrices of type {'/'.join(types)} ({fallback[0].name}"
              f"{', ...' if len(fallback) > 1 else ''}) dequantized to float32 at load: ffnlab has no "
              f"kernel for {'these types' if len(types) > 1 else 'this type'}", file=sys.stderr)
    # every check of the file's contents before anything is packed or compiled: a damaged file is
    # refused in milliseconds, not after the kernels' first compile (seconds to minutes)
    tok = tokenizer_cache.load(reader)                     # built on an earlier load of the same header
    if tok is None:
        tok = tokenizer_from_gguf(tokenizer_meta(reader, path), path)
        tokenizer_cache.store(reader, tok)
    file_type = file_type_name(reader, path)
    cached = not dequantize and pack_cache.restore(path, reader, params, arith)   # laid out on an earlier load
    m = Model(cfg, params, tok, source=path, pack_weights=True, arith=arith)
    if not dequantize and not cached:
        pack_cache.store(path, reader, params, arith)
    m.pack_cached = cached
    # numba: compiled once, then loaded from its disk cache; here, so that no timed step pays for it
    m.compile_seconds = warm_up(m, None if dequantize else path, arith, progress) if warm else 0.0
    release_code()                                         # numba's LLVM: not needed again unless a kernel compiles
    if not dequantize:
        # the file's pages that reading the metadata and copying the small tensors mapped, with
        # their neighbours (fault-around, read-only file huge pages: ~57 MB of Gemma 3's file
        # stayed resident beside its packed weights); a later read faults them in again
        release_pages(reader.data)
    trim_heap()
    m.load_seconds = time.perf_counter() - t0
    m.file_type = file_type
    return m
