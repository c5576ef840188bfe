"""Compile (or load from numba's disk cache) the kernels a model's weights need, at load time.

numba compiles a kernel on its first call and caches the machine code on disk (cache=True), so
the first load on a machine pays seconds of compilation and later loads only read the cache.
Doing it here, on one row of each weight type, keeps that cost out of the first timed product
and lets the load line report it.
"""
import dataclasses
import time

import numpy as np

from .packed import R
from .simd import HAS_AVX512
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
    load, not inside the first timed step (~55 ms for SmolLM2). The step runs one layer of each
    kind (the same weight types and shapes) and the first 64 rows of the LM head: it loads every
    kernel a step calls while reading ~1/30 of the weights, so nothing of a weight the cache has
    mapped (formats/pack_cache.py) is made resident before release_code() runs. -> seconds taken."""
    from ..model.decode import decode_step
    t0 = time.perf_counter()
    plan = model.decode_plan()
    kinds = {}
    for L in plan.layers:
        kinds.setdefault(_kind(L), L)
    head = plan.head[:min(R, plan.head.shape[0])]
    decode_step(model.params, model.config, plan._replace(layers=list(kinds.values()), head=head), 0,
                model.new_cache(n_ctx=1), model.arith)
    return time.perf_counter() - t0


def compile_prompt(model) -> float:
    """The compiled calls a prompt makes besides the products (ops/fastmath.py: the softmax, the
    FFN's activation and gated product, RMSNorm and RoPE in float32; the cached attention of
    model/decode_kernels.py), on a few values: loaded here, not in the first timed prefill, and
    before release_code(). -> seconds taken."""
    from ..model.decode_kernels import attend_rows
    from ..model.ffn import FFN_KINDS, _glu_halves
    from ..ops.activations import ACTIVATIONS
    from ..ops.norms import rmsnorm_forward
    from ..ops.rope import rope_forward
    from ..ops.softmax import softmax_forward
    t0 = time.perf_counter()
    if model.arith.name == "f32" and model.params["token_embd.weight"].dtype == np.float32:
        z = np.zeros((1, 8), np.float32)
        softmax_forward(z)
        act = FFN_KINDS[model.config.ffn].act
        ACTIVATIONS[act].forward(np.zeros(8, np.float32))
        if act in ("silu", "gelu_tanh"):
            _glu_halves(np.zeros((1, 16), np.float32), act == "gelu_tanh")
        rmsnorm_forward(z, np.ones(8, np.float32), 1e-6)
        rmsnorm_forward(z, None, 1e-6)
        q = np.zeros((1, 1, 1, 32), np.float32)                 # attend_rows: head widths a multiple of 16
        rope_forward(q, np.ones((1, 16), np.float32), np.zeros((1, 16), np.float32), model.config.rope_pairing)
        attend_rows(q, np.zeros((1, 1, 2, 32), np.float32), np.zeros((1, 1, 2, 32), np.float32), 0, 0,
                    np.float32(1.0), np.empty_like(q), HAS_AVX512)
        _warm_parallel_rows(act)
    return time.perf_counter() - t0


def _warm_parallel_rows(act):
    """the parallel variants of the row kernels above (a prompt of more than a few rows takes them),
    and the q/k pass of model/attention.py's unhooked path (fastmath.qk_rows), both variants"""
    from ..ops import fastmath
    x = np.zeros((2, 16), np.float32)
    fastmath._rms_norm_parallel(x, np.ones(16, np.float32), np.float32(1e-6), x.copy(), x.copy(), np.zeros(2, np.float32))
    fastmath._rms_norm_parallel(x, np.zeros(0, np.float32), np.float32(1e-6), x.copy(), x.copy(), np.zeros(2, np.float32))
    q = np.zeros((1, 2, 1, 32), np.float32)
    fastmath._rope_parallel(q, np.ones((2, 16), np.float32), np.zeros((2, 16), np.float32), False, q.copy())
    for a in (np.zeros((2, 1, 16), np.float32), np.zeros((2, 1, 32), np.float32)[:, :, :16]):   # C, and a slice
        for kernel in (fastmath._qk_serial, fastmath._qk_parallel):
            for w in (np.ones(16, np.float32), np.zeros(0, np.float32)):
                kernel(a, w, np.float32(1e-6), w.shape[0] > 0, np.ones((2, 8), np.float32), np.zeros((2, 8), np.float32),
                       False, np.float32(1.0), False, np.zeros((2, 1, 16), np.float32), 2)
    if act in ("silu", "gelu_tanh"):
        fastmath._glu_parallel(x, 0, x, 8, act == "gelu_tanh", np.float32(0.8), np.float32(0.04),
                               np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32))


def _kind(value):
    """What decides the kernels a layer's step calls: the types, dtypes and shapes of its weights"""
    if isinstance(value, (tuple, list)):
        return tuple(_kind(v) for v in value)
    if dataclasses.is_dataclass(value):                            # FFNWeights, the experts' weights
        return (type(value).__name__,) + tuple(_kind(getattr(value, f.name)) for f in dataclasses.fields(value))
    return (type(value).__name__, getattr(value, "shape", None), str(getattr(value, "dtype", "")),
            getattr(value, "qtype", None), getattr(value, "packed", None) is None)
