"""ggml arithmetic, end to end: ffnlab.load(path, arith="ggml") against llama.cpp's own numbers
(llama-cpp-python's C API, flash attention off, f16 K/V cache, weights in their file layout:
tests/reference/ggml_cpu_ref.py's llama_logits) on SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M and small random
GGUFs of every type ggml mode computes.

ggml mode follows the code path this CPU's llama.cpp build takes (quant/ggml_path.py): the test
runs on whatever CPU it meets, against the llama-cpp-python the test extra builds for that CPU
(GGML_NATIVE), so an AVX-512 machine checks the AVX-512 transcription and an AVX2 one the AVX2.

The floors: max |logit - llama.cpp| <= 0.02 at every position of the prompt (one
decode); the argmax equal wherever llama.cpp's top-2 margin is >= 0.04; 32 greedy steps equal
up to the first step whose margin is below 0.04; the perplexity equal to 4 significant digits;
verify's default tolerance (1e-3 of each node's max |ref|) passes and still localises an injected
fault. Measured on an Intel Xeon with AVX-512 F/DQ/VNNI/BF16/FP16 (llama-cpp-python 0.3.36,
2026-12-01) and before that on AVX2: every logit of the two models bit-equal (difference 0.0), so
these floors hold with the whole margin to spare; they are the stated floors, not tuned to the
measurement.
"""
import dataclasses

import numpy as np
import pytest

import ggml_cpu_ref as R
from ffnlab.evaluation.perplexity import RunningNLL, chunk_nll, perplexity, text_chunks
from ffnlab.formats.installed import resolve_model
from ffnlab.formats.load import load
from ffnlab.generation.chat import encode_chat, render_chat
from ffnlab.generation.chat_templates import BUILTIN

pytestmark = pytest.mark.slow

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python, the reference engine (scripts/install.sh --test installs it)")

LOGIT_TOL = 0.02
MARGIN = 0.04
PROMPTS = {
    "english": "The Eiffel Tower is located in the city of",
    "chinese": "北京是中国的首都，上海是",
    "paragraph": ("The transformer's feed-forward block applies the same two-layer network to every position: "
                  "it widens the residual stream by a factor of four, applies a nonlinearity, and projects back. "
                  "Most of a small language model's parameters live there, and interpretability work often finds "
                  "that individual neurons respond to recognisable features of the text"),
    "chat": None,                                                  # the model's chat template, one user turn
}


def _model(name):
    try:
        path = resolve_model(name)
    except Exception as e:                                         # not installed on this machine
        pytest.skip(f"{name}: {e}")
    return load(path, arith="ggml")


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def model(request):
    return _model(request.param)


def _ids(m, prompt_name):
    text = PROMPTS[prompt_name]
    if text is None:
        # the file's template (SmolLM2), or ffnlab's built-in one for the family (this Gemma 3 GGUF has none)
        template = m.tokenizer.chat_template or BUILTIN["gemma"]
        text = render_chat(m.tokenizer, [{"role": "user", "content": "What is the capital of France?"}],
                           template=template)
        return encode_chat(m.tokenizer, text)
    return m.tokenizer.encode(text)


def _margin(logits):
    top2 = np.sort(logits, axis=-1)[..., -2:]
    return top2[..., 1] - top2[..., 0]


@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_logits_match_llamacpp_at_every_position(model, prompt):
    ids = _ids(model, prompt)
    ref, _, _ = R.llama_logits(model.source, ids)
    ours = model.forward(ids)                                      # [T, vocab], the whole prompt at once
    assert np.abs(ours - ref).max() <= LOGIT_TOL
    sure = _margin(ref) >= MARGIN
    assert np.array_equal(ours.argmax(-1)[sure], ref.argmax(-1)[sure])


def test_greedy_continuation_matches_llamacpp(model):
    steps = 32
    ids = _ids(model, "english")
    _, ref_ids, ref_logits = R.llama_logits(model.source, ids, steps=steps)
    kv = model.new_cache(n_ctx=len(ids) + steps)
    assert kv.k[0].dtype == np.float16                              # llama.cpp's default K/V type
    logits = model.forward_last(ids, kv)
    ours = []
    for s in range(steps):
        tok = int(np.argmax(logits))
        ours.append(tok)
        logits = model.forward_last([tok], kv)                     # one token per decode, as llama.cpp
        if ref_ids[:s + 1] == ours:
            assert np.abs(logits - ref_logits[s]).max() <= LOGIT_TOL
    m = _margin(ref_logits)
    # the token chosen at step s comes from the previous step's logits (the prompt's last for s = 0)
    first_close = next((s for s in range(steps) if s and m[s - 1] < MARGIN), steps)
    assert ours[:first_close] == ref_ids[:first_close]


# every type ggml mode lays out (quant/ggml_packed*.py) and the row-kernel types (quant/ggml_kernels.py)
RANDOM_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "Q5_1", "Q2_K", "Q3_K", "Q5_K"]


def _random_logits_match(path):
    m = load(path, arith="ggml")
    rng = np.random.default_rng(0)
    for T in (1, 5, 20):
        ids = [int(i) for i in rng.integers(0, m.config.vocab_size, T)]
        ref, _, _ = R.llama_logits(path, ids)
        ours = m.forward(ids)
        assert np.abs(ours - ref).max() <= LOGIT_TOL, T
        sure = _margin(ref) >= MARGIN
        assert np.array_equal(ours.argmax(-1)[sure], ref.argmax(-1)[sure]), T
    _greedy_matches(m, path, ids[:5], 32)


def _greedy_matches(m, path, ids, steps):
    """`steps` greedy tokens, one decode each on both sides (model/decode.py's one-token step
    here), equal up to the first step whose margin is below MARGIN, logits within LOGIT_TOL"""
    _, ref_ids, ref_logits = R.llama_logits(path, ids, steps=steps)
    kv = m.new_cache(n_ctx=len(ids) + steps)
    logits, ours = m.forward_last(ids, kv), []
    for s in range(steps):
        ours.append(int(np.argmax(logits)))
        logits = m.forward_last([ours[-1]], kv)
        if ref_ids[:s + 1] == ours:
            assert np.abs(logits - ref_logits[s]).max() <= LOGIT_TOL, s
    margin = _margin(ref_logits)
    first_close = next((s for s in range(steps) if s and margin[s - 1] < MARGIN), steps)
    assert ours[:first_close] == ref_ids[:first_close]


@pytest.mark.parametrize("qtype", RANDOM_TYPES)
def test_random_gguf_logits_match_llamacpp(tmp_path, qtype):
    """A 2-layer model (d_model 256, d_ff 512, head dim 64) of random qtype blocks, for 1, 5 and 20
    tokens: one token takes ggml_vec_dot_f16 and the row kernels, 5 tinyBLAS for the f16 and Q0
    products, 20 also the tiled K-quant matmul (8+ tokens); then 32 greedy steps."""
    from quant_models import quant_model
    _random_logits_match(quant_model(tmp_path, qtype, n_ctx=256))


@pytest.mark.parametrize("n_head", [8, 32])
def test_small_heads_match_llamacpp(tmp_path, n_head):
    """Head dims 32 and 8: KQ's k is shorter than ggml_vec_dot_f16's step (64 on AVX-512, 32 on
    AVX2), so its products are summed in float64, and 8 is not a multiple of tinyBLAS's 16
    lanes, so an AVX-512 build leaves a 5-token KQ to ggml_vec_dot_f16 too"""
    from quant_models import quant_model
    _random_logits_match(quant_model(tmp_path, "Q8_0", n_ctx=256, n_head=n_head, n_kv_head=n_head // 4))


def test_layernorm_gelu_model_matches_llamacpp(tmp_path):
    """A GPT-2-layout GGUF (LayerNorm with biases, fused QKV, learned positions, GELU) of random
    Q8_0 matrices: ggml_compute_forward_norm_f32's mean and ggml_vec_cvar_f32's variance"""
    from gguf import GGMLQuantizationType as T
    from models import TINY, tiny_gguf
    from quant_blocks import fill_random_blocks

    from ffnlab.config import ModelConfig
    from ffnlab.model.params import param_shapes
    cfg = dict(arch="gpt2", n_layer=2, d_model=256, n_head=4, n_kv_head=4, d_ff=512, ffn="gelu_tanh", ffn_bias=True,
               attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="learned", n_ctx=256,
               tie_embeddings=True)
    matrices = [n for n, sh in param_shapes(ModelConfig(**{**TINY, **cfg})).items() if len(sh) == 2 and "pos" not in n]
    path = tiny_gguf(tmp_path / "gpt2.gguf", tensor_types={n: T.Q8_0 for n in matrices},
                     meta={"attention.layer_norm_epsilon": 1e-5}, **cfg)
    _random_logits_match(fill_random_blocks(path))


def test_perplexity_equals_llamacpps_to_4_digits(model):
    text = " ".join([PROMPTS["paragraph"]] * 3)
    chunks = text_chunks(model, text, n_ctx=48, n_chunks=2)        # llama-perplexity's chunks and BOS rule
    ours = perplexity(model, chunks, batch=2).ppl
    ref = RunningNLL()
    for c in chunks:
        logits, _, _ = R.llama_logits(model.source, c)
        ref.add(chunk_nll(logits[None], c[None]))
    digit = 10.0 ** (np.floor(np.log10(ref.ppl)) - 3)             # the 4th significant digit's unit
    assert abs(ours - ref.ppl) <= 0.5 * digit, f"ffnlab {ours:.6f} vs llama.cpp {ref.ppl:.6f}"


def test_verify_passes_at_the_default_tolerance(model):
    from ffnlab.tracing.verify import verify
    ids = _ids(model, "english")
    report = verify(model, ids, "llama.cpp")
    assert report.rtol == 1e-3 and report.passed, "\n".join(r.name for r in report.rows if r.ok is False)


@pytest.fixture(scope="module")
def smol_reference():
    from ffnlab.tracing.verify import reference_nodes
    m = _model("smollm2")
    ids = m.tokenizer.encode(PROMPTS["paragraph"])        # later positions turn a base change into larger angles
    return m, ids, reference_nodes("llama.cpp", m.source, ids, arch=m.config.arch)


def _verify_with(m, ids, reference, **change):
    from ffnlab.tracing.verify import verify
    cfg = m.config
    m.config = dataclasses.replace(cfg, **change)
    try:
        return verify(m, ids, "llama.cpp", reference=reference)
    finally:
        m.config = cfg


def test_verify_names_the_rope_when_its_base_is_off_by_1_percent(smol_reference):
    """Over a 60-token prompt the rotation moves Qcur-0 past 1e-3 (1.1e-3 at 13 tokens; less on a
    shorter prompt, where the first node past the tolerance is a later one and first_diff still
    names the RoPE)."""
    m, ids, ref = smol_reference
    report = _verify_with(m, ids, ref, rope_theta=m.config.rope_theta * 1.01)
    assert not report.passed
    assert (report.first_bad.name, report.first_bad.op) == ("Qcur-0", "ROPE")
    assert (report.first_diff.name, report.first_diff.op) == ("Qcur-0", "ROPE")


def test_verify_names_the_norm_when_its_eps_is_wrong(smol_reference):
    """SmolLM2's eps is 1e-5; run it with 1e-6. The first RMSNorm moves by a few 1e-6 (within
    1e-3), so the first node past the tolerance is a later one; the first node that is not
    bit-equal is the norm itself, and verify names both."""
    m, ids, ref = smol_reference
    report = _verify_with(m, ids, ref, norm_eps=1e-6)
    assert not report.passed
    assert (report.first_diff.name, report.first_diff.op) == ("norm-0", "RMS_NORM")
    assert report.first_diff.rel < 1e-3 < report.first_bad.rel
