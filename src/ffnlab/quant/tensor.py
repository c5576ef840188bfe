"""QuantTensor: a weight matrix kept in its GGUF blocks.

It holds the blocks as they lie in the file (a memory-mapped [rows, row_bytes] uint8 array, so
nothing is read until a product touches it), the ggml type and the logical shape [out, in]; a
loaded model then pack()s them (quant/packed.py: the same codes, 64 rows interleaved, what its
products read) and the file's pages are released. It is
what ops/linear.py's linear_forward accepts besides a float array; everything else that needs
floats asks for them: dequantize() for the whole matrix, w[ids] for some rows (the embedding
lookup reads only the tokens it needs). It never turns into a float array by accident:
np.asarray(w) raises, so a float32 copy of a matrix is always a visible dequantize() call.
"""
import functools
import threading

import numpy as np
from gguf import GGMLQuantizationType

from . import gemm, ggml_kernels, ggml_packed, kernels, packed, simd
from .blocks import KERNEL_TYPES, row_bytes, table_for
from .ggml_quants import Q8Rows
from .pages import release_pages
from .types import TYPES
from .. import threads

TILE_BYTES = 1 << 20                 # a prefill tile of float32 weights (blocks as in the file): fits in L2
PACKED_TILE_BYTES = 1 << 20          # packed weights: whole 64-row groups, in L2 (4 MB tiles ran prefill 30% slower)
HALF_BLOCK = 16                      # the fused kernels' lane count, passed at run time (kernels.py says why)
T = GGMLQuantizationType


# arith -> (the types pack() lays out, the packing function); the types stacked() can stack, with
# the empty() / fill() that make their layout (ggml's K-quants have layouts of their own)
_PACKS = {"f32": (packed.PACKED_TYPES, packed.pack), "ggml": (ggml_packed.PACKED_TYPES, ggml_packed.pack)}
_STACKS = {"f32": (packed.PACKED_TYPES, packed.empty, packed.fill),
           "ggml": (ggml_packed.STACKABLE, ggml_packed.empty, ggml_packed.fill)}


class QuantTensor:
    dtype = np.dtype(np.float32)     # what its products and dequantize() give
    ndim = 2

    def __init__(self, data, qtype, shape, arith="f32"):
        """data: the blocks (any array over the file's bytes), qtype: ggml type, shape: (out, in),
        arith: "f32" (float32 products of the exact weights) or "ggml" (llama.cpp's CPU products:
        the activation quantized to 8-bit blocks, integer dot products; quant/ggml_kernels.py)"""
        self.qtype = GGMLQuantizationType(qtype)
        self.arith = arith
        if self.qtype not in KERNEL_TYPES:
            raise ValueError(f"no kernel for ggml type {self.qtype.name}")
        out, n = (int(s) for s in shape)
        self.shape = (out, n)
        nbytes = row_bytes(self.qtype, n)
        raw = np.asarray(data)
        if raw.dtype != np.uint8:
            raw = raw.view(np.uint8)
        if raw.size != out * nbytes:
            raise ValueError(f"{raw.size} bytes of {self.qtype.name} blocks, but [{out}, {n}] needs {out * nbytes}")
        self.data = raw.reshape(out, nbytes)          # [out, row_bytes]: a view, no copy
        # read-only, like the mapped file: numba compiles a kernel per array kind, so one kind
        # (read-only, C-contiguous) keeps it to one compilation per type
        self.data.flags.writeable = False
        self.table = table_for(self.qtype)            # 16-bit -> float32 lookup for the block scales
        self.packed = None                            # packed.Packed once pack() ran: what the products read
        self.stack = None                             # the stacked matrix this one is a part of (stacked())

    def pack(self, release=True):
        """Lay the blocks out row-interleaved for the products (arith "f32": quant/packed.py, the
        types in packed.PACKED_TYPES; arith "ggml": quant/ggml_packed.py, its TYPES; others keep
        the row kernels of kernels.py / ggml_kernels.py). release: hand the
        file's pages of these blocks back to the OS, so that they do not stay resident besides
        the packed copy (lookups w[ids] and the ggml kernels read them again on demand). -> bytes packed"""
        if self.packed is None and int(self.qtype) in _PACKS[self.arith][0]:
            self.packed = _PACKS[self.arith][1](int(self.qtype), self.data, self.table, self.shape[1])
            if release:
                release_pages(self.data)
        return 0 if self.packed is None else self.packed.nbytes

    @classmethod
    def stacked(cls, parts, release=True, fused=None):
        """One matrix of the parts' rows, stacked (q/k/v, gate/up: one product where a decode step
        would make three or two), packed straight into one layout whose row groups are the parts'
        packed views (nothing is stored twice, no copy is made on the way). Needs unpacked parts of
        one packed type and width (one arith: _STACKS), all but the last a whole number of row groups.
        fused: that layout, already made (formats/pack_cache.py reads it back from disk), whose
        groups the parts become. -> QuantTensor, or None where the parts do not fit (each can
        still pack() alone)."""
        first = parts[0]
        if any(not isinstance(w, QuantTensor) or w.packed is not None or w.arith != first.arith or w.qtype != first.qtype
               or w.shape[1] != first.shape[1] for w in parts) or int(first.qtype) not in _STACKS[first.arith][0] \
                or any(w.shape[0] % packed.R for w in parts[:-1]):
            return None
        rows, n = sum(w.shape[0] for w in parts), first.shape[1]
        _, empty, fill = _STACKS[first.arith]
        made = fused is None
        if made:
            fused = empty(int(first.qtype), rows, n)
        elif (fused.rows, fused.n) != (rows, n):
            return None
        g = 0
        for w in parts:
            G = -(-w.shape[0] // packed.R)
            w.packed = fused.groups(g, g + G)
            if made:
                fill(w.packed, first.qtype, w.data, w.table)
                if release:
                    release_pages(w.data)
            g += G
        self = cls.__new__(cls)
        self.qtype, self.arith, self.shape, self.table = first.qtype, first.arith, (rows, n), first.table
        self.data, self.packed, self.stack = None, fused, None    # no blocks of its own: the parts keep theirs
        for w in parts:
            w.stack = self
        return self

    @property
    def size(self):
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self):
        return self.data.nbytes if self.data is not None else self.packed.nbytes

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"QuantTensor({self.qtype.name}, [{self.shape[0]}, {self.shape[1]}])"

    def __array__(self, dtype=None, copy=None):
        raise TypeError(f"{self!r} is kept in its GGUF blocks: call .dequantize() for a float32 array")

    def dequantize(self) -> np.ndarray:
        """-> float32 [out, in], the exact values gguf.quants.dequantize gives."""
        out = np.empty(self.shape, np.float32)
        if self.packed is not None:
            for r0, rows in self._row_tiles():
                out[r0:r0 + rows.shape[0]] = rows
            return out
        kernels.dequant_rows(int(self.qtype), self.data, self.table, out, HALF_BLOCK)
        return out

    def _tile_groups(self):
        """Row groups per tile at most: ~PACKED_TILE_BYTES of float32 (the GEMM reads it from L2)"""
        return max(1, min(PACKED_TILE_BYTES // (4 * self.shape[1] * packed.R), self.packed.n_groups))

    def _strips(self, g0, g1):
        """row groups g0..g1 of the packed weights dequantized as quant/gemm.py's strips
        [4 (g1 - g0), in, 16], in a scratch buffer of this thread's, reused (a fresh 4 MB buffer
        per product costs ~1,000 page faults)"""
        S, n = (g1 - g0) * (packed.R // gemm.STRIP), self.shape[1]
        buf = _scratch(S * n * gemm.STRIP).reshape(S, n, gemm.STRIP)
        self.packed.dequant_strips(g0, g1, buf)
        return buf

    def _row_tiles(self):
        """every tile of rows in turn: yields (first row, [rows, in] float32), for dequantize() and
        rmatmul(), in a scratch buffer of this thread's (quant/layout.py: any layout)"""
        G, per = self.packed.n_groups, self._tile_groups()
        for g0 in range(0, G, per):
            g1 = min(G, g0 + per)
            rows = self.packed.dequant_rows(g0, g1, _scratch)
            yield g0 * packed.R, rows[:min(self.shape[0], g1 * packed.R) - g0 * packed.R]

    def __getitem__(self, key):
        """w[i] / w[ids]: dequantized rows ([in] / [*ids.shape, in]), reading only those blocks;
        w[a:b]: the rows a..b as a QuantTensor (blocks are per row, so no copy)."""
        if self.data is None:
            raise TypeError(f"{self!r} is a stacked product matrix: index its parts (the params entries)")
        if isinstance(key, slice):
            rows = self.data[key]
            w = QuantTensor(rows, self.qtype, (rows.shape[0], self.shape[1]), self.arith)
            start, stop, step = key.indices(self.shape[0])
            if self.packed is not None and step == 1 and start % packed.R == 0 and stop > start \
                    and (stop % packed.R == 0 or stop == self.shape[0]):
                w.packed = self.packed.groups(start // packed.R, -(-stop // packed.R))   # whole groups: views
            return w
        ids = np.asarray(key)
        if ids.dtype.kind not in "iu":
            raise TypeError(f"{self!r} takes integer row indices or a slice, not {key!r}")
        flat = ids.reshape(-1)
        if flat.size and (flat.min() < -self.shape[0] or flat.max() >= self.shape[0]):
            raise IndexError(f"row index out of range for {self!r}")
        out = np.empty((flat.size, self.shape[1]), np.float32)
        if self.packed is not None:
            self.packed.lookup(flat.astype(np.int64) % self.shape[0], out)
            return out.reshape(*ids.shape, self.shape[1])
        rows = self.data[flat]                                       # [k, row_bytes]: only these rows' blocks
        rows.flags.writeable = False
        kernels.dequant_rows(int(self.qtype), rows, self.table, out, HALF_BLOCK)
        return out.reshape(*ids.shape, self.shape[1])

    def matvec(self, x) -> np.ndarray:
        """x: [in] float32 -> W x: [out] float32"""
        if self.arith == "ggml":
            return self.matmul(x[None])[0]
        if self.packed is not None:
            y = np.empty(self.packed.n_groups * packed.R, np.float32)
            self.packed.matvec(np.ascontiguousarray(x, np.float32), y)
            return y[:self.shape[0]]
        y = np.empty(self.shape[0], np.float32)
        kernels.matvec(int(self.qtype), self.data, self.table, np.ascontiguousarray(x, np.float32), y, HALF_BLOCK)
        return y

    def matmul(self, x) -> np.ndarray:
        """x: [N, in] float32 -> x W^T: [N, out]. Tiles of rows are dequantized into a
        cache-sized float32 buffer and multiplied there (packed: quant/gemm.py's kernel on numba's
        threads; the file's blocks: BLAS), so the float32 matrix never exists whole."""
        x = np.ascontiguousarray(x, np.float32)
        if self.arith == "ggml":
            return self._ggml_matmul(x)
        if self.packed is not None:
            n_threads = threads.threads()
            G = self.packed.n_groups
            per, chunks = tiling(G, self._tile_groups(), x.shape[0], n_threads)
            n_tiles = -(-G // per)
            width = gemm.tile_tokens()
            step = -(-x.shape[0] // (chunks * width)) * width           # tokens per part: whole register tiles
            y = simd.empty_aligned((x.shape[0], G * packed.R))       # whole groups: the last one's padding rows too
            if gemm.HAS_AVX2:
                self.packed.matmul(x, y, per, chunks, step)
            else:
                def item(i):                                        # one tile's share of tokens, on whichever thread is free
                    g0, t0 = (i // chunks) * per, (i % chunks) * step
                    gemm.product(self._strips(g0, min(G, g0 + per)), x[t0:t0 + step], y[t0:t0 + step], g0 * packed.R)
                threads.parallel_for(item, n_tiles * chunks)        # BLAS in each thread (threads.parallel_for says why)
            return y if y.shape[1] == self.shape[0] else np.ascontiguousarray(y[:, :self.shape[0]])
        out, n = self.shape
        rows = max(16, TILE_BYTES // (4 * n))
        tile = np.empty((min(rows, out), n), np.float32)
        yt = np.empty((out, x.shape[0]), np.float32)                # [out, N]: each tile's rows are contiguous
        for r0 in range(0, out, rows):
            t = tile[:min(rows, out - r0)]
            kernels.dequant_rows(int(self.qtype), self.data[r0:r0 + t.shape[0]], self.table, t, HALF_BLOCK)
            np.matmul(t, x.T, out=yt[r0:r0 + t.shape[0]])           # [rows, in] @ [in, N]
        return np.ascontiguousarray(yt.T)                           # [N, out]

    def rmatmul(self, dy) -> np.ndarray:
        """dy: [N, out] float32 -> dy W: [N, in], the input gradient of a frozen quantized weight
        (LoRA fine-tuning). The same row tiles as matmul: each adds its rows' share, so the
        float32 matrix never exists whole and no gradient buffer for W is made."""
        dy = np.ascontiguousarray(dy, np.float32)
        if self.packed is not None:
            dx = np.zeros((dy.shape[0], self.shape[1]), np.float32)
            for r0, rows in self._row_tiles():
                dx += dy[:, r0:r0 + rows.shape[0]] @ rows           # [N, rows] @ [rows, in]
            return dx
        out, n = self.shape
        rows = max(16, TILE_BYTES // (4 * n))
        tile = np.empty((min(rows, out), n), np.float32)
        dx = np.zeros((dy.shape[0], n), np.float32)
        for r0 in range(0, out, rows):
            t = tile[:min(rows, out - r0)]
            kernels.dequant_rows(int(self.qtype), self.data[r0:r0 + t.shape[0]], self.table, t, HALF_BLOCK)
            dx += dy[:, r0:r0 + t.shape[0]] @ t                      # [N, rows] @ [rows, in]
        return dx

    def _ggml_matmul(self, x):
        """x: [N, in] -> [N, out] as ggml's mul_mat: x converted to the weight's vec_dot_type, then
        one dot product per (token, row)"""
        vec_dot = TYPES[TYPES[self.qtype].vec_dot]                  # ggml's vec_dot_type (type_traits_cpu)
        if vec_dot.block_weights == 1:                              # F16 / BF16: x rounded to the same type
            x = _round_to(x, self.qtype)
            return QuantTensor(self.data, self.qtype, self.shape).matmul(x)
        kind = vec_dot.name.lower()                                 # the 8-bit blocks: "q8_0", "q8_1", "q8_k"
        a = Q8Rows(kind, x)
        if self.packed is not None:                                 # the row-interleaved layout (ggml_packed.py)
            return ggml_packed.product(self.packed, a, self.shape[0])
        y = np.empty((x.shape[0], self.shape[0]), np.float32)
        batch = x.shape[0] > 1 if kind != "q8_k" else x.shape[0] >= ggml_kernels.TILED_MIN_BATCH
        if batch:                                                   # vectorized over the tokens, same order
            qxt = np.ascontiguousarray(a.qs.T, np.int32)            # [in, N]
            f = ggml_kernels.gemm32_batch if kind != "q8_k" else ggml_kernels.gemmk_batch
            args = () if kind != "q8_k" else (TYPES[self.qtype].block_bytes,)
            f(int(self.qtype), *args, self.data, self.table, qxt, np.ascontiguousarray(a.d.T),
              np.ascontiguousarray(a.e.T), y)
        elif kind != "q8_k":                                        # one token: the FMA kernel
            for t in range(x.shape[0]):
                ggml_kernels.gemv32(int(self.qtype), self.data, self.table, a.qs[t].astype(np.int32), a.d[t], a.e[t],
                                    y[t])
        else:
            ggml_kernels.gemm(int(self.qtype), self.data, self.table, a.qs, a.d, a.e, y)
        return y


@functools.lru_cache(maxsize=4096)
def tiling(n_groups, max_per, n_tokens, n_threads) -> tuple:
    """How a prefill product is cut into work items -> (groups per tile, token parts per tile).

    Each item dequantizes its tile and multiplies it by its part of the tokens; the threads take
    equal runs of items, so the product ends when the busiest thread does: 11 tiles on 2 threads
    is 6 against 5, 16 smaller ones 8 against 8. Costs in one group's multiply-adds for one
    token: an item of p groups and T/c tokens costs p (T/c + 11), since dequantizing costs
    ~0.28 ns a weight against ~0.025 ns a weight per token for the products (one core,
    quant/gemm.py); a thread's share is ceil(items / threads) items. Parts are at least two
    register tiles of tokens. Ties go to bigger tiles and fewer parts (fewer items)."""
    best, best_cost = (max_per, 1), None
    for per in range(max_per, 0, -1):
        tiles = -(-n_groups // per)
        for c in range(1, 5):
            if c > 1 and n_tokens < c * 2 * gemm.tile_tokens():
                break
            cost = -(-tiles * c // n_threads) * per * (n_tokens / c + 11.0)
            if best_cost is None or cost < best_cost * 0.99:
                best, best_cost = (per, c), cost
    return best


_local = threading.local()


def _scratch(size) -> np.ndarray:
    """A float32 buffer of at least size elements, this thread's own, kept between products."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < size:
        buf = _local.buf = np.empty(size, np.float32)
    return buf[:size]


def _round_to(x, qtype):
    """float32 x rounded to half (F16C) or bfloat16 (ggml_cpu_fp32_to_bf16: nearest, ties to even)"""
    if qtype == T.F16:
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)
