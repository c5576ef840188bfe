"""GGUF blocks: the size of a row of them, and the 16-bit float tables their scales are read with.

A quantized row of n weights is n / block_weights blocks of block_bytes each (types.py: one record
per ggml type, with its fields), stored back to back; blocks never straddle rows, so a matrix is a
[rows, row_bytes] byte array and any subset of its rows is again a valid matrix of the same type.
"""
import numpy as np

from .types import BF16, KERNEL_TYPES, TYPES

__all__ = ["KERNEL_TYPES", "row_bytes", "table_for"]


def row_bytes(qtype, n):
    """Bytes of one row of n weights; n must be a whole number of blocks."""
    r = TYPES[int(qtype)]
    if n % r.block_weights:
        raise ValueError(f"a row of {n} weights is not a whole number of {r.name} blocks ({r.block_weights} weights)")
    return n // r.block_weights * r.block_bytes


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
    return BF16_TABLE if int(qtype) == BF16 else F16_TABLE
