"""The one-token step (model/decode.py, what generation runs) is the block's forward for one token,
bit for bit: for every family's tiny model, in both arithmetics, each decoded token's logits equal
those of Model.forward over that one token against the same cache. The step exists for speed
only (a one-token forward with nothing hooked, without the batched forward's per-call overhead),
so it must run the forward's kernels in the forward's order; any difference is a second forward."""
import dataclasses

import numpy as np
import pytest
from block_checks import CONFIGS, random_params
from moe_models import moe_config
from moe_models import random_params as moe_params

from ffnlab.model import Model
from ffnlab.threads import set_threads

MODELS = {arch: (cfg, lambda cfg=cfg: random_params(cfg)) for arch, cfg in CONFIGS.items()}
MODELS["moe_shexp"] = (moe_config(shared=True), lambda: moe_params(moe_config(shared=True)))
_granite = dataclasses.replace(CONFIGS["llama"], arch="granite", embedding_multiplier=3.0, residual_multiplier=0.4,
                               logits_scaling=2.5, attn_scale=0.09)
MODELS["granite"] = (_granite, lambda: random_params(_granite))
_smollm3 = dataclasses.replace(CONFIGS["llama"], arch="smollm3", n_layer=4, no_rope_layer_step=4)
MODELS["smollm3"] = (_smollm3, lambda: random_params(_smollm3))
_llama64 = CONFIGS["llama"]
MODELS["llama_float64"] = (_llama64, lambda: random_params(_llama64, dtype=np.float64))


@pytest.fixture(autouse=True)
def one_thread():
    set_threads(1)


@pytest.mark.parametrize("arith", ["f32", "ggml"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_each_decoded_token_is_the_one_token_forward(name, arith):
    cfg, make = MODELS[name]
    if arith == "ggml" and name == "llama_float64":
        pytest.skip("ggml arithmetic computes in float32: a float64 model has no ggml counterpart")
    model = Model(cfg, make(), arith=arith)
    ids = np.random.default_rng(len(name)).integers(0, cfg.vocab_size, size=min(16, cfg.n_ctx))
    prompt, steps = ids[:5], ids[5:]                          # decoding past every sliding window (3 and 5)
    kv_step, kv_fwd = model.new_cache(), model.new_cache()
    model.forward_last(prompt, kv_step)                       # the same prefill into both caches
    model.forward_last(prompt, kv_fwd)
    for i, tok in enumerate(steps):
        step = model.forward_last(np.asarray([tok]), kv_step)
        fwd = model.forward(np.asarray([tok]), kv=kv_fwd, last_only=True)[-1]
        assert step.dtype == fwd.dtype
        assert np.array_equal(step.view(np.uint8), fwd.view(np.uint8)), \
            f"{name}/{arith}: token {i} differs by up to {np.abs(step - fwd).max():.3g}"
    for il in range(cfg.n_layer):                             # and the two caches hold the same bits
        n = kv_step.n
        assert np.array_equal(kv_step.k[il][:, :, :n], kv_fwd.k[il][:, :, :n])
        assert np.array_equal(kv_step.v[il][:, :, :n], kv_fwd.v[il][:, :, :n])


# the real models' head shapes (SmolLM2: 9 heads over 3 of 64; Gemma 3: 4 over 1 of 256): the
# reassociated sums of the attention's kernel round by their length, so a step that compiles them
# otherwise than the forward (another kernel, or the same one inlined elsewhere) shows only once
# the cache holds some dozens of positions, past the tiny models' 24
LONG = {"llama_9x3x64": dataclasses.replace(CONFIGS["llama"], d_model=96, n_head=9, n_kv_head=3, head_dim=64,
                                             n_ctx=160),
        "gemma3_4x1x256": dataclasses.replace(CONFIGS["gemma3"], n_head=4, n_kv_head=1, head_dim=256, n_ctx=160,
                                               sliding_window=100)}


@pytest.mark.parametrize("name", sorted(LONG))
def test_decoding_150_positions_is_the_forward(name):
    cfg = LONG[name]
    model = Model(cfg, random_params(cfg))
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, size=cfg.n_ctx - 10)
    kv_step, kv_fwd = model.new_cache(), model.new_cache()
    model.forward_last(ids[:2], kv_step)
    model.forward_last(ids[:2], kv_fwd)
    for i, tok in enumerate(ids[2:]):
        step = model.forward_last(np.asarray([tok]), kv_step)
        fwd = model.forward(np.asarray([tok]), kv=kv_fwd, last_only=True)[-1]
        assert np.array_equal(step.view(np.uint8), fwd.view(np.uint8)), \
            f"{name}: position {i + 2} differs by up to {np.abs(step - fwd).max():.3g}"
