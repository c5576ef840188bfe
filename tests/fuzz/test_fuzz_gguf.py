"""Fuzzing GGUF files: truncations, bit flips, directory fields, metadata of the wrong type or value,
malformed tokenizers. Every case is `ffnlab run -m CASE -p hi -n 2` under a 4 GB address-space limit
and a time limit (tests/reference/fuzz.py); each must end in a clean one-line error or a normal run."""
import pytest
import numpy as np

from fuzz import assert_clean, run_cases
from fuzz_cases import gguf_byte_cases, gguf_metadata_cases, gguf_structure_cases, gguf_tokenizer_cases

pytestmark = pytest.mark.slow


def test_truncated_and_bit_flipped_gguf_files(tmp_path):
    cases = gguf_byte_cases(tmp_path, np.random.default_rng(11))
    results = run_cases(cases, tmp_path)
    assert results[0]["rc"] == 0                                  # the unmodified file runs
    assert_clean(cases, results, min_errors=len(cases) // 2)


def test_gguf_directory_and_count_fields(tmp_path):
    cases = gguf_structure_cases(tmp_path)
    assert_clean(cases, run_cases(cases, tmp_path), min_errors=len(cases) * 3 // 4)


def test_gguf_metadata_and_tokenizer_values(tmp_path):
    cases = gguf_metadata_cases(tmp_path) + gguf_tokenizer_cases(tmp_path)
    assert_clean(cases, run_cases(cases, tmp_path), min_errors=len(cases) // 2)
