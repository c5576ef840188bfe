"""Bytes of weights under ggml quantization, and llama.cpp's per-tensor recipe for mixed types.

Bits per weight come from ggml's block layouts as the gguf package publishes them
(gguf.constants.GGML_QUANT_SIZES: elements per block, bytes per block), e.g. Q4_0 packs 32
weights in 18 bytes (16 bytes of nibbles + one fp16 scale) = 4.5 bits per weight.

A llama-quantize file type such as Q4_K_M is not one type: llama.cpp picks a type per tensor
(src/llama-quant.cpp, llama_tensor_get_type). recipe_type() follows its rules for the k-quant
and legacy file types (no importance matrix, dense models):
  - 1-D tensors, norms and the learned position table are never quantized (kept as in the source);
  - output.weight (or the token table when tied) -> Q6_K, or Q8_0 when its rows do not split into
    256-blocks (the Q8_0 file type keeps Q8_0);
  - attn_v / attn_qkv, ffn_down and attn_output get more bits in some layers, depending on the file
    type (Q4_K_M: Q6_K in the "use_more_bits" layers: the first and last eighth, and every third
    layer in between);
  - the 70B Llama shape (80 layers, grouped-query) bumps attn_v from Q3_K/Q4_K to Q5_K;
  - a tensor whose rows are not a multiple of the block size falls back (Q4_K->Q5_0, Q5_K->Q5_1,
    Q6_K->Q8_0, Q2_K/Q3_K->Q4_0, else F16).
The source model is assumed to be an F16 GGUF (llama.cpp's usual input): 1-D tensors F32,
unquantized 2-D tensors F16.
"""
import re

from ..errors import UsageError

# llama-quantize file type -> the default ggml type of its tensors (llama_ftype_get_default_type)
FILE_TYPES = {
    "F32": "F32", "F16": "F16", "BF16": "BF16",
    "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0", "Q5_1": "Q5_1", "Q8_0": "Q8_0",
    "Q2_K": "Q2_K", "Q2_K_S": "Q2_K", "Q3_K_S": "Q3_K", "Q3_K_M": "Q3_K", "Q3_K_L": "Q3_K",
    "Q4_K_S": "Q4_K", "Q4_K_M": "Q4_K", "Q5_K_S": "Q5_K", "Q5_K_M": "Q5_K", "Q6_K": "Q6_K",
}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}
DEFAULT_QUANTS = ("F32", "F16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")


def block_layout(type_name: str) -> tuple[int, int]:
    """ggml type name -> (elements per block, bytes per block)"""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]
    except KeyError:
        raise UsageError(f"unknown ggml type {type_name!r}") from None


def bits_per_weight(type_name: str) -> float:
    block, size = block_layout(type_name)
    return 8.0 * size / block


def tensor_bytes(type_name: str, ne) -> int:
    """Bytes of a tensor of ggml shape ne (rows of ne[0] elements) stored as type_name."""
    block, size = block_layout(type_name)
    n = 1
    for d in ne:
        n *= int(d)
    if int(ne[0]) % block:
        raise UsageError(f"rows of {ne[0]} elements do not split into {type_name} blocks of {block}")
    return n // block * size


def check_quant(name: str) -> str:
    """A --quant entry: a llama-quantize file type (Q4_K_M, Q8_0, ...) or any ggml type (Q4_K, IQ4_NL:
    every quantizable tensor pure, as llama-quantize --pure)."""
    up = name.upper()
    if up in FILE_TYPES:
        return up
    block_layout(up)
    return up


def _use_more_bits(i_layer, n_layer):
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def _layer(name):
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def _quantizable(name, ne):
    return (len(ne) >= 2 and name.endswith("weight") and "_norm.weight" not in name
            and name not in ("position_embd.weight", "token_types.weight"))


def recipe_type(name, ne, quant, cfg) -> str:
    """The ggml type llama-quantize gives tensor `name` (ggml shape ne) for `quant` (see module doc)."""
    if not _quantizable(name, ne):
        return "F32" if len(ne) < 2 else "F16"
    if quant not in FILE_TYPES:                              # a pure ggml type (llama-quantize --pure)
        return _fallback(quant, ne)
    t = FILE_TYPES[quant]
    if t in ("F32", "F16", "BF16"):
        return t
    il, L = _layer(name), cfg.n_layer
    n_gqa = cfg.n_head // cfg.n_kv_head
    if name == "output.weight" or (cfg.tie_embeddings and name == "token_embd.weight"):
        if int(ne[0]) % block_layout(t)[0]:
            t = "Q8_0"
        elif t != "Q8_0":
            t = "Q6_K"
    elif name.endswith(("attn_v.weight", "attn_qkv.weight")):
        if quant == "Q2_K":
            t = "Q4_K" if n_gqa >= 4 else "Q3_K"
        elif quant == "Q2_K_S" and n_gqa >= 4:
            t = "Q4_K"
        elif quant == "Q3_K_M":
            t = "Q5_K" if il < 2 else "Q4_K"
        elif quant == "Q3_K_L":
            t = "Q5_K"
        elif quant in ("Q4_K_M", "Q5_K_M") and _use_more_bits(il, L):
            t = "Q6_K"
        elif quant == "Q4_K_S" and il < 4:
            t = "Q5_K"
        if cfg.arch == "llama" and L == 80 and n_gqa > 1 and t in ("Q3_K", "Q4_K"):
            t = "Q5_K"                                       # LLM_TYPE_70B: attn_v is 8x smaller than attn_q
    elif name.endswith("ffn_down.weight"):
        if quant == "Q2_K":
            t = "Q3_K"
        elif quant == "Q2_K_S":
            t = "Q4_K" if il < L // 8 else t
        elif quant == "Q3_K_M":
            t = "Q5_K" if il < L // 16 else "Q4_K"
        elif quant == "Q3_K_L":
            t = "Q5_K"
        elif quant in ("Q4_K_M", "Q5_K_M") and _use_more_bits(il, L):
            t = "Q6_K"
        elif quant == "Q4_K_S" and il < L // 8:
            t = "Q5_K"
    elif name.endswith("attn_output.weight"):
        t = {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(quant, t)
    return _fallback(t, ne)


def _fallback(t, ne):
    """llama.cpp's tensor_type_fallback: rows must split into whole blocks."""
    if int(ne[0]) % block_layout(t)[0] == 0:
        return t
    t = _FALLBACK.get(t, "F16")
    return t if int(ne[0]) % block_layout(t)[0] == 0 else "F16"


def weights_bytes(tensors, quant, cfg) -> dict:
    """tensors: [(name, ne)] -> {"bytes", "bits_per_weight" (effective), "types": {ggml type: tensor count}}"""
    total = n = 0
    types = {}
    for name, ne in tensors:
        t = recipe_type(name, ne, quant, cfg)
        total += tensor_bytes(t, ne)
        e = 1
        for d in ne:
            e *= int(d)
        n += e
        types[t] = types.get(t, 0) + 1
    return {"bytes": total, "bits_per_weight": 8.0 * total / n, "types": types}
