"""BOS/EOS of an HF directory's tokenizer: ffnlab adds what transformers' AutoTokenizer adds for the same
directory, decided by the tokenizer's own configuration (tokenizer.json's post_processor; transformers 5
ignores add_bos_token / add_eos_token in tokenizer_config.json when tokenizer.json exists), never by
the architecture."""
import json

import pytest

from ffnlab.formats.hf_tokenizer import tokenizer_from_hf

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")

TEXT = "hello world, hello there"
SPECIALS = ["<s>", "</s>", "<|endoftext|>"]


def byte_level_bpe():
    """A small trained byte-level BPE (GPT-2 style tokenizer.json), with <s>, </s> and <|endoftext|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([TEXT * 20, "the quick brown fox"], trainer)
    return tk


def template(single):
    from tokenizers import processors
    tk = byte_level_bpe()
    return processors.TemplateProcessing(single=single, special_tokens=[(t, tk.token_to_id(t)) for t in SPECIALS])


def make_dir(tmp_path, model_type, post=None, tc=None):
    from tokenizers import processors
    tk = byte_level_bpe()
    tk.post_processor = {"none": None, "bytelevel": processors.ByteLevel(trim_offsets=False)}.get(post, post)
    tk.save(str(tmp_path / "tokenizer.json"))
    config = {"model_type": model_type, "bos_token_id": tk.token_to_id("<s>"), "eos_token_id": tk.token_to_id("</s>")}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tc = {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast", **(tc or {})}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({k: v for k, v in tc.items() if v is not None}))
    return config


CASES = {
    # the reported case: a Llama directory whose GPT-2 style tokenizer adds nothing
    "llama-no-post-processor": ("llama", "none", {}),
    "llama-no-post-processor-no-class": ("llama", "none", {"tokenizer_class": None}),
    "gpt2-bytelevel": ("gpt2", "bytelevel", {}),
    "llama-template-bos": ("llama", "template-bos", {}),              # Llama 2/3 tokenizer.json
    "qwen2-template-bos": ("qwen2", "template-bos", {}),              # not the architecture: the file decides
    "template-bos-but-add-bos-false": ("llama", "template-bos", {"add_bos_token": False}),
    "no-post-processor-add-bos-true": ("gpt2", "none", {"add_bos_token": True}),   # transformers 5 ignores it
    "add-eos-true": ("llama", "none", {"add_bos_token": True, "add_eos_token": True}),
    "only-add-eos-true": ("llama", "template-bos", {"add_eos_token": True}),    # BOS flag absent: false
    "template-bos-eos": ("llama", "template-bos-eos", {}),
    "llama-class-add-bos-true": ("llama", "none", {"tokenizer_class": "LlamaTokenizerFast", "add_bos_token": True}),
    "llama-class-template": ("llama", "template-bos", {"tokenizer_class": "LlamaTokenizerFast"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bos_eos_as_transformers_adds_them(case, tmp_path):
    model_type, post, tc = CASES[case]
    post = {"template-bos": lambda: template("<s> $A"),
            "template-bos-eos": lambda: template("<s> $A </s>")}.get(post, lambda: post)()
    config = make_dir(tmp_path, model_type, post, tc)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path)).encode(TEXT)
    ours = tokenizer_from_hf(str(tmp_path), config).encode(TEXT)
    assert ours == theirs, case
    plain = tokenizer_from_hf(str(tmp_path), config).encode(TEXT, add_bos=False)
    assert ours[len(ours) - len(plain) - (ours[-1:] == [config["eos_token_id"]]):][:len(plain)] == plain


def test_the_reported_case_adds_no_bos(tmp_path):
    config = make_dir(tmp_path, "llama", "none", {"tokenizer_class": None})
    tok = tokenizer_from_hf(str(tmp_path), config)
    assert not tok.add_bos and tok.encode(TEXT)[0] != config["bos_token_id"]


@pytest.mark.parametrize("bad, msg", [
    ({"add_bos_token": "false"}, "field 'add_bos_token' must be true or false"),
    ({"bos_token": 5}, "field 'bos_token' must be a string or an object"),
    ({"chat_template": 3}, "field 'chat_template' must be a string"),
])
def test_wrong_types_in_tokenizer_config_are_one_line_errors(tmp_path, bad, msg):
    from ffnlab.errors import ModelFileError
    config = make_dir(tmp_path, "llama", "none", bad)
    with pytest.raises(ModelFileError, match=msg):
        tokenizer_from_hf(str(tmp_path), config)


@pytest.mark.parametrize("add_bos, add_eos", [(True, False), (False, False), (True, True)])
def test_exported_tokenizer_adds_in_transformers_what_it_adds_in_ffnlab(tmp_path, add_bos, add_eos):
    from ffnlab.formats.export_hf import tokenizer_config
    from ffnlab.formats.hf_tokenizer import tokenizer_json
    from ffnlab.formats.tokenizer import Tokenizer
    tk = byte_level_bpe()
    tok = Tokenizer(tk, bos_id=tk.token_to_id("<s>"), eos_id=tk.token_to_id("</s>"), add_bos=add_bos, add_eos=add_eos)
    tokenizer_json(tok).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tok, 64)))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path)).encode(TEXT)
    assert theirs == tok.encode(TEXT) == tokenizer_from_hf(str(tmp_path), {}).encode(TEXT)
    assert (theirs[0] == tok.bos_id) == add_bos and (theirs[-1] == tok.eos_id) == add_eos
