"""Compile (or load from numba's disk cache) the kernels a model's weights need, at load time.

numba compiles a kernel on its first call and caches the machine code on disk (cache=True), so
the first load on a machine pays seconds of compilation and later loads only read the cache.
Doing it here, on one row of each weight type, keeps that cost out of the first timed product
and lets the load line report it.
"""
import time

import numpy as np

from .packed import R
from .tensor import QuantTensor


def compile_kernels(params) -> float:
    """Run the kernels generation uses once, on one row (packed: one row group) of each
    QuantTensor type in params: the one-token product for every matrix, the prompt's tiled
    product for the layers' matrices, the row lookup for the embedding tables. (The LM head's
    tiled product, for logits at every position, loads on first use.) -> seconds taken."""
    t0 = time.perf_counter()
    seen = set()
    for name, w in params.items():
        if not isinstance(w, QuantTensor):
            continue
        uses = {"matvec"} | ({"matmul"} if name.startswith("blk.") else set()) | ({"lookup"} if "embd" in name else set())
        kind = (w.qtype, w.packed is None)
        todo = {u for u in uses if (u,) + kind not in seen}
        if not todo:
            continue
        seen |= {(u,) + kind for u in todo}
        part = w[:min(w.shape[0], R)]                          # same array kinds as the model's: packed views, mapped rows
        if "matvec" in todo:
            part.matvec(np.zeros(w.shape[1], np.float32))
        if "matmul" in todo:
            part.matmul(np.zeros((2, w.shape[1]), np.float32))
        if "lookup" in todo:
            part[np.zeros(1, np.int64)]
    return time.perf_counter() - t0


def compile_decode(model) -> float:
    """One decode step (model/decode.py) on a throwaway one-position cache: its compiled calls
    (RMSNorm, RoPE + attention, the GLU; ggml's in arith "ggml") are loaded from numba's cache at
    load, not inside the first timed step (~55 ms for SmolLM2). -> seconds taken."""
    t0 = time.perf_counter()
    model.forward_last([0], model.new_cache(n_ctx=1))
    return time.perf_counter() - t0
