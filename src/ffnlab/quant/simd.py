"""Vector registers for numba: values of their own numba types, and the few x86 instructions the
quantized products are made of, as numba intrinsics (numba.extending.intrinsic).

numba compiles Python loops over small integers by widening them to 64 bits, so it never emits
the byte multiplies ggml's quants.c is built on, and it keeps few vectors in registers. Here a
vector is a value like any local, and each intrinsic writes the LLVM IR of one step. One
template, vectors(L), makes them for L 32-bit lanes:

    Y = vectors(8)    256-bit registers (AVX2): the float kernels' 8 lanes
    Z = vectors(16)   512-bit registers (AVX-512): the GEMM's tile (quant/gemm.py), 16 rows' codes
    V                 ggml mode's byte products (quant/ggml_int8.py, ggml_int8_k.py): ROWS rows,
                      one per lane: 16 on a CPU with AVX-512 F, BW and VL, else 8

  vf  <L x float>   L float32
  vb  <4L x i8>     4L bytes (a row's 4 codes of one lane), or L int32 lanes, as an op says

    dot_u8(a, b)   vpmaddubsw(a, b) then vpmaddwd(., 1): L exact int32 sums of 4 products u8 a x
                   s8 b (ggml's mul_sum_us8_pairs_float less the float conversion). A pair of
                   products saturates int16 only past 32767; the codes the kernels pass keep
                   below (a <= 128 and |b| <= 127: 2 x 128 x 127 = 32512). With AVX-512 VNNI
                   (VNNI) one vpdpbusd gives the same sums, as ggml's build there does.

ggml's vec_dot keeps one row's 8 lanes in a 256-bit register; V turns that sideways, lane j of
ROWS rows side by side, so each instruction acts on each row alone and a row's integers and
float steps are ggml's lanes' whatever ROWS is. ROWS depends on the CPU alone (not on
FFNLAB_NO_AVX512): the kernels' compiled code is cached per CPU and reads ROWS as a constant.
The float ops are one IEEE operation each (fma: one rounding), as ggml's _mm256_* steps.

An intrinsic takes an array and a flat element index for its loads and stores (the array must be
C-contiguous: the index is counted from its first element). They compile only on a host with
AVX2 and FMA: HAS_AVX2 says so, decided once at import (FFNLAB_NO_AVX2=1: as if there were none).
HAS_AVX512 says the CPU has 512-bit registers (AVX-512F; on a CPU without, LLVM would split each
Z vector into two 256-bit halves: correct, not faster); FFNLAB_NO_AVX512=1 keeps the 256-bit
float kernels (for comparisons and tests).
"""
import os
import sys
from types import ModuleType

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


_F = binding.get_host_cpu_features()
HAS_AVX2 = _host_has_avx2()
HAS_AVX512 = HAS_AVX2 and bool(_F.get("avx512f")) and os.environ.get("FFNLAB_NO_AVX512", "") in ("", "0")
# AVX-512 VNNI with VL (vpdpbusd on 256- and 512-bit registers), and the byte and word multiplies on
# 512-bit ones: read inside codegen, so they depend on the CPU alone
VNNI = HAS_AVX2 and bool(_F.get("avx512vnni")) and bool(_F.get("avx512vl"))
WIDE = HAS_AVX2 and all(_F.get(k) for k in ("avx512f", "avx512bw", "avx512vl"))
ROWS = 16 if WIDE else 8                       # rows per register of ggml mode's byte products
I32 = ir.IntType(32)


def _llvm(kind, lanes):
    return ir.VectorType(ir.FloatType(), lanes) if kind == "f" else ir.VectorType(ir.IntType(8), 4 * lanes)


class Vector(types.Type):
    """a vector register of `lanes` 32-bit lanes: kind "f" float32, "b" bytes (or int32 lanes)"""
    def __init__(self, kind, lanes):
        self.kind, self.lanes = kind, lanes
        super().__init__(name=f"v{kind}{lanes}")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _llvm(fe_type.kind, fe_type.lanes))


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
        zero = ir.Constant(_llvm("f", 16), [0.0] * 16)
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
    return types.UniTuple(Z.vf, 16)(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9), codegen


# numba reads an intrinsic's arguments off its typer's signature: one of fixed arity per count
_TYPERS = (lambda f: lambda typingctx: f(), lambda f: lambda typingctx, a: f(a),
           lambda f: lambda typingctx, a, b: f(a, b), lambda f: lambda typingctx, a, b, c: f(a, b, c))


# ---- the template -----------------------------------------------------------------------------

def vectors(L) -> ModuleType:
    """The intrinsics of L 32-bit lanes (8 or 16), as a module compiled code reads (Y.fma, Z.load).
    Each names the instruction it stands for; integer ops are exact, float ops one rounding."""
    vf, vb = Vector("f", L), Vector("b", L)
    F, B = _llvm("f", L), _llvm("b", L)
    I16V, I32V = ir.VectorType(ir.IntType(16), 2 * L), ir.VectorType(I32, L)
    wide = L == 16
    pmaddubsw = "llvm.x86.avx512.pmaddubs.w.512" if wide else "llvm.x86.avx2.pmadd.ub.sw"
    pmaddwd = "llvm.x86.avx512.pmaddw.d.512" if wide else "llvm.x86.avx2.pmadd.wd"
    ops = ModuleType(f"{__name__}.vectors{L}", vectors.__doc__)
    ops.vf, ops.vb, ops.L = vf, vb, L
    # by its name in sys.modules pickle refers to the module instead of copying it: a kernel made for
    # one width (a closure over it, quant/packed.py) then has the same key in numba's disk cache in
    # every process, and is read back from there
    sys.modules[ops.__name__] = ops

    def op(result, doc, arrays=0, ctx=False):
        """an intrinsic giving a `result`, its IR written by the decorated function of (builder,
        *args), or of (context, builder, sig, *args) where it reads arrays (the first `arrays`
        arguments, C-contiguous) or casts a scalar (ctx)"""
        def make(gen):
            def typed(*args):
                for a in args[:arrays]:
                    _contiguous(a)

                def codegen(context, builder, sig, llargs):
                    return gen(context, builder, sig, *llargs) if arrays or ctx else gen(builder, *llargs)
                return result(*args), codegen
            n_args = gen.__code__.co_argcount - len(gen.__defaults__ or ()) - (3 if arrays or ctx else 1)
            typer = _TYPERS[n_args](typed)
            typer.__name__, typer.__doc__ = gen.__name__, doc
            setattr(ops, gen.__name__, intrinsic(typer))
        return make

    i32 = lambda builder, v: builder.bitcast(v, I32V)            # noqa: E731 (bytes as int32 lanes)
    b8 = lambda builder, v: builder.bitcast(v, B)                 # noqa: E731
    const = lambda ty, v: ir.Constant(ty, [v] * ty.count)          # noqa: E731

    # loads and stores
    @op(vf, f"{L} float32 from ary.flat[index] (unaligned)", arrays=1)
    def load(context, builder, sig, ary, index):
        return builder.load(_pointer(context, builder, sig.args[0], ary, index, F), align=1)

    @op(types.none, f"ary.flat[index : index + {L}] = v (float32)", arrays=1)
    def store(context, builder, sig, ary, index, v):
        builder.store(v, _pointer(context, builder, sig.args[0], ary, index, F), align=1)
        return context.get_dummy_value()

    @op(vf, "the float32 at ary.flat[index] in each lane (vbroadcastss from memory)", arrays=1)
    def splat_load(context, builder, sig, ary, index):
        v = builder.load(_pointer(context, builder, sig.args[0], ary, index, ir.FloatType()), align=4)
        return _splat(builder, v, F)

    @op(vf, f"{L} scales from ary.flat[index]: float32 as they are, or half bits in uint16 widened "
            "(vcvtph2ps: exact)", arrays=1)
    def scales(context, builder, sig, ary, index):
        if sig.args[0].dtype == types.float32:
            return builder.load(_pointer(context, builder, sig.args[0], ary, index, F), align=1)
        if sig.args[0].dtype != types.uint16:
            raise numba.core.errors.TypingError(f"float32 or uint16 (half) scales, not {sig.args[0]}")
        bits = builder.load(_pointer(context, builder, sig.args[0], ary, index, ir.VectorType(ir.IntType(16), L)),
                            align=1)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), L)), F)

    @op(vb, f"{4 * L} bytes from ary.flat[index] (unaligned)", arrays=1)
    def load_b(context, builder, sig, ary, index):
        return builder.load(_pointer(context, builder, sig.args[0], ary, index, B), align=1)

    @op(vb, "the 4 bytes at ary.flat[index] (one lane's 4 activation codes, or one int32) in each "
            "32-bit lane (vpbroadcastd)", arrays=1)
    def splat4(context, builder, sig, ary, index):
        word = builder.load(_pointer(context, builder, sig.args[0], ary, index, I32), align=1)
        return b8(builder, _splat(builder, word, I32V))

    @op(vb, f"{L} bytes at ary.flat[index] -> {L} int32 (sign-extended from int8, zero-extended from uint8)",
        arrays=1)
    def widen(context, builder, sig, ary, index):
        v = builder.load(_pointer(context, builder, sig.args[0], ary, index, ir.VectorType(ir.IntType(8), L)),
                         align=1)
        return b8(builder, (builder.sext if sig.args[0].dtype.signed else builder.zext)(v, I32V))

    # constants and conversions
    @op(vf, "0.0 in each lane")
    def zeros(builder):
        return const(F, 0.0)

    @op(vb, "0 in each byte")
    def zeros_b(builder):
        return const(B, 0)

    @op(vf, "a float32 in each lane", ctx=True)
    def splat(context, builder, sig, value):
        return _splat(builder, context.cast(builder, value, sig.args[0], types.float32), F)

    @op(vb, "an int32 in each lane", ctx=True)
    def splat_i(context, builder, sig, value):
        return b8(builder, _splat(builder, context.cast(builder, value, sig.args[0], types.int32), I32V))

    @op(vf, "int32 lanes -> float32 (vcvtdq2ps; exact below 2^24)")
    def to_f(builder, a):
        return builder.sitofp(i32(builder, a), F)

    # integer lanes
    @op(vb, "each byte & 0x0F (ggml's bytes_from_nibbles_32, first half)")
    def low4(builder, a):
        return builder.and_(a, const(B, 15))

    @op(vb, "each byte >> 4 (bytes_from_nibbles_32's second half)")
    def high4(builder, a):
        return builder.lshr(a, const(B, 4))

    @op(vb, "each int32 lane & 15")
    def low4_i32(builder, a):
        return b8(builder, builder.and_(i32(builder, a), const(I32V, 15)))

    @op(vb, "each int32 lane >> 4 (lanes holding one byte: its high nibble)")
    def high4_i32(builder, a):
        return b8(builder, builder.lshr(i32(builder, a), const(I32V, 4)))

    @op(vb, "a & b, bit for bit")
    def and_b(builder, a, b):
        return builder.and_(a, b)

    @op(vb, "each int32 lane & value", ctx=True)
    def and_splat(context, builder, sig, a, value):
        v = _splat(builder, context.cast(builder, value, sig.args[1], types.int32), I32V)
        return b8(builder, builder.and_(i32(builder, a), v))

    for name, how, doc in (("add_i", "add", "a + b"), ("sub_i", "sub", "a - b"), ("mul_i", "mul", "a * b (vpmulld)")):
        def gen(builder, a, b, how=how):
            return b8(builder, getattr(builder, how)(i32(builder, a), i32(builder, b)))
        gen.__name__ = name
        op(vb, f"{doc} in int32 lanes")(gen)

    @op(vb, "L int32 (each within int16) -> each as two int16 copies, (v & 0xFFFF) | (v << 16): a "
            "scale for madd")
    def pairs16(builder, a):
        v = i32(builder, a)
        return b8(builder, builder.or_(builder.and_(v, const(I32V, 0xFFFF)), builder.shl(v, const(I32V, 16))))

    def dot(builder, c, a, b):
        """c + the int32 sums of 4 products u8 a x s8 b per 32-bit lane (c None: 0)"""
        if VNNI:             # vpdpbusd: the 4-product sums added to c in one instruction, no int16 step
            return _call(builder, f"llvm.x86.avx512.vpdpbusd.{32 * L}", I32V,
                         [const(I32V, 0) if c is None else i32(builder, c), i32(builder, a), i32(builder, b)])
        pairs = _call(builder, pmaddubsw, I16V, [a, b])                      # a0 b0 + a1 b1 per int16
        lanes = _call(builder, pmaddwd, I32V, [pairs, const(I16V, 1)])
        return lanes if c is None else builder.add(i32(builder, c), lanes)

    @op(vb, "u8 a, s8 b -> L int32 sums of 4 products (vpdpbusd with VNNI, else vpmaddubsw, vpmaddwd)")
    def dot_u8(builder, a, b):
        return b8(builder, dot(builder, None, a, b))

    @op(vb, "c + dot_u8(a, b) in int32 lanes (one vpdpbusd with VNNI)")
    def dot_u8_from(builder, c, a, b):
        return b8(builder, dot(builder, c, a, b))

    @op(vb, """s8 w, s8 x, c = -128 x (each lane's sum of its 4 x) -> L int32 sums of 4 products w x.
    ggml's mul_sum_i8_pairs_float forms them as |w| x sign(x, w) (vpabsb, vpsignb; exact while
    x != -128: activation codes lie within +-127), and so does this without VNNI (c unused).
    With VNNI: one vpdpbusd of the unsigned w + 128 (w ^ 0x80) onto c, since the sum of
    (w + 128) x less 128 sum x is the same integer (vpdpbusd adds in int32 without saturating;
    vpmaddubsw's int16 pairs of 255 x 127 would saturate, hence not without VNNI)""")
    def dot_s8_biased(builder, c, w, x):
        if VNNI:
            return b8(builder, dot(builder, c, builder.xor(w, const(B, -128)), x))
        magnitude = _call(builder, f"llvm.abs.v{4 * L}i8", B, [w, ir.Constant(ir.IntType(1), 0)])
        if wide:                                # no vpsignb on 512-bit registers: a masked negate
            signed = builder.select(builder.icmp_signed("<", w, const(B, 0)), builder.sub(const(B, 0), x), x)
        else:
            signed = _call(builder, "llvm.x86.avx2.psign.b", B, [x, w])
        return b8(builder, dot(builder, None, magnitude, signed))

    @op(vb, "u8 a x s8 b -> 2L int16 sums of adjacent products (vpmaddubsw)")
    def maddubs(builder, a, b):
        return b8(builder, _call(builder, pmaddubsw, I16V, [a, b]))

    @op(vb, "int16 a x int16 b -> L int32 sums of adjacent products (vpmaddwd): with b a scale in both "
            "halves of each 32-bit lane, scale x (a pair's sum)")
    def madd(builder, a, b):
        return b8(builder, _call(builder, pmaddwd, I32V, [builder.bitcast(a, I16V), builder.bitcast(b, I16V)]))

    # float lanes
    @op(vf, "a * b + c, one rounding (vfmadd: ggml's _mm256_fmadd_ps)")
    def fma(builder, a, b, c):
        return _call(builder, f"llvm.fma.v{L}f32", F, [a, b, c])

    @op(vf, "a * b")
    def mul(builder, a, b):
        return builder.fmul(a, b)

    @op(vf, "a + b")
    def add(builder, a, b):
        return builder.fadd(a, b)
    return ops


Y, Z = vectors(8), vectors(16)
V = Z if ROWS == 16 else Y                     # ggml mode's byte products: ROWS rows, one a lane


