"""The tokenizer cache (formats/tokenizer_cache.py): a hit gives the same tokenizer as building it
from the GGUF's metadata; an edited file, a damaged entry or an unwritable directory build again."""
import json
import os

import pytest

import ffnlab
from ffnlab.formats import gguf as gguf_load
from ffnlab.formats.installed import resolve_model

TEXTS = ["The capital of France is Paris.", "  spaces\tand\nnewlines  ", "<|im_start|>user\nhi<|im_end|>",
         "naïve café 你好 🙂 1234567"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FFNLAB_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tokenizers"


def _ids(tok):
    return [tok.encode(t) for t in TEXTS]


def _same(a, b):
    assert _ids(a) == _ids(b)
    assert (a.bos_id, a.eos_id, a.add_bos, a.add_eos, a.eot_ids, a.chat_template) == \
        (b.bos_id, b.eos_id, b.add_bos, b.add_eos, b.eot_ids, b.chat_template)
    assert [a.token_text(i) for i in range(0, a.vocab_size, 997)] == [b.token_text(i) for i in range(0, b.vocab_size, 997)]


def test_a_second_load_reads_the_tokenizer_back(cache, monkeypatch):
    path = resolve_model("smollm2")
    built = ffnlab.load(path).tokenizer
    assert len(os.listdir(cache)) == 1
    monkeypatch.setattr(gguf_load, "tokenizer_from_gguf", lambda *a: pytest.fail("built again despite the cache"))
    back = ffnlab.load(path).tokenizer
    _same(back, built)
    (entry,) = cache.iterdir()
    assert isinstance(json.loads(json.loads(entry.read_text())["tokenizers"])["model"]["merges"][0], str)  # "a b"
    assert back.tk.to_str() == built.tk.to_str()                  # the same vocabulary, merges and rules, all of them


def test_a_damaged_entry_is_built_again(cache, monkeypatch):
    path = resolve_model("smollm2")
    built = ffnlab.load(path).tokenizer
    (entry,) = cache.iterdir()
    entry.write_text(entry.read_text()[:1000])                       # cut short
    _same(ffnlab.load(path).tokenizer, built)
    entry.write_text('{"tokenizers": "not a tokenizer", "bos_id": 1}')
    _same(ffnlab.load(path).tokenizer, built)


def test_a_file_rewritten_in_place_misses(cache, tmp_path):
    """the key is the header's bytes, not the file's name or time: the same path rewritten with
    another header (here the context length) is a new entry"""
    from models import tiny_gguf
    path = tmp_path / "m.gguf"
    tiny_gguf(path, n_ctx=64)
    first = ffnlab.load(path).tokenizer
    tiny_gguf(path, n_ctx=128)
    second = ffnlab.load(path)
    assert second.config.n_ctx == 128 and len(os.listdir(cache)) == 2
    _same(second.tokenizer, first)


def test_an_unwritable_cache_still_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("FFNLAB_CACHE_DIR", "")                       # no cache at all: built every time
    built = ffnlab.load(resolve_model("smollm2")).tokenizer
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FFNLAB_CACHE_DIR", str(blocker))             # a file where the directory would go
    _same(ffnlab.load(resolve_model("smollm2")).tokenizer, built)
    assert blocker.read_text() == ""
