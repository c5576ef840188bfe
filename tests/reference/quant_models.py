"""A tiny GGUF model whose weights are random quantized blocks of one type, shared by
test_quant_model.py, test_pack_cache.py and test_warmup.py."""
from gguf import GGMLQuantizationType as T
from models import tiny_gguf
from quant_blocks import fill_random_blocks
from ffnlab.model.params import param_shapes


# d_model and d_ff multiples of 256 so every type (the K-quants' 256-weight blocks) fits a row
SHAPE = dict(d_model=256, d_ff=512, n_head=4, n_kv_head=2, n_ctx=64)


def quant_model(tmp_path, qtype, name="q.gguf", **shape):
    """A tiny llama-family GGUF with every weight matrix (embedding included) as random qtype blocks."""
    cfg = {**SHAPE, **shape}
    from ffnlab.config import ModelConfig
    from models import TINY
    matrices = [n for n, s in param_shapes(ModelConfig(**{**TINY, **cfg})).items() if len(s) == 2]
    path = tiny_gguf(tmp_path / name, tensor_types={n: T[qtype] for n in matrices}, **cfg)
    return fill_random_blocks(path)
