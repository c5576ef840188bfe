"""Inference weight layout: packed projections, column-major tall matrices, huge pages.

Decoding one token is a chain of matrix-vector products, bound by how fast the weights stream
from memory (~540 MB of float32 per SmolLM2 token). pack() lays the matrices a decode step
reads out for streaming, without changing a single value or tensor name:

- Packing. One product over a [q+k+v, d_model] matrix streams faster than three small ones
  (and costs one Python call, not three), and the same holds for gate and up. Each layer's
  q/k/v rows and gate/up rows are copied into one buffer and the params entries become views
  of it, so nothing is stored twice. If a params entry is later replaced by another array,
  model/weights.py notices (the entry is no longer the view pack() made) and the model falls
  back to the separate products.
- Memory order. Tall matrices (more rows than columns: packed q/k/v [960, 576], gate/up
  [3072, 576], the LM head [49152, 576] on SmolLM2) are stored column-major (Fortran order):
  still [out, in] arrays with the same values, but each input feature's weights for all
  outputs lie together. OpenBLAS's matrix-vector kernel streams that layout 20-35% faster for
  tall shapes; the square attn_output and the wide ffn_down stream faster row-major and stay so.
  Prefill's GEMMs run as fast either way (bench runs 4-6: 360-405 tokens/s, against 360-431).
- Threading. OpenBLAS runs a matrix-vector product of fewer than 460,800 elements on one
  thread (interface/gemv.c: 115,200 x GEMM_MULTITHREAD_THRESHOLD), so SmolLM2's [576, 576]
  attn_output streamed at half the speed of the rest. A matrix that is at least 2/3 of that size
  gets zero rows below it up to it: the product runs on both cores, and the extra outputs (zeros)
  are sliced off. Its params entry is a view of the real rows.
- Huge pages. All these matrices live in one anonymous memory mapping that the kernel is asked
  (madvise MADV_HUGEPAGE) to back with 2 MB pages: a 4 KB page is 1,024 floats, so a token's
  sweep over the weights would otherwise walk ~130,000 page-table entries, and the hardware
  prefetcher stops at every 4 KB boundary. Where the platform has no such advice, it is
  ordinary memory.
Quantized matrices (quant.QuantTensor) are laid out row-interleaved for their own kernels
(quant/packed.py: QuantTensor.pack), and the file's pages of their blocks are given back, so
their resident memory is the packed copy alone.
With model/decode.py, SmolLM2 decoding went from 26.5 to 28-44 tokens/s on the shared machine
(bench/RESULTS.md, run 3 against runs 8-15).
"""
import mmap

import numpy as np

from .params import lm_head_name

BLAS_THREADED_MIN = 460_800     # elements from which OpenBLAS splits a gemv across threads
QKV = ("attn_q.weight", "attn_k.weight", "attn_v.weight")
GATE_UP = ("ffn_gate.weight", "ffn_up.weight")


def pack(params, cfg) -> dict:
    """-> {(layer, "qkv"|"gate_up"|"attn_output"): (buffer, views)}; moves the matrices a decode step
    reads into one huge-page block and rewrites their params entries as views into it (same values)."""
    packs = pack_quantized(params, cfg)
    groups = []                                 # (pack key or None, tensor names stacked by rows)

    def add(key, parts):
        names = [f"blk.{il}.{n}" for n in parts]
        if all(isinstance(params.get(n), np.ndarray) for n in names):
            groups.append((key, names))
            return True
        return False

    for il in range(cfg.n_layer):
        add((il, "qkv"), QKV) or add(None, ("attn_qkv.weight",))        # GPT-2 files fuse q/k/v already
        add((il, "attn_output"), ("attn_output.weight",))
        add((il, "gate_up"), GATE_UP) or add(None, ("ffn_up.weight",))  # dense FFN: up alone
        add(None, ("ffn_down.weight",))
    if isinstance(params[lm_head_name(cfg)], np.ndarray):
        groups.append((None, [lm_head_name(cfg)]))
    if not groups:
        return packs
    shapes = [_padded_shape(sum(params[n].shape[0] for n in names), params[names[0]].shape[1]) for _, names in groups]
    starts = np.cumsum([0] + [-(-r * c // 16) * 16 for r, c in shapes])   # each matrix 64-byte aligned (float32)
    arena = _huge_page_array(int(starts[-1]), params[groups[0][1][0]].dtype)
    for (key, names), (rows, cols), start in zip(groups, shapes, starts):
        flat = arena[start:start + rows * cols]
        buf = flat.reshape(cols, rows).T if rows > cols else flat.reshape(rows, cols)   # [rows, cols]: tall ones column-major
        real = sum(params[n].shape[0] for n in names)
        np.concatenate([params[n] for n in names], axis=0, out=buf[:real])
        buf[real:] = 0                                                  # padding rows (see Threading)
        views, row = [], 0
        for n in names:
            params[n] = buf[row:row + params[n].shape[0]]
            row += params[n].shape[0]
            views.append(params[n])
        if key is not None:
            packs[key] = (buf, tuple(views))
    return packs


def pack_quantized(params, cfg) -> dict:
    """Lay out every quantized matrix for its kernels (QuantTensor.pack), q/k/v and gate/up of a
    layer stacked into one matrix each. -> {(layer, "qkv"|"qk"|"gate_up"): (stacked, part views)}.
    Where v's type differs from q's and k's (Gemma 3's Q4_K_M: Q8_0 or Q6_K v beside Q5_0 q
    and k), q and k are stacked alone ("qk"): one product instead of two.
    Called again on packed params (load_gguf packs while the tokenizer is built), it finds the
    stacks it made: each part remembers its stack."""
    from ..quant import QuantTensor
    packs = {}
    for il in range(cfg.n_layer):
        for key, parts in (("qkv", QKV), ("qk", QKV[:2]), ("gate_up", GATE_UP)):
            if key == "qk" and (il, "qkv") in packs:
                continue
            names = [f"blk.{il}.{n}" for n in parts]
            if all(isinstance(params.get(n), QuantTensor) for n in names):
                views = tuple(params[n] for n in names)
                stack = views[0].stack if all(w.stack is views[0].stack for w in views) else None
                stack = stack or QuantTensor.stacked(views)
                if stack is not None:
                    packs[(il, key)] = (stack, views)
    for w in params.values():                   # the other quantized matrices, each alone
        if isinstance(w, QuantTensor):
            w.pack()
    return packs


def _padded_shape(rows, cols):
    """[rows, cols], with zero rows added up to BLAS_THREADED_MIN elements when that costs at most 1.5x."""
    if rows * cols < BLAS_THREADED_MIN <= 1.5 * rows * cols:
        rows = -(-BLAS_THREADED_MIN // cols)
    return rows, cols


def _huge_page_array(n, dtype):
    """A 1-D array of n elements in an anonymous mapping advised to use transparent huge pages."""
    nbytes = n * np.dtype(dtype).itemsize
    if nbytes == 0 or not hasattr(mmap, "MADV_HUGEPAGE") or not hasattr(mmap, "MAP_ANONYMOUS"):
        return np.empty(n, dtype)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(m, dtype, count=n)                    # the array keeps the mapping alive
