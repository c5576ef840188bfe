"""Shared by the export tests: small checkpoints whose weights make every part of the model
matter (init-scale weights would leave attention uniform and logits near zero)."""
import numpy as np

from ffnlab.config import ModelConfig
from ffnlab.training.checkpoint import save_model
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

GPT2 = dict(arch="gpt2", n_layer=2, d_model=64, n_head=4, d_ff=256, ffn="gelu_tanh", ffn_bias=True, attn_bias=True,
            attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="learned", vocab_size=256, n_ctx=64,
            tie_embeddings=True)
LLAMA = dict(arch="llama", n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_ff=96, ffn="swiglu", norm="rmsnorm",
             positions="rope", rope_pairing="normal", vocab_size=256, n_ctx=64, tie_embeddings=False)
PROMPT = "Hello, world! The quick brown fox jumps; naïve café 😀."


def config(base, **kw):
    return ModelConfig(**{**base, **kw})


def lively_params(cfg, seed=0):
    """Matrices N(0, 1/fan_in), norms 1 + N(0, 0.2^2), biases N(0, 0.2^2), embeddings N(0, 0.3^2)."""
    from block_checks import random_params
    return random_params(cfg, np.float32, seed)


def make_checkpoint(path, cfg, tok=None, tok_meta=None, seed=0):
    tok = tok or byte_tokenizer()
    params = lively_params(cfg, seed)
    save_model(str(path), cfg, params, tok, tok_meta or tokenizer_meta(tok, "byte"))
    return params, tok
