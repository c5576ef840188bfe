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
    """Drop this process's resident pages of a shared library's machine code and read-only data:
    its r-xp and r--p mappings in /proc/self/smaps that hold no private (copy-on-write) page.
    Those pages are never written, so the next call into the library faults the same bytes back
    from the page cache; a mapping with private pages (the relocated tables, written at load, then
    made read-only) or a writable one is left alone. Called once a model's kernels are loaded, so
    LLVM's code and tables (~50 MB resident once numba has loaded a model's kernels; 17 MB of
    them read-only data) do not count towards the peak resident memory of generation.
    -> bytes advised away (0 where not possible)"""
    if not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    spans, span = [], None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                fields = line.split()
                if fields and "-" in fields[0] and ":" not in fields[0]:       # a mapping's header line
                    mine = (len(fields) > 5 and fields[1] in ("r-xp", "r--p") and fields[5].endswith(".so")
                            and library in fields[5])
                    span = fields[0] if mine else None
                elif span is not None and fields[0] == "Anonymous:":
                    if fields[1] == "0":                                      # no private page: all the file's
                        spans.append(span)
                    span = None
    except OSError:
        return 0
    return sum(_dontneed(*(int(x, 16) for x in span.split("-"))) for span in spans)


def trim_heap() -> bool:
    """Give the C heap's free memory back to the OS (glibc's malloc_trim): what a load freed (the
    tokenizer's build, the metadata's Python objects) stays resident otherwise, under the weights
    the first forward pages in. -> whether it ran (False where there is no glibc)."""
    try:
        trim = _c().malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim(0)
    return True


def _c():
    """the C library, loaded once"""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        _libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return _libc


def _dontneed(lo, hi) -> int:
    if hi <= lo:
        return 0
    return hi - lo if _c().madvise(lo, hi - lo, mmap.MADV_DONTNEED) == 0 else 0


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
