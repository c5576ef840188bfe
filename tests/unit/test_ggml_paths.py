"""ggml arithmetic, part 3: the code path (quant/ggml_path.py) and the kernels whose float order
depends on it (ops/ggml_math.py), held bit for bit to the libggml-cpu llama-cpp-python ships
(tests/ggml_cpu_ref.py) on the path that library was built for: its 16 lanes on an AVX-512 CPU,
its 8 on an AVX2 one. The test runs ffnlab's kernel with the library's lane count, so it checks
whichever path this CPU's llama.cpp takes."""
import os
import subprocess
import sys

import numpy as np
import pytest

import ggml_cpu_ref as R
from ffnlab.ops import ggml_math
from ffnlab.quant import ggml_path
from ffnlab.tracing.verify import Report, summary_lines

AVX2_CPU = {"avx2": True, "fma": True, "f16c": True}
AVX512_CPU = {**AVX2_CPU, "avx512f": True, "avx512dq": True, "avx512bw": True, "avx512vl": True}


def lib_lanes():
    """the float32 lanes of the installed llama.cpp's build (16, 8 or 1)"""
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python, the reference engine (scripts/install.sh --test installs it)")
    return ggml_path.LANES[ggml_path.llamacpp_path(llama_cpp.llama_print_system_info().decode())]


# --- the path -----------------------------------------------------------------------------------
def test_avx512_needs_f_and_dq():
    assert ggml_path.cpu_path(AVX512_CPU) == "avx512"
    assert ggml_path.cpu_path({**AVX512_CPU, "avx512dq": False}) == "avx2"   # vec.cpp's softmax tests both


def test_avx2_needs_fma_and_f16c():
    assert ggml_path.cpu_path(AVX2_CPU) == "avx2"
    assert ggml_path.cpu_path({**AVX2_CPU, "f16c": False}) == "scalar"
    assert ggml_path.cpu_path({}) == "scalar"


def test_a_forced_path_below_the_cpus_is_taken():
    assert ggml_path.choose("avx2", AVX512_CPU) == "avx2"
    assert ggml_path.choose("scalar", AVX2_CPU) == "scalar"
    assert ggml_path.choose("", AVX2_CPU) == "avx2"


def test_forcing_avx512_on_an_avx2_cpu_is_refused_in_one_line():
    with pytest.raises(ggml_path.GgmlPathError) as e:
        ggml_path.choose("avx512", AVX2_CPU)
    msg = str(e.value)
    assert "FFNLAB_GGML_PATH=avx512" in msg and "AVX-512" in msg and "\n" not in msg


def test_an_unknown_path_is_refused_naming_the_variable():
    with pytest.raises(ggml_path.GgmlPathError, match="FFNLAB_GGML_PATH=avx3: not a ggml path"):
        ggml_path.choose("avx3", AVX512_CPU)


def test_the_cli_reports_a_bad_path_in_one_line_without_a_traceback():
    env = dict(os.environ, FFNLAB_GGML_PATH="avx3")
    p = subprocess.run([sys.executable, "-m", "ffnlab.cli.main", "run", "-p", "hi", "-n", "1", "--arith", "ggml"],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode != 0
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "FFNLAB_GGML_PATH=avx3" in lines[0]


def test_llamacpp_system_info_names_its_path():
    head = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
    assert ggml_path.llamacpp_path(head + "AVX512 = 1 | AVX512_VNNI = 1 | LLAMAFILE = 1 | ") == "avx512"
    assert ggml_path.llamacpp_path(head + "LLAMAFILE = 1 | ") == "avx2"
    assert ggml_path.llamacpp_path("CPU : SSE3 = 1 | LLAMAFILE = 1 | ") == "scalar"


def test_verify_explains_a_path_mismatch():
    report = Report("llama.cpp", 1e-3, 1e-6, ggml_path="avx2", llamacpp_build=("avx512", "0.3.36"))
    text = "\n".join(summary_lines(report))
    assert "reproduced llama.cpp's avx2 code path" in text
    assert "runs its avx512 kernels" in text and "cannot agree bit for bit" in text


def test_verify_says_the_scalar_builds_quantized_products_are_not_transcribed():
    report = Report("llama.cpp", 1e-3, 1e-6, ggml_path="scalar", llamacpp_build=("scalar", "0.3.36"))
    assert "quantized products" in "\n".join(summary_lines(report))


def test_verify_gives_no_hint_when_the_paths_agree():
    report = Report("llama.cpp", 1e-3, 1e-6, ggml_path="avx512", llamacpp_build=("avx512", "0.3.36"))
    assert "cannot agree" not in "\n".join(summary_lines(report))


# --- the kernels, on the library's path -----------------------------------------------------------
@pytest.mark.parametrize("K", [64, 96, 100, 256, 1000])
def test_vec_dot_f16_is_ggmls_bit_for_bit(K):
    """K past a multiple of the step (4 vectors) exercises the float64 tail"""
    lanes, rng = lib_lanes(), np.random.default_rng(K)
    for _ in range(20):
        a = (rng.standard_normal(K) * 3).astype(np.float16)
        b = rng.standard_normal(K).astype(np.float16)
        ours = ggml_math.vec_dot_f16(a.astype(np.float32), b.astype(np.float32), lanes, np.empty(64, np.float32))
        assert ours == R.vec_dot("f16", K, a, b)


@pytest.mark.parametrize("n", [256, 1024])
def test_soft_max_exps_and_sum_are_ggmls_bit_for_bit(n):
    """ggml_vec_soft_max_f32: y = exp(x - max) and the float64 sum of the vectors' sums"""
    lanes, rng = lib_lanes(), np.random.default_rng(n)
    for _ in range(20):
        x = (rng.standard_normal(n) * 10).astype(np.float32)
        x[rng.random(n) < 0.3] = -np.inf                                   # masked cells
        mx = np.float32(x.max())
        y_ref, s_ref = R.soft_max(x, float(mx))
        y = np.empty_like(x)
        ggml_math._expf_row(x - mx, y, lanes, np.empty(2 * n, np.int32))
        assert np.array_equal(y, y_ref)
        assert sum(float(ggml_math.hsum(y, j, lanes)) for j in range(0, n, lanes)) == s_ref


def test_expf_is_ggmls_over_its_whole_range():
    """from the subnormal results below -87 to the overflow past 88.7, as exp(x - 0)"""
    lanes = lib_lanes()
    x = np.linspace(-110, 100, 200_001).astype(np.float32)
    y_ref, _ = R.soft_max(x, 0.0)
    y = np.empty_like(x)
    ggml_math._expf_row(x, y, lanes, np.empty(2 * x.size, np.int32))
    assert np.array_equal(y, y_ref)


@pytest.mark.parametrize("n", [4096, 4096 + 5])
def test_silu_is_ggmls_bit_for_bit(n):
    """ggml_vec_swiglu_f32 with g = 1 is ggml_vec_silu_f32; n = 4101 leaves a libm tail"""
    lanes, rng = lib_lanes(), np.random.default_rng(n)
    x = (rng.standard_normal(n) * 30).astype(np.float32)
    y = np.empty_like(x)
    ggml_math._silu_row(x, y, lanes, np.empty(3 * n, np.int32))
    assert np.array_equal(y, R.swiglu(x, np.ones_like(x)))


def test_tinyblas_takes_only_what_sgemm_accepts():
    assert ggml_math.tinyblas_takes("avx512", 256, 2, 64)
    assert not ggml_math.tinyblas_takes("avx512", 256, 1, 64)          # one column: ggml_vec_dot_f16
    assert not ggml_math.tinyblas_takes("avx512", 256, 2, 8)           # k % 16
    assert ggml_math.tinyblas_takes("avx2", 256, 2, 8)
    assert not ggml_math.tinyblas_takes("avx2", 6, 2, 64)              # m % 4
    assert not ggml_math.tinyblas_takes("scalar", 256, 2, 64)
