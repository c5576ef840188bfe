"""Random quantized blocks and activations for the ggml kernel tests, and the (activation quantizer,
vec-dot kernel) pair of each weight type. Used by test_ggml_quants.py, test_ggml_packed.py and
bench/bench_ggml_kernels.py."""
import gguf
import numpy as np
from gguf import GGMLQuantizationType as T


# weight type -> (activation kind, ggml's vec_dot name, offsets of the f16 scales in a block)
PAIRS = {T.Q4_0: ("q8_0", "q4_0_q8_0", [0]), T.Q5_0: ("q8_0", "q5_0_q8_0", [0]),
         T.Q8_0: ("q8_0", "q8_0_q8_0", [0]), T.Q4_1: ("q8_1", "q4_1_q8_1", [0, 2]),
         T.Q5_1: ("q8_1", "q5_1_q8_1", [0, 2]), T.Q2_K: ("q8_k", "q2_K_q8_K", [80, 82]),
         T.Q3_K: ("q8_k", "q3_K_q8_K", [108]), T.Q4_K: ("q8_k", "q4_K_q8_K", [0, 2]),
         T.Q5_K: ("q8_k", "q5_K_q8_K", [0, 2]), T.Q6_K: ("q8_k", "q6_K_q8_K", [208])}


def random_blocks(qtype, rows, n, rng):
    """rows of random blocks (every bit pattern is a valid block) with finite, small f16 scales"""
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, n // elems, nbytes), dtype=np.uint8)
    for o in PAIRS[qtype][2]:
        d = rng.uniform(1e-3, 1e-2, (rows, n // elems)).astype(np.float16)
        raw[:, :, o:o + 2] = d[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


def activations(rng, N, n):
    x = rng.standard_normal((N, n)) * rng.uniform(0.01, 50, (N, 1))     # rows of very different scales
    return x.astype(np.float32)
