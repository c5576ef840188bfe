"""A tiny mixture-of-experts configuration and its random float parameters, shared by the MoE tests
and scripts/trace_hashes.py."""
import numpy as np
from ffnlab.config import ModelConfig
from ffnlab.model.params import param_shapes


def moe_config(shared=False, norm=True, E=6, K=2, **kw):
    base = dict(arch="llama", n_layer=2, d_model=16, n_head=4, n_kv_head=2, d_ff=24,
                ffn="moe", n_expert=E, n_expert_used=K, expert_norm=norm, d_ff_shexp=20 if shared else 0,
                norm="rmsnorm", positions="rope", rope_pairing="neox", vocab_size=37, n_ctx=16,
                tie_embeddings=False)
    base.update(kw)
    return ModelConfig(**base)


def random_params(cfg, dtype=np.float32, seed=0):
    """Matrices N(0, 1/fan_in) (fan_in = the last axis, also for stacked [E, out, in] experts),
    norms 1 + N(0, 0.2^2), the router and the shared gate large enough that routing is decisive."""
    r = np.random.default_rng(seed)
    p = {}
    for name, shape in param_shapes(cfg).items():
        if "norm" in name:
            a = 1.0 + 0.2 * r.normal(size=shape)
        elif name == "token_embd.weight":
            a = 0.5 * r.normal(size=shape)
        else:
            a = r.normal(size=shape) / np.sqrt(shape[-1])
            if "gate_inp" in name:
                a *= 3.0
        p[name] = a.astype(dtype)
    return p


MOE_TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"


def byte_moe_model():
    """A 2-layer mixture of 5 experts (2 per token) with the byte tokenizer: the expert-scan tests' model."""
    from ffnlab.model import Model
    from ffnlab.training.data import byte_tokenizer
    cfg = moe_config(E=5, K=2, vocab_size=256, n_ctx=128)
    return Model(cfg, random_params(cfg), tokenizer=byte_tokenizer())
