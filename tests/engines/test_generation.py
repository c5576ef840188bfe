"""Generation: the KV cache, the stopping rules, llama.cpp's samplers, seeds and chat templates.

References: a full forward over the whole sequence (the cache), llama.cpp's own sampler
implementations called through llama-cpp-python (the candidate sets kept by top-k, top-p, min-p
and the repeat penalty), the softmax of the logits (what is drawn), and SmolLM2's published
ChatML format (the chat template).
"""
import ctypes

import numpy as np
import pytest

import models as M
from ffnlab.config import ModelConfig
from ffnlab.errors import UsageError
from ffnlab.generation import SamplingParams, generate, sample
from ffnlab.generation.sampling import most_likely
from ffnlab.generation.chat import encode_chat, render_chat
from ffnlab.model import Model
from tolerances import f32_atol

pytestmark = pytest.mark.slow

# small random models: GQA + normal RoPE, Gemma-3-like (sliding window 4 on every other layer,
# q/k norms, post norms, GeGLU), GPT-2 (learned positions, fused qkv)
LLAMA = ModelConfig(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=48, ffn="swiglu",
                    norm="rmsnorm", positions="rope", vocab_size=50, n_ctx=64)
GEMMA = ModelConfig(arch="gemma3", n_layer=2, d_model=32, n_head=2, n_kv_head=1, head_dim=16, d_ff=48, ffn="geglu",
                    norm="rmsnorm", positions="rope", rope_pairing="neox", post_attn_norm=True, post_ffn_norm=True,
                    qk_norm=True, embed_scale=True, sliding_window=4, sliding_window_pattern=2,
                    rope_theta_local=10000.0, rope_theta=1e6, vocab_size=50, n_ctx=64)
GPT2 = ModelConfig(arch="gpt2", n_layer=2, d_model=32, n_head=4, d_ff=64, ffn="gelu_tanh", ffn_bias=True,
                   attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="learned",
                   vocab_size=50, n_ctx=64)
QWEN2 = ModelConfig(arch="qwen2", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=48, ffn="swiglu",
                    attn_bias=True, norm="rmsnorm", positions="rope", rope_pairing="neox", vocab_size=50, n_ctx=64)
IDS = [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 23, 8]


# --- KV cache ------------------------------------------------------------------------------------

def with_random_biases(params, seed=0):
    """init_params zeroes every bias, which would hide a bias the one-token path forgets."""
    rng = np.random.default_rng(seed)
    for name in [n for n in params if n.endswith(".bias")]:
        params[name] = rng.normal(0.0, 0.5, params[name].shape).astype(params[name].dtype)
    return params


@pytest.mark.parametrize("packed", [False, True], ids=["separate", "packed"])
@pytest.mark.parametrize("cfg", [LLAMA, GEMMA, GPT2, QWEN2], ids=["llama", "gemma3-swa", "gpt2", "qwen2"])
def test_cached_steps_equal_a_full_recompute(cfg, packed):
    """Prefill 5 tokens, then one token per step (model/decode.py's one-token path): each step's
    logits equal the full forward's row at that position (the Gemma case runs 9 steps past its
    window of 4), with q/k/v and gate/up as separate matrices and packed into one."""
    model = Model(cfg, with_random_biases(Model.random(cfg, seed=1).params), pack_weights=packed)
    full = model.forward(IDS)                                    # [T, vocab]
    assert np.abs(full).max() > 0.1
    kv = model.new_cache(n_ctx=len(IDS))
    steps = [model.forward_last(IDS[:5], kv)] + [model.forward_last([t], kv) for t in IDS[5:]]
    np.testing.assert_allclose(np.stack(steps), full[4:], rtol=0, atol=f32_atol(cfg, full))


def test_one_token_path_equals_the_general_forward():
    """decode_step against forward() on the same cache state, step by step, to float32 rounding;
    a batch-2 cache and an attached tracer take the general path."""
    from ffnlab.model.transformer import forward
    model = Model(LLAMA, Model.random(LLAMA, seed=4).params, pack_weights=True)
    kv_fast, kv_ref = model.new_cache(n_ctx=len(IDS)), model.new_cache(n_ctx=len(IDS))
    model.forward_last(IDS[:3], kv_fast), model.forward_last(IDS[:3], kv_ref)
    for t in IDS[3:]:
        fast = model.forward_last([t], kv_fast)
        ref = forward(model.params, model.config, [[t]], kv=kv_ref, last_only=True, weights=model.weights())[0][0, -1]
        np.testing.assert_allclose(fast, ref, rtol=0, atol=f32_atol(LLAMA, ref))
    assert kv_fast.n == kv_ref.n == len(IDS)
    np.testing.assert_allclose(kv_fast.k[1], kv_ref.k[1], rtol=0, atol=f32_atol(LLAMA, kv_ref.k[1]))   # same keys


def test_one_token_path_with_only_some_qkv_biases():
    """A q and v bias without a k bias (an edited checkpoint): the one-token path adds none to k."""
    params = with_random_biases(Model.random(QWEN2, seed=6).params)
    del params["blk.0.attn_k.bias"]
    model = Model(QWEN2, params, pack_weights=True)
    full = model.forward(IDS[:6])
    kv = model.new_cache(n_ctx=6)
    steps = [model.forward_last(IDS[:3], kv)] + [model.forward_last([t], kv) for t in IDS[3:6]]
    np.testing.assert_allclose(np.stack(steps), full[2:], rtol=0, atol=f32_atol(QWEN2, full))


def test_one_token_path_sees_replaced_weights():
    """The model keeps its weight records (model/weights.py); replacing a params entry reads them again."""
    model = Model(LLAMA, Model.random(LLAMA, seed=5).params, pack_weights=True)
    kv = model.new_cache(n_ctx=4)
    before = model.forward_last([1], kv)
    model.params["blk.1.ffn_down.weight"] = model.params["blk.1.ffn_down.weight"] * 3.0
    kv.clear()
    after = model.forward_last([1], kv)
    expected = model.forward([1])[0]
    np.testing.assert_allclose(after, expected, rtol=0, atol=f32_atol(LLAMA, expected))
    assert np.abs(after - before).max() > 1e-3


def test_one_token_path_sees_a_bias_updated_in_place():
    """A training step updates a params array in place (its id unchanged): the one-token path reads
    the new values, as the full forward does."""
    model = Model(QWEN2, with_random_biases(Model.random(QWEN2, seed=7).params), pack_weights=True)
    kv = model.new_cache(n_ctx=4)
    before = model.forward_last([1], kv)
    model.params["blk.0.attn_v.bias"] += 1.0
    kv.clear()
    after = model.forward_last([1], kv)
    expected = model.forward([1])[0]
    np.testing.assert_allclose(after, expected, rtol=0, atol=f32_atol(QWEN2, expected))
    assert np.abs(after - before).max() > 1e-3


@pytest.mark.slow
def test_cached_steps_equal_a_full_recompute_on_smollm2():
    model = M.ours("smollm2")
    ids = list(M.prompt_ids("smollm2", M.PROMPTS["english"]))
    full = M.logits("ours", "smollm2", M.PROMPTS["english"])
    kv = model.new_cache(n_ctx=len(ids))
    steps = [model.forward_last(ids[:-3], kv)] + [model.forward_last([t], kv) for t in ids[-3:]]
    np.testing.assert_allclose(np.stack(steps), full[-4:], rtol=0, atol=1e-4)


# --- stopping and streaming ----------------------------------------------------------------------

class ScriptedTokenizer:
    eot_ids = {0}

    def decode(self, ids):
        return "".join(chr(ord("a") + i) for i in ids)


class ScriptedModel:
    """Whatever the input, the next token is script[step]: generate's control flow in isolation."""

    def __init__(self, script, n_ctx=64):
        self.script, self.calls = list(script), []
        self.config = ModelConfig(arch="llama", n_layer=1, d_model=4, n_head=1, d_ff=4, ffn="swiglu", vocab_size=26,
                                  n_ctx=n_ctx)
        self.tokenizer = ScriptedTokenizer()

    def new_cache(self, n_ctx=None):
        return None

    def forward_last(self, ids, kv):
        self.calls.append(list(ids))
        logits = np.zeros(26, np.float32)
        logits[self.script[len(self.calls) - 1]] = 10.0
        return logits


def test_generation_stops_at_an_end_of_turn_token():
    model = ScriptedModel([5, 6, 7, 0, 8])
    out = generate(model, [1, 2, 3], n_predict=10, params=SamplingParams(temp=0))
    assert out.ids == [5, 6, 7] and out.stop_reason == "eos" and out.text == "fgh"
    assert model.calls == [[1, 2, 3], [5], [6], [7]]            # prefill, then one token per step
    assert (out.timings.prompt_tokens, out.timings.eval_tokens) == (3, 3)


def test_generation_stops_at_max_tokens_and_streams_the_text():
    model = ScriptedModel([5, 6, 7, 8, 9])
    pieces = []
    out = generate(model, [1], n_predict=4, params=SamplingParams(temp=0), on_token=lambda i, s: pieces.append(s))
    assert out.ids == [5, 6, 7, 8] and out.stop_reason == "length"
    assert "".join(pieces) == out.text == "fghi"
    assert len(model.calls) == 4                                 # the 4th token needs no forward after it


def test_generation_refuses_a_prompt_as_long_as_the_context():
    with pytest.raises(UsageError, match="16 tokens, the model's context length is 16"):
        generate(ScriptedModel([1], n_ctx=16), list(range(1, 17)), n_predict=4)


def test_same_seed_same_text_other_seed_other_text():
    model = Model.random(LLAMA, seed=2)
    params = dict(temp=1.5, top_k=0, top_p=1.0, min_p=0.0)
    a = model.generate([1, 2, 3], 24, seed=7, **params).ids
    assert model.generate([1, 2, 3], 24, seed=7, **params).ids == a
    assert model.generate([1, 2, 3], 24, seed=8, **params).ids != a


# --- samplers vs llama.cpp's ----------------------------------------------------------------------

def llama_cpp_survivors(logits, top_k=0, top_p=1.0, min_p=0.0, penalty=1.0, last_n=64, history=()):
    """Apply llama.cpp's penalties -> top-k -> top-p -> min-p samplers (the common sampler order)
    to logits [V] -> (surviving ids as a set, their logits after the penalty)."""
    L = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
    V = len(logits)
    chain = []
    if penalty != 1.0:
        chain.append(L.llama_sampler_init_penalties(V, last_n, penalty, 0.0, 0.0))
    if top_k > 0:
        chain.append(L.llama_sampler_init_top_k(top_k))
    if top_p < 1.0:
        chain.append(L.llama_sampler_init_top_p(top_p, 1))
    if min_p > 0.0:
        chain.append(L.llama_sampler_init_min_p(min_p, 1))
    data = (L.llama_token_data * V)(*[L.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)])
    arr = L.llama_token_data_array(ctypes.cast(data, ctypes.POINTER(L.llama_token_data)), V, -1, False)
    for s in chain:
        for t in history:
            L.llama_sampler_accept(s, int(t))
        L.llama_sampler_apply(s, ctypes.byref(arr))
    kept = {arr.data[i].id: arr.data[i].logit for i in range(arr.size)}
    for s in chain:
        L.llama_sampler_free(s)
    return set(kept), kept


def drawn(logits, n=3000, seed=0, history=(), **kw):
    """The set of ids sample() draws in n tries at temperature 100 (near-uniform over what survives)."""
    rng = np.random.default_rng(seed)
    p = SamplingParams(temp=100.0, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **kw})
    return {sample(logits, p, rng, list(history)) for _ in range(n)}


LOGITS = np.log(np.array([0.30, 0.22, 0.15, 0.11, 0.08, 0.05, 0.04, 0.03, 0.015, 0.005]))[np.array(
    [3, 0, 7, 1, 9, 4, 2, 8, 6, 5])]                            # a shuffled, known distribution


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_k=3), dict(top_p=0.5), dict(top_p=0.7), dict(top_p=0.9),
                                dict(min_p=0.2), dict(min_p=0.45), dict(top_k=6, top_p=0.9, min_p=0.3)],
                         ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_candidate_sets_equal_llama_cpp_samplers(kw):
    expected, _ = llama_cpp_survivors(LOGITS, **kw)
    assert drawn(LOGITS, **kw) == expected


def test_top_k_by_partition_equals_a_stable_sort():
    """most_likely() (a partition, O(vocab)) gives the first k of a stable descending argsort,
    ties at the k-th value broken by lower id, on random logits with and without heavy ties."""
    rng = np.random.default_rng(0)
    for trial in range(200):
        n, k = int(rng.integers(1, 3000)), int(rng.integers(-1, 60))
        x = rng.integers(-4, 4, n).astype(np.float64) if trial % 2 else rng.standard_normal(n)
        full = np.argsort(-x, kind="stable")
        assert np.array_equal(most_likely(x, k), full if k <= 0 else full[:k]), (n, k)


def test_top_k_on_a_real_vocabulary_size_equals_llama_cpp():
    logits = np.random.default_rng(1).normal(size=4096) * 3
    expected, _ = llama_cpp_survivors(logits, top_k=40)
    assert set(most_likely(logits, 40).tolist()) == expected


def test_candidate_sets_by_hand():
    """The documented rules on the sorted distribution 0.30 0.22 0.15 0.11 0.08 0.05 ...
    (ids 1, 3, 6, 0, 5, 9, 8, 2, 7, 4 in that order)."""
    assert drawn(LOGITS, top_k=1) == {1}                                   # the argmax only
    assert drawn(LOGITS, top_p=0.5) == {1, 3}                              # 0.30 + 0.22 >= 0.5
    assert drawn(LOGITS, top_p=0.53) == {1, 3, 6}                          # 0.52 < 0.53
    assert drawn(LOGITS, min_p=0.49) == {1, 3, 6}                          # p >= 0.49 * 0.30 = 0.147
    assert drawn(LOGITS, min_p=0.34) == {1, 3, 6, 0}                       # p >= 0.102


def test_greedy_is_the_argmax_whatever_the_filters():
    rng = np.random.default_rng(0)
    for k in range(20):
        logits = rng.normal(size=100)
        assert sample(logits, SamplingParams(temp=0.0, top_k=5, top_p=0.5, min_p=0.2), rng) == int(np.argmax(logits))
        assert sample(logits, SamplingParams(temp=0.7, top_k=1), rng) == int(np.argmax(logits))


def test_draws_follow_the_softmax_at_the_temperature():
    """No filters: 20000 draws at T=0.7 match softmax(logits / 0.7) within 4 standard errors."""
    n, temp = 20000, 0.7
    rng = np.random.default_rng(1)
    counts = np.bincount([sample(LOGITS, SamplingParams(temp=temp, top_k=0, top_p=1.0, min_p=0.0), rng)
                          for _ in range(n)], minlength=len(LOGITS))
    p = np.exp(LOGITS / temp) / np.exp(LOGITS / temp).sum()
    assert np.all(np.abs(counts / n - p) <= 4 * np.sqrt(p * (1 - p) / n) + 1e-9), (counts / n, p)


def test_repeat_penalty_equals_llama_cpp():
    """Of the last repeat_last_n tokens, a positive logit is divided by the penalty, a negative one
    multiplied (llama.cpp's penalties sampler, frequency and presence penalties off)."""
    from ffnlab.generation.sampling import apply_repeat_penalty
    logits = LOGITS + 2.5                                               # both signs
    history = [1, 5, 5, 9, 3, 4]                                       # id 1: too far back
    _, theirs = llama_cpp_survivors(logits, penalty=1.3, last_n=4, history=history)
    ours = apply_repeat_penalty(logits, history[-4:], 1.3)
    np.testing.assert_allclose(ours, [theirs[i] for i in range(len(logits))], rtol=1e-6)
    assert logits[3] > 0 > logits[9]
    assert ours[1] == logits[1] and ours[3] == logits[3] / 1.3 and ours[9] == logits[9] * 1.3
    rng = np.random.default_rng(0)                                      # and sample() applies it
    favourite = int(np.argmax(logits))
    assert sample(logits, SamplingParams(temp=0, repeat_penalty=50.0), rng, [favourite]) != favourite
    assert sample(logits, SamplingParams(temp=0, repeat_penalty=50.0, repeat_last_n=1), rng, [favourite, 0]) == favourite


# --- chat templates ------------------------------------------------------------------------------

@pytest.mark.slow
def test_smollm2_chat_template_renders_chatml():
    """SmolLM2's tokenizer.chat_template gives the ChatML text the model card shows, with its
    default system prompt when none is given; the ids parse <|im_start|> / <|im_end|> as one id each."""
    tok = M.ours("smollm2").tokenizer
    text = render_chat(tok, [{"role": "user", "content": "Hi"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    own = render_chat(tok, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert own == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    ids = encode_chat(tok, own)
    assert ids == M.llama_cpp("smollm2").tokenize(own) and ids.count(tok.tk.token_to_id("<|im_start|>")) == 3


@pytest.mark.slow
def test_gemma3_gguf_has_no_chat_template_and_says_so():
    tok = M.ours("gemma3").tokenizer
    assert tok.chat_template is None
    with pytest.raises(UsageError, match="no chat template"):
        render_chat(tok, [{"role": "user", "content": "Hi"}])
