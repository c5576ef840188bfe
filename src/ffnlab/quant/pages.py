"""Hand a memory-mapped array's pages back to the OS (madvise MADV_DONTNEED).

Reading a tensor's blocks from the mapped file makes its pages part of the process's resident
memory for as long as the mapping lives. Once the blocks are packed (quant/packed.py) they are
not read again in a forward pass, so their pages are released: a later read (an embedding
lookup, the ggml kernels, an export) faults them back in from the page cache, with the same bytes.
Only whole pages inside the array are released; the call is skipped where madvise is missing.
"""
import ctypes
import ctypes.util
import mmap

_libc = None


def release_pages(a) -> int:
    """a: an array over a read-only file mapping -> bytes advised away (0 where not possible)"""
    global _libc
    if not hasattr(mmap, "MADV_DONTNEED") or not a.size or not _on_read_only_file(a):
        return 0                                          # only a file's read-only mapping, never our own memory
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = mmap.PAGESIZE
    start = a.ctypes.data
    lo, hi = -(-start // page) * page, (start + a.nbytes) // page * page
    if hi <= lo:
        return 0
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
