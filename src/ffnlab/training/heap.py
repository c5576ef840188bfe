"""Keep the training step's freed arrays in the process's heap instead of handing them back to the kernel.

A training step allocates its activations on the way forward and frees them on the way back:
tens of MB in arrays of 1-6 MB each. glibc's malloc gives the top of its heap back to the kernel
once more than M_TRIM_THRESHOLD of it is free (and serves large blocks by mmap, unmapped on free),
so the next step finds that memory gone and page-faults it in again, 4 KB at a time, each page
zeroed by the kernel: ~10,000 minor faults per GPT-2 step at 4 layers x d_model 256, T=256,
batch 4 (2026-12-02, Intel Xeon family 6 model 167: ~18 ms of system time in a ~270 ms step).
Raising the mmap threshold to its largest value (blocks up to 32 MB come from the heap) and the
trim threshold out of reach keeps the freed blocks for the next step's arrays of the same sizes;
the process then holds the step's peak heap, which each step reaches anyway.

glibc only (ctypes' mallopt): elsewhere nothing changes. The setting is the process's: every
library in it (torch too, in bench/bench_train.py) allocates from the same heap.
"""
import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1         # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_MAX = 32 << 20           # bytes: glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_NEVER = (1 << 31) - 1    # bytes free at the heap's top before glibc trims it: never, in practice

_taken = None                 # keep_freed_memory's answer, once asked


def keep_freed_memory() -> bool:
    """Raise malloc's mmap and trim thresholds, once per process -> whether glibc took them"""
    global _taken
    if _taken is None:
        _taken = _mallopt(M_MMAP_THRESHOLD, MMAP_MAX) and _mallopt(M_TRIM_THRESHOLD, TRIM_NEVER)
    return _taken


def _mallopt(param, value) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:                               # not glibc (musl, macOS)
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(param, value))
