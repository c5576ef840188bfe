"""How many threads ffnlab's compute uses: one setting for BLAS and for the compiled kernels.

    set_threads(2)        # every BLAS pool loaded now (OpenBLAS under NumPy, MKL/OpenMP under
                          # torch if loaded), and numba's kernels, now or when numba is imported
    set_threads(None)     # the default: the cores other processes leave idle now (all of them on
                          # an idle machine, as llama.cpp's -t; fewer beside a busy process)
    threads()             # -> the number set (the default if set_threads was never called)
    report()              # -> {"threads": n, "libraries": {"openblas": 2, "openmp": 2}, "numba": 2 | None}

Why one place: NumPy's OpenBLAS starts as many threads as there are cores and its threads
wait for each other at every product. When another process holds a core, one of them waits for
a descheduled sibling, and a product that took 0.1 ms can take a scheduler tick (see
bench/bench_threads.py and bench/RESULTS.md). The number of threads is therefore a user
setting (-t), printed with every timing, and the same number reaches every library.
"""
import itertools
import os
import sys
import threading
import time
from contextlib import contextmanager

_threads = None          # the number set by set_threads(); None: not set yet
_default = None          # default_threads() as first measured, for threads() before any set_threads()
_limiter = None          # threadpoolctl's handle (kept so the limits stay applied)
_pool = None             # parallel_for()'s worker threads, started on first use
_blas = None             # threadpoolctl's controller of the BLAS libraries, for blas_single()
_inside = threading.local()   # .on: this thread runs parallel_for's items; .blas_single: inside blas_single()
_one_pool = 0            # depth of one_pool() blocks: the row kernels split on parallel_for's threads


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, as llama.cpp's cpu_get_num_math falls back to)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                       # not Linux
        return max(1, os.cpu_count() or 1)


def busy_cores(samples=10, interval=0.002, stat="/proc/stat", own="/proc/self/task"):
    """How many cores other processes keep busy now: the kernel's count of runnable threads
    (procs_running in /proc/stat) less this process's own runnable threads, averaged over
    `samples` reads `interval` seconds apart (20 ms in all). A process that ended a moment ago
    counts for nothing, unlike in the 1-minute load average, which stays near 1.0-1.6 on an idle
    2-core machine for a minute after an ffnlab or llama.cpp run. -> cores, or None without /proc."""
    total = 0
    for i in range(samples):
        if i:
            time.sleep(interval)
        try:
            with open(stat) as f:
                running = next(int(line.split()[1]) for line in f if line.startswith("procs_running"))
        except (OSError, StopIteration, ValueError, IndexError):   # not Linux, or no such line
            return None
        total += max(0, running - _own_running(own))
    return total / samples


def _own_running(own) -> int:
    """This process's threads in state R (the one reading, at least; BLAS threads still spinning)."""
    n = 0
    try:
        tasks = os.listdir(own)
    except OSError:
        return 1
    for t in tasks:
        try:
            with open(os.path.join(own, t, "stat")) as f:
                n += f.read().rpartition(")")[2].split()[0] == "R"     # the state follows the (name)
        except (OSError, IndexError):                                  # a thread that just ended
            pass
    return max(n, 1)


def default_threads() -> int:
    """The cores no other process is using now: available_cores() minus busy_cores() (rounded),
    at least 1. On an idle machine that is every core (llama.cpp's default: the physical cores);
    beside a busy process, fewer threads than cores, because a product split across a core another
    process holds waits for that core's next time slice (bench/RESULTS.md: 2 threads beside one
    busy process were 5-10x slower than 1 thread on a 2-core machine). Without /proc: every core."""
    cores = available_cores()
    busy = busy_cores()
    if busy is None:
        return cores
    return max(1, min(cores, cores - int(busy + 0.5)))


def set_threads(n=None) -> int:
    """Use n threads for BLAS and compiled kernels; n None or <= 0: default_threads(). -> n"""
    global _threads, _limiter
    n = default_threads() if n is None or n <= 0 else int(n)
    from threadpoolctl import threadpool_limits
    _limiter = threadpool_limits(limits=n)       # every BLAS / OpenMP library loaded in this process
    # numba reads NUMBA_NUM_THREADS once, at import: set it for a later import, or tell a loaded numba
    if "numba" in sys.modules:
        import numba
        numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    else:
        os.environ["NUMBA_NUM_THREADS"] = str(n)
    # worker processes (ablate, a spawned reference) start with the same number
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    _threads = n
    return n


def threads() -> int:
    """The number set; before any set_threads(), the default measured once (products call this
    on every call: a fresh 20 ms measurement each time would cost more than they do)."""
    global _default
    if _threads is not None:
        return _threads
    if _default is None:
        _default = default_threads()
    return _default


def report() -> dict:
    """What each thread pool actually uses now (BLAS and OpenMP libraries, as threadpoolctl sees
    them, and numba): {"threads": n, "libraries": {name: n}, "numba": n or None}."""
    from threadpoolctl import threadpool_info
    pools = dict(sorted((i["internal_api"], i["num_threads"]) for i in threadpool_info()))   # load order varies
    numba_n = None
    if "numba" in sys.modules:
        import numba
        numba_n = numba.get_num_threads()
    return {"threads": threads(), "libraries": pools, "numba": numba_n}


def blas_kernels() -> str:
    """NumPy's BLAS and the kernels it runs on this CPU ("openblas 0.3.31, SkylakeX kernels"), with
    OPENBLAS_CORETYPE when set: what a float32 product's speed and last bits depend on (on an AMD EPYC
    of family 26, OpenBLAS's Haswell kernels, which OPENBLAS_CORETYPE=Haswell selects, take ~1.9x
    the time of the SkylakeX ones it picks itself, 2026-12-03)."""
    import numpy  # noqa: F401 (loads the BLAS that threadpoolctl reports)
    from threadpoolctl import threadpool_info
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    b = next((i for i in blas if "numpy" in i.get("filepath", "")), blas[0] if blas else None)  # SciPy has its own
    if b is None:
        return "no BLAS found"
    pinned = os.environ.get("OPENBLAS_CORETYPE")
    return (f"{b.get('internal_api')} {b.get('version')}, {b.get('architecture')} kernels"
            + (f" (OPENBLAS_CORETYPE={pinned})" if pinned else ""))


@contextmanager
def blas_single(on=True):
    """BLAS runs on one thread inside (when on), as the calls parallel_for() makes need. A quantized
    model's forward runs inside it whole (model/transformer.py): after a two-thread BLAS call,
    OpenBLAS's idle thread spins on the other core for ~0.1 s, and slowed parallel_for()'s worker
    there (a SmolLM2 prefill: 550 ms, against 400 ms inside) and the numba threads of the next
    decoding steps (the first three after a prefill took 30-45 ms, not 17)."""
    global _blas
    if not on or getattr(_inside, "blas_single", False):    # off, or already inside (a forward's products)
        yield
        return
    if _blas is None:
        from threadpoolctl import ThreadpoolController
        _blas = ThreadpoolController().select(user_api="blas")
    _inside.blas_single = True
    try:
        with _blas.limit(limits=1):
            yield
    finally:
        _inside.blas_single = False


def parallel_for(fn, n_items):
    """fn(i) for every i in range(n_items), on threads() threads at once: this one and workers,
    each taking the next i as it finishes one (items of uneven cost balance themselves);
    returns when all are done. While it runs, BLAS uses one thread per call.

    Why: on a CPU without AVX2 a prefill product dequantizes a tile of weights (a numba kernel,
    nogil) and hands it to OpenBLAS (with AVX2 the whole product is one numba parallel region:
    quant/packed.py's Packed.matmul). With numba and OpenBLAS each splitting its own step over the cores, each pool's
    idle threads spin while the other works, and two threads ran slower than one
    (bench/RESULTS.md, section "Threads under a competing load"). Here each thread does both steps for its own tiles: one pool,
    nothing waits. fn must release the GIL for its long steps (NumPy's BLAS calls and nogil
    kernels do) and write disjoint outputs."""
    global _pool
    n = min(threads(), n_items)
    if n <= 1 or getattr(_inside, "on", False):   # nested (fn calls parallel_for): this thread does it all,
        for i in range(n_items):                     # since a worker waiting for its own pool would wait forever
            fn(i)
        return
    if _pool is None or _pool._max_workers < n - 1:
        from concurrent.futures import ThreadPoolExecutor
        _pool = ThreadPoolExecutor(max_workers=n - 1, thread_name_prefix="ffnlab")
    items = itertools.count()                    # next(items) is atomic: the GIL holds it

    def run():
        _inside.on = True
        try:
            for i in iter(items.__next__, None):
                if i >= n_items:
                    return
                fn(i)
        finally:
            _inside.on = False

    with blas_single():
        workers = [_pool.submit(run) for _ in range(n - 1)]
        try:
            run()
        finally:
            for f in workers:
                f.result()                       # waits; re-raises a worker's error here


@contextmanager
def one_pool():
    """Inside, ops/fastmath.py's row kernels (RMSNorm, RoPE) spread their rows on parallel_for's
    threads, not numba's. The training step splits its products there (ops/matmul.py), and numba's
    threads, woken for each norm and rotation, spun on the core the products' worker needed: a
    Llama-style step at 2 threads took 1.36x the CPU time of its 1-thread step (1,004 against 740 ms,
    6 x 384, AMD EPYC, 2026-12-02). Each row is computed by the same code either way: the same bits."""
    global _one_pool
    _one_pool += 1
    try:
        yield
    finally:
        _one_pool -= 1


def on_one_pool() -> bool:
    """inside one_pool(): a kernel that would open a numba parallel region uses parallel_for instead"""
    return _one_pool > 0


def split_rows(fn, n_rows):
    """fn(lo, hi) over blocks of range(n_rows) on parallel_for's threads, two blocks a thread (a late
    thread leaves its second to the others)"""
    k = min(2 * threads(), n_rows)
    edges = [n_rows * i // k for i in range(k + 1)]
    parallel_for(lambda i: fn(edges[i], edges[i + 1]), k)


def describe() -> str:
    """One line for the perf output: '2 (openblas 2, numba 2)'."""
    r = report()
    parts = [f"{k} {v}" for k, v in r["libraries"].items()] + ([f"numba {r['numba']}"] if r["numba"] else [])
    return f"{r['threads']}" + (f" ({', '.join(parts)})" if parts else "")
