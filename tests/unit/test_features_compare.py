"""`ffnlab features eval DIR --compare-model / --compare-arith` (features/compare.py): the quantization gap.

References: a byte-for-byte copy of the model file (every figure of the second side equals the first's, every
latent's correlation is 1 and its density unchanged); the per-latent correlation and density recomputed here
with NumPy from dense activations of the traced site (np.corrcoef), against the streamed sparse sums; and the
two tiny GGUFs of one set of weights, f32 and q8_0 (mlp_models.tiny_gguf), whose latents must track each other.
"""
import json
import shutil

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.evaluation.activations import batches
from ffnlab.features import saelens_io
from ffnlab.features.dictionary import DictConfig, encode, init_params
from ffnlab.features.evaluate import evaluate_dictionary
from mlp_models import TEXT, tiny_gguf, write_text

LAYER, WIDTH = 1, 128
WINDOW = ["--ctx", "48", "--min-context", "8", "--tokens", "2000", "-t", "1"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cmp")
    cfg = DictConfig("transcoder", "topk", 64, WIDTH, 64, k=8)
    site, site_out = f"ffn_norm-{LAYER}", f"ffn_out-{LAYER}"
    meta = saelens_io.cfg_dict(cfg, site, site_out, "tiny", {"site_in": site, "site_out": site_out, "n_vocab": 256})
    d = tmp / "tc"
    d.mkdir()
    p = init_params(cfg, np.random.default_rng(0))
    p["b_enc"] += np.float32(0.05)
    saelens_io.save(str(d), p, cfg, meta)
    return {"dir": str(d), "p": p, "cfg": cfg, "data": write_text(tmp, TEXT), "tmp": tmp}


def eval_json(capsys, s, *flags):
    code = main(["features", "eval", s["dir"], "--data", s["data"], *WINDOW, "--json", *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


FIGURES = ("tokens", "l0", "mse", "fvu", "ce_clean", "ce_spliced", "ce_ablated", "ce_loss_score", "kl_score")


def test_a_copy_of_the_model_file_shows_no_gap(setup, capsys, tmp_path):
    copy = str(tmp_path / "copy.gguf")
    shutil.copyfile(tiny_gguf("f32"), copy)
    m = eval_json(capsys, setup, "-m", tiny_gguf("f32"), "--compare-model", copy)
    c = m["compare"]
    assert {k: c[k] for k in FIGURES} == {k: m[k] for k in FIGURES}
    assert all(v == 0 for v in c["gap"].values())
    lat = c["latents"]["per_latent"]
    assert lat["density"] == lat["density_compare"]
    fired = [r for r, dens in zip(lat["correlation"], lat["density"]) if dens > 0]
    assert fired and all(r == pytest.approx(1.0, abs=1e-9) for r in fired)


def dense_latents(model, p, cfg, windows, tokens):
    """the site's latents at the scored positions, dense [R, d_sae], from a trace (the windows as eval reads them)"""
    rows, n = [], 0
    for first, ids in batches(windows.windows, 4):
        if n >= tokens:
            break
        _, scored = windows.positions(first, *ids.shape)
        with ffnlab.trace(model, filter=f"ffn_norm-{LAYER}$") as t:
            model.forward(ids)
        x = t[f"ffn_norm-{LAYER}"].reshape(*ids.shape, -1)[scored]
        rows.append(encode(p, cfg, np.ascontiguousarray(x, np.float32))[0].dense())
        n += int(scored.sum())
    return np.concatenate(rows).astype(np.float64)


def test_the_quantized_file_gap_and_latent_figures_match_a_dense_recount(setup, capsys):
    m = eval_json(capsys, setup, "-m", tiny_gguf("f32"), "--compare-model", tiny_gguf("q8_0"))
    c = m["compare"]
    assert c["arith"] == "f32" and c["model"].endswith("tiny-q8_0.gguf")
    for k in ("fvu", "ce_loss_score", "kl_score"):
        assert c["gap"][k] == c[k] - m[k]
    assert c["fvu"] != m["fvu"]                                                 # the quantized weights move it
    from ffnlab.cli.features import _windows
    import argparse
    a = ffnlab.load(tiny_gguf("f32"), progress=False)
    b = ffnlab.load(tiny_gguf("q8_0"), progress=False)
    cw, _ = _windows(argparse.Namespace(ctx=48, min_context=8, data=setup["data"]), a, TEXT)
    A = dense_latents(a, setup["p"], setup["cfg"], cw, 2000)
    B = dense_latents(b, setup["p"], setup["cfg"], cw, 2000)
    lat = c["latents"]["per_latent"]
    assert c["latents"]["tokens"] == len(A) == m["tokens"]
    assert lat["density"] == [round(float(v), 6) for v in (A > 0).mean(0)]
    assert lat["density_compare"] == [round(float(v), 6) for v in (B > 0).mean(0)]
    for j in range(WIDTH):
        if A[:, j].std() > 0 and B[:, j].std() > 0:
            assert lat["correlation"][j] == pytest.approx(np.corrcoef(A[:, j], B[:, j])[0, 1], abs=2e-6)
        else:
            assert lat["correlation"][j] is None
    # q8_0's weights are the f32 ones to 8 bits per block (relative error ~ 2^-8): the latents must track them
    assert c["latents"]["correlation_median"] > 0.9
    # the evaluation's own figures on the second side, recomputed through the library on the same windows
    from ffnlab.features.harvest import sites
    want = evaluate_dictionary(b, setup["p"], setup["cfg"], cw, *sites("transcoder", LAYER), 2000, 4)
    assert c["fvu"] == want["fvu"] and c["ce_loss_score"] == want["ce_loss_score"]


def test_the_other_arithmetic_of_one_file(setup, capsys):
    out = main(["features", "eval", setup["dir"], "--data", setup["data"], *WINDOW, "-m", tiny_gguf("q8_0"),
                "--compare-arith", "ggml"])
    text = capsys.readouterr().out
    assert out == 0
    assert "(f32)" in text and "(ggml), the same tokens:" in text and "gap (second - first): FVU" in text
    assert "(lowest correlation)" in text and "(largest density change)" in text


def one_line(capsys, s, *flags):
    code = main(["features", "eval", s["dir"], "--data", s["data"], *WINDOW, *flags])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    return err


def test_bad_comparisons_are_one_line(setup, capsys, tmp_path):
    from models import tiny_gguf as other_tiny
    assert "is the first model itself" in one_line(capsys, setup, "-m", tiny_gguf("f32"), "--compare-model",
                                                     tiny_gguf("f32"))
    assert "is the first model itself" in one_line(capsys, setup, "-m", tiny_gguf("f32"), "--compare-arith", "f32")
    other = other_tiny(tmp_path / "other.gguf")                                  # another model: d_model 32
    assert "is not the same model" in one_line(capsys, setup, "-m", tiny_gguf("f32"), "--compare-model", other)
    assert "no-such.gguf" in one_line(capsys, setup, "-m", tiny_gguf("f32"), "--compare-model",
                                      str(tmp_path / "no-such.gguf"))
    code = main(["features", "show", setup["dir"], "--data", setup["data"], "-m", tiny_gguf("f32"),
                 "--compare-arith", "ggml"])
    err = capsys.readouterr().err
    assert code == 1 and "flags of features eval" in err
