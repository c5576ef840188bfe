"""Hand a memory-mapped array's pages back to the OS (madvise MADV_DONTNEED).

Reading a tensor's blocks from the mapped file makes its pages part of the process's resident
memory for as long as the mapping lives. Once the blocks are packed (quant/packed.py) they are
not read again in a forward pass, so their pages are released: a later read (an embedding
lookup, the ggml kernels, an export) faults them back in from the page cache, with the same bytes.
Only whole pages inside the array are released; the call is skipped where madvise is missing.

release_code() does the same for the machine code of LLVM (libllvmlite, ~50 MB resident once
numba has loaded a model's kernels), which numba needs only to compile or load a kernel.
"""
import ctypes
import ctypes.util
import mmap

_libc = None


def release_pages(a) -> int:
    """a: an array over a read-only file mapping -> bytes advised away (0 where not possible)"""
    if not hasattr(mmap, "MADV_DONTNEED") or not a.size or not _on_read_only_file(a):
        return 0                                          # only a file's read-only mapping, never our own memory
    page = mmap.PAGESIZE
    start = a.ctypes.data
    lo, hi = -(-start // page) * page, (start + a.nbytes) // page * page
    return _dontneed(lo, hi)


def release_code(library="libllvmlite") -> int:
    """Drop this process's resident pages of a shared library's machine code (its r-xp mappings
    in /proc/self/maps). Code pages are never written, so the next call into the library faults
    the same bytes back from the page cache; no other mapping (data, relocated tables) is touched.
    Called once a model's kernels are loaded, so LLVM's code does not count towards the peak
    resident memory of generation. -> bytes advised away (0 where not possible)"""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    try:
        with open("/proc/self/maps") as f:
            spans = [line.split()[0] for line in f
                     if line.split()[1:2] == ["r-xp"] and line.rstrip().endswith(".so") and library in line]
    except OSError:
        return 0
    return sum(_dontneed(*(int(x, 16) for x in span.split("-"))) for span in spans)


def _dontneed(lo, hi) -> int:
    global _libc
    if hi <= lo:
        return 0
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return hi - lo if _libc.madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0 else 0


def _on_read_only_file(a) -> bool:
    """Whether a is a view of an np.memmap opened read-only (GGUFReader's mode "r"): pages that
    MADV_DONTNEED drops are read again from the file. Private or anonymous memory would be zeroed."""
    import numpy as np
    b = a
    while b is not None:
        if isinstance(b, np.memmap):
            return b.mode == "r"
        b = getattr(b, "base", None)
    return False
