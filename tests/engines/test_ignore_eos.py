"""generate(ignore_eos=True) / `ffnlab run --ignore-eos`: exactly -n tokens, none of them an end token."""
import pytest
import json
import os
import subprocess
import sys

import numpy as np
from models import tiny_gguf

import ffnlab

pytestmark = pytest.mark.slow


def eos_first(model):
    """Make the end token (id 1) the greedy choice at every step."""
    forward_last = model.forward_last

    def rigged(ids, kv):
        logits = forward_last(ids, kv).copy()
        logits[1] = logits.max() + 10.0
        return logits
    model.forward_last = rigged
    return model


def test_generation_stops_at_the_end_token_unless_told_to_ignore_it(tmp_path):
    m = eos_first(ffnlab.load(tiny_gguf(tmp_path / "t.gguf")))
    assert 1 in m.tokenizer.eot_ids
    stopped = m.generate([2, 3, 4], n_predict=6, temp=0)
    assert stopped.ids == [] and stopped.stop_reason == "eos"
    kept = m.generate([2, 3, 4], n_predict=6, temp=0, ignore_eos=True)
    assert len(kept.ids) == 6 and 1 not in kept.ids and kept.stop_reason == "length"
    # the second choice of the unrigged logits is what comes out
    kv = m.new_cache()
    assert kept.ids[0] == int(np.argsort(-m.forward_last([2, 3, 4], kv))[1])


def test_run_flag_generates_exactly_n_tokens(tmp_path):
    path = tiny_gguf(tmp_path / "t.gguf")
    out = subprocess.run([sys.executable, "-m", "ffnlab.cli.main", "run", "-m", path, "-p", "hello", "-n", "9", "--temp", "0",
                          "--ignore-eos", "--json"], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert len(r["ids"]) == 9 and 1 not in r["ids"] and r["stop_reason"] == "length"
