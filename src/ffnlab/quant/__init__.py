"""Quantized-resident weights: GGUF blocks, the QuantTensor that holds them, compiled kernels.

  types.py    one record per ggml type: block sizes, fields, scales, vec-dot type, layout family
  blocks.py   a row's bytes, the 16-bit float tables of the block scales, and Blocks, the file's own layout
  unpack.py   the bit tricks of the blocks (Q6_K's code, the Q5 fifth bit, K-quant scales), one helper each
  layout.py   what every layout offers: its arithmetic's products, groups, dequantized tiles and rows, its size
  dequant.py  one compiled dequantizer per type (a row of blocks -> float32)
  kernels.py  the products on the blocks as they lie in the file: matrix-vector, row tiles for BLAS
  packed.py   the layout a loaded model multiplies by: 64 rows interleaved, and its kernels
  pages.py    handing the file's pages back once the blocks are packed
  simd.py     vector registers for numba: one template of intrinsics, for 8 and for 16 lanes
  ggml_*.py   arith "ggml": llama.cpp's activation quantizers and integer products (ggml_int8.py:
              ggml's AVX2 byte multiplies, written with the intrinsics of simd.py)
  tensor.py   QuantTensor, the weight object ops/linear.py multiplies by: one layout's products
"""
from .blocks import KERNEL_TYPES
from .tensor import QuantTensor

__all__ = ["KERNEL_TYPES", "QuantTensor", "floats"]


def floats(w):
    """A weight as a float array: a QuantTensor dequantized (a float32 copy), an array as it is.
    For the few places that need every value (weight statistics, export), not for products."""
    return w.dequantize() if isinstance(w, QuantTensor) else w
