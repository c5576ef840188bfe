"""Fuzzing GGUF files: truncations, bit flips, directory fields, metadata of the wrong type or value,
malformed tokenizers. Every case is `ffnlab run -m CASE -p hi -n 2` under a 4 GB address-space limit
and a time limit (tests/reference/fuzz.py); each must end in a clean one-line error or a normal run."""
import pytest
import numpy as np

from fuzz import assert_clean, run_cases
from fuzz_cases import (gguf_byte_cases, gguf_general_cases, gguf_metadata_cases, gguf_structure_cases,
                        gguf_tokenizer_cases, overflow_gguf)

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


def test_gguf_general_keys_of_the_wrong_type(tmp_path):
    """Every general.* key ffnlab reads, and every one the file holds, with a value of each wrong type"""
    cases = gguf_general_cases(tmp_path)
    results = run_cases(cases, tmp_path)
    assert_clean(cases, results, min_errors=len(cases) // 2)
    by_name = {c["name"]: results[i] for i, c in enumerate(cases)}
    assert "'general.file_type' must be an integer, found 'Q4'" in by_name["gguf-general.file_type=string"]["stderr"]


def test_weights_whose_products_overflow_float32_end_cleanly(tmp_path):
    """Finite weights, products past float32's range: no NumPy RuntimeWarning with a source line (the
    fuzz driver runs with PYTHONWARNINGS=default), and the one-token step computes what the batched
    forward computes. Here the residual stream reaches ~1e36, its mean square is inf in float32, so
    every RMSNorm after it gives 0 (as torch's and ggml's do) and the run ends normally; when the
    step's logits were not finite where the traced forward's were, the sentinel could only say
    that the two paths diverged."""
    cases = overflow_gguf(tmp_path)
    results = run_cases(cases, tmp_path)
    assert_clean(cases, results)
    err = results[0]["stderr"]
    assert "RuntimeWarning" not in err and "diverged" not in err
