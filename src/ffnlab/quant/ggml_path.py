"""Which of ggml-cpu's code paths `--arith ggml` reproduces, decided once from this CPU's features
exactly as a llama.cpp built for this CPU (GGML_NATIVE, i.e. -march=native) compiles them in.

  path     ggml's compile-time test                      what changes in the float order
  avx512   __AVX512F__ (simd-mappings.h, sgemm.cpp) and   16-lane vectors: ggml_vec_dot_f16 (4 x 16 lanes,
           __AVX512DQ__ (vec.cpp's softmax / SiLU)        _mm512_reduce_add_ps), tinyBLAS<16, __m512>
                                                          for f16 x f16, the softmax's 16-lane sums,
                                                          the AVX-512 ggml_v_expf (vscalefps)
  avx2     __AVX2__, __FMA__, __F16C__                    8-lane vectors (the kernels ffnlab first
                                                          transcribed: see ops/ggml_math.py)
  scalar   anything else (no GGML_SIMD)                   float64 sums of f16 products, libm expf,
                                                          no tinyBLAS

The integer dot products of quants.c are the same code on avx512 and avx2 (AVX-512 only changes
how an int32 sum is formed: vpdpbusd, exact), and so are tinyBLAS_Q0_AVX's __m256 lanes and the
tiled K-quant matmul's epilogue up to its FMA (GCC's gnu++17 contracts the AVX-512 microtile's
mul + add into the same FMA; measured equal, tests/engines/test_ggml_vs_llamacpp.py). On a scalar build
the quantized products are quants.c's generic C, which ffnlab does not transcribe: there ggml mode
reproduces the f16 attention and the softmax, not the quantized products.

The CPU flags are llvmlite's, as quant/simd.py reads them (not simd.HAS_AVX512 itself: that is
ffnlab's own kernel choice, switched off by FFNLAB_NO_AVX512, while llama.cpp's build has no such
switch). FFNLAB_GGML_PATH=avx512|avx2|scalar forces a path, to compare with a llama.cpp built for
it; forcing one this CPU could not run is refused in one line (GgmlPathError, when ggml mode is
asked for), as llama.cpp's build for it would not run here either.
"""
import os

from llvmlite import binding

from ..errors import UsageError

PATHS = ("avx512", "avx2", "scalar")
LANES = {"avx512": 16, "avx2": 8, "scalar": 1}        # float32 lanes of one vector register
ENV = "FFNLAB_GGML_PATH"
NEEDS = {"avx512": "AVX-512 F and DQ", "avx2": "AVX2 with FMA and F16C", "scalar": "CPU"}


class GgmlPathError(UsageError):
    """FFNLAB_GGML_PATH names no path, or one this CPU cannot run"""


def cpu_path(features=None):
    """this CPU's features -> the path llama.cpp's native build takes ("avx512" | "avx2" | "scalar")"""
    f = binding.get_host_cpu_features() if features is None else features
    if f.get("avx512f") and f.get("avx512dq"):
        return "avx512"
    if f.get("avx2") and f.get("fma") and f.get("f16c"):
        return "avx2"
    return "scalar"


def choose(env=None, features=None):
    """the path ggml mode runs: FFNLAB_GGML_PATH if set (and runnable here), else cpu_path()"""
    native = cpu_path(features)
    want = (os.environ.get(ENV, "") if env is None else env).strip().lower()
    if not want:
        return native
    if want not in PATHS:
        raise GgmlPathError(f"{ENV}={want}: not a ggml path (one of {', '.join(PATHS)})")
    if PATHS.index(want) < PATHS.index(native):
        raise GgmlPathError(f"{ENV}={want}: this CPU has no {NEEDS[want]} (a llama.cpp built for it takes the "
                            f"{native} path)")
    return want


def llamacpp_path(system_info):
    """llama_print_system_info()'s text -> the path that llama.cpp build runs"""
    flags = dict(p.strip().rsplit(" = ", 1) for p in system_info.split("|") if " = " in p)
    flags = {k.split(":")[-1].strip(): v for k, v in flags.items()}          # "CPU : SSE3" -> "SSE3"
    if flags.get("AVX512") == "1":
        return "avx512"
    if flags.get("AVX2") == "1" and flags.get("FMA", "1") == "1":
        return "avx2"
    return "scalar"


try:
    PATH = choose()
except GgmlPathError as e:              # reported where ggml mode is asked for (model/arith.py)
    PATH, PATH_ERROR = cpu_path(), e
else:
    PATH_ERROR = None


def llamacpp_build():
    """the installed llama-cpp-python's path and its version -> ("avx512", "0.3.36"), or None
    when it is not installed"""
    try:
        import llama_cpp
    except ImportError:
        return None
    return llamacpp_path(llama_cpp.llama_print_system_info().decode(errors="replace")), llama_cpp.__version__


def mismatch_hint(ours, theirs):
    """why ggml mode cannot match a llama.cpp build on path `theirs`, or None when it can"""
    if ours != theirs:
        forced = os.environ.get(ENV, "")
        how = f"{ENV}={forced}" if forced else "this CPU's"
        fix = f"unset {ENV}, or compare" if forced else f"set {ENV}={theirs} if this CPU has it, or compare"
        return (f"ffnlab reproduced the {ours} path ({how}) and llama.cpp runs its {theirs} kernels: their float "
                f"sums differ in the last bits from kq-0 on, and each product's 8-bit activation rounding grows "
                f"such bits; {fix} with a llama.cpp built for {ours}")
    if ours == "scalar":
        return ("ffnlab does not transcribe the scalar build's quantized products (quants.c's generic C), so "
                "the MUL_MAT nodes of quantized weights differ in their last bits")
    return None
