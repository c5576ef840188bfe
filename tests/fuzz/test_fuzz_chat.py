"""Fuzzing chat templates (untrusted jinja2 from the model file): syntax and runtime errors, loops
of 10^10 steps, values of 10^10 characters, doubling strings, deep recursion, sandbox escapes.
Each is `ffnlab run -m GGUF --chat -p hi -n 2`; each must be a clean one-line error or a run."""
import pytest
from fuzz import assert_clean, run_cases
from fuzz_cases import chat_cases

pytestmark = pytest.mark.slow


def test_hostile_chat_templates(tmp_path):
    cases = chat_cases(tmp_path)
    results = run_cases(cases, tmp_path)
    by_name = {c["name"]: results[i] for i, c in enumerate(cases)}
    assert by_name["chat-plain"]["rc"] == 0
    assert_clean(cases, results, min_errors=len(cases) - 2)
    for name in ("infinite-loop", "huge-repeat", "huge-power", "huge-center", "huge-output", "doubling"):
        assert ": template refused: it " in by_name[f"chat-{name}"]["stderr"], name
    assert by_name["chat-infinite-loop"]["seconds"] < 10                # the 5 s render bound, not 10^10 steps
