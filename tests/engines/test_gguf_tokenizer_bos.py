"""BOS/EOS of a GGUF tokenizer: ffnlab adds what llama.cpp adds for the same file (llama_vocab::impl::load):
BOS by default for SentencePiece vocabularies and the Llama 3 family of BPE pre-tokenizers, not for
other BPE ones; tokenizer.ggml.add_bos_token / add_eos_token override the default."""
import gguf
import pytest

import ffnlab
from fuzz_cases import rewrite_gguf
from models import tiny_gguf

pytestmark = pytest.mark.slow

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")

T = gguf.GGUFValueType
TEXT = "hello there"
CASES = {
    "gpt2-default": {},
    "llama-bpe-default": {"tokenizer.ggml.pre": ("llama-bpe", T.STRING, None)},
    "llama-bpe-add-bos-false": {"tokenizer.ggml.pre": ("llama-bpe", T.STRING, None),
                                "tokenizer.ggml.add_bos_token": (False, T.BOOL, None)},
    "gpt2-add-bos-true": {"tokenizer.ggml.add_bos_token": (True, T.BOOL, None)},
    "gpt2-add-eos-true": {"tokenizer.ggml.add_eos_token": (True, T.BOOL, None)},
}
# a SentencePiece vocabulary of the same size (258): <unk> <s> </s> and the byte tokens <0x00>..<0xFE>
SPM = {"tokenizer.ggml.model": ("llama", T.STRING, None),
       "tokenizer.ggml.tokens": (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(255)], T.ARRAY, T.STRING),
       "tokenizer.ggml.token_type": ([2, 3, 3] + [6] * 255, T.ARRAY, T.INT32),
       "tokenizer.ggml.scores": ([0.0] * 258, T.ARRAY, T.FLOAT32),
       "tokenizer.ggml.unknown_token_id": (0, T.UINT32, None), "tokenizer.ggml.bos_token_id": (1, T.UINT32, None),
       "tokenizer.ggml.eos_token_id": (2, T.UINT32, None)}
CASES.update({"spm-default": SPM, "spm-add-bos-false": {**SPM, "tokenizer.ggml.add_bos_token": (False, T.BOOL, None)},
              "spm-add-eos-true": {**SPM, "tokenizer.ggml.add_eos_token": (True, T.BOOL, None)},
              "spm-no-space-prefix": {**SPM, "tokenizer.ggml.add_space_prefix": (False, T.BOOL, None)}})


@pytest.mark.parametrize("case", list(CASES))
def test_bos_eos_as_llama_cpp_adds_them(case, tmp_path):
    drop = ("tokenizer.ggml.merges", "tokenizer.ggml.pre") if case.startswith("spm") else ()
    path = rewrite_gguf(tiny_gguf(tmp_path / "base.gguf"), tmp_path / "m.gguf", CASES[case], drop_keys=drop)
    llm = llama_cpp.Llama(model_path=path, n_ctx=32, vocab_only=True, verbose=False)
    theirs = llm.tokenize(TEXT.encode(), add_bos=True, special=False)     # add_special: the vocab decides
    ours = ffnlab.load(path, progress=False).tokenizer.encode(TEXT)
    assert ours == theirs, case
