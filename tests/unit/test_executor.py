"""The execution layer without Ray (runtime/executor.py, evaluation/shards.py): units merged in unit
order, atomic results in --out, resume, one-line failures, and corpus shards that merge to the
single pass of evaluation/perplexity.py and evaluation/neurons.py -- bit for bit for the sums.
Nothing here imports Ray; test_in_process_run_imports_no_ray holds the CLI to that."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.errors import UsageError
from ffnlab.evaluation import DEFAULT_MIN_CONTEXT
from ffnlab.runtime.executor import InProcess, OutputDir, Task, Unit, execute, read_result, write_result
from mlp_models import TEXT, tiny_gguf, write_text


def _square(model, params, payload):
    if payload in params.get("bad", ()):
        raise ValueError(f"payload {payload} is corrupt")
    return {"value": np.array([payload * payload], dtype=np.float64), "payload": payload}


def _units(n):
    return [Unit(f"u-{i:03d}", i) for i in range(n)]


def _append(acc, r):
    return acc + [int(r["payload"])]


class Reversed(InProcess):
    """A backend that finishes the units last first: the merge must not follow it."""
    def run(self, task, units, on_result, on_failure, on_retry):
        for u in reversed(units):
            on_result(u, task.fn(None, task.params, u.payload))


def test_merge_follows_unit_order_not_completion_order():
    out = execute(Task(None, _square), _units(6), _append, [], backend=Reversed())
    assert out.merged == [0, 1, 2, 3, 4, 5]


def test_unit_ids_out_of_order_are_refused():
    with pytest.raises(ValueError):
        execute(Task(None, _square), [Unit("b", 1), Unit("a", 0)], _append, [])


def test_result_reads_back_bit_for_bit_and_leaves_no_temporary(tmp_path):
    r = np.random.default_rng(0)
    result = {"sums": r.normal(size=7), "counts": r.integers(0, 9, size=(2, 3)), "x": 0.1 + 0.2, "n": 3}
    write_result(str(tmp_path), "u-000", result)
    back = read_result(str(tmp_path), "u-000")
    assert os.listdir(tmp_path) == ["u-000"]
    assert back["x"] == result["x"] and back["n"] == 3
    for k in ("sums", "counts"):
        assert back[k].dtype == result[k].dtype and np.array_equal(back[k], result[k])


def test_resume_computes_only_the_units_the_output_lacks(tmp_path):
    calls = []

    def counted(model, params, payload):
        calls.append(payload)
        return _square(model, params, payload)

    out = OutputDir(str(tmp_path), "test", {"a": 1}, [u.id for u in _units(5)])
    first = execute(Task(None, counted), _units(5), _append, [], out=out)
    os.rename(tmp_path / "units" / "u-003", tmp_path / "gone")     # as if the driver died before unit 3 landed
    calls.clear()
    again = execute(Task(None, counted), _units(5), _append, [], out=OutputDir(str(tmp_path), "test", {"a": 1},
                                                                                [u.id for u in _units(5)]))
    assert calls == [3]
    assert again.resumed == 4 and again.merged == first.merged == [0, 1, 2, 3, 4]


def test_a_raising_unit_fails_alone(tmp_path):
    out = execute(Task(None, _square, {"bad": (2,)}), _units(4), _append, [])
    assert out.failures == [("u-002", "ValueError: payload 2 is corrupt")]
    assert out.merged is None and out.done == 3


def test_output_of_other_arguments_is_refused(tmp_path):
    OutputDir(str(tmp_path), "perplexity", {"ctx": 64}, ["a"])
    with pytest.raises(UsageError, match=r"other arguments \(ctx\)"):
        OutputDir(str(tmp_path), "perplexity", {"ctx": 128}, ["a"])


def test_output_of_another_command_is_refused(tmp_path):
    OutputDir(str(tmp_path), "perplexity", {"ctx": 64}, ["a"])
    with pytest.raises(UsageError, match="written by `ffnlab perplexity`, not `ffnlab neurons`"):
        OutputDir(str(tmp_path), "neurons", {"ctx": 64}, ["a"])


def test_a_folder_that_is_no_job_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="holds no job.json"):
        OutputDir(str(tmp_path), "perplexity", {}, ["a"])


# --- corpus shards against the single pass --------------------------------------------------------
def _ppl_json(capsys, args):
    assert main(["perplexity", "-m", tiny_gguf("bos"), "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("shard", ["2", "6", "40"])
def test_perplexity_shards_sum_to_the_single_pass_bit_for_bit(tmp_path, capsys, shard):
    from ffnlab.evaluation.perplexity import perplexity, text_chunks
    data = write_text(tmp_path, TEXT * 4)
    m = ffnlab.load(tiny_gguf("bos"))
    want = perplexity(m, text_chunks(m, TEXT * 4, 32), 2)
    got = _ppl_json(capsys, ["--data", data, "--ctx", "32", "--batch", "2", "--shard", shard])
    assert got["nll"] == want.nll and got["ppl_stderr"] == want.ppl_stderr and got["tokens_scored"] == want.tokens_scored


def test_perplexity_resumed_from_out_gives_the_same_figure(tmp_path, capsys):
    data = write_text(tmp_path, TEXT * 4)
    args = ["--data", data, "--ctx", "32", "--batch", "2", "--out", str(tmp_path / "out")]
    first = _ppl_json(capsys, args)
    units = sorted(os.listdir(tmp_path / "out" / "units"))
    for u in units[1::2]:                                            # half the units never landed
        os.rename(tmp_path / "out" / "units" / u, tmp_path / f"lost-{u}")
    again = _ppl_json(capsys, args)
    assert again["nll"] == first["nll"] and again["ppl_stderr"] == first["ppl_stderr"]
    assert again["executor"]["resumed"] == len(units) - len(units[1::2])


def test_perplexity_out_with_another_ctx_is_one_line(tmp_path, capsys):
    data = write_text(tmp_path, TEXT * 4)
    _ppl_json(capsys, ["--data", data, "--ctx", "32", "--out", str(tmp_path / "out")])
    assert main(["perplexity", "-m", tiny_gguf("bos"), "--data", data, "--ctx", "16", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "other arguments" in err[-1] and "ctx" in err[-1]


def test_shard_that_splits_a_batch_is_one_line(tmp_path, capsys):
    data = write_text(tmp_path, TEXT)
    assert main(["perplexity", "-m", tiny_gguf("bos"), "--data", data, "--ctx", "32", "--batch", "4", "--shard", "6"]) == 1
    assert "--shard 6 must be a multiple of --batch 4" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["f32", "bos"])
def test_neuron_shards_merge_to_the_single_pass_scan(tmp_path, kind):
    import argparse
    from ffnlab.cli.neurons import scan_units
    from ffnlab.evaluation.neurons import scan_layer
    m = ffnlab.load(tiny_gguf(kind))
    # no repeated passages: a repeat gives two tokens the same activation, whose order in a top-k is a tie
    text = "".join(np.random.default_rng(0).choice(list("abcdefghij klmnop,.\n"), 600))
    want = scan_layer(m, text, 1, 24, 4, 2)
    args = argparse.Namespace(model=tiny_gguf(kind), arith="f32", data=write_text(tmp_path, text), layer=1, ctx=24,
                              top=4, batch=2, max_windows=-1, shard=4, ray=None, out=None, workers=None,
                              min_context=DEFAULT_MIN_CONTEXT)
    got, outcome, n_units = scan_units(args, m, text)
    assert n_units > 2 and not outcome.failures
    st, ws = got.stats, want.stats
    assert st.n == ws.n
    for name in ("sum_abs", "sum", "sum2", "max", "min"):            # the same additions in the same order
        assert np.array_equal(getattr(st, name), getattr(ws, name)), name
    assert np.array_equal(got.hist.R, want.hist.R) and np.array_equal(got.hist.counts, want.hist.counts)
    assert np.array_equal(got.ranking, want.ranking)
    for u in range(m.config.d_ff):                                    # the same top-k tokens, in the same order
        g, w = got.top.sorted(u), want.top.sorted(u)
        assert [v for v, _, _ in g] == [v for v, _, _ in w]
        # a window's first token, without BOS, has no context: windows that start with the same token
        # tie exactly, and which of them a top-k keeps is not defined; every other token is the same
        values = [v for v, _, _ in g + w]
        for (v, p, a), (_, q, b) in zip(g, w):
            if values.count(v) == 2:
                assert p == q and np.array_equal(a, b, equal_nan=True)


def test_in_process_run_imports_no_ray(tmp_path):
    data = write_text(tmp_path, TEXT)
    code = ("import sys; from ffnlab.cli.main import main; "
            f"rc = main(['perplexity', '-m', {tiny_gguf('bos')!r}, '--data', {data!r}, '--ctx', '32', "
            f"'--out', {str(tmp_path / 'out')!r}]); print('ray' in sys.modules); sys.exit(rc)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False"


def test_ray_flag_without_ray_says_how_to_install(tmp_path):
    data = write_text(tmp_path, TEXT)
    code = ("import sys; sys.modules['ray'] = None; from ffnlab.cli.main import main; "   # as if Ray were absent
            f"sys.exit(main(['perplexity', '-m', {tiny_gguf('bos')!r}, '--data', {data!r}, '--ctx', '32', '--ray', 'local']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].endswith("pip install 'ffnlab[ray]'")


def test_expert_shards_merge_to_the_single_pass_routing(tmp_path):
    import argparse
    from ffnlab.cli.experts import route_units
    from ffnlab.evaluation.experts import scan_routing
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import tokenizer_meta
    from moe_models import MOE_TEXT, byte_moe_model as moe_model
    m = moe_model()
    save_model(str(tmp_path / "ck"), m.config, m.params, m.tokenizer, tokenizer_meta(m.tokenizer, "byte"))
    text = MOE_TEXT * 6
    want = scan_routing(m, text, 32, 2)
    args = argparse.Namespace(model=str(tmp_path / "ck"), arith="f32", data=write_text(tmp_path, text), ctx=32,
                              batch=2, max_windows=-1, shard=2, ray=None, out=None, workers=None,
                              min_context=DEFAULT_MIN_CONTEXT)
    got, outcome, n_units = route_units(args, m, text)
    assert n_units > 2 and not outcome.failures
    for g, w in zip(got, want):
        for name in ("counts", "cofire", "by_token", "token_totals"):
            assert np.array_equal(getattr(g, name), getattr(w, name)), name
        assert g.entropy_sum == w.entropy_sum and g.n_tokens == w.n_tokens


# --- causal tracing over a prompt dataset --------------------------------------------------------------
TRACE = ["--samples", "2", "--window", "1", "--json"]


def _prompts(tmp_path, lines):
    p = tmp_path / "facts.jsonl"
    p.write_text("\n".join(json.dumps(x) if isinstance(x, dict) else x for x in lines) + "\n", encoding="utf-8")
    return str(p)


def test_each_prompt_of_a_dataset_gets_its_single_prompt_trace(tmp_path, capsys):
    facts = [{"prompt": "First Citizen: Before we", "subject": "Citizen"},
             {"prompt": "All: Speak, speak.", "subject": "Speak", "target": " "}]
    assert main(["causal-trace", "-m", tiny_gguf("f32"), "--prompts", _prompts(tmp_path, facts), *TRACE]) == 0
    got = json.loads(capsys.readouterr().out)["prompts"]
    for f, g in zip(facts, got):
        one = ["-p", f["prompt"], "--subject", f["subject"]] + (["--target", f["target"]] if "target" in f else [])
        assert main(["causal-trace", "-m", tiny_gguf("f32"), *one, *TRACE]) == 0
        want = json.loads(capsys.readouterr().out)
        assert {k: g[k] for k in ("hidden", "mlp", "attn", "clean_p", "corrupt_p", "subject", "target_id")} == \
               {k: want[k] for k in ("hidden", "mlp", "attn", "clean_p", "corrupt_p", "subject", "target_id")}


def test_average_indirect_effect_averages_rome_position_groups():
    from ffnlab.interventions.datasets import average_indirect_effect
    # one layer; prompt A: 5 tokens, subject 1..3; prompt B: 3 tokens, subject 0..0 (first = last: "last")
    a = {"corrupt_p": 0.1, "subject": [1, 3], "hidden": [[0.2, 0.3, 0.5, 0.7, 0.9]]}
    b = {"corrupt_p": 0.2, "subject": [0, 0], "hidden": [[0.6, 0.4, 0.3]]}
    for r in (a, b):
        r["mlp"] = r["attn"] = r["hidden"]
    got = average_indirect_effect([a, b])["hidden"][0]
    # A: further {0}: .1; first {1}: .2; middle {2}: .4; last {3}: .6; last token {4}: .8
    # B: last subject {0}: .4; first subsequent {1}: .2; last token {2}: .1
    want = [0.2, 0.4, (0.6 + 0.4) / 2, 0.2, 0.1, (0.8 + 0.1) / 2]
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_bad_prompt_line_fails_alone_with_its_line_number(tmp_path, capsys):
    facts = [{"prompt": "First Citizen: Before we", "subject": "Citizen"}, {"prompt": "All: Speak", "subject": "Rome"},
             "not json", {"prompt": "All: Speak, speak.", "subject": "Speak"}]
    path = _prompts(tmp_path, facts)
    assert main(["causal-trace", "-m", tiny_gguf("f32"), "--prompts", path, *TRACE]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"unit line-000002 failed: {path} line 2: --subject 'Rome' does not occur in the prompt 'All: Speak'"
    assert err[1].startswith(f"unit line-000003 failed: {path} line 3: not JSON")
    assert err[2].startswith("2 of 4 units failed")


# --- activation patching over a dataset of pairs -------------------------------------------------------
PAIRS = [{"clean": "First Citizen: Before we", "corrupt": "First Soldier: Before we", "target": " ", "foil": "e"},
         {"clean": "All: Speak, speak.", "corrupt": "All: Speak, shout.", "target": "\n", "foil": " "}]


def test_each_pair_of_a_dataset_gets_its_single_pair_patching(tmp_path, capsys):
    assert main(["patch", "-m", tiny_gguf("f32"), "--prompts", _prompts(tmp_path, PAIRS), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    for pair, g in zip(PAIRS, got["prompts"]):
        one = [a for k in ("clean", "corrupt", "target", "foil") for a in (f"--{k}", pair[k])]
        assert main(["patch", "-m", tiny_gguf("f32"), *one, "--json"]) == 0
        want = json.loads(capsys.readouterr().out)
        assert {k: g[k] for k in ("effect", "clean", "corrupt", "tokens", "target")} == \
               {k: want[k] for k in ("effect", "clean", "corrupt", "tokens", "target")}
    # byte tokens: "Citizen" -> "Soldier" differ at positions 6..12; "speak" -> "shout" at 13..16
    assert [g["subject"] for g in got["prompts"]] == [[6, 12], [13, 16]]
    from ffnlab.interventions.datasets import average_patch_effect
    assert got["average_effect"] == json.loads(json.dumps(average_patch_effect(got["prompts"])))


def test_average_patch_effect_groups_positions_by_the_corrupted_span():
    from ffnlab.interventions.datasets import average_patch_effect
    # one layer; pair A: 4 tokens, corrupted 1..2; pair B: 3 tokens, corrupted 0..0
    a = {"subject": [1, 2], "effect": [[0.1, 0.2, 0.4, 0.8]]}
    b = {"subject": [0, 0], "effect": [[0.5, 0.25, 0.125]]}
    got = average_patch_effect([a, b])["effect"][0]
    # A: further {}: -, first {1}: .2, middle {}: -, last {2}: .4, first subsequent {3} is the last token: .8
    # B: last subject {0}: .5, first subsequent {1}: .25, last token {2}: .125
    want = [0.2, np.nan, (0.4 + 0.5) / 2, 0.25, 0.1, (0.8 + 0.125) / 2]
    np.testing.assert_allclose(got, want, rtol=1e-12)     # float64 means of one or two terms: ~1e-16


def test_a_bad_pair_line_fails_alone_with_its_line_number(tmp_path, capsys):
    lines = [PAIRS[0], {"clean": "All: Speak", "corrupt": "All: Speak, speak", "target": " ", "foil": "e"},
             {"clean": "All", "corrupt": "All", "target": " "}, PAIRS[1]]
    path = _prompts(tmp_path, lines)
    assert main(["patch", "-m", tiny_gguf("f32"), "--prompts", path, "--json"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"unit line-000002 failed: {path} line 2: --clean has 10 tokens and --corrupt 17")
    assert err[1].startswith(f"unit line-000003 failed: {path} line 3: expected {{\"clean\"")
    assert err[2].startswith("2 of 4 units failed")


def test_patch_without_its_four_prompts_or_a_dataset_is_one_line(capsys):
    assert main(["patch", "-m", tiny_gguf("f32"), "--clean", "a b", "--corrupt", "a c"]) == 1
    assert "give --target --foil (all four of --clean, --corrupt, --target, --foil), or --prompts" in \
           capsys.readouterr().err


def test_dataset_results_resume_and_refuse_other_arguments(tmp_path, capsys):
    path, results = _prompts(tmp_path, PAIRS), str(tmp_path / "results")
    run = ["patch", "-m", tiny_gguf("f32"), "--prompts", path, "--results", results, "--json"]
    assert main(run) == 0
    first = json.loads(capsys.readouterr().out)
    assert sorted(os.listdir(os.path.join(results, "units"))) == ["line-000001", "line-000002"]
    assert main(run) == 0                                               # every unit read back, none recomputed
    again = json.loads(capsys.readouterr().out)
    assert again["prompts"] == first["prompts"] and again["executor"]["resumed"] == 2
    assert main(run[:-1] + ["--node", "ffn_out", "--json"]) == 1       # other arguments: refused, not mixed
    assert capsys.readouterr().err.strip() == (f"ffnlab patch: error: {results}: written by `ffnlab patch` with "
                                               f"other arguments (node); give another --results or remove it")
