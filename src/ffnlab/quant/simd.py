"""AVX2 integer products for numba: 256-bit vector values and the few x86 instructions ggml's
integer dot products are made of, as numba intrinsics (numba.extending.intrinsic).

numba compiles Python loops over small integers by widening them to 64 bits, so it never emits
the byte multiplies ggml's quants.c is built on. Here the vectors are values of their own numba
types, kept in registers like any local, and each intrinsic writes the LLVM IR of one step:

    m256i   <32 x i8>  (the bytes of a __m256i; read as 16 x i16 or 8 x i32 where an op says so)
    m256    <8 x float>
    m512    <16 x float>  (AVX-512: the float GEMM's tile, quant/gemm.py; the *_z intrinsics)
    m512i   <16 x i32>    (AVX-512: 16 rows' codes, widened, in quant/packed.py's dequantization)

    lanes_u8(a, b)   vpmaddubsw(a, b) then vpmaddwd(., 1): 8 exact int32 sums of 4 products
                     u8 a[4l..4l+3] x s8 b[4l..4l+3] (ggml's mul_sum_us8_pairs_float, less the
                     float conversion). A pair of products saturates int16 only past 32767;
                     here a <= 128 and |b| <= 127 (2 x 128 x 127 = 32512), so it never does.
                     With AVX-512 VNNI (HAS_VNNI) one vpdpbusd gives the same sums (as ggml's
                     build there: quants.c's mul_sum_us8_pairs_float under __AVX512VNNI__).
    lanes_s8(w, x)   the same for signed w: |w| x sign(x, w) (vpabsb, vpsignb), as ggml's
                     mul_sum_i8_pairs_float. sign(x, w) negates x where w < 0: exact while
                     x != -128 (activation codes are within +-127: ggml_quants.py).

An intrinsic takes an array and a flat element index for its loads and stores (the array must be
C-contiguous: the index is counted from its first element). They compile only on a host with
AVX2 and FMA: HAS_AVX2 says so, decided once at import (FFNLAB_NO_AVX2=1: as if there were none).
The *_z intrinsics use 512-bit registers; HAS_AVX512 says the CPU has them (AVX-512F; on a CPU
without, LLVM would split each into two 256-bit halves: correct, not faster). FFNLAB_NO_AVX512=1
keeps the 256-bit kernels (for comparisons and tests).
"""
import os

import numba
import numpy as np
from llvmlite import binding, ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model


def _host_has_avx2():
    """AVX2 and FMA on this CPU, and numba compiling for this CPU (NUMBA_CPU_NAME unset: a
    generic target could not select the instructions); FFNLAB_NO_AVX2=1 says no (the float
    kernels, as on a CPU without AVX2: for comparisons and tests)"""
    if os.environ.get("FFNLAB_NO_AVX2", "") not in ("", "0"):
        return False
    features = binding.get_host_cpu_features()
    return bool(features.get("avx2") and features.get("fma")) and not numba.config.CPU_NAME


HAS_AVX2 = _host_has_avx2()
HAS_AVX512 = HAS_AVX2 and bool(binding.get_host_cpu_features().get("avx512f")) \
    and os.environ.get("FFNLAB_NO_AVX512", "") in ("", "0")

# AVX-512 VNNI with VL: vpdpbusd on 256-bit registers. Read inside an intrinsic's codegen, so it
# must depend on the CPU alone (numba's cache is keyed by the CPU, not by FFNLAB_NO_AVX512)
HAS_VNNI = HAS_AVX2 and bool(binding.get_host_cpu_features().get("avx512vnni")) \
    and bool(binding.get_host_cpu_features().get("avx512vl"))

I8x32 = ir.VectorType(ir.IntType(8), 32)
I16x16 = ir.VectorType(ir.IntType(16), 16)
I32x8 = ir.VectorType(ir.IntType(32), 8)
F32x8 = ir.VectorType(ir.FloatType(), 8)
F32x16 = ir.VectorType(ir.FloatType(), 16)
I32 = ir.IntType(32)


class M256i(types.Type):
    def __init__(self):
        super().__init__(name="m256i")


class M256(types.Type):
    def __init__(self):
        super().__init__(name="m256")


class M512(types.Type):
    def __init__(self):
        super().__init__(name="m512")


class M512i(types.Type):
    def __init__(self):
        super().__init__(name="m512i")


m256i, m256, m512, m512i = M256i(), M256(), M512(), M512i()
I32x16 = ir.VectorType(ir.IntType(32), 16)


@register_model(M256i)
class _M256iModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, I8x32)


@register_model(M256)
class _M256Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, F32x8)


@register_model(M512)
class _M512Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, F32x16)


@register_model(M512i)
class _M512iModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, I32x16)


def _contiguous(ary):
    if not (isinstance(ary, types.Array) and ary.layout == "C"):
        raise numba.core.errors.TypingError(f"a C-contiguous array, not {ary}")


def _pointer(context, builder, aryty, ary, index, llty):
    """&ary.flat[index] as a pointer to llty"""
    data = context.make_array(aryty)(context, builder, ary).data
    return builder.bitcast(builder.gep(data, [index]), llty.as_pointer())


def _splat(builder, value, vecty):
    v = builder.insert_element(ir.Constant(vecty, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, vecty.count), [0] * vecty.count))


def _call(builder, name, ret, args):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


LINE = 64                       # bytes in a cache line


def empty_aligned(shape, dtype=np.float32) -> np.ndarray:
    """np.empty whose data start on a cache line (64 bytes), so that a 512-bit load or store of a
    row's 16 floats never spans two lines. np.empty's data start where malloc put them (16-byte
    steps): on a 2-vCPU Intel Xeon (family 6 model 207) a product whose scratch buffer and output were both 16 bytes off a
    line ran 9-30% slower than with both on one (bench/RESULTS.md, 2026-12-01, commit 2800b10), and which of
    the two a process got was chance."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(n + LINE, np.uint8)
    off = (-raw.ctypes.data) % LINE
    return raw[off:off + n].view(dtype).reshape(shape)


# ---- loads and stores -------------------------------------------------------------------------

def _load(name, llty, result, doc):
    """an intrinsic name(ary, index): the vector llty at ary.flat[index] (unaligned) -> result"""
    def typer(typingctx, ary, index):
        _contiguous(ary)

        def codegen(context, builder, sig, args):
            return builder.load(_pointer(context, builder, sig.args[0], *args, llty), align=1)
        return result(ary, index), codegen
    typer.__name__, typer.__doc__ = name, doc
    return intrinsic(typer)


load_i = _load("load_i", I8x32, m256i, "32 bytes from ary.flat[index] -> m256i")
load_f = _load("load_f", F32x8, m256, "8 float32 from ary.flat[index] -> m256")
load_z = _load("load_z", F32x16, m512, "16 float32 from ary.flat[index] -> m512")


def _scales(lanes, vecty, result, doc):
    """An intrinsic loading `lanes` scales from ary.flat[index] as float32: a float32 array as
    it is, a uint16 array as IEEE half-precision bits, widened (vcvtph2ps: exact)"""
    @intrinsic
    def load(typingctx, ary, index):
        _contiguous(ary)
        half = ary.dtype == types.uint16
        if not half and ary.dtype != types.float32:
            raise numba.core.errors.TypingError(f"float32 or uint16 (half) scales, not {ary}")

        def codegen(context, builder, sig, args):
            if not half:
                return builder.load(_pointer(context, builder, sig.args[0], *args, vecty), align=1)
            bits = builder.load(_pointer(context, builder, sig.args[0], *args, ir.VectorType(ir.IntType(16), lanes)),
                                align=1)
            return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), lanes)), vecty)
        return result(ary, index), codegen
    load.__doc__ = doc
    return load


load_scales = _scales(8, F32x8, m256, "8 scales from ary.flat[index] (float32, or half bits in uint16) -> m256")
load_scales_z = _scales(16, F32x16, m512, "16 scales from ary.flat[index] (float32, or half bits in uint16) -> m512")


@intrinsic
def scale_at(typingctx, ary, index):
    """the scale at ary.flat[index] as a float32 (a float32 array, or half bits in a uint16 one)"""
    _contiguous(ary)
    half = ary.dtype == types.uint16

    def codegen(context, builder, sig, args):
        if not half:
            return builder.load(_pointer(context, builder, sig.args[0], *args, ir.FloatType()))
        bits = builder.load(_pointer(context, builder, sig.args[0], *args, ir.IntType(16)))
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())
    return types.float32(ary, index), codegen


@intrinsic
def broadcast4(typingctx, ary, index):
    """the 4 bytes at ary.flat[index] in each of the 8 32-bit lanes (vpbroadcastd): one lane's
    4 activation codes (an int8 array), against 8 rows' 4 weight codes; or one int32"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        word = builder.load(_pointer(context, builder, sig.args[0], *args, I32), align=1)
        return builder.bitcast(_splat(builder, word, I32x8), I8x32)
    return m256i(ary, index), codegen


@intrinsic
def store_f(typingctx, ary, index, v):
    """ary.flat[index : index + 8] = v (float32)"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], F32x8), align=1)
        return context.get_dummy_value()
    return types.none(ary, index, v), codegen


@intrinsic
def store_z(typingctx, ary, index, v):
    """ary.flat[index : index + 16] = v (float32)"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], F32x16), align=1)
        return context.get_dummy_value()
    return types.none(ary, index, v), codegen


@intrinsic
def broadcast_f(typingctx, value):
    """a float32 in each lane"""
    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return _splat(builder, v, F32x8)
    return m256(value), codegen


@intrinsic
def broadcast_load_f(typingctx, ary, index):
    """the float32 at ary.flat[index] in each lane (vbroadcastss from memory)"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        v = builder.load(_pointer(context, builder, sig.args[0], *args, ir.FloatType()), align=4)
        return _splat(builder, v, F32x8)
    return m256(ary, index), codegen


@intrinsic
def broadcast_load_z(typingctx, ary, index):
    """the float32 at ary.flat[index] in each of 16 lanes (an FMA's {1to16} memory operand)"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        v = builder.load(_pointer(context, builder, sig.args[0], *args, ir.FloatType()), align=4)
        return _splat(builder, v, F32x16)
    return m512(ary, index), codegen


@intrinsic
def zeros_z(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(F32x16, [0.0] * 16)
    return m512(), codegen


@intrinsic
def zeros_f(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(F32x8, [0.0] * 8)
    return m256(), codegen


@intrinsic
def prefetch(typingctx, ary, index):
    """a hint: start loading the cache line of ary.flat[index] into L1 (llvm.prefetch, read, high
    locality). Nothing is read or faulted: an index past the array's end is harmless (x86's
    PREFETCHT0 ignores the address's validity; LLVM drops the hint where a CPU has none). The
    matrix-vector kernels prefetch their codes AHEAD bytes before reading them (quant/packed.py)."""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        i32 = ir.IntType(32)
        p = _pointer(context, builder, sig.args[0], *args, ir.IntType(8))
        _call(builder, "llvm.prefetch.p0i8", ir.VoidType(), [p, ir.Constant(i32, 0), ir.Constant(i32, 3),
                                                            ir.Constant(i32, 1)])
        return context.get_dummy_value()
    return types.none(ary, index), codegen


@intrinsic
def fetch_add(typingctx, ary, index, value):
    """atomically ary.flat[index] += value (an int64 array) -> the value before: a work counter
    that threads draw items from (LLVM's atomicrmw add, sequentially consistent)"""
    _contiguous(ary)
    if ary.dtype != types.int64:
        raise numba.core.errors.TypingError(f"an int64 array, not {ary}")

    def codegen(context, builder, sig, args):
        ptr = _pointer(context, builder, sig.args[0], args[0], args[1], ir.IntType(64))
        v = context.cast(builder, args[2], sig.args[2], types.int64)
        return builder.atomic_rmw("add", ptr, v, "seq_cst")
    return types.int64(ary, index, value), codegen


@intrinsic
def transpose10_z(typingctx, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9):
    """ten 16-float vectors (rows t = 0..9) -> sixteen: out[k] lane t = a_t lane k for t < 10,
    lanes 10..15 zero (quant/gemm.py's pack_tokens: ten tokens' x for 16 positions, turned to
    16 positions' ten tokens). A 16 x 16 transpose in four butterfly stages of shuffles (rows
    10..15 zero): at stage s, rows i and i + s (i & s == 0) swap their lanes l & s != 0 / == 0."""
    def codegen(context, builder, sig, args):
        zero = ir.Constant(F32x16, [0.0] * 16)
        a = list(args) + [zero] * 6
        for s in (8, 4, 2, 1):
            lo = ir.Constant(ir.VectorType(I32, 16), [l if l & s == 0 else 16 + l - s for l in range(16)])
            hi = ir.Constant(ir.VectorType(I32, 16), [l + s if l & s == 0 else 16 + l for l in range(16)])
            b = list(a)
            for i in range(16):
                if i & s == 0:
                    b[i] = builder.shuffle_vector(a[i], a[i + s], lo)
                    b[i + s] = builder.shuffle_vector(a[i], a[i + s], hi)
            a = b
        return context.make_tuple(builder, sig.return_type, a)
    return types.UniTuple(m512, 16)(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9), codegen


# ---- integer lanes ----------------------------------------------------------------------------
# (These one-operation intrinsics are written out one by one: made by a factory like _load's,
# the nibble and broadcast-load ones left a Gemma 3 prefill 6% slower in an A/B of 80 alternating
# pairs, the same logits; the cause was not found. Later A/Bs (2026-12-01) on that Xeon
# put two identical copies of the code 0.95-1.07x apart (bench/RESULTS.md), so the factories may
# well cost nothing; they were not tried again.)

@intrinsic
def low_nibbles(typingctx, a):
    """each byte & 0x0F (ggml's bytes_from_nibbles_32, first half)"""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(I8x32, [15] * 32))
    return m256i(a), codegen


@intrinsic
def high_nibbles(typingctx, a):
    """each byte >> 4 (vpsrlw then vpand, as bytes_from_nibbles_32's second half)"""
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], ir.Constant(I8x32, [4] * 32))
    return m256i(a), codegen


def _lanes(builder, a, b):
    if HAS_VNNI:                 # vpdpbusd: the same 4-product int32 sums in one instruction, no int16 step
        a32, b32 = builder.bitcast(a, I32x8), builder.bitcast(b, I32x8)
        return _call(builder, "llvm.x86.avx512.vpdpbusd.256", I32x8, [ir.Constant(I32x8, [0] * 8), a32, b32])
    pairs = _call(builder, "llvm.x86.avx2.pmadd.ub.sw", I16x16, [a, b])        # 16 x (a0 b0 + a1 b1)
    return _call(builder, "llvm.x86.avx2.pmadd.wd", I32x8, [pairs, ir.Constant(I16x16, [1] * 16)])


@intrinsic
def lanes_u8(typingctx, a, b):
    """u8 a, s8 b -> 8 int32 sums of 4 products (m256i)"""
    def codegen(context, builder, sig, args):
        return builder.bitcast(_lanes(builder, args[0], args[1]), I8x32)
    return m256i(a, b), codegen


@intrinsic
def lanes_s8(typingctx, w, x):
    """s8 w, s8 x -> 8 int32 sums of 4 products w x, as |w| x sign(x, w) (m256i)"""
    def codegen(context, builder, sig, args):
        w, x = args
        magnitude = _call(builder, "llvm.abs.v32i8", I8x32, [w, ir.Constant(ir.IntType(1), 0)])
        signed = _call(builder, "llvm.x86.avx2.psign.b", I8x32, [x, w])
        return builder.bitcast(_lanes(builder, magnitude, signed), I8x32)
    return m256i(w, x), codegen


@intrinsic
def maddubs(typingctx, a, b):
    """u8 a x s8 b -> 16 int16 sums of adjacent products (vpmaddubsw)"""
    def codegen(context, builder, sig, args):
        return builder.bitcast(_call(builder, "llvm.x86.avx2.pmadd.ub.sw", I16x16, list(args)), I8x32)
    return m256i(a, b), codegen


@intrinsic
def madd(typingctx, a, b):
    """int16 a x int16 b -> 8 int32 sums of adjacent products (vpmaddwd): with b a scale in both
    halves of each 32-bit lane, scale x (a pair's sum)"""
    def codegen(context, builder, sig, args):
        a, b = (builder.bitcast(v, I16x16) for v in args)
        return builder.bitcast(_call(builder, "llvm.x86.avx2.pmadd.wd", I32x8, [a, b]), I8x32)
    return m256i(a, b), codegen


@intrinsic
def widen8(typingctx, ary, index):
    """8 bytes at ary.flat[index] -> 8 int32 (sign-extended from int8, zero-extended from uint8)"""
    _contiguous(ary)
    signed = ary.dtype.signed

    def codegen(context, builder, sig, args):
        v = builder.load(_pointer(context, builder, sig.args[0], *args, ir.VectorType(ir.IntType(8), 8)), align=1)
        return builder.bitcast((builder.sext if signed else builder.zext)(v, I32x8), I8x32)
    return m256i(ary, index), codegen


@intrinsic
def pairs16(typingctx, a):
    """8 int32 (each within int16) -> each as two int16 copies, (v & 0xFFFF) | (v << 16): a scale
    for madd"""
    def codegen(context, builder, sig, args):
        v = builder.bitcast(args[0], I32x8)
        low = builder.and_(v, ir.Constant(I32x8, [0xFFFF] * 8))
        return builder.bitcast(builder.or_(low, builder.shl(v, ir.Constant(I32x8, [16] * 8))), I8x32)
    return m256i(a), codegen


@intrinsic
def add_i32(typingctx, a, b):
    """a + b in 8 int32 lanes"""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.add(builder.bitcast(args[0], I32x8), builder.bitcast(args[1], I32x8)), I8x32)
    return m256i(a, b), codegen


@intrinsic
def mul_i32(typingctx, a, b):
    """a * b in 8 int32 lanes (vpmulld)"""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.mul(builder.bitcast(args[0], I32x8), builder.bitcast(args[1], I32x8)), I8x32)
    return m256i(a, b), codegen


@intrinsic
def and_i(typingctx, a, b):
    """a & b, bit for bit"""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], args[1])
    return m256i(a, b), codegen


@intrinsic
def splat_i32(typingctx, value):
    """an int32 in each of the 8 lanes"""
    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.int32)
        return builder.bitcast(_splat(builder, v, I32x8), I8x32)
    return m256i(value), codegen


@intrinsic
def zeros_i(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(I8x32, [0] * 32)
    return m256i(), codegen


@intrinsic
def sub_i32(typingctx, a, b):
    """a - b in 8 int32 lanes"""
    def codegen(context, builder, sig, args):
        d = builder.sub(builder.bitcast(args[0], I32x8), builder.bitcast(args[1], I32x8))
        return builder.bitcast(d, I8x32)
    return m256i(a, b), codegen


@intrinsic
def to_float(typingctx, a):
    """8 int32 lanes -> float32 (vcvtdq2ps; exact below 2^24)"""
    def codegen(context, builder, sig, args):
        return builder.sitofp(builder.bitcast(args[0], I32x8), F32x8)
    return m256(a), codegen


# ---- float lanes ------------------------------------------------------------------------------

@intrinsic
def fma(typingctx, a, b, c):
    """a * b + c, one rounding (vfmadd: ggml's _mm256_fmadd_ps)"""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v8f32", F32x8, list(args))
    return m256(a, b, c), codegen


@intrinsic
def fma_z(typingctx, a, b, c):
    """a * b + c in 16 lanes, one rounding (vfmadd on zmm registers)"""
    def codegen(context, builder, sig, args):
        return _call(builder, "llvm.fma.v16f32", F32x16, list(args))
    return m512(a, b, c), codegen


@intrinsic
def widen16_z(typingctx, ary, index):
    """16 bytes at ary.flat[index] -> 16 int32 (sign-extended from int8, zero-extended from uint8)"""
    _contiguous(ary)
    signed = ary.dtype.signed

    def codegen(context, builder, sig, args):
        v = builder.load(_pointer(context, builder, sig.args[0], *args, ir.VectorType(ir.IntType(8), 16)), align=1)
        return (builder.sext if signed else builder.zext)(v, I32x16)
    return m512i(ary, index), codegen


@intrinsic
def low_nibbles_z(typingctx, a):
    """each int32 lane & 15"""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(I32x16, [15] * 16))
    return m512i(a), codegen


@intrinsic
def high_nibbles_z(typingctx, a):
    """each int32 lane >> 4 (lanes holding one byte: its high nibble)"""
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], ir.Constant(I32x16, [4] * 16))
    return m512i(a), codegen


@intrinsic
def and_splat_z(typingctx, a, value):
    """each int32 lane & value"""
    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[1], sig.args[1], types.int32)
        return builder.and_(args[0], _splat(builder, v, I32x16))
    return m512i(a, value), codegen


@intrinsic
def to_float_z(typingctx, a):
    """16 int32 lanes -> float32 (exact below 2^24)"""
    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], F32x16)
    return m512(a), codegen


@intrinsic
def broadcast_z(typingctx, value):
    """a float32 in each of 16 lanes"""
    def codegen(context, builder, sig, args):
        v = context.cast(builder, args[0], sig.args[0], types.float32)
        return _splat(builder, v, F32x16)
    return m512(value), codegen


@intrinsic
def mul_z(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return m512(a, b), codegen


@intrinsic
def add_z(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return m512(a, b), codegen


@intrinsic
def mul(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return m256(a, b), codegen


@intrinsic
def add(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return m256(a, b), codegen
