"""`ffnlab experts`: routing statistics against the router's own outputs read from the forward's cache."""
import json

import numpy as np

from ffnlab.evaluation.activations import DEFAULT_MIN_CONTEXT
from ffnlab.evaluation.experts import layer_report, scan_routing
from ffnlab.model import Model
from ffnlab.model.transformer import forward
from ffnlab.training.data import byte_tokenizer
from moe_models import MOE_TEXT, byte_moe_model

TEXT = MOE_TEXT


def model():
    return byte_moe_model()


def test_counts_cofiring_and_entropy_equal_the_routers_outputs():
    m = model()
    layers = scan_routing(m, TEXT, ctx=128, batch=1)
    ids = np.array(m.tokenizer.encode(TEXT, add_bos=False))[None]
    _, cache = forward(m.params, m.config, ids, train=True)          # one window holds the whole text
    N = DEFAULT_MIN_CONTEXT                                          # its first N tokens are context only
    ids = ids[:, N:]
    for il, L in enumerate(layers):
        c = cache.blocks[il].ffn
        topk, probs = c.topk[N:], c.probs[N:]
        E = m.config.n_expert
        assert L.n_tokens == ids.size
        assert np.array_equal(L.counts, np.bincount(topk.reshape(-1), minlength=E))
        chosen = np.zeros((ids.size, E), int)
        for n, row in enumerate(topk):
            chosen[n, row] = 1
        assert np.array_equal(L.cofire, chosen.T @ chosen)
        ent = -(probs * np.log(probs)).sum(-1).mean()
        r = layer_report(L, m.tokenizer)
        assert np.isclose(r["router_entropy"], ent, rtol=1e-5)
        assert np.isclose(r["cv"], L.counts.std() / L.counts.mean())
        assert sum(e["tokens"] for e in r["experts"]) == 2 * ids.size
        # the top token of each expert really was routed there that often
        for e in r["experts"]:
            for t in e["top_tokens"]:
                assert t["count"] == int(((ids[0] == t["id"]) & chosen[:, e["expert"]].astype(bool)).sum())


def test_experts_cli_json_and_files(tmp_path, capsys):
    from ffnlab.cli.main import main
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import tokenizer_meta
    m = model()
    save_model(str(tmp_path / "ck"), m.config, m.params, m.tokenizer, tokenizer_meta(m.tokenizer, "byte"))
    data = tmp_path / "d.txt"
    data.write_text(TEXT * 3)
    rc = main(["experts", "-m", str(tmp_path / "ck"), "--data", str(data), "--json", "--ctx", "64",
               "--png", str(tmp_path / "e.png"), "--html", str(tmp_path / "e.html")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(out["layers"]) == {"0", "1"} and out["n_expert"] == 5
    assert (tmp_path / "e.png").stat().st_size > 1000 and "layer 1" in (tmp_path / "e.html").read_text()


def test_experts_on_a_dense_model_is_one_line(tmp_path, capsys):
    from ffnlab.cli.main import main
    from ffnlab.config import ModelConfig
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import tokenizer_meta
    cfg = ModelConfig(vocab_size=256)
    tok = byte_tokenizer()
    save_model(str(tmp_path / "ck"), cfg, Model.random(cfg).params, tok, tokenizer_meta(tok, "byte"))
    (tmp_path / "d.txt").write_text(TEXT)
    rc = main(["experts", "-m", str(tmp_path / "ck"), "--data", str(tmp_path / "d.txt")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(lines) == 1 and "not a mixture of experts" in lines[0]


def test_neurons_and_prune_on_a_mixture_of_experts_are_one_line(tmp_path, capsys):
    from ffnlab.cli.main import main
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import tokenizer_meta
    m = model()
    save_model(str(tmp_path / "ck"), m.config, m.params, m.tokenizer, tokenizer_meta(m.tokenizer, "byte"))
    (tmp_path / "d.txt").write_text(TEXT)
    for argv in (["neurons", "--layer", "0", "--data", str(tmp_path / "d.txt"), "--ctx", "32"],
                 ["prune", "--keep", "0.5", "--by", "weight", "--out", str(tmp_path / "p.gguf"), "--ctx", "32"]):
        rc = main([argv[0], "-m", str(tmp_path / "ck"), *argv[1:]])
        lines = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and "has a mixture of experts (5 experts per layer)" in lines[0], lines
