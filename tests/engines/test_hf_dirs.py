"""ffnlab.load(dir) on Hugging Face directories written by transformers: logits equal transformers'.

Each test builds a small random model with transformers (GPT2LMHeadModel, LlamaForCausalLM with
grouped-query attention, Qwen2ForCausalLM), saves it with save_pretrained(safe_serialization=True)
and compares ffnlab's float32 logits for every position with the same model's PyTorch forward:
<= 1e-4 absolute. The weights are re-drawn with a large spread (norm weights around 1, matrices
with std 0.25) so that the logits are O(1-10) and a transposed or mis-paired weight cannot hide.
The ids run past position 0, where a wrong RoPE pairing would show.
"""
import json

import numpy as np
import pytest

import ffnlab

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hf_dense_models import randomize  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
VOCAB = 300
IDS = [3, 17, 250, 9, 42, 0, 101, 7, 299, 64, 5, 12, 77, 180]


def reference_logits(model, ids=IDS):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def check(model_dir, ref):
    m = ffnlab.load(str(model_dir), progress=False)
    ours = m.forward(IDS)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert np.abs(ref).max() > 1.0                               # the comparison is not between near-zeros
    err = np.abs(ours - ref).max()
    assert err <= TOL, f"max |ffnlab - transformers| = {err:.2e}"
    return m


def gpt2(seed=0):
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return randomize(transformers.GPT2LMHeadModel(cfg), seed)


def test_gpt2_dir_with_transformer_prefix(tmp_path):
    model = gpt2()
    model.save_pretrained(tmp_path, safe_serialization=True)
    from safetensors.numpy import load_file
    assert all(k.startswith("transformer.") for k in load_file(tmp_path / "model.safetensors"))
    m = check(tmp_path, reference_logits(model))
    assert m.config.arch == "gpt2" and m.config.fused_qkv and m.config.tie_embeddings


def test_gpt2_dir_without_prefix_and_with_mask_buffers(tmp_path):
    """GPT2Model-style keys (h.0.attn.c_attn.weight, no `transformer.`), as in the original
    openai-community/gpt2 upload, which also stores attn.bias / attn.masked_bias mask buffers."""
    from safetensors.numpy import load_file, save_file
    model = gpt2(seed=1)
    model.save_pretrained(tmp_path, safe_serialization=True)
    f = tmp_path / "model.safetensors"
    tensors = {k.removeprefix("transformer."): v for k, v in load_file(f).items()}
    for layer in range(2):
        tensors[f"h.{layer}.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
        tensors[f"h.{layer}.attn.masked_bias"] = np.array(-1e4, np.float32)
    save_file(tensors, f)
    check(tmp_path, reference_logits(model))


@pytest.mark.parametrize("tied", [False, True])
def test_llama_gqa_dir(tmp_path, tied):
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=5000.0, rms_norm_eps=1e-5, tie_word_embeddings=tied)
    model = randomize(transformers.LlamaForCausalLM(cfg), seed=2)
    model.save_pretrained(tmp_path, safe_serialization=True)
    m = check(tmp_path, reference_logits(model))
    c = m.config
    assert (c.arch, c.n_head, c.n_kv_head, c.head_dim, c.d_ff, c.ffn) == ("llama", 4, 2, 16, 96, "swiglu")
    assert c.rope_theta == 5000.0 and c.tie_embeddings == tied


def test_qwen2_dir_with_qkv_biases(tmp_path):
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rope_theta=20000.0, tie_word_embeddings=True)
    model = randomize(transformers.Qwen2ForCausalLM(cfg), seed=3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    m = check(tmp_path, reference_logits(model))
    assert m.config.attn_bias and not m.config.attn_out_bias and m.config.rope_theta == 20000.0


def test_tokenizer_json_is_used_as_written(tmp_path):
    """tokenizer.json + tokenizer_config.json: ffnlab's ids are the tokenizers library's, plus what
    transformers adds (here nothing: tokenizer.json has no post_processor, and transformers 5 ignores
    add_bos_token when tokenizer.json exists; tests/engines/test_hf_tokenizer_bos.py has the other setups)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, hello tokenizer"] * 20
    tk.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>",
                                                                "add_bos_token": True}))
    cfg = transformers.LlamaConfig(vocab_size=tk.get_vocab_size(), hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=1, num_attention_heads=2, max_position_embeddings=64)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path, safe_serialization=True)
    tok = ffnlab.load(str(tmp_path), progress=False).tokenizer
    text = "the lazy fox says hello world"
    assert tok.bos_id == tk.token_to_id("<s>") and tok.eos_id == tk.token_to_id("</s>")
    assert tok.encode(text) == transformers.AutoTokenizer.from_pretrained(str(tmp_path)).encode(text)
    assert tok.encode(text) == tk.encode(text).ids
    assert tok.decode(tok.encode(text, add_bos=False)) == text
