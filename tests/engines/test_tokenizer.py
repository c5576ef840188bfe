"""GGUF tokenizers (SmolLM2: byte-level BPE, pre 'smollm'; Gemma 3: SentencePiece-style with
scores) give the ids llama.cpp gives for the same text.

Reference: llama_tokenize(vocab, text, add_special=True, parse_special=True) through
llama-cpp-python: BOS as the file says (SmolLM2 add_bos_token=false, Gemma 3 true), and special
tokens written in the text (<|im_start|>, <start_of_turn>) parsed as one id each. Decoding is
checked against llama_detokenize and as a round trip back to the text.
"""
import os

import pytest

import models as M

pytestmark = pytest.mark.slow

TEXTS = [
    "",
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple    spaces   between  words",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four",
    "windows\r\nline endings\r\n",
    "\n\n\n",
    "digits 1234567890 and 3.14159 and 1,000,000",
    "2024-05-17 12:34:56",
    "我爱自然语言处理。今天天气很好！",
    "日本語のテキストと한국어 텍스트",
    "emoji 😀👍🏽🎉 and 🇫🇷 flags",
    "Ünïcödé àccents: café, naïve, Zürich",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "<html><body><p>Hi</p></body></html>",
    "it's they're we've I'm you'll he'd",
    "IT'S THEY'RE",
    "a" * 100,
]
SPECIAL_TEXTS = {
    "smollm2": ["<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
                "<|endoftext|>text after end"],
    "gemma3": ["<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n", "<bos>twice<eos>"],
}


@pytest.mark.parametrize("name", M.MODELS)
def test_ids_equal_llama_cpp(name):
    tok, lcpp = M.ours(name).tokenizer, M.llama_cpp(name)
    for text in TEXTS + SPECIAL_TEXTS[name] + list(M.prompts(name).values()):
        assert tok.encode(text) == lcpp.tokenize(text), f"{name}: {text!r}"


@pytest.mark.parametrize("name", M.MODELS)
def test_a_long_text_encoded_in_pieces_has_the_whole_texts_ids(name):
    """a corpus is encoded a piece at a time (formats/tokenizer.py _pieces): the ids are llama.cpp's for
    the whole text, cuts among the runs of newlines, spaces, CR-LF and special tokens included"""
    from ffnlab.formats.tokenizer import PIECE
    tok, lcpp = M.ours(name).tokenizer, M.llama_cpp(name)
    with open(os.path.join(os.path.dirname(M.__file__), "..", "..", "docs", "data", "calib.txt"), encoding="utf-8") as f:
        calib = f.read()
    blocks = TEXTS + SPECIAL_TEXTS[name] + [calib]
    text = ""
    for i in range(10 ** 6):
        text += blocks[i % len(blocks)] + ("\n", "\n\n", " \n", "\r\n", "\nX")[i % 5]
        if len(text) > 5 * PIECE:
            break
    assert len(list(tok._pieces(text))) >= 3                      # it was cut
    assert tok.encode(text, add_bos=False) == lcpp.tokenize(text, add_special=False)


@pytest.mark.parametrize("name,add_bos,bos", [("smollm2", False, 1), ("gemma3", True, 2)])
def test_bos_follows_the_file(name, add_bos, bos):
    tok, lcpp = M.ours(name).tokenizer, M.llama_cpp(name)
    assert (tok.add_bos, tok.bos_id) == (add_bos, bos)
    assert (tok.encode("x")[0] == bos) == add_bos
    assert tok.encode("x", add_bos=False) == lcpp.tokenize("x", add_special=False)


@pytest.mark.parametrize("name", M.MODELS)
def test_special_tokens_are_one_id_each(name):
    tok = M.ours(name).tokenizer
    for special in {"smollm2": ["<|im_start|>", "<|im_end|>"], "gemma3": ["<start_of_turn>", "<end_of_turn>"]}[name]:
        ids = tok.encode(special, add_bos=False)
        assert len(ids) == 1 and tok.token_text(ids[0]) == special


@pytest.mark.parametrize("name", M.MODELS)
def test_decode_round_trips_and_equals_llama_cpp(name):
    tok, lcpp = M.ours(name).tokenizer, M.llama_cpp(name)
    for text in TEXTS + SPECIAL_TEXTS[name]:
        ids = tok.encode(text, add_bos=False)
        assert tok.decode(ids) == text, f"{name}: {text!r}"
        assert tok.decode(ids) == lcpp.detokenize(ids), f"{name}: {text!r}"
