"""Fingerprint every product quant/ computes, to prove a change to its kernels changed no number.

    python scripts/quant_hashes.py > before.txt       # on the old commit
    python scripts/quant_hashes.py > after.txt        # on the new one
    diff before.txt after.txt                         # empty: every kernel's output bit-identical

For each of the 13 weight types ffnlab multiplies by (quant/types.py KERNEL_TYPES): random rows,
quantized by gguf-py (gguf.quants.quantize) where it can, else random blocks whose scales are
finite halves; then the sha1 of what a QuantTensor gives in arith "f32" and "ggml", in the file's
blocks and packed (each arith's own layout), and stacked from two parts: dequantize(), an
embedding lookup w[ids] (of a stacked matrix's part), matvec, matmul for T = 1, 3, 17, 64 tokens and, in arith "f32", rmatmul.
Each instruction-set mode this CPU can run goes in a process of its own (the choice is made at
import): the native one, FFNLAB_NO_AVX512=1, FFNLAB_NO_AVX2=1 and FFNLAB_GGML_PATH=avx2 / scalar
where this CPU takes those paths. A mode's lines start with its name.
"""
import argparse
import hashlib
import os
import subprocess
import sys

import numpy as np

ROWS, N = 200, 512            # 200 rows: three whole groups of 64 and a padded one; 512 = 2 K-quant blocks
TOKENS = (1, 3, 17, 64)


def sha(a):
    a = np.ascontiguousarray(a)
    return hashlib.sha1(a.view(np.uint8).reshape(-1).tobytes() + str(a.dtype).encode()).hexdigest()[:16]


def blocks(qtype, rows, n, rng):
    """[rows, row_bytes] uint8 blocks of qtype: gguf-py's quantization of random floats, or random
    bytes with finite scales where gguf-py has no quantizer"""
    from gguf import quants
    from ffnlab.quant.types import TYPES
    r = TYPES[int(qtype)]
    w = (rng.standard_normal((rows, n)) * 0.05).astype(np.float32)
    try:
        return np.ascontiguousarray(quants.quantize(w, qtype)).view(np.uint8).reshape(rows, -1)
    except NotImplementedError:                      # gguf-py has no quantizer for this type: random blocks
        pass
    data = rng.integers(0, 256, (rows, n // r.block_weights, r.block_bytes), dtype=np.uint8)
    for at in (r.d_at, r.m_at):                   # d and dmin: halves in [2^-10, 2^-6), both signs for dmin
        if at >= 0:
            half = (rng.uniform(2 ** -10, 2 ** -6, data.shape[:2]) * (1 if at == r.d_at else
                    rng.choice([-1, 1], data.shape[:2]))).astype(np.float16)
            data[:, :, at:at + 2] = half.view(np.uint8).reshape(*data.shape[:2], 2)
    return data.reshape(rows, -1)


def emit(*parts):
    print(" ".join(str(p) for p in parts), flush=True)


def fingerprint(label, w, rng, arith, rows=True):
    emit(label, "dequantize", sha(w.dequantize()))
    ids = rng.integers(0, w.shape[0], 9)
    if rows:                                      # a stacked matrix has no rows of its own: its parts do
        emit(label, "rows", sha(w[ids]))
    x = rng.standard_normal((max(TOKENS), w.shape[1])).astype(np.float32)
    emit(label, "matvec", sha(w.matvec(x[0])))
    for t in TOKENS:
        emit(label, "matmul", t, sha(w.matmul(x[:t])))
    if arith == "f32":
        emit(label, "rmatmul", sha(w.rmatmul(rng.standard_normal((3, w.shape[0])).astype(np.float32))))


def run_mode(mode):
    from ffnlab.quant import QuantTensor
    from ffnlab.quant.types import KERNEL_TYPES
    for qtype in KERNEL_TYPES:
        for arith in ("f32", "ggml"):
            rng = np.random.default_rng(int(qtype))
            data = blocks(qtype, ROWS, N, rng)
            label = f"{mode} {qtype.name} {arith}"
            fingerprint(f"{label} file", QuantTensor(data, qtype, (ROWS, N), arith), rng, arith)
            w = QuantTensor(data, qtype, (ROWS, N), arith)
            w.pack(release=False)
            fingerprint(f"{label} packed:{type(w.packed).__name__ if w.packed is not None else '-'}", w, rng, arith)
            parts = [QuantTensor(data[:128], qtype, (128, N), arith), QuantTensor(data[128:], qtype, (ROWS - 128, N),
                                                                                  arith)]
            s = QuantTensor.stacked(parts, release=False)
            if s is not None:
                fingerprint(f"{label} stacked:{type(s.packed).__name__}", s, rng, arith, rows=False)
                fingerprint(f"{label} stacked-part", parts[1], rng, arith)


def modes():
    """the modes this CPU runs: name -> environment"""
    from llvmlite import binding
    f = binding.get_host_cpu_features()
    out = {"native": {}}
    if f.get("avx512f"):
        out["no_avx512"] = {"FFNLAB_NO_AVX512": "1"}
    if f.get("avx2"):
        out["no_avx2"] = {"FFNLAB_NO_AVX2": "1"}
        out["ggml_path_avx2"] = {"FFNLAB_GGML_PATH": "avx2"}
    out["ggml_path_scalar"] = {"FFNLAB_GGML_PATH": "scalar"}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", help="run one mode in this process (the environment already set)")
    ap.add_argument("--only", nargs="+", help="run only these modes (native, no_avx512, ...)")
    args = ap.parse_args()
    if args.mode:
        return run_mode(args.mode)
    for name, env in modes().items():
        if args.only and name not in args.only:
            continue
        clean = {k: v for k, v in os.environ.items() if k not in ("FFNLAB_NO_AVX512", "FFNLAB_NO_AVX2",
                                                                  "FFNLAB_GGML_PATH")}
        subprocess.run([sys.executable, __file__, "--mode", name], env={**clean, **env}, check=True)


if __name__ == "__main__":
    main()
