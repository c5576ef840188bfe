"""quant/pages.py: handing pages back to the OS must drop only what can be read again unchanged.

release_code() advises away a library's clean read-only mappings (code and constants); the
relocated tables, written at load (private copy-on-write pages), must be left alone or the next
call would read the unrelocated bytes of the file. After it, LLVM must still compile correctly."""
import os

import numpy as np
import pytest

from ffnlab.quant import pages


def _mappings(library):
    """[(perms, rss kB, anonymous kB)] of the library's mappings, from /proc/self/smaps"""
    out, cur = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if fields and "-" in fields[0] and ":" not in fields[0]:
                cur = [fields[1], 0, 0] if len(fields) > 5 and library in fields[5] else None
                if cur is not None:
                    out.append(cur)
            elif cur is not None and fields[0] == "Rss:":
                cur[1] = int(fields[1])
            elif cur is not None and fields[0] == "Anonymous:":
                cur[2] = int(fields[1])
    return out


def test_release_code_drops_clean_read_only_pages_and_llvm_still_works():
    numba = pytest.importorskip("numba")
    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("no /proc/self/smaps")

    @numba.njit
    def first(x):
        return x * 2.0 + 1.0
    assert first(3.0) == 7.0                                          # LLVM's pages resident
    before = _mappings("libllvmlite")
    assert before, "llvmlite is not mapped"
    dirty = [(p, a) for p, _, a in before if a > 0]                   # relocated tables, data
    released = pages.release_code()
    assert released > 0
    after = _mappings("libllvmlite")
    clean_rss = sum(r for p, r, a in after if p in ("r-xp", "r--p") and a == 0)
    assert clean_rss <= 512                                           # kB: what a stray access may have faulted back
    assert [(p, a) for p, _, a in after if a > 0] == dirty            # the private pages untouched

    @numba.njit
    def second(x):                                                    # compiling again reads the dropped pages
        return np.sqrt(x) + x
    assert second(16.0) == 20.0


def test_trim_heap_calls_glibc_malloc_trim():
    import platform
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    a = [bytes(1000) for _ in range(10000)]                           # ~10 MB freed, then handed back
    del a
    assert pages.trim_heap() is True
