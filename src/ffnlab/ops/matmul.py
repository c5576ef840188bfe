"""Float products on several threads with one thread pool: the work split into whole BLAS calls,
each on one thread (ffnlab/threads.py's parallel_for, BLAS limited to one thread inside it).

Why: with two threads, OpenBLAS splits every product over both cores and its threads meet at a
barrier per call. A training step makes ~40 products per layer, the attention's being small
([256, 64] x [64, 256] per head): when another process holds a core, each call waits for a
descheduled sibling, and NumPy's own two-thread step ran 5x slower than its one-thread step
(2026-12-01, Intel Xeon, load average ~1-3). Here each thread takes the next run of whole matrices (or
block of rows) as it finishes one, so a descheduled thread delays only its own item.
training/trainer.loss_and_grads runs the whole step with BLAS on one thread (threads.blas_single),
so a product is split here or runs on one thread, and no idle OpenBLAS thread spins beside the
split ones (a two-thread step at load average ~5: 0.98 s inside, 1.49 s without).
A head's product is the very BLAS call NumPy's batched matmul makes for it: the same bits. One
thread (threads() == 1): exactly NumPy's `a @ b`.
"""
import numpy as np

from .. import threads as _threads

MIN_WORK = 1 << 20        # multiply-adds from which a product is split (below, a thread hand-off costs more)
MIN_ROWS = 64             # rows per block of a split 2-D product


def batched_matmul(a, b, out=None):
    """a: [..., M, K], b: [..., K, N] with the same leading shape (strided views welcome) -> [..., M, N],
    written into out when given (a [..., M, N] array or view whose rows have unit stride, so that
    BLAS writes it directly: a head-major view of a token-major buffer)"""
    n = _threads.threads()
    lead = a.shape[:-2]
    M, K, N = a.shape[-2], a.shape[-1], b.shape[-1]
    count = int(np.prod(lead)) if lead else 1
    if n <= 1 or count < 2 or b.shape[:-2] != lead or count * M * K * N < MIN_WORK:
        return np.matmul(a, b, out=out)
    if out is None:
        out = np.empty(lead + (M, N), np.result_type(a, b))
    index = list(np.ndindex(*lead))
    k = min(count, 2 * n)               # runs of heads, two a thread: a hand-off costs ~10 us, and a head of
    edges = [count * i // k for i in range(k + 1)]      # [64, 32] x [32, 64] takes less (64 heads a call)

    def run(i):
        for j in index[edges[i]:edges[i + 1]]:
            np.matmul(a[j], b[j], out=out[j])
    _threads.parallel_for(run, k)
    return out


def matmul_rows(a, b):
    """a: [M, K], b: [K, N] (b may be a transposed view) -> a @ b, blocks of a's rows on the threads"""
    return matmuls([(a, b)])[0]


def matmuls(pairs):
    """[(a [M, K], b [K, N])] -> [a @ b]: products that need nothing of each other (a weight's dx and
    dw) in one parallel_for, each in its blocks of rows (the blocks matmul_rows gives it alone, so
    the same bits). One hand-off instead of one a product: each costs ~50 us of waiting for the other
    thread, a tenth of a [1024, 128] x [128, 128] product at 2 threads (AMD EPYC, 2026-12-03)."""
    n = _threads.threads()
    if n <= 1 or sum(a.shape[0] * a.shape[1] * b.shape[1] for a, b in pairs) < MIN_WORK:
        return [a @ b for a, b in pairs]
    outs, items = [], []
    for j, (a, b) in enumerate(pairs):
        M, K = a.shape
        N = b.shape[1]
        # one block a thread: each call packs all of b again, and two blocks a thread took 1.1-1.3x
        # one block's time on the step's products (2 threads, idle Intel Xeon, 2026-12-02)
        blocks = min(n, M // MIN_ROWS) if M * K * N >= MIN_WORK else 1
        if blocks < 2:
            outs.append(None)                     # whole: `a @ b`, the very call of a product too small
            items.append((j, a, b, None))         # to split alone
            continue
        out = np.empty((M, N), np.result_type(a, b))
        edges = [M * i // blocks for i in range(blocks + 1)]
        items += [(j, a[lo:hi], b, out[lo:hi]) for lo, hi in zip(edges, edges[1:])]
        outs.append(out)
    if len(items) == 1:
        return [pairs[0][0] @ pairs[0][1]]

    def one(i):
        j, a, b, out = items[i]
        if out is None:
            outs[j] = a @ b
        else:
            np.matmul(a, b, out=out)
    _threads.parallel_for(one, len(items))
    return outs
