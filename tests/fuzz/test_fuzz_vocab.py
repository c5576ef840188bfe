"""Fuzzing the agreement of tokenizer and model: tokenizer ids past the embedding's rows (a GGUF's
tokenizer.ggml.tokens longer or shorter than token_embd; an HF Llama, an HF GPT-2 and an ffnlab
checkpoint of 200 rows with a 256-token tokenizer; an HF added token of id 1000) are refused at load
in one line; a padded table (300 rows, 256 tokens) runs. Each case is `ffnlab run -m CASE -p hi -n 2`."""
import pytest

from fuzz import assert_clean, run_cases
from fuzz_cases import vocab_cases

pytestmark = pytest.mark.slow


def test_tokenizer_and_model_vocabularies_that_disagree(tmp_path):
    cases = vocab_cases(tmp_path)
    results = run_cases(cases, tmp_path)
    assert_clean(cases, results)
    by_name = {c["name"]: results[i] for i, c in enumerate(cases)}
    for name, r in by_name.items():
        padded = "-300-rows-" in name
        assert r["rc"] == (0 if padded else 1), (name, r["stderr"][-300:])
        if not padded and not name.startswith("gguf-"):
            assert "tokenizer.json: the tokenizer has" in r["stderr"], name
