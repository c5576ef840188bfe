"""Feature pages' most similar neurons (features/pages.py): the cosine of a latent's decoder row with each down
column of its block's MLP, and of its encoder column with each up (and gate) row. References: latents built as
copies of chosen neurons (cosine +1 / -1 at that neuron) and a NumPy recount of every cosine."""
import json

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.features import saelens_io
from ffnlab.features.dictionary import DictConfig, init_params
from ffnlab.features.pages import mlp_vectors, similar_neurons
from mlp_models import TEXT, tiny_gguf, write_text

LAYER = 1


@pytest.fixture(scope="module")
def model():
    return ffnlab.load(tiny_gguf("f32"), progress=False)


def planted(model):
    """latent 0 writes 3 x neuron 17's down column; latent 1 reads neuron 5's up row; latent 2 reads minus
    neuron 9's gate row"""
    cfg = DictConfig("transcoder", "topk", 64, 32, 64, k=4)
    p = init_params(cfg, np.random.default_rng(0))
    w = model.params
    p["W_dec"][0] = 3 * w[f"blk.{LAYER}.ffn_down.weight"][:, 17]
    p["W_enc"][:, 1] = w[f"blk.{LAYER}.ffn_up.weight"][5]
    p["W_enc"][:, 2] = -0.5 * w[f"blk.{LAYER}.ffn_gate.weight"][9]
    return p, cfg


def test_a_latent_copied_from_a_neuron_finds_it(model):
    p, cfg = planted(model)
    near = [similar_neurons(mlp_vectors(model, LAYER), p, j) for j in range(3)]
    assert near[0]["down"][0]["neuron"] == 17 and near[0]["down"][0]["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert near[1]["up"][0]["neuron"] == 5 and near[1]["up"][0]["cosine"] == pytest.approx(1.0, abs=1e-6)
    assert near[2]["gate"][0]["neuron"] == 9 and near[2]["gate"][0]["cosine"] == pytest.approx(-1.0, abs=1e-6)


def test_the_cosines_are_those_of_a_recount(model):
    p, cfg = planted(model)
    down = model.params[f"blk.{LAYER}.ffn_down.weight"].astype(np.float64)          # [d_model, d_ff]
    for j in range(5, 9):
        v = p["W_dec"][j].astype(np.float64)
        cos = down.T @ v / np.linalg.norm(down, axis=0) / np.linalg.norm(v)
        want = sorted(range(len(cos)), key=lambda i: -abs(cos[i]))[:5]
        got = similar_neurons(mlp_vectors(model, LAYER), p, j)["down"]
        assert [e["neuron"] for e in got] == want
        assert [e["cosine"] for e in got] == [round(float(cos[i]), 4) for i in want]


def test_show_lists_them_in_json_and_text(model, tmp_path, capsys):
    p, cfg = planted(model)
    d = tmp_path / "tc"
    d.mkdir()
    site, out = f"ffn_norm-{LAYER}", f"ffn_out-{LAYER}"
    saelens_io.save(str(d), p, cfg, saelens_io.cfg_dict(cfg, site, out, "tiny", {"site_in": site, "site_out": out}))
    data = write_text(tmp_path, TEXT)
    argv = ["features", "show", str(d), "-m", tiny_gguf("f32"), "--data", data, "--ctx", "48", "--min-context", "8",
            "--features", "0,1", "-t", "1"]
    assert main(argv + ["--json"]) == 0
    pages = json.loads(capsys.readouterr().out)["features"]
    assert pages[0]["neurons"]["layer"] == LAYER and pages[0]["neurons"]["down"][0]["neuron"] == 17
    assert set(pages[1]["neurons"]) == {"layer", "down", "up", "gate"}
    assert main(argv) == 0
    assert f"neurons of layer {LAYER} (decoder row . down column): 17 +1.00" in capsys.readouterr().out
