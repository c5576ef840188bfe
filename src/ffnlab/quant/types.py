"""The ggml types ffnlab reads, one record each: what ggml's type_traits and type_traits_cpu say.

Every packer, dequantizer and kernel in quant/ takes a type's sizes, byte offsets and layout from
here. A block of `block_weights` weights is `block_bytes` bytes, its fields in the order of
ggml-common.h's struct (`fields`, "name:bytes"); the offsets below are those fields' places:

  type   weights  fields (bytes)                                    weight
  Q4_0   32       d 2, qs 16                                        d (q - 8)
  Q4_1   32       d 2, m 2, qs 16                                   d q + m
  Q5_0   32       d 2, qh 4, qs 16                                  d (q | h << 4) - 16 d
  Q5_1   32       d 2, m 2, qh 4, qs 16                             d (q | h << 4) + m
  Q8_0   32       d 2, qs 32 (int8)                                 d q
  Q2_K   256      scales 16 (4-bit scale | min << 4), qs 64, d 2, m 2    d sc q - dmin mn
  Q3_K   256      qh 32 (hmask), qs 64, scales 12 (16 x 6 bits), d 2     d (sc - 32) (q - 4 [no h])
  Q4_K   256      d 2, m 2, scales 12 (8 x 6-bit scale, 8 x 6-bit min), qs 128   d sc q - dmin mn
  Q5_K   256      d 2, m 2, scales 12, qh 32, qs 128                d sc (q | h << 4) - dmin mn
  Q6_K   256      qs 128 (low 4 bits), qh 64 (high 2), scales 16 (int8), d 2     d sc (q - 32)
  (in the 32-weight 4-bit types byte j holds weight j in its low nibble and weight j + 16 in its high one)

Q8_1 and Q8_K are not weight types here: they are the blocks ggml quantizes an activation into
for a weight's `vec_dot` (type_traits_cpu's vec_dot_type: Q4_0 -> Q8_0, Q4_1 -> Q8_1, Q4_K -> Q8_K).

`layout` is the row-interleaved family arith "f32" packs a type into (quant/packed.py: "nib" for
4-bit codes with an optional fifth bit, "i8" for 8-bit codes; "" keeps kernels.py's row kernels);
`ggml_layout` the one arith "ggml" packs into (quant/ggml_packed.py: "block32", "k"; "" keeps
ggml_kernels.py's row kernels). Type ids are gguf-py's GGMLQuantizationType, sizes its
GGML_QUANT_SIZES: the table is checked against them when it is made.

Compiled kernels read the records' numbers through QT: QT[Q6_K].block_bytes in an njit function
is the constant 210 (numba freezes a global tuple), and QT[qtype] with a run-time qtype indexes it.
"""
from typing import NamedTuple

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

# the type ids, as the kernels compare them (numba compares plain ints)
F32, F16, BF16 = int(T.F32), int(T.F16), int(T.BF16)
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = int(T.Q4_0), int(T.Q4_1), int(T.Q5_0), int(T.Q5_1), int(T.Q8_0), int(T.Q8_1)
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = int(T.Q2_K), int(T.Q3_K), int(T.Q4_K), int(T.Q5_K), int(T.Q6_K), int(T.Q8_K)


class QType(NamedTuple):
    id: int              # ggml type id (gguf.GGMLQuantizationType)
    name: str
    block_weights: int   # weights per block (gguf.GGML_QUANT_SIZES)
    block_bytes: int     # bytes per block (gguf.GGML_QUANT_SIZES)
    fields: str          # the block's fields in order, "name:bytes" (ggml-common.h)
    sub_block: int       # weights that share one scale (a 32-weight type: the block)
    code_bits: int       # bits of a weight's code (a float type: the float's)
    zero: int            # w = d (q - zero) (0 where the type has mins; Q3_K's offset is per weight)
    has_mins: bool       # an offset per block or sub-block: w = d q + m, or d sc q - dmin mn
    scale_bits: int      # bits of a sub-block's integer scale (0: the block's d is the scale)
    vec_dot: int         # ggml's vec_dot_type: the type an activation is quantized to for this weight
    layout: str          # arith "f32": packed.py's family ("nib" | "i8"), "" for the row kernels
    ggml_layout: str     # arith "ggml": ggml_packed.py's family ("block32" | "k"), "" for the row kernels
    d_at: int            # byte offset of the block's f16 d (-1: none)
    m_at: int            # byte offset of the f16 m / dmin (-1: none)
    qh_at: int           # byte offset of the high bits (Q5: a 32-bit qh; K-quants: qh / hmask) (-1: none)
    qs_at: int           # byte offset of the codes (their low bits)
    scales_at: int       # byte offset of the K-quants' sub-block scales (-1: none)


def _record(t, fields, sub_block, code_bits, zero=0, has_mins=False, scale_bits=0, vec_dot=None, layout="",
            ggml_layout=""):
    """One row, its offsets from `fields` and its sizes checked against gguf-py's."""
    weights, nbytes = GGML_QUANT_SIZES[t]
    at, o = {}, 0
    for f in fields.split():
        name, size = f.split(":")
        at[name], o = o, o + int(size)
    if t == T.Q8_1:                   # gguf-py keeps the old block_q8_1 of two float32s (40 bytes); ggml's
        nbytes = o                    # has two halves (36): only ever an activation, never read from a file
    if o != nbytes:
        raise AssertionError(f"{t.name}: fields {fields!r} make {o} bytes, gguf-py says {nbytes}")
    return QType(int(t), t.name, weights, nbytes, fields, sub_block, code_bits, zero, has_mins, scale_bits,
                 int(t if vec_dot is None else vec_dot), layout, ggml_layout, at.get("d", -1), at.get("m", -1),
                 at.get("qh", -1), at.get("qs", 0), at.get("scales", -1))


TYPES = {r.id: r for r in (
    _record(T.F32, "qs:4", 1, 32),
    _record(T.F16, "qs:2", 1, 16),
    _record(T.BF16, "qs:2", 1, 16),
    _record(T.Q4_0, "d:2 qs:16", 32, 4, zero=8, vec_dot=T.Q8_0, layout="nib", ggml_layout="block32"),
    _record(T.Q4_1, "d:2 m:2 qs:16", 32, 4, has_mins=True, vec_dot=T.Q8_1, layout="nib", ggml_layout="block32"),
    _record(T.Q5_0, "d:2 qh:4 qs:16", 32, 5, zero=16, vec_dot=T.Q8_0, layout="nib", ggml_layout="block32"),
    _record(T.Q5_1, "d:2 m:2 qh:4 qs:16", 32, 5, has_mins=True, vec_dot=T.Q8_1, layout="nib"),
    _record(T.Q8_0, "d:2 qs:32", 32, 8, vec_dot=T.Q8_0, layout="i8", ggml_layout="block32"),
    _record(T.Q8_1, "d:2 m:2 qs:32", 32, 8),                          # activations: m is s = d sum q
    _record(T.Q2_K, "scales:16 qs:64 d:2 m:2", 16, 2, has_mins=True, scale_bits=4, vec_dot=T.Q8_K),
    _record(T.Q3_K, "qh:32 qs:64 scales:12 d:2", 16, 3, scale_bits=6, vec_dot=T.Q8_K),
    _record(T.Q4_K, "d:2 m:2 scales:12 qs:128", 32, 4, has_mins=True, scale_bits=6, vec_dot=T.Q8_K, layout="nib",
            ggml_layout="k"),
    _record(T.Q5_K, "d:2 m:2 scales:12 qh:32 qs:128", 32, 5, has_mins=True, scale_bits=6, vec_dot=T.Q8_K,
            layout="nib"),
    _record(T.Q6_K, "qs:128 qh:64 scales:16 d:2", 16, 6, zero=32, scale_bits=8, vec_dot=T.Q8_K, layout="i8",
            ggml_layout="k"),
    _record(T.Q8_K, "d:4 qs:256 bsums:32", 256, 8),                   # activations: d float32, bsums int16 per 16
)}

# every type id up to the largest, as a tuple the compiled kernels index (ids ffnlab has no row for:
# NONE): each record's numbers only. A string in a global numba freezes keeps LLVM from folding the
# record into constants: the dequantizers' inner loops then ran scalar, 4x slower (Q4_0, one core).
NONE = QType(-1, "", 0, 0, "", 0, 0, 0, False, 0, -1, "", "", -1, -1, -1, 0, -1)
Block = NamedTuple("Block", [(f, t) for f, t in QType.__annotations__.items() if t in (int, bool)])
QT = tuple(Block(*(getattr(TYPES.get(i, NONE), f) for f in Block._fields)) for i in range(max(TYPES) + 1))

# the types only activations take (vec_dot types), and the weight types with compiled kernels
# (quant/kernels.py; other weight types are dequantized at load)
ACTIVATION_TYPES = (Q8_1, Q8_K)
KERNEL_TYPES = tuple(T(t) for t in TYPES if t not in ACTIVATION_TYPES)
# d (and m) are the block's own halves (a 32-weight type), not products of a half and an integer scale
HALF_SCALES = tuple(int(t) for t in KERNEL_TYPES if TYPES[t].block_weights == 32)


def qtype(t) -> QType:
    """The record of a ggml type (an id, a GGMLQuantizationType or its name)."""
    return TYPES[int(T[t.upper()] if isinstance(t, str) else t)]
