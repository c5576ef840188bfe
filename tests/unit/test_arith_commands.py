"""Every command that takes --arith computes in that arithmetic: in ggml mode, what it prints equals
the ggml forward's own values for the same nodes (ffnlab.load(path, arith="ggml").forward), and
differs from the float32 forward's (so each check can fail).

The commands run in-process through the CLI's main() on tiny Q8_0 GGUFs (a dense SwiGLU model and a
mixture of experts) written by ffnlab's exporter: Q8_0 weights make ggml mode quantize the
activations to 8-bit blocks before every product, so the two arithmetics disagree by ~1e-2
relative, far above any summation-order effect; ggml's norms, softmax and RoPE differ too.
The floats compared come from the same code on the same arrays, so they are compared exactly.
"""
import functools
import json
import os
import tempfile

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from mlp_models import TEXT, tiny_gguf

PROMPT = "First Citizen: Before we proceed"
CORRUPT = "First Citizen: Before we procure"          # the same number of byte tokens


@functools.lru_cache(maxsize=None)
def models(path):
    return {a: ffnlab.load(path, progress=False, arith=a) for a in ("f32", "ggml")}


@functools.lru_cache(maxsize=None)
def moe_gguf():
    from ffnlab.formats.export_gguf import export_gguf
    from ffnlab.training.data import byte_tokenizer, tokenizer_meta
    from moe_models import moe_config, random_params
    cfg = moe_config(E=4, K=2, d_model=32, d_ff=32, vocab_size=256, n_ctx=128)
    tok = byte_tokenizer()
    path = os.path.join(tempfile.mkdtemp(prefix="ffnlab-arith-moe-"), "moe-q8_0.gguf")
    export_gguf(cfg, random_params(cfg, np.float32, seed=2), tok, tokenizer_meta(tok, "byte"), path, "q8_0")
    return path


def cli_json(capsys, *argv):
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def ids_of(m, text):
    return np.array(m.tokenizer.encode(text))


@pytest.fixture(scope="module")
def dense():
    path = tiny_gguf("q8_0")
    return path, models(path)


def test_the_two_arithmetics_disagree_on_the_tiny_model(dense):
    """What the checks below rest on: a Q8_0 model's logits differ between f32 and ggml."""
    _, m = dense
    a, b = (m[k].forward(ids_of(m[k], PROMPT)) for k in ("f32", "ggml"))
    assert np.abs(a - b).max() > 1e-3 * np.abs(a).max()


def test_lens_last_layer_equals_the_ggml_logits(dense, capsys):
    path, m = dense
    out = cli_json(capsys, "lens", "-m", path, "-p", PROMPT, "--arith", "ggml", "--top", "3")
    for arith, equal in (("ggml", True), ("f32", False)):
        logits = m[arith].forward(ids_of(m[arith], PROMPT))              # [T, vocab]
        top = np.sort(logits, axis=-1)[:, ::-1][:, :3]
        assert np.array_equal(np.asarray(out["top_logits"][-1], np.float32), top) == equal, arith


def test_patch_metrics_equal_the_ggml_forward(dense, capsys):
    path, m = dense
    out = cli_json(capsys, "patch", "-m", path, "--clean", PROMPT, "--corrupt", CORRUPT, "--target", "#100",
                   "--foil", "#101", "--node", "ffn_out", "--arith", "ggml")
    for arith, equal in (("ggml", True), ("f32", False)):
        clean, corrupt = (m[arith].forward(ids_of(m[arith], t))[-1].astype(np.float64) for t in (PROMPT, CORRUPT))
        assert (out["clean"] == clean[100] - clean[101]) == equal, arith
        assert (out["corrupt"] == corrupt[100] - corrupt[101]) == equal, arith


def test_causal_trace_clean_probability_is_the_ggml_models(dense, capsys):
    path, m = dense
    out = cli_json(capsys, "causal-trace", "-m", path, "-p", PROMPT, "--subject", "Citizen", "--samples", "2",
                   "--arith", "ggml")
    for arith, near in (("ggml", True), ("f32", False)):
        z = m[arith].forward(ids_of(m[arith], PROMPT))[-1].astype(np.float64)
        p = np.exp(z - z.max())
        p = p[out["target_id"]] / p.sum()
        # the command runs the head on the final norm's rows of a batch: 1e-6 covers a product's
        # other blocking of the same float32 sums (d_model 64 x eps 6e-8 x the logits' size), and
        # is far below the two arithmetics' ~1e-2 disagreement
        assert (abs(out["clean_p"] - p) <= 1e-6 * p) == near, arith


def test_attribute_logit_is_the_ggml_logit(dense, capsys):
    path, m = dense
    out = cli_json(capsys, "attribute", "-m", path, "-p", PROMPT, "--target", "#100", "--arith", "ggml")
    for arith, equal in (("ggml", True), ("f32", False)):
        logits = m[arith].forward(ids_of(m[arith], PROMPT))
        assert (np.float32(out["logit"]) == logits[-1, 100]) == equal, arith


def test_perplexity_equals_the_ggml_forwards_nll(dense, capsys, tmp_path):
    from ffnlab.evaluation.perplexity import chunk_nll
    path, m = dense
    data = tmp_path / "d.txt"
    data.write_text(TEXT)
    out = cli_json(capsys, "perplexity", "-m", path, "--data", str(data), "--ctx", "64", "--chunks", "2", "--arith", "ggml")
    ids = np.array(m["ggml"].tokenizer.encode(TEXT, add_bos=False)[:128]).reshape(2, 64)
    for arith, equal in (("ggml", True), ("f32", False)):
        nll = chunk_nll(m[arith].forward(ids), ids).astype(np.float64)
        assert (out["ppl"] == pytest.approx(float(np.exp(nll.mean())), rel=1e-12)) == equal, arith


def test_neurons_values_are_ggml_activations(dense, capsys, tmp_path):
    """Each top window's value is one of the ggml forward's activations of that unit, over the
    one window the short text makes."""
    path, m = dense
    data = tmp_path / "d.txt"
    text = TEXT[:120]
    data.write_text(text)
    out = cli_json(capsys, "neurons", "-m", path, "--layer", "1", "--data", str(data), "--ctx", "128", "--top", "3",
                   "--units", "4", "--arith", "ggml")
    for arith, inside in (("ggml", True), ("f32", False)):
        with ffnlab.trace(m[arith], filter="ffn_swiglu-1$") as t:
            m[arith].forward(np.array(m[arith].tokenizer.encode(text, add_bos=False)))
        acts = t["ffn_swiglu-1"]                                          # [T, d_ff]
        found = [np.float32(w["value"]) in set(acts[:, u["unit"]].tolist()) for u in out["units"] for w in u["windows"]]
        assert (all(found) if inside else not any(found)), arith


def test_trace_values_are_the_ggml_nodes(dense, capsys, tmp_path):
    path, m = dense
    cli_json(capsys, "trace", "-m", path, "-p", PROMPT, "--arith", "ggml", "--dump", str(tmp_path / "d"))
    index = json.loads((tmp_path / "d" / "index.json").read_text())
    entries = index["nodes"] if isinstance(index, dict) else index
    for arith, equal in (("ggml", True), ("f32", False)):
        with ffnlab.trace(m[arith]) as t:
            m[arith].forward(ids_of(m[arith], PROMPT))
        for name in ("ffn_out-0", "kq_soft_max-1", "ffn_swiglu-1", "result_output"):   # after a Q8_0 product
            e = next(e for e in entries if e["name"] == name)
            assert np.array_equal(np.load(tmp_path / "d" / e["file"]), t[name]) == equal, (arith, name)


def test_run_greedy_tokens_are_the_ggml_models(dense, capsys):
    path, m = dense
    out = cli_json(capsys, "run", "-m", path, "-p", PROMPT, "-n", "8", "--temp", "0", "--ignore-eos", "--arith", "ggml")
    ids = list(ids_of(m["ggml"], PROMPT))
    for _ in range(8):                                                   # greedy by full recomputation
        ids.append(int(np.argmax(m["ggml"].forward(np.array(ids))[-1])))
    assert out["ids"] == ids[-8:] or out["ids"] == ids


def test_experts_statistics_are_the_ggml_routers(capsys, tmp_path):
    """The command's per-layer router entropy equals the library's accumulator fed with the ggml
    forward's own router probabilities and choices, over the positions the command scored."""
    from ffnlab.evaluation.experts import LayerRouting
    path = moe_gguf()
    m = models(path)
    data = tmp_path / "d.txt"
    text = TEXT[:120]
    data.write_text(text)
    out = cli_json(capsys, "experts", "-m", path, "--data", str(data), "--ctx", "128", "--arith", "ggml")
    cfg = m["ggml"].config
    ids = np.array(m["ggml"].tokenizer.encode(text, add_bos=False))
    for arith, equal in (("ggml", True), ("f32", False)):
        with ffnlab.trace(m[arith], filter="ffn_moe_(probs|topk)") as t:
            m[arith].forward(ids)
        for il in range(cfg.n_layer):
            got = out["layers"][str(il)]
            n = got["n_tokens"]                                          # the window's last n tokens were scored
            L = LayerRouting(cfg.n_expert, cfg.n_expert_used, cfg.vocab_size)
            L.update(t[f"ffn_moe_probs-{il}"][-n:], t[f"ffn_moe_topk-{il}"][-n:], ids[-n:])
            assert (got["router_entropy"] == L.entropy_sum / L.n_tokens) == equal, (arith, il)
