"""Fuzzing HF directories: every config.json field the loader reads set to the wrong type or an
absurd value (strings, lists, null, objects, 0, -1, 2^32-1, NaN), unparsable configs (5,000-digit
integers, 100,000-deep nesting, not UTF-8), malformed tokenizer.json / tokenizer_config.json, and
safetensors files that are truncated, garbled, FIFOs, of unreadable dtypes, or shards redefining a
tensor. Each case is `ffnlab run -m DIR -p hi -n 2` under tests/reference/fuzz.py's limits."""
import pytest
from fuzz import assert_clean, run_cases
from fuzz_cases import hf_cases

pytestmark = pytest.mark.slow


def test_malformed_hf_directories(tmp_path):
    cases = hf_cases(tmp_path)
    results = run_cases(cases, tmp_path)
    assert results[0]["rc"] == 0                                  # the unmodified directory runs
    assert_clean(cases, results, min_errors=len(cases) * 3 // 4)
