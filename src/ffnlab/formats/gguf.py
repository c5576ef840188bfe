"""Load a GGUF file: config from the metadata, tensors dequantized with gguf.quants, tokenizer.

Every tensor is dequantized to float32 once, at load time (gguf.quants.dequantize knows every
quant type the gguf package supports). A tensor whose shape disagrees with what the metadata
implies (e.g. an edited feed_forward_length) is an error naming both.
"""
import os
import time

import numpy as np

from ..errors import ModelFileError
from ..model import Model
from ..model.params import param_shapes
from ..progress import Progress
from .gguf_meta import config_from_gguf, file_type_name, open_gguf, tokenizer_meta
from .gguf_tokenizer import tokenizer_from_gguf

# tensors that change the forward in ways ffnlab does not implement: refused, not ignored,
# because running without them gives plausible but wrong logits
UNSUPPORTED_TENSORS = {
    "rope_freqs.weight": "per-dimension RoPE frequency factors (Llama 3.1/3.2 'llama3' rope scaling)",
}


def _gguf_version():
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("gguf")
    except PackageNotFoundError:
        return ""


def _ggml_shape(shape):
    return "{" + ", ".join(str(n) for n in reversed(shape)) + "}"


def load_gguf(path, dtype=np.float32, progress=None) -> Model:
    import gguf

    path = os.fspath(path)
    t0 = time.perf_counter()
    reader = open_gguf(path)
    cfg = config_from_gguf(reader, path)
    expected = param_shapes(cfg)
    params = {}
    bar = Progress(len(reader.tensors), "loading", enabled=progress)
    for t in reader.tensors:
        bar.update(1, t.name)
        if t.name in UNSUPPORTED_TENSORS:
            raise ModelFileError(f"{path}: tensor {t.name} holds {UNSUPPORTED_TENSORS[t.name]}, "
                                 f"which ffnlab does not implement")
        if t.name not in expected:
            raise ModelFileError(f"{path}: unexpected tensor {t.name} for a {cfg.arch} model with this metadata")
        shape = tuple(int(n) for n in reversed(t.shape))          # ggml ne {in, out} -> numpy [out, in]
        if shape != expected[t.name]:
            raise ModelFileError(f"{path}: tensor {t.name} has ggml shape {_ggml_shape(shape)} but the metadata "
                                 f"implies {_ggml_shape(expected[t.name])} (d_model={cfg.d_model}, d_ff={cfg.d_ff}, "
                                 f"n_head={cfg.n_head}, n_kv_head={cfg.n_kv_head}, vocab={cfg.vocab_size})")
        try:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelFileError(f"{path}: tensor {t.name} has quant type {t.tensor_type.name}, "
                                 f"which gguf {_gguf_version()} cannot dequantize") from None
        except (ValueError, IndexError) as e:
            raise ModelFileError(f"{path}: tensor {t.name} ({t.tensor_type.name}) is corrupt: {e}") from None
        params[t.name] = np.ascontiguousarray(a.reshape(shape), dtype=dtype)
    bar.close()
    missing = [n for n in expected if n not in params]
    if missing:
        raise ModelFileError(f"{path}: missing tensor {missing[0]} (expected {len(expected)} tensors for a "
                             f"{cfg.arch} model, {len(missing)} missing)")
    tok = tokenizer_from_gguf(tokenizer_meta(reader, path), path)
    m = Model(cfg, params, tok, source=path, pack_weights=True)
    m.load_seconds = time.perf_counter() - t0
    m.file_type = file_type_name(reader)
    return m
