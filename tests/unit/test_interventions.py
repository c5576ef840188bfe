"""Activation patching and causal tracing (interventions/) on small random models.

References: brute-force runs through ffnlab.hooks one patch at a time (patching runs T patches in
one batch), the clean run itself (restoring the final state gives the clean answer), and the
command line's one-line errors. TransformerLens's patching is the external reference
(tests/engines/test_patch_vs_transformer_lens.py).
"""
import json

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.errors import UsageError
from ffnlab.interventions.causal_trace import causal_trace, subject_range, window_layers
from ffnlab.interventions.patching import metric, patch
from ffnlab.model import Model
from mlp_models import tiny_gguf
from block_checks import CONFIGS, random_params

CLEAN, CORRUPT = np.array([3, 7, 1, 9, 4, 2]), np.array([3, 12, 5, 9, 4, 2])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("node", ["l_out", "ffn_out", "attn_out"])
def test_patching_equals_one_patch_at_a_time(arch, node):
    m = Model(CONFIGS[arch], random_params(CONFIGS[arch]))
    target, foil = 5, 17
    r = patch(m, CLEAN, CORRUPT, target, foil, node)
    with ffnlab.trace(m, filter=f"{node}-") as t:
        m.forward(CLEAN)
    span = r["clean"] - r["corrupt"]
    for il, p in [(0, 1), (1, 2), (m.config.n_layer - 1, len(CLEAN) - 1)]:
        def put(v, name, pos, row=t[f"{node}-{il}"][p]):
            v = v.copy()
            v[p] = row
            return v
        with ffnlab.hooks(m, {f"{node}-{il}": put}):
            got = float(metric(m.forward(CORRUPT)[-1], target, foil))
        # batch of T vs one row: the same products blocked differently, float32 rounding of
        # O(10) logits (|logit| * d_model * eps ~ 1e-4) divided by the clean-corrupt span
        tol = 1e-4 * max(1.0, 10 / abs(span))
        assert abs(r["effect"][il][p] - (got - r["corrupt"]) / span) < tol
    if node == "l_out":
        # the last layer's state: at the last position it is the clean answer; elsewhere it
        # reaches no later position, so it changes nothing (up to the batch's rounding)
        assert r["effect"][-1][-1] == pytest.approx(1.0, abs=tol)
        assert max(abs(v) for v in r["effect"][-1][:-1]) < tol


def test_patching_refuses_prompts_of_different_lengths():
    m = Model(CONFIGS["llama"], random_params(CONFIGS["llama"]))
    with pytest.raises(UsageError, match="--clean has 6 tokens and --corrupt 5"):
        patch(m, CLEAN, CORRUPT[:5], 5, 17)
    with pytest.raises(UsageError, match="--node ffn_outt: the model has no node ffn_outt-0"):
        patch(m, CLEAN, CORRUPT, 5, 17, "ffn_outt")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_causal_trace_restoring_the_last_state_gives_clean_p_exactly(arch):
    m = Model(CONFIGS[arch], random_params(CONFIGS[arch]))
    r = causal_trace(m, CLEAN, 1, 2, None, noise=3.0, samples=4, window=2, seed=1)
    L, T = m.config.n_layer, len(CLEAN)
    assert r["hidden"][L - 1][T - 1] == r["clean_p"]
    assert r["corrupt_p"] != r["clean_p"]
    # restoring a position before the subject restores nothing that differs: it was never noised
    assert r["hidden"][0][0] == pytest.approx(r["corrupt_p"], rel=1e-6)


def test_causal_trace_is_reproducible_from_its_seed():
    m = Model(CONFIGS["llama"], random_params(CONFIGS["llama"]))
    a = causal_trace(m, CLEAN, 1, 2, 5, samples=3, window=2, seed=7)
    assert a == causal_trace(m, CLEAN, 1, 2, 5, samples=3, window=2, seed=7)
    assert a != causal_trace(m, CLEAN, 1, 2, 5, samples=3, window=2, seed=8)


def test_subject_range_and_window_follow_rome():
    toks = ["The", " E", "iffel", " Tower", " is", " in"]
    assert subject_range(toks, "", "The Eiffel Tower") == (0, 3)
    assert subject_range(toks, "", "Eiffel") == (1, 2)
    assert list(window_layers(0, 30, 10)) == list(range(0, 5))
    assert list(window_layers(15, 30, 10)) == list(range(10, 20))
    assert list(window_layers(29, 30, 10)) == list(range(24, 30))
    with pytest.raises(UsageError, match="does not occur in the prompt"):
        subject_range(toks, "p", "Louvre")


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_patch_and_causal_trace_json(capsys, tmp_path):
    path = tiny_gguf("f32")
    code, out, err = run_cli(capsys, "patch", "-m", path, "--clean", "abcd", "--corrupt", "abxd", "--target", "e",
                             "--foil", "y", "--node", "ffn_out", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["node"] == "ffn_out" and r["tokens"] == list("abcd") and len(r["effect"]) == 2
    assert all(len(row) == 4 for row in r["effect"])
    code, out, err = run_cli(capsys, "causal-trace", "-m", path, "-p", "abcd", "--subject", "bc", "--samples", "2",
                             "--window", "2", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert r["subject"] == [1, 2] and len(r["hidden"]) == 2 and r["hidden"][1][3] == r["clean_p"]
    code, out, err = run_cli(capsys, "causal-trace", "-m", path, "-p", "abcd", "--subject", "bc", "--samples", "2",
                             "--window", "2", "--out", str(tmp_path / "ct.png"))
    assert code == 0 and (tmp_path / "ct.png").stat().st_size > 1000


@pytest.mark.parametrize("argv,msg", [
    (["patch", "--clean", "abcd", "--corrupt", "abc", "--target", "e", "--foil", "y"], "--clean has 4 tokens and --corrupt 3"),
    (["patch", "--clean", "abcd", "--corrupt", "abxd", "--target", "ee", "--foil", "y"], "--target 'ee' is 2 tokens"),
    (["causal-trace", "-p", "abcd", "--subject", "zz"], "--subject 'zz' does not occur"),
    (["causal-trace", "-p", "abcd", "--subject", "b", "--target", "xyz"], "--target 'xyz' is 3 tokens"),
])
def test_cli_bad_input_is_one_line(capsys, argv, msg):
    code, out, err = run_cli(capsys, argv[0], "-m", tiny_gguf("f32"), *argv[1:])
    assert code == 1 and msg in err and err.count("\n") == 1, err


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "qwen2"])
@pytest.mark.parametrize("node", ["l_out", "ffn_out"])
def test_lens_of_the_last_layer_is_the_models_logits(arch, node):
    from ffnlab.interventions.lens import logit_lens
    m = Model(CONFIGS[arch], random_params(CONFIGS[arch]))
    r = logit_lens(m, CLEAN, node, top=3)
    assert len(r["top_ids"]) == m.config.n_layer and len(r["top_ids"][0]) == len(CLEAN)
    if node == "l_out":
        assert np.array_equal(r["last_lens"], r["logits"])                 # bit for bit
        assert r["top_ids"][-1][-1] == list(np.argsort(-r["logits"][-1], kind="stable")[:3])


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_attribution_units_sum_to_the_mlp_outputs_direct_effect(arch):
    from ffnlab.interventions.attribution import attribute
    from ffnlab.model.params import lm_head_name
    m = Model(CONFIGS[arch], random_params(CONFIGS[arch]))
    cfg, p = m.config, m.params
    r = attribute(m, CLEAN, 5, top=cfg.d_ff)
    with ffnlab.trace(m, filter=f"l_out-{cfg.n_layer - 1}$") as t:
        logits = m.forward(CLEAN)
    # the direction, written out in float64 from the weights (the final norm's scale frozen)
    x = t[f"l_out-{cfg.n_layer - 1}"][-1].astype(np.float64)
    d = p[lm_head_name(cfg)][5].astype(np.float64) * p["output_norm.weight"]
    if cfg.norm == "layernorm":
        d = (d - d.mean()) / np.sqrt(((x - x.mean()) ** 2).mean() + cfg.norm_eps)
        # the linearization is exact for the last state itself: logit = d . x + head[t] . b_norm
        want = d @ x + p[lm_head_name(cfg)][5].astype(np.float64) @ p["output_norm.bias"]
    else:
        d = d / np.sqrt((x * x).mean() + cfg.norm_eps)
        want = d @ x
    if not cfg.final_logit_softcap:
        assert want == pytest.approx(float(logits[-1, 5]), rel=1e-5, abs=1e-5)
    for lay in r["layers"]:
        units = sorted(lay["units"], key=lambda u: u[0])
        assert len(units) == cfg.d_ff
        # float32 ffn_out vs the float64 sum of its units: eps32 * sqrt(d_ff) * sum|terms|
        bound = 4 * np.finfo(np.float32).eps * np.sqrt(cfg.d_ff) * sum(abs(a) for _, a, _ in units) + 1e-6
        assert abs(lay["total"] - lay["ffn_out"]) <= bound
        assert [u[1] for u in lay["units"]] == sorted((u[1] for u in lay["units"]), reverse=True)


def test_cli_lens_and_attribute(capsys, tmp_path):
    path = tiny_gguf("f32")
    code, out, err = run_cli(capsys, "lens", "-m", path, "-p", "abcd", "--top", "2", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert len(r["top_ids"]) == 2 and len(r["top_ids"][0]) == 4 and len(r["top_ids"][0][0]) == 2
    code, out, err = run_cli(capsys, "lens", "-m", path, "-p", "abcd", "--html", str(tmp_path / "l.html"))
    assert code == 0 and "<table>" in (tmp_path / "l.html").read_text()
    code, out, err = run_cli(capsys, "attribute", "-m", path, "-p", "abcd", "--target", "e", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert len(r["layers"]) == 2 and r["node"] == "ffn_swiglu"
    code, out, err = run_cli(capsys, "attribute", "-m", path, "-p", "abcd", "--target", "ef")
    assert code == 1 and "--target 'ef' is 2 tokens" in err
