"""Alignment of the MLP's widths, and how the model splits under tensor parallelism.

GPU matmul kernels tile their operands in blocks of 64/128/256 along each dimension; a width
that is not a multiple wastes a partial tile (and llama.cpp's k-quants need rows in multiples of
256, see quant.py). Under Megatron-style tensor parallelism of degree N every GPU gets
n_head/N query heads, n_kv_head/N KV heads (when n_kv_head < N, each KV head is replicated
on N/n_kv_head GPUs, which needs N to be a multiple of n_kv_head) and d_ff/N columns of
gate/up (rows of down).
"""

ALIGNMENTS = (64, 128, 256)


def alignment_report(cfg, tp_degrees=(1, 2, 4, 8)) -> dict:
    widths = {"d_model": cfg.d_model, "d_ff": cfg.d_ff, "head_dim": cfg.head_dim, "vocab_size": cfg.vocab_size}
    divisible = {name: {str(a): w % a == 0 for a in ALIGNMENTS} for name, w in widths.items()}
    tp = {}
    for n in tp_degrees:
        kv_ok = cfg.n_kv_head % n == 0 or (n % cfg.n_kv_head == 0)
        tp[str(n)] = {
            "heads": cfg.n_head % n == 0,
            "kv_heads": cfg.n_kv_head % n == 0,
            "kv_heads_replicated": cfg.n_kv_head < n and n % cfg.n_kv_head == 0,
            "d_ff": cfg.d_ff % n == 0,
            "d_ff_per_gpu": cfg.d_ff / n,
            "d_ff_per_gpu_multiple_of_64": cfg.d_ff % n == 0 and (cfg.d_ff // n) % 64 == 0,
            "even": cfg.n_head % n == 0 and kv_ok and cfg.d_ff % n == 0,
        }
    return {"widths": widths, "divisible": divisible, "tensor_parallel": tp}
