"""What machine a benchmark ran on, for the line every bench script prints with its figures."""
import platform


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo's "model name"; elsewhere platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def blas_kernels() -> str:
    """The BLAS NumPy loaded and the kernels it runs on this CPU ("OpenBLAS 0.3.31, SkylakeX kernels"),
    with OPENBLAS_CORETYPE when it is set: a float32 product's speed depends on them (on an AMD
    EPYC of family 26, OpenBLAS's Haswell kernels take ~1.9x the time of its SkylakeX ones)."""
    import os
    from threadpoolctl import threadpool_info
    import numpy  # noqa: F401 (loads the BLAS threadpoolctl reports)
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    if not blas:
        return "no BLAS found"
    b = next((i for i in blas if "numpy" in i.get("filepath", "")), blas[0])   # NumPy's (SciPy brings its own)
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return (f"{b.get('internal_api')} {b.get('version')}, {b.get('architecture')} kernels"
            + (f" (OPENBLAS_CORETYPE={pinned})" if pinned else ""))
