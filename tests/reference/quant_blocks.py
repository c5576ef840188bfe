"""Random GGUF blocks of every kernel type, for the kernel and loader tests.

Random bytes are valid blocks except for their 16-bit float scales (random bits can be NaN, Inf
or 1e4); those are overwritten with random halves of a plausible size, so dequantized weights
have a spread like a real model's (std ~0.01-0.05).
"""
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

# byte offsets of the f16 scale fields in each block: (d-like fields, min-like fields)
SCALES = {T.Q4_0: ((0,), ()), T.Q4_1: ((0,), (2,)), T.Q5_0: ((0,), ()), T.Q5_1: ((0,), (2,)),
          T.Q8_0: ((0,), ()), T.Q2_K: ((80,), (82,)), T.Q3_K: ((108,), ()), T.Q4_K: ((0,), (2,)),
          T.Q5_K: ((0,), (2,)), T.Q6_K: ((208,), ())}
# largest integer a min-like field is multiplied by (Q2_K: a 4-bit min, Q4_K/Q5_K: 6-bit)
MIN_MULT = {T.Q4_1: 1, T.Q5_1: 1, T.Q2_K: 15, T.Q4_K: 63, T.Q5_K: 63}
# types whose kernels factor a constant offset times d out of the block: w = d q - OFFSET d
D_OFFSET = {T.Q4_0: 8, T.Q5_0: 16}
# scale size that gives weights of std ~0.02: the quant range over 32 / 256 weights
D_SIZE = {T.Q4_0: 5e-3, T.Q4_1: 5e-3, T.Q5_0: 2.5e-3, T.Q5_1: 2.5e-3, T.Q8_0: 3e-4, T.Q2_K: 1e-3,
          T.Q3_K: 3e-4, T.Q4_K: 2e-4, T.Q5_K: 1e-4, T.Q6_K: 4e-4}


def random_blocks(qtype, rows, n, rng) -> np.ndarray:
    """-> uint8 [rows, row_bytes]: rows of n weights of ggml type qtype."""
    qtype = T(qtype)
    if qtype == T.F32:
        return rng.normal(0, 0.02, (rows, n)).astype(np.float32).view(np.uint8)
    if qtype == T.F16:
        return rng.normal(0, 0.02, (rows, n)).astype(np.float16).view(np.uint8)
    if qtype == T.BF16:
        w = rng.normal(0, 0.02, (rows, n)).astype(np.float32)
        return (w.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * (n // elems), nbytes), dtype=np.uint8)
    d_fields, m_fields = SCALES[qtype]
    for o in d_fields:
        d = rng.uniform(0.5, 1.5, len(blocks)) * D_SIZE[qtype] * rng.choice([-1, 1], len(blocks))
        blocks[:, o:o + 2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    for o in m_fields:
        m = -rng.uniform(0.5, 1.5, len(blocks)) * D_SIZE[qtype] * 8 / MIN_MULT[qtype]
        blocks[:, o:o + 2] = m.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def offset_bound(qtype, data, n) -> np.ndarray:
    """-> [rows, n]: the largest |offset term| each weight's block can add (0 for types without one).
    A kernel that factors w = d q + m into d (sum q x) + m (sum x) rounds relative to
    sum |d q x| + |m x|, which can exceed sum |w x| when d q and m cancel (m = -8 d for Q4_0)."""
    qtype = T(qtype)
    rows = data.shape[0]
    if qtype not in MIN_MULT and qtype not in D_OFFSET:
        return np.zeros((rows, n))
    elems, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(-1, nbytes)
    o = SCALES[qtype][1][0] if qtype in MIN_MULT else SCALES[qtype][0][0]
    mult = MIN_MULT[qtype] if qtype in MIN_MULT else D_OFFSET[qtype]
    m = np.abs(blocks[:, o:o + 2].copy().view(np.float16).astype(np.float64)[:, 0]) * mult
    return np.repeat(m, elems).reshape(rows, n)


def fill_random_blocks(path, seed=0):
    """Overwrite every quantized tensor of a GGUF file (tests/reference/models.tiny_gguf writes zero blocks)
    with random blocks of its type, in place: a small model whose weights are real blocks."""
    import gguf

    rng = np.random.default_rng(seed)
    reader = gguf.GGUFReader(path)
    todo = [(int(t.data_offset), T(t.tensor_type), tuple(int(n) for n in reversed(t.shape)))
            for t in reader.tensors if T(t.tensor_type) in SCALES or T(t.tensor_type) in (T.F16, T.BF16)]
    del reader
    with open(path, "r+b") as f:
        for offset, qtype, (rows, n) in todo:
            f.seek(offset)
            f.write(random_blocks(qtype, rows, n, rng).tobytes())
    return path
