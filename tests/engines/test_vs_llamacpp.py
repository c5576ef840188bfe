"""SmolLM2 and Gemma 3 vs llama.cpp (llama-cpp-python) on the same GGUF file, logits at every position.

llama.cpp rounds activations to 8 bits inside its quantized matmuls (Q4_1 and Q4_K weights are
multiplied with Q8_1 / Q8_K activations), so it is not the same float function as ffnlab or
transformers, which dequantize the weights and multiply in float32. What is asked of them:
  floors, on every prompt: argmax agreement >= 85% of positions, mean cosine >= 0.998, min cosine >= 0.99;
  and ffnlab at least as close to llama.cpp as transformers (same file, same ids) is.
"At least as close" is checked per prompt with a margin for float32 noise: ffnlab's argmax
agreement may be lower by at most one position, its mean cosine by at most 1e-5, its min
cosine by at most 1e-4 (ffnlab and transformers differ by < 1e-3 in logits, which moves
cosines by ~1e-7).
The floors are not a property of the engine alone: on some texts transformers itself is below
them (seen on Intel: SmolLM2 min cosine 0.985-0.989 at one position of the "numbers" prompt and of
two Chinese sentences; Gemma 3 argmax agreement 6 of 8 on the shortest Chinese sentence). Which
prompts those are depends on the CPU, because llama.cpp's 8-bit activation rounding runs through
different kernels (AMX, AVX-512, AVX2) that round differently: on AMD EPYC (AVX-512) transformers
reaches the floors on "numbers". So no list is kept: where transformers (the float32 function
ffnlab computes too) misses a floor, ffnlab is held to being as close as transformers (the next
test); on every other prompt, ffnlab must reach the floors, and that must be most prompts.
That the gap is only llama.cpp's activation rounding is checked directly on SmolLM2: on an F32
copy of the same file (every tensor dequantized by gguf.quants and written back as F32), llama.cpp's
logits equal ffnlab's within 1e-3 at every position, the prompts below the floors included. (Not on
Gemma 3: there llama.cpp's fp16 GELU lookup table and its RoPE angles, accumulated in float32 over 128
frequencies, move the F32 logits by up to 7e-2 at 565 tokens; Gemma's float32 function is checked
against transformers, past the sliding window too, in test_real_models.py.)
Architectures without a real file here (qwen2: q/k/v biases, neox RoPE; llama with GQA) are checked
on small random F32 GGUFs written with gguf.GGUFWriter: llama.cpp's logits within 1e-3 of ffnlab's.
llama.cpp runs with use_extra_bufts=False, flash attention off and an f32 KV cache (models.LlamaCpp).
"""
import numpy as np
import pytest

import models as M

pytestmark = pytest.mark.slow

ARGMAX_FLOOR, COS_MEAN_FLOOR, COS_MIN_FLOOR = 0.85, 0.998, 0.99
COS_MEAN_MARGIN, COS_MIN_MARGIN = 1e-5, 1e-4
F32_TOL = 1e-3


def texts(name):
    return {**M.prompts(name), **M.HARD_PROMPTS}


def closeness(name, text):
    lcpp = M.logits("llama_cpp", name, text)
    return M.agreement(M.logits("ours", name, text), lcpp), M.agreement(M.logits("hf", name, text), lcpp)


def misses_a_floor(a):
    return a["argmax"] < ARGMAX_FLOOR or a["cos_mean"] < COS_MEAN_FLOOR or a["cos_min"] < COS_MIN_FLOOR


@pytest.mark.parametrize("name", M.MODELS)
def test_logits_reach_the_floors_against_llama_cpp(name):
    held = 0
    for label, text in texts(name).items():
        ours, hf = closeness(name, text)
        if misses_a_floor(hf):
            continue                                            # the float32 function itself is below
        assert ours["argmax"] >= ARGMAX_FLOOR, f"{name} {label}: {ours}"
        assert ours["cos_mean"] >= COS_MEAN_FLOOR, f"{name} {label}: {ours}"
        assert ours["cos_min"] >= COS_MIN_FLOOR, f"{name} {label}: {ours}"
        held += 1
    assert held >= 4 and held >= len(texts(name)) // 2, f"{name}: the floors hold on only {held} prompts"


@pytest.mark.parametrize("name", M.MODELS)
def test_at_least_as_close_to_llama_cpp_as_transformers(name):
    for label, text in texts(name).items():
        ours, hf = closeness(name, text)
        one_position = 1.0 / len(M.prompt_ids(name, text))
        assert ours["argmax"] >= hf["argmax"] - one_position - 1e-12, f"{name} {label}: ffnlab {ours}, hf {hf}"
        assert ours["cos_mean"] >= hf["cos_mean"] - COS_MEAN_MARGIN, f"{name} {label}: ffnlab {ours}, hf {hf}"
        assert ours["cos_min"] >= hf["cos_min"] - COS_MIN_MARGIN, f"{name} {label}: ffnlab {ours}, hf {hf}"


def test_same_vocabulary_and_ids_as_llama_cpp():
    """The engines are compared on ffnlab's ids: llama.cpp must read them as the same tokens."""
    for name in M.MODELS:
        lcpp = M.llama_cpp(name)
        assert lcpp.n_vocab == M.ours(name).config.vocab_size
        for text in texts(name).values():
            assert list(M.prompt_ids(name, text)) == lcpp.tokenize(text)


def test_f32_copy_gives_llama_cpp_logits_within_1e_3():
    name = "smollm2"
    for label, text in texts(name).items():
        ids = list(M.prompt_ids(name, text))
        ref = M.llama_cpp_f32(name).logits(ids)
        diff = np.abs(M.logits("ours", name, text) - ref).max(-1)   # [T]
        assert diff.max() <= F32_TOL, f"{name} {label}: max |logit diff| {diff.max():.2e} at position {diff.argmax()}"


@pytest.mark.parametrize("arch,extra", [("llama", {}), ("qwen2", dict(attn_bias=True, rope_pairing="neox")),
                                        ("llama", dict(tie_embeddings=False, n_kv_head=1))],
                         ids=["llama-gqa", "qwen2-biases", "llama-untied-mqa"])
def test_small_f32_gguf_gives_llama_cpp_logits(tmp_path, arch, extra):
    import ffnlab
    path = M.tiny_gguf(tmp_path / "m.gguf", arch=arch, seed=3, **extra)
    model = ffnlab.load(path, progress=False)
    assert model.config.arch == arch and model.config.attn_bias == ("attn_bias" in extra)
    text = "hello, tiny model! 12345"
    ids = model.tokenizer.encode(text)
    lcpp = M.LlamaCpp(path, n_ctx=32)
    assert lcpp.tokenize(text) == ids and len(ids) == len(text.encode()) - 2     # "he", "ll" merged
    ref, ours = lcpp.logits(ids), model.forward(ids)
    assert np.abs(ref).max() > 1.0
    assert np.abs(ours - ref).max() <= F32_TOL, f"{arch}: max |logit diff| {np.abs(ours - ref).max():.2e}"
