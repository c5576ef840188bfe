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
import numpy as np
from gguf import GGMLQuantizationType

from . import ggml_packed, packed
from .blocks import KERNEL_TYPES, Blocks, row_bytes, table_for
from .ggml_quants import Q8Rows
from .pages import release_pages
from .types import TYPES

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
        self.blocks = Blocks(self.qtype, self.data, self.table, n)   # the file's layout (quant/blocks.py)
        self.packed = None                            # the packed layout once pack() ran: what the products read
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
        self.data, self.blocks, self.packed, self.stack = None, None, fused, None   # no blocks: the parts keep theirs
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

    @property
    def layout(self):
        """what the products read: the packed layout once pack() ran, else the file's blocks"""
        return self.packed if self.packed is not None else self.blocks

    def __array__(self, dtype=None, copy=None):
        raise TypeError(f"{self!r} is kept in its GGUF blocks: call .dequantize() for a float32 array")

    def dequantize(self) -> np.ndarray:
        """-> float32 [out, in], the exact values gguf.quants.dequantize gives."""
        return self.layout.dequantize()

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
        self.layout.lookup(flat.astype(np.int64) % self.shape[0], out)
        return out.reshape(*ids.shape, self.shape[1])

    def matvec(self, x) -> np.ndarray:
        """x: [in] float32 -> W x: [out] float32"""
        if self.arith == "ggml":
            return self.matmul(x[None])[0]
        return self.layout.mul_vec(x)

    def matmul(self, x) -> np.ndarray:
        """x: [N, in] float32 -> x W^T: [N, out], by the layout's own product (quant/layout.py): tiles
        of rows dequantized into a cache-sized float32 buffer and multiplied there, so the float32
        matrix never exists whole; in arith "ggml", ggml's mul_mat (_ggml_matmul)."""
        x = np.ascontiguousarray(x, np.float32)
        if self.arith == "ggml":
            return self._ggml_matmul(x)
        return self.layout.mul(x)

    def rmatmul(self, dy) -> np.ndarray:
        """dy: [N, out] float32 -> dy W: [N, in], the input gradient of a frozen quantized weight
        (LoRA fine-tuning): the same row tiles as matmul, each adding its rows' share, so no
        float32 matrix and no gradient buffer for W is made."""
        return self.layout.mul_t(np.ascontiguousarray(dy, np.float32))

    def _ggml_matmul(self, x):
        """x: [N, in] -> [N, out] as ggml's mul_mat: x converted to the weight's vec_dot_type, then
        one dot product per (token, row)"""
        vec_dot = TYPES[TYPES[self.qtype].vec_dot]                  # ggml's vec_dot_type (type_traits_cpu)
        if vec_dot.block_weights == 1:                              # F16 / BF16: x rounded to the same type
            return self.blocks.mul(_round_to(x, self.qtype))
        return self.layout.mul_q8(Q8Rows(vec_dot.name.lower(), x))  # the 8-bit blocks: "q8_0", "q8_1", "q8_k"


def _round_to(x, qtype):
    """float32 x rounded to half (F16C) or bfloat16 (ggml_cpu_fp32_to_bf16: nearest, ties to even)"""
    if qtype == T.F16:
        return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)
