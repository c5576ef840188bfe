"""Packed projections for fast inference.

Decoding one token is a chain of matrix-vector products, bound by how fast the weights stream
from memory. One product over a [q+k+v, d_model] matrix streams faster than three small ones
(and costs one Python call, not three), and the same holds for gate and up. pack() copies each
layer's q/k/v rows and gate/up rows into one buffer and makes the params entries views of it,
so nothing is stored twice and the named tensors stay what they were.

If a params entry is later replaced by another array, packed() notices (the entry is no longer
a view of the buffer) and the model falls back to the separate products.

Memory order. The packed buffers and the LM head are stored column-major (Fortran order): still
[out, in] arrays with the same values, but each input feature's weights for all outputs lie
together. For these tall matrices ([960, 576] q/k/v, [3072, 576] gate/up, [49152, 576] head on
SmolLM2) OpenBLAS's matrix-vector kernel for that layout streams 20-35% more GB/s, and a decoded
token is ~10% faster (bench/RESULTS.md); attn_output and ffn_down, square and wide, stream
faster row-major and stay so. Prefill's GEMMs run as fast either way (bench runs 4-6: 360-405
tokens/s, against 360-431 before).
"""
import numpy as np

from .params import lm_head_name

QKV = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
GATE_UP = ("ffn_gate.weight", "ffn_up.weight")


def pack(params, cfg) -> dict:
    """-> {(layer, "qkv"|"gate_up"): buffer}; rewrites params entries as views into the buffers
    (and the LM head as a column-major copy)."""
    packs = {}
    for il in range(cfg.n_layer):
        for kind, parts in (("qkv", QKV), ("gate_up", GATE_UP)):
            names = [f"blk.{il}.{n}" for n in parts]
            if not all(n in params for n in names):
                continue                      # fused GPT-2 qkv, dense FFN: nothing to pack
            rows = sum(params[n].shape[0] for n in names)
            buf = np.empty((rows, cfg.d_model), params[names[0]].dtype, order="F")   # [sum(out), d_model]
            np.concatenate([params[n] for n in names], axis=0, out=buf)
            row = 0
            for n in names:
                rows = params[n].shape[0]
                params[n] = buf[row:row + rows]
                row += rows
            packs[(il, kind)] = buf
    head = lm_head_name(cfg)
    params[head] = np.asfortranarray(params[head])             # [vocab, d_model], column-major
    return packs


def packed(packs, params, il, kind, names):
    """The packed buffer for these tensors, if params still holds views of it; else None."""
    if not packs:
        return None
    buf = packs.get((il, kind))
    if buf is None or any(params[n].base is not buf for n in names):
        return None
    return buf
