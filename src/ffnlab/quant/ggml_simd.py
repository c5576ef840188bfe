"""The vectors of ggml mode's integer products (quant/ggml_int8.py, ggml_int8_k.py): ROWS rows'
int32 lanes or float32 accumulators in one register, as numba intrinsics (quant/simd.py says how
such intrinsics work; this file holds the width-generic ones those two kernels are written in).

ggml's vec_dot keeps one row's 8 lanes in a 256-bit register. ffnlab turns that sideways: lane j
of ROWS rows side by side in one register, so every instruction below acts on each row alone and
a row's integers and float steps are those of ggml's lanes whatever ROWS is. ROWS is the
register's width in 32-bit lanes:

  ROWS = 16  on a CPU with AVX-512 F, BW and VL (512-bit registers, byte and word multiplies)
  ROWS = 8   on any other CPU with AVX2 and FMA (256-bit registers)

    vb   ROWS x 4 bytes (a row's 4 codes of one lane), or ROWS int32 lanes, as an op says
    vf   ROWS float32

ROWS depends on the CPU alone (not on FFNLAB_NO_AVX512), since the kernels' compiled code is
cached per CPU and reads ROWS as a constant. The integer ops are exact: a lane's 4 products of
a code <= 255 (u8) and one within +-127 (s8) sum to within +-129540; the int16 pairs of the
vpmaddubsw form (no VNNI) stay within int16 for the codes the kernels pass (simd.py's lanes_u8).
The float ops are one IEEE operation each (fma: one rounding), as ggml's _mm256_* steps.
"""
from llvmlite import binding, ir
from numba import types
from numba.extending import intrinsic, models, register_model

from .simd import HAS_AVX2, _call, _contiguous, _pointer, _splat

_F = binding.get_host_cpu_features()
WIDE = HAS_AVX2 and all(_F.get(k) for k in ("avx512f", "avx512bw", "avx512vl"))
VNNI = HAS_AVX2 and bool(_F.get("avx512vnni")) and bool(_F.get("avx512vl"))
ROWS = 16 if WIDE else 8                       # rows per register: 32-bit lanes of a 512- or 256-bit one
BITS = 32 * ROWS

I8 = ir.VectorType(ir.IntType(8), 4 * ROWS)
I16 = ir.VectorType(ir.IntType(16), 2 * ROWS)
I32V = ir.VectorType(ir.IntType(32), ROWS)
F32V = ir.VectorType(ir.FloatType(), ROWS)
I32 = ir.IntType(32)
_PMADDUBSW = "llvm.x86.avx512.pmaddubs.w.512" if WIDE else "llvm.x86.avx2.pmadd.ub.sw"
_PMADDWD = "llvm.x86.avx512.pmaddw.d.512" if WIDE else "llvm.x86.avx2.pmadd.wd"
_VPDPBUSD = f"llvm.x86.avx512.vpdpbusd.{BITS}"


class VB(types.Type):
    def __init__(self):
        super().__init__(name=f"ggml_vb{ROWS}")


class VF(types.Type):
    def __init__(self):
        super().__init__(name=f"ggml_vf{ROWS}")


vb, vf = VB(), VF()


@register_model(VB)
class _VBModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, I8)


@register_model(VF)
class _VFModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, F32V)


def _i32(builder, v):
    return builder.bitcast(v, I32V)


def _b(builder, v):
    return builder.bitcast(v, I8)


# ---- loads and stores -------------------------------------------------------------------------

@intrinsic
def load_b(typingctx, ary, index):
    """4 * ROWS bytes from ary.flat[index] (unaligned) -> vb"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], *args, I8), align=1)
    return vb(ary, index), codegen


@intrinsic
def splat4(typingctx, ary, index):
    """the 4 bytes at ary.flat[index] (one lane's 4 activation codes, or one int32) in each 32-bit
    lane (vpbroadcastd)"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        word = builder.load(_pointer(context, builder, sig.args[0], *args, I32), align=1)
        return _b(builder, _splat(builder, word, I32V))
    return vb(ary, index), codegen


@intrinsic
def widen(typingctx, ary, index):
    """ROWS bytes at ary.flat[index] -> ROWS int32 (sign-extended from int8, zero-extended from uint8)"""
    _contiguous(ary)
    signed = ary.dtype.signed

    def codegen(context, builder, sig, args):
        v = builder.load(_pointer(context, builder, sig.args[0], *args, ir.VectorType(ir.IntType(8), ROWS)), align=1)
        return _b(builder, (builder.sext if signed else builder.zext)(v, I32V))
    return vb(ary, index), codegen


@intrinsic
def load_v(typingctx, ary, index):
    """ROWS float32 from ary.flat[index] -> vf"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        return builder.load(_pointer(context, builder, sig.args[0], *args, F32V), align=1)
    return vf(ary, index), codegen


@intrinsic
def store_v(typingctx, ary, index, v):
    """ary.flat[index : index + ROWS] = v (float32)"""
    _contiguous(ary)

    def codegen(context, builder, sig, args):
        builder.store(args[2], _pointer(context, builder, sig.args[0], args[0], args[1], F32V), align=1)
        return context.get_dummy_value()
    return types.none(ary, index, v), codegen


@intrinsic
def splat_f(typingctx, value):
    """a float32 in each lane"""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32), F32V)
    return vf(value), codegen


@intrinsic
def zeros_v(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(F32V, [0.0] * ROWS)
    return vf(), codegen


@intrinsic
def zeros_b(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(I8, [0] * (4 * ROWS))
    return vb(), codegen


# ---- integer lanes ----------------------------------------------------------------------------

@intrinsic
def low4(typingctx, a):
    """each byte & 0x0F (ggml's bytes_from_nibbles_32, first half)"""
    def codegen(context, builder, sig, args):
        return builder.and_(args[0], ir.Constant(I8, [15] * (4 * ROWS)))
    return vb(a), codegen


@intrinsic
def high4(typingctx, a):
    """each byte >> 4 (bytes_from_nibbles_32's second half)"""
    def codegen(context, builder, sig, args):
        return builder.lshr(args[0], ir.Constant(I8, [4] * (4 * ROWS)))
    return vb(a), codegen


def _dot(builder, c, a, b):
    """c + the int32 sums of 4 products u8 a x s8 b per 32-bit lane (c None: 0)"""
    if VNNI:                 # vpdpbusd: the 4-product sums added to c in one instruction, no int16 step
        zero = ir.Constant(I32V, [0] * ROWS)
        return _call(builder, _VPDPBUSD, I32V, [zero if c is None else _i32(builder, c), _i32(builder, a),
                                                _i32(builder, b)])
    pairs = _call(builder, _PMADDUBSW, I16, [a, b])                         # a0 b0 + a1 b1 per int16
    lanes = _call(builder, _PMADDWD, I32V, [pairs, ir.Constant(I16, [1] * (2 * ROWS))])
    return lanes if c is None else builder.add(_i32(builder, c), lanes)


@intrinsic
def dot_u8(typingctx, a, b):
    """u8 a, s8 b -> ROWS int32 sums of 4 products (ggml's mul_sum_us8_pairs_float less the
    float conversion: vpdpbusd with AVX-512 VNNI, else vpmaddubsw then vpmaddwd against ones)"""
    def codegen(context, builder, sig, args):
        return _b(builder, _dot(builder, None, *args))
    return vb(a, b), codegen


@intrinsic
def dot_u8_from(typingctx, c, a, b):
    """c + dot_u8(a, b) in int32 lanes (one vpdpbusd with VNNI)"""
    def codegen(context, builder, sig, args):
        return _b(builder, _dot(builder, *args))
    return vb(c, a, b), codegen


def _sign_split(builder, w, x):
    """(|w|, sign(x, w)): u8 and s8 bytes whose products are w x"""
    magnitude = _call(builder, f"llvm.abs.v{4 * ROWS}i8", I8, [w, ir.Constant(ir.IntType(1), 0)])
    if WIDE:                                    # no vpsignb on 512-bit registers: a masked negate
        negative = builder.icmp_signed("<", w, ir.Constant(I8, [0] * (4 * ROWS)))
        return magnitude, builder.select(negative, builder.sub(ir.Constant(I8, [0] * (4 * ROWS)), x), x)
    return magnitude, _call(builder, "llvm.x86.avx2.psign.b", I8, [x, w])


@intrinsic
def dot_s8_biased(typingctx, c, w, x):
    """s8 w, s8 x, c = -128 x (each lane's sum of its 4 x) -> ROWS int32 sums of 4 products w x.
    ggml's mul_sum_i8_pairs_float forms them as |w| x sign(x, w) (vpabsb, vpsignb; exact while
    x != -128: activation codes lie within +-127), and so does this without VNNI (c unused).
    With VNNI: one vpdpbusd of the unsigned w + 128 (w ^ 0x80) onto c, since the sum of
    (w + 128) x less 128 sum x is the same integer (vpdpbusd adds in int32 without saturating;
    vpmaddubsw's int16 pairs of 255 x 127 would saturate, hence not without VNNI)"""
    def codegen(context, builder, sig, args):
        c, w, x = args
        if VNNI:
            biased = builder.xor(w, ir.Constant(I8, [-128] * (4 * ROWS)))
            return _b(builder, _dot(builder, c, biased, x))
        return _b(builder, _dot(builder, None, *_sign_split(builder, w, x)))
    return vb(c, w, x), codegen


@intrinsic
def maddubs(typingctx, a, b):
    """u8 a x s8 b -> 2 * ROWS int16 sums of adjacent products (vpmaddubsw)"""
    def codegen(context, builder, sig, args):
        return _b(builder, _call(builder, _PMADDUBSW, I16, list(args)))
    return vb(a, b), codegen


@intrinsic
def madd(typingctx, a, b):
    """int16 a x int16 b -> ROWS int32 sums of adjacent products (vpmaddwd): with b a scale in
    both halves of each 32-bit lane, scale x (a pair's sum)"""
    def codegen(context, builder, sig, args):
        a, b = (builder.bitcast(v, I16) for v in args)
        return _b(builder, _call(builder, _PMADDWD, I32V, [a, b]))
    return vb(a, b), codegen


@intrinsic
def pairs16(typingctx, a):
    """ROWS int32 (each within int16) -> each as two int16 copies, (v & 0xFFFF) | (v << 16): a
    scale for madd"""
    def codegen(context, builder, sig, args):
        v = _i32(builder, args[0])
        low = builder.and_(v, ir.Constant(I32V, [0xFFFF] * ROWS))
        return _b(builder, builder.or_(low, builder.shl(v, ir.Constant(I32V, [16] * ROWS))))
    return vb(a), codegen


def _int_op(name, op, doc):
    def typer(typingctx, a, b):
        def codegen(context, builder, sig, args):
            return _b(builder, getattr(builder, op)(_i32(builder, args[0]), _i32(builder, args[1])))
        return vb(a, b), codegen
    typer.__name__, typer.__doc__ = name, doc
    return intrinsic(typer)


add_i = _int_op("add_i", "add", "a + b in int32 lanes")
sub_i = _int_op("sub_i", "sub", "a - b in int32 lanes")
mul_i = _int_op("mul_i", "mul", "a * b in int32 lanes (vpmulld)")


@intrinsic
def to_f(typingctx, a):
    """int32 lanes -> float32 (vcvtdq2ps; exact below 2^24)"""
    def codegen(context, builder, sig, args):
        return builder.sitofp(_i32(builder, args[0]), F32V)
    return vf(a), codegen


# ---- float lanes ------------------------------------------------------------------------------

@intrinsic
def fma_v(typingctx, a, b, c):
    """a * b + c, one rounding (vfmadd: ggml's _mm256_fmadd_ps)"""
    def codegen(context, builder, sig, args):
        return _call(builder, f"llvm.fma.v{ROWS}f32", F32V, list(args))
    return vf(a, b, c), codegen


@intrinsic
def mul_v(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])
    return vf(a, b), codegen


@intrinsic
def add_v(typingctx, a, b):
    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return vf(a, b), codegen

