"""Fuzzing ffnlab checkpoints: ffnlab.json config and tokenizer fields of the wrong type or value,
an arch ffnlab does not run ("mamba"), corrupt or missing files (`ffnlab run -m CKPT`), and the
resume state (`ffnlab train --resume`): trainer.json corrupt, missing keys, a state file path that
escapes the checkpoint, a missing or truncated state file, the state file of another config."""
import pytest
from fuzz import assert_clean, run_cases
from fuzz_cases import checkpoint_cases, resume_cases

pytestmark = pytest.mark.slow


def test_malformed_checkpoints(tmp_path):
    cases = checkpoint_cases(tmp_path)
    results = run_cases(cases, tmp_path)
    assert results[0]["rc"] == 0
    assert_clean(cases, results, min_errors=len(cases) * 3 // 4)


def test_malformed_resume_state(tmp_path):
    cases = resume_cases(tmp_path)
    results = run_cases(cases, tmp_path)
    assert results[0]["rc"] == 0                                  # the unmodified checkpoint resumes
    assert_clean(cases, results, min_errors=len(cases) - 2)
    escaped = [r for c, r in zip(cases, results.values()) if "etc-passwd" in c["name"] or "dotdot" in c["name"]]
    assert all("must name a state-NNNNNN.safetensors file inside" in r["stderr"] for r in escaped)
