"""The whole model, forward and backward: embeddings -> blocks -> final norm -> LM head.

Functional core in llm.c style: forward(params, cfg, ids, ...) returns logits and the
activations the backward needs; backward(dlogits, params, cfg, cache) returns a gradient for
every parameter. Model (model/__init__.py) wraps it with a tokenizer and generation.
"""
import math
from typing import NamedTuple

import numpy as np

from ..ops.attention import causal_mask
from ..ops.embedding import embedding_backward
from ..ops.linear import ComposedWeight, linear_backward, linear_forward
from ..quant import QuantTensor
from ..threads import blas_single
from .arith import F32, fused
from .block import block_backward, block_forward, norm_backward, norm_forward
from .hooks import Hooks
from .params import lm_head_name
from .weights import model_weights


class ForwardCache(NamedTuple):
    """What backward() needs from a training forward."""
    ids: np.ndarray                 # [B, T]
    pos: np.ndarray                 # [T] absolute positions
    blocks: list                    # [n_layer] block.BlockCache
    output_norm: tuple              # the final norm's cache
    y: np.ndarray                   # [B, T, d_model] the final norm's output (the LM head's input)
    softcap: np.ndarray | None      # tanh(z / c) when the logits are soft-capped


def forward(p, cfg, ids, kv=None, hooks=None, train=False, last_only=False, weights=None, arith=F32):
    """ids: [T] or [B, T] int -> logits [B, T, vocab] (float32 for float32 params), ForwardCache or None

    kv: KVCache; the tokens are placed after its kv.n cached positions and appended to it.
    hooks: model/hooks.py's Hooks (a tracer, editors) on every named node; None: identity hooks.
    train: keep the activations for backward().
    weights: p read into records (model/weights.py: Model.weights() keeps them, with the layouts
             of load); None: read here.
    last_only: compute logits for the last position only (generation: the LM head is the
               largest matmul, and only the last row is sampled) -> [B, 1, vocab].
    arith: model/arith.py's F32 or GGML (llama.cpp's CPU numerics); the weights' products
           follow the QuantTensors' own setting, made at load.
    """
    # quantized weights: the products dequantize and multiply their tiles on numba's threads
    # (quant/packed.py's Packed.matmul), and BLAS stays on one thread for the whole forward, so that
    # no idle BLAS thread spins beside them
    with blas_single(any(isinstance(w, QuantTensor) for w in p.values())):
        return _forward(weights or model_weights(p, cfg), cfg, ids, kv, hooks, train, last_only, arith)


def _forward(w, cfg, ids, kv, hooks, train, last_only, arith):
    ids = np.atleast_2d(np.asarray(ids))
    B, T = ids.shape
    pos0 = kv.n if kv is not None else 0
    if pos0 + T > (kv.n_ctx if kv is not None else cfg.n_ctx):
        raise ValueError(f"{pos0 + T} positions exceed the context length {kv.n_ctx if kv is not None else cfg.n_ctx}")
    pos = np.arange(pos0, pos0 + T)
    # only the last logits wanted, nothing to observe or edit: the last block computes its queries,
    # attention output and FFN for the last position alone (the others feed no logit)
    trim_last = last_only and not train and not hooks
    hooks = hooks or Hooks()
    hook = hooks.point(-1, pos)
    # nothing observes or differentiates the nodes: the arithmetic's fused kernel set (model/arith.py)
    ops = fused(arith) if kv is not None and not hooks and not train else arith
    # llama.cpp's build_inp_embd names its last step embd: the rows, or Granite's multiplier after them
    rows = "embd_rows" if cfg.embedding_multiplier else "embd"
    x = hook(rows, w.token_embd[ids])                                          # [B, T, d_model]
    if cfg.embed_scale:
        # Gemma: scale by sqrt(d_model)
        x = hook("inp_scaled", x * np.asarray(math.sqrt(cfg.d_model), dtype=x.dtype))
    if cfg.embedding_multiplier:                                               # Granite
        x = hook("embd", x * np.asarray(cfg.embedding_multiplier, dtype=x.dtype), "SCALE", (rows,))   # not the rows
    if cfg.positions == "learned":
        pe = hook("pos_embd", w.position_embd[pos][None])
        x = hook("inpL", x + pe)                                               # [B, T, d_model]
    k_pos = np.arange(0, pos0 + T)
    masks, ropes = {}, {}                      # shared by the layers: built once per forward
    block_caches = []
    for il in range(cfg.n_layer):
        L = w.layers[il]
        if L.window not in masks:
            m = causal_mask(pos, k_pos, L.window)                          # [T, S]
            masks[L.window] = None if m.all() else m                       # None: nothing to mask
        if L.rope is not None and L.rope not in ropes:                     # not SmolLM3's NoPE layers
            cos, sin = arith.rope_angles(pos, cfg.n_rot, *L.rope)        # once per forward, cast once
            ropes[L.rope] = (cos.astype(x.dtype), sin.astype(x.dtype))
        x, c = block_forward(x, L, cfg, pos, masks[L.window], kv, hooks.point(il, pos), ropes.get(L.rope), ops,
                             last_only=trim_last and il == cfg.n_layer - 1)
        if train:
            block_caches.append(c)
        del c                                  # inference: free this layer's activations before the next
    if last_only:
        x = x[:, -1:]                                                      # [B, T, d_model] -> [B, 1, d_model]
        hook = hooks.point(-1, pos[-1:])
    y, fn_cache = norm_forward(x, w.output_norm, cfg, "result_norm", hook, arith=arith)
    logits, softcap = lm_head(y, w.head, cfg)           # [B, T, d_model] -> [B, T, vocab]
    # llama.cpp names the last node result_output: the softcap's SCALE when there is one
    logits = hook("result_output", logits, "SCALE" if softcap is not None or cfg.logits_scaling else "MUL_MAT",
                  (lm_head_name(cfg), "result_norm"))
    if kv is not None:
        kv.n += T
    cache = ForwardCache(ids, pos, block_caches, fn_cache, y, softcap) if train else None
    return logits, cache


def lm_head(y, head, cfg):
    """y: [..., d_model] the final norm's output, head: [vocab, d_model] -> logits [..., vocab],
    tanh(z / c) or None

    The one LM head: the forward, the one-token step (model/decode.py) and the logit lens read
    the logits through it. Gemma 2/3 soft-cap them, logits = c * tanh(z / c); the tanh is kept
    for the backward."""
    logits = linear_forward(y, head)                                      # [..., d_model] -> [..., vocab]
    softcap = None
    if cfg.final_logit_softcap:
        c = cfg.final_logit_softcap
        softcap = np.tanh(logits / c)
        logits = softcap * c
    if cfg.logits_scaling:                          # Granite: logits / s, as llama.cpp's ggml_scale(1/s)
        logits = logits * np.asarray(1.0 / cfg.logits_scaling, dtype=logits.dtype)
    return logits, softcap


def backward(dlogits, p, cfg, cache):
    """dlogits: [B, T, vocab] -> {tensor name: gradient}, same keys as p"""
    ids, pos, block_caches, fn_cache, y, softcap = cache                  # a ForwardCache
    if cfg.logits_scaling:
        dlogits = dlogits * (1.0 / cfg.logits_scaling)
    if softcap is not None:
        dlogits = dlogits * (1.0 - softcap * softcap)                     # d(c*tanh(z/c))/dz
    g = {}
    w = model_weights(p, cfg)
    dy, dhead, _ = linear_backward(dlogits, y, w.head, has_bias=False)
    dx, gn = norm_backward(dy, w.output_norm, cfg, fn_cache)
    g.update(gn)
    for il in reversed(range(cfg.n_layer)):
        dx, gb = block_backward(dx, w.layers[il], cfg, block_caches[il])
        g.update(gb)
    if isinstance(p["token_embd.weight"], ComposedWeight):
        return g                         # a frozen table (LoRA fine-tuning): no [vocab, d_model] gradient
    if cfg.embed_scale:
        dx = dx * math.sqrt(cfg.d_model)
    if cfg.embedding_multiplier:
        dx = dx * cfg.embedding_multiplier
    B, T = ids.shape
    dflat = dx.reshape(B * T, -1)
    learned = cfg.positions == "learned"
    dwte, dwpe = embedding_backward(dflat, ids.reshape(-1), cfg.vocab_size,
                                    np.tile(pos, B) if learned else None, cfg.n_ctx)
    if learned:
        g["position_embd.weight"] = dwpe
    if cfg.tie_embeddings:
        dwte += dhead                                                     # the head and the table are one matrix
    else:
        g["output.weight"] = dhead
    g["token_embd.weight"] = dwte
    return g
