"""`ffnlab attribute --features DIR` on a tiny GGUF: the latents' table and JSON come from attribute_latents
(whose values tests/model/test_features_attribution.py holds to torch autograd), and a directory that does not
write an MLP's output, or two for one layer, is one line."""
import json

import numpy as np
import pytest

from ffnlab.cli.main import main
from ffnlab.features import saelens_io
from ffnlab.features.dictionary import DictConfig, init_params
from mlp_models import tiny_gguf

PROMPT = "First Citizen:\nBefore we"


def dictionary_dir(path, kind="transcoder", site="ffn_norm-1", site_out="ffn_out-1"):
    cfg = DictConfig(kind, "topk", 64, 96, 64, k=6)
    meta = saelens_io.cfg_dict(cfg, site, site_out, "tiny", {"site_in": site, "site_out": site_out, "n_vocab": 256})
    path.mkdir(parents=True, exist_ok=True)
    p = init_params(cfg, np.random.default_rng(0))
    p["b_enc"] += np.float32(0.1)
    saelens_io.save(str(path), p, cfg, meta)
    return str(path)


def run(capsys, *flags):
    code = main(["attribute", "-m", tiny_gguf("f32"), "-p", PROMPT, "--target", "e", *flags])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_attribute_lists_the_transcoders_latents(tmp_path, capsys):
    d = dictionary_dir(tmp_path / "tc")
    code, out, err = run(capsys, "--features", d, "--json", "--top", "3")
    assert code == 0, err
    r = json.loads(out)
    (t,) = r["transcoders"]
    assert t["layer"] == 1 and t["features"] == d and 0 < t["firing"] <= 6
    assert len(t["latents"]) + len(t["negative"]) <= 6 and len(t["latents"]) <= 3
    assert t["total"] + t["b_dec"] + t["skip"] + t["error"] == pytest.approx(t["ffn_out"], rel=1e-9, abs=1e-9)
    assert t["ffn_out"] == pytest.approx(r["layers"][1]["ffn_out"], rel=1e-9, abs=1e-12)
    code, out, err = run(capsys, "--features", d, "--top", "3")
    assert code == 0 and f"latents of {d}" in out and f"ffnlab features show {d}" in out


@pytest.mark.parametrize("case,msg", [("sae", "latent attribution reads dictionaries that write an MLP's output"),
                                      ("twice", "both write ffn_out-1")])
def test_a_directory_that_cannot_be_attributed_is_one_line(tmp_path, capsys, case, msg):
    if case == "sae":
        flags = ["--features", dictionary_dir(tmp_path / "s", "sae", "l_out-1", "l_out-1")]
    else:
        d = dictionary_dir(tmp_path / "t")
        flags = ["--features", d, "--features", d]
    code, out, err = run(capsys, *flags)
    assert code == 1 and msg in err and err.count("\n") == 1, err
