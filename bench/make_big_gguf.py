"""Write a Llama-2-7B-shaped GGUF of random Q4_0 blocks, for the big-model benchmark.

  python3 bench/make_big_gguf.py OUT.gguf [--layers 32] [--seed 0]

Shapes are Llama 2 7B's (d_model 4096, 32 heads, d_ff 11008, 32 layers, rope base 10000,
RMSNorm eps 1e-5); the tokenizer is SmolLM2's (its GGUF metadata copied: 49,152 tokens, a real
BPE vocabulary and merges), so the vocabulary, not Llama 2's 32,000, sets the embedding size:
6.9 B parameters, 3.9 GB of blocks. Every matrix is Q4_0 (general.file_type 2, "mostly Q4_0"),
the token embedding and the output matrix included; the norms are float32.

The blocks are random: nibbles uniform in 0..15 (weights (q - 8) d, whose std is 4.6 d) and fp16
scales d ~ U(0.5, 1.5) x 4.3e-3, so weights have std ~0.02 like a trained model's. Tensors are
generated and written one at a time (the writer never holds the whole file in memory).
"""
import argparse
import os
import sys
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T, GGUFReader, GGUFValueType, GGUFWriter

D_MODEL, N_HEAD, D_FF, ROPE_BASE, EPS = 4096, 32, 11008, 10000.0, 1e-5
D_SCALE = 0.02 / 4.61      # std of (q - 8) for q uniform in 0..15 is sqrt(255/12) = 4.61


def q4_0_blocks(rows, cols, rng) -> np.ndarray:
    """-> uint8 [rows, cols / 32 * 18]: random Q4_0 blocks (fp16 d, then 16 bytes of nibbles)."""
    elems, size = GGML_QUANT_SIZES[T.Q4_0]
    blocks = rng.integers(0, 256, (rows * cols // elems, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, len(blocks)).astype(np.float32) * D_SCALE
    blocks[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def tensors(n_layer, vocab):
    """-> [(name, shape [out, in], is_matrix)] in llama.cpp's order."""
    out = [("token_embd.weight", (vocab, D_MODEL), True)]
    for i in range(n_layer):
        out += [(f"blk.{i}.attn_norm.weight", (D_MODEL,), False),
                (f"blk.{i}.attn_q.weight", (D_MODEL, D_MODEL), True),
                (f"blk.{i}.attn_k.weight", (D_MODEL, D_MODEL), True),
                (f"blk.{i}.attn_v.weight", (D_MODEL, D_MODEL), True),
                (f"blk.{i}.attn_output.weight", (D_MODEL, D_MODEL), True),
                (f"blk.{i}.ffn_norm.weight", (D_MODEL,), False),
                (f"blk.{i}.ffn_gate.weight", (D_FF, D_MODEL), True),
                (f"blk.{i}.ffn_up.weight", (D_FF, D_MODEL), True),
                (f"blk.{i}.ffn_down.weight", (D_MODEL, D_FF), True)]
    return out + [("output_norm.weight", (D_MODEL,), False), ("output.weight", (vocab, D_MODEL), True)]


def copy_tokenizer(w: GGUFWriter, src: str) -> int:
    """Copy every tokenizer.* field of src into w; -> the vocabulary size."""
    r = GGUFReader(src)
    vocab = 0
    for key, field in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            sub = field.types[-1]
            if sub == GGUFValueType.STRING:
                value = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                value = [field.parts[i][0].item() for i in field.data]
            w.add_array(key, value)
            if key == "tokenizer.ggml.tokens":
                vocab = len(value)
        elif kind == GGUFValueType.STRING:
            w.add_string(key, bytes(field.parts[field.data[0]]).decode("utf-8"))
        elif kind == GGUFValueType.BOOL:
            w.add_bool(key, bool(field.parts[field.data[0]][0]))
        else:
            w.add_uint32(key, int(field.parts[field.data[0]][0]))
    return vocab


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32, help="blocks (default 32, as Llama 2 7B)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", default=None, help="GGUF whose tokenizer.* metadata is copied (default: SmolLM2's)")
    args = ap.parse_args()
    src = args.tokenizer
    if src is None:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
        import models
        src = models.model_path("smollm2")
    t0 = time.perf_counter()
    w = GGUFWriter(args.out, arch="llama")
    w.add_name(f"random Llama-2-7B-shaped Q4_0 ({args.layers} layers)")
    w.add_file_type(2)                                   # LLAMA_FTYPE_MOSTLY_Q4_0
    w.add_context_length(4096)
    w.add_embedding_length(D_MODEL)
    w.add_feed_forward_length(D_FF)
    w.add_block_count(args.layers)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(D_MODEL // N_HEAD)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    vocab = copy_tokenizer(w, src)
    w.add_vocab_size(vocab)
    w.add_quantization_version(2)
    specs = tensors(args.layers, vocab)
    for name, shape, is_matrix in specs:
        if is_matrix:
            byte_shape = (shape[0], shape[1] // 32 * 18)        # the writer takes a raw tensor's byte shape
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), byte_shape[0] * byte_shape[1], raw_dtype=T.Q4_0)
        else:
            w.add_tensor_info(name, shape, np.dtype(np.float32), shape[0] * 4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(args.seed)
    for name, shape, is_matrix in specs:
        if is_matrix:
            w.write_tensor_data(q4_0_blocks(shape[0], shape[1], rng))
        else:
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(shape[0])).astype(np.float32))
    w.close()
    size = os.path.getsize(args.out)
    n_params = sum(int(np.prod(s)) for _, s, _ in specs)
    print(f"wrote {args.out}: {n_params / 1e9:.2f} B parameters, {size / 1e9:.2f} GB, "
          f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
