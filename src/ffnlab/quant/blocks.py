"""GGUF block layouts: which ggml types ffnlab multiplies from their blocks, and their sizes.

A quantized row of n weights is n / block_elems blocks of block_bytes each, stored back to back;
blocks never straddle rows, so a matrix is a [rows, row_bytes] byte array and any subset of its
rows is again a valid matrix of the same type. The layouts (ggml-common.h, gguf-py quants.py):

  F32   4 bytes per weight; F16 / BF16: 2 bytes per weight
  Q4_0  32 weights: d f16, qs[16]                      w = d * (q - 8)
  Q4_1  32 weights: d f16, m f16, qs[16]               w = d * q + m
  Q5_0  32 weights: d f16, qh u32, qs[16]              w = d * (q | h << 4) - 16 d
  Q5_1  32 weights: d f16, m f16, qh u32, qs[16]       w = d * (q | h << 4) + m
  Q8_0  32 weights: d f16, qs[32] int8                 w = d * q
  (in the 4-bit types byte j holds weight j in its low nibble and weight j + 16 in its high one)
  Q2_K  256 weights: scales[16] (4-bit scale | 4-bit min), qs[64] 2-bit, d f16, dmin f16
  Q3_K  256 weights: hmask[32], qs[64] 2-bit, scales[12] (16 x 6-bit), d f16
  Q4_K  256 weights: d f16, dmin f16, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]
  Q5_K  256 weights: d f16, dmin f16, scales[12], qh[32], qs[128]
  Q6_K  256 weights: ql[128], qh[64], scales[16] int8, d f16
"""
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

# the types with compiled kernels (quant/kernels.py); others are dequantized at load
KERNEL_TYPES = (T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0,
                T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K)


def block_size(qtype):
    """-> (weights per block, bytes per block) of a ggml type."""
    return GGML_QUANT_SIZES[T(qtype)]


def row_bytes(qtype, n):
    """Bytes of one row of n weights; n must be a whole number of blocks."""
    elems, nbytes = block_size(qtype)
    if n % elems:
        raise ValueError(f"a row of {n} weights is not a whole number of {T(qtype).name} blocks ({elems} weights)")
    return n // elems * nbytes


def _half_tables():
    """float32 value of every 16-bit pattern, as IEEE half and as bfloat16: one lookup converts a
    block scale (numba has no float16 arithmetic on the CPU)."""
    bits = np.arange(1 << 16, dtype=np.uint16)
    f16 = bits.view(np.float16).astype(np.float32)
    bf16 = (bits.astype(np.uint32) << 16).view(np.float32)
    return f16, bf16


F16_TABLE, BF16_TABLE = _half_tables()


def table_for(qtype):
    """The 16-bit lookup table a kernel of this type reads (BF16 weights: bfloat16, else half)."""
    return BF16_TABLE if T(qtype) == T.BF16 else F16_TABLE
