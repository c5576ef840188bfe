"""`ffnlab run` on SmolLM2: the continuation on stdout, llama.cpp-style perf lines on stderr, the same
figures in --json, and --chat through the model's template.

The reference for the text is ffnlab's Python API on the same model (greedy, so deterministic),
which test_real_models.py checks against transformers.
"""
import json
import re

import pytest

import models as M
from ffnlab.cli.main import main
from ffnlab.generation.chat import encode_chat, render_chat

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
PER_TOKEN = r"\( *[\d.]+ ms per token, +([\d.]+) tokens per second\)"
PERF = {                                        # llama.cpp's llama_perf_context_print shape
    "load": r"ffnlab_perf: +load time = +([\d.]+) ms",
    "prompt": r"ffnlab_perf: prompt eval time = +([\d.]+) ms / +(\d+) tokens " + PER_TOKEN,
    "eval": r"ffnlab_perf: +eval time = +([\d.]+) ms / +(\d+) runs +" + PER_TOKEN,
}


def ffnlab_run(capsys, *argv):
    rc = main(["run", "-m", M.model_path("smollm2"), *argv])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out, err


def perf_figures(err):
    found = {k: re.search(rx, err) for k, rx in PERF.items()}
    assert all(found.values()), err
    return {k: tuple(float(x) for x in m.groups()) for k, m in found.items()}


def greedy(ids, n):
    return M.ours("smollm2").generate(ids, n, temp=0.0)


def test_run_prints_the_continuation_and_perf_lines(capsys):
    out, err = ffnlab_run(capsys, "-p", PROMPT, "-n", "8", "--temp", "0")
    ids = M.ours("smollm2").tokenizer.encode(PROMPT)
    expected = greedy(ids, 8)
    assert out == PROMPT + expected.text + "\n"
    assert len(expected.ids) == 8 and expected.text.strip()
    f = perf_figures(err)
    assert f["load"][0] > 0
    assert f["prompt"][1] == len(ids) and f["prompt"][0] > 0
    assert f["eval"][1] == 7 and f["eval"][0] > 0              # 8 tokens: the first comes from the prompt pass
    assert abs(f["eval"][2] - 1000 * 7 / f["eval"][0]) <= 0.01 * f["eval"][2] + 0.01


def test_json_has_the_same_figures_as_the_perf_lines(capsys):
    out, err = ffnlab_run(capsys, "-p", PROMPT, "-n", "8", "--temp", "0", "--json")
    r = json.loads(out)
    ids = M.ours("smollm2").tokenizer.encode(PROMPT)
    expected = greedy(ids, 8)
    assert (r["prompt_ids"], r["ids"], r["text"], r["stop_reason"]) == (ids, expected.ids, expected.text, "length")
    t, f = r["timings"], perf_figures(err)
    assert abs(t["load_ms"] - f["load"][0]) <= 0.01
    assert (t["prompt_tokens"], t["eval_tokens"]) == (f["prompt"][1], f["eval"][1]) == (len(ids), 7)
    assert abs(t["prompt_ms"] - f["prompt"][0]) <= 0.01 and abs(t["eval_ms"] - f["eval"][0]) <= 0.01
    assert abs(t["prompt_tokens_per_s"] - f["prompt"][2]) <= 0.01 and abs(t["eval_tokens_per_s"] - f["eval"][2]) <= 0.01


def test_chat_wraps_the_prompt_in_the_template(capsys):
    out, _ = ffnlab_run(capsys, "-p", "What is the capital of France?", "--chat", "-n", "8", "--temp", "0", "--json")
    r = json.loads(out)
    tok = M.ours("smollm2").tokenizer
    ids = encode_chat(tok, render_chat(tok, [{"role": "user", "content": "What is the capital of France?"}]))
    assert r["prompt_ids"] == ids
    assert tok.decode(ids).endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
    expected = greedy(ids, 8)
    assert r["ids"] == expected.ids and "Paris" in r["text"]
