"""`ffnlab features show` on a tiny GGUF: the quantile bins of a latent's activations (their range and their
windows, the activating token marked) in the text and the HTML page as in the --json output, and
--neuronpedia OUTDIR: one file a latent in Neuronpedia's field names (SAEDashboard's
sae_dashboard/neuronpedia/neuronpedia_export.py `Feature` / `Activation`) holding the --json output's values;
a bad OUTDIR is one line with nothing written."""
import html
import json
import os
import re

import numpy as np
import pytest

from ffnlab.cli.main import main
from ffnlab.features import saelens_io
from ffnlab.features.dictionary import DictConfig, init_params
from mlp_models import TEXT, tiny_gguf, write_text

DATA = TEXT + "<script>alert('x')</script> & co.\n" + TEXT      # markup in the corpus: the page must escape it


@pytest.fixture(scope="module")
def argv(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bins")
    cfg = DictConfig("transcoder", "topk", 64, 32, 64, k=4)
    d = str(tmp / "tc")
    os.makedirs(d)
    saelens_io.save(d, init_params(cfg, np.random.default_rng(0)), cfg,
                    saelens_io.cfg_dict(cfg, "ffn_norm-1", "ffn_out-1", "tiny", {"site_in": "ffn_norm-1",
                                                                                 "site_out": "ffn_out-1"}))
    return ["features", "show", d, "-m", tiny_gguf("f32"), "--data", write_text(tmp, DATA), "--ctx", "48",
            "--min-context", "8", "--features", "0,1,5", "--top", "3", "-t", "1"]


@pytest.fixture(scope="module")
def run(argv, tmp_path_factory):
    """one run with --json, --html and --neuronpedia: (its JSON, its page, {latent: its Neuronpedia file})"""
    import contextlib
    import io
    tmp = tmp_path_factory.mktemp("out")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(argv + ["--json", "--html", str(tmp / "f.html"), "--neuronpedia", str(tmp / "np")]) == 0
    pages = json.loads(out.getvalue())
    files = {int(n[:-5]): json.load(open(tmp / "np" / n, encoding="utf-8")) for n in os.listdir(tmp / "np")}
    return pages, (tmp / "f.html").read_text(encoding="utf-8"), files


def bins(f):
    qs = f["quantiles"]
    assert [q["quantile"] for q in qs] == [[0.5, 0.75], [0.25, 0.5], [0.0, 0.25]]
    assert all(q["windows"] for q in qs), "each bin of these latents has examples"
    return qs


def marked(w):
    """the window's activating token, from its token list, as the text marks it"""
    tok = w["tokens"][w["at"]]
    assert "[[" + tok + "]]" in w["text"] and w["values"][w["at"]] == w["value"]
    return tok


def test_a_bin_holds_the_activations_of_its_quantiles(run):
    pages, _, _ = run
    for f in pages["features"]:
        prev_low = f["windows"][-1]["value"]
        for q in bins(f):
            lo, hi = q["range"]
            assert lo <= hi <= prev_low and q["contains"] == pytest.approx(0.25, abs=2 / f["count"])
            assert all(lo <= w["value"] <= hi for w in q["windows"])
            prev_low = lo


def recount(argv):
    """every scored text token's latents, recounted without pages.py: the model's ffn_norm-1 one window at a time
    and the transcoder's encoder in NumPy (TopK: each token's k largest pre-activations, ReLU'd)
    -> [n_text, d_sae], NaN where a token is not scored"""
    import ffnlab
    from ffnlab.evaluation.activations import context_windows
    from ffnlab.features.harvest import capture
    p, cfg, _ = saelens_io.load(argv[2])
    model = ffnlab.load(tiny_gguf("f32"), progress=False)
    ids = np.array(model.tokenizer.encode(DATA, add_bos=False), dtype=np.int64)
    cw = context_windows(ids, 48, 8, None)
    out = np.full((len(ids), cfg.d_sae), np.nan)
    for w, start, sf in zip(cw.windows, cw.starts, cw.scored_from):
        got, _ = capture(model, w[None], ["ffn_norm-1"])
        pre = got["ffn_norm-1"][0].astype(np.float64) @ p["W_enc"] + p["b_enc"]         # [T, d_sae]
        kth = np.sort(pre, axis=1)[:, -cfg.k][:, None]
        out[start + sf:start + len(w)] = np.where(pre >= kth, np.maximum(pre, 0), 0)[sf:]
    return out


def test_a_windows_values_are_the_latents_activations_at_its_tokens(argv, run):
    pages, _, _ = run
    acts = recount(argv)
    for f in pages["features"]:
        for w in f["windows"] + [w for q in bins(f) for w in q["windows"]]:
            a = w["token"] - w["at"]                                                 # the window's first text token
            want = acts[a:a + len(w["values"]), f["latent"]]
            assert not np.isnan(want).any(), "a window holds only tokens that were scored"
            np.testing.assert_allclose(w["values"], want, atol=2e-4)


def test_text_shows_each_bin_after_the_top_windows(argv, run, capsys):
    pages, _, _ = run
    assert main(argv) == 0
    out = capsys.readouterr().out
    for f in pages["features"]:
        section = re.search(rf"^latent {f['latent']} .*?(?=^latent |\Z)", out, re.S | re.M).group(0)
        at = max(section.index(repr(w["text"])) for w in f["windows"])
        for q in bins(f):
            lo, hi = q["quantile"]
            label = re.search(rf"^  quantile {100 * lo:.0f}-{100 * hi:.0f}%: .*$", section[at:], re.M)
            assert label and f"{q['range'][0]:.4g} to {q['range'][1]:.4g}" in label.group(0)
            at += label.end()
            for w in q["windows"]:
                assert "[[" + marked(w) + "]]" in w["text"]
                at = section.index(f"{w['value']:+9.4g}  {w['text']!r}", at)


def test_html_shows_each_bin_with_its_token_marked_and_escaped(run):
    pages, page, _ = run
    assert page.count("<script") == 1                                      # the page's own data, no corpus markup
    data = re.search(r"<script type='application/json' id='data'>(.*?)</script>", page, re.S).group(1)
    assert json.loads(html.unescape(data))["features"] == pages["features"]
    for f in pages["features"]:
        body = page.split(f"<div class='f' id='latent-{f['latent']}'>")[1].split("<div class='f'")[0]
        shown = f["windows"] + [w for q in bins(f) for w in q["windows"]]
        assert body.count('<b class="tok">') == len(shown)
        at = 0
        for q in bins(f):
            lo, hi = q["quantile"]
            at = body.index(f"<h3 class='bin'>quantile {100 * lo:.0f}-{100 * hi:.0f}%: ", at)
            assert f"{q['range'][0]:.4g} to {q['range'][1]:.4g}" in body[at:body.index("</h3>", at)]
            for w in q["windows"]:
                before, rest = w["text"].split("[[" + marked(w) + "]]", 1)
                shown = html.escape(before) + f'<b class="tok">{html.escape(marked(w))}</b>' + html.escape(rest)
                at = body.index(f"<pre>{w['value']:+.4g}  {shown}</pre>", at)


def test_neuronpedia_writes_one_file_a_latent_with_the_json_values(run):
    pages, _, files = run
    assert sorted(files) == sorted(f["latent"] for f in pages["features"])
    for f in pages["features"]:
        n = files[f["latent"]]
        assert n["modelId"] == "tiny" and n["layer"] == "1-tc" and n["index"] == str(f["latent"])
        assert n["frac_nonzero"] == f["density"] and n["maxActApprox"] == f["max"]
        assert n["freq_hist_data_bar_heights"] == f["hist"]["counts"]
        assert n["pos_str"] == [e["token"] for e in f["logits_pos"]]
        assert n["pos_values"] == [e["logit"] for e in f["logits_pos"]]
        assert n["neg_str"] == [e["token"] for e in f["logits_neg"]]
        assert n["neg_values"] == [e["logit"] for e in f["logits_neg"]]
        assert n["logits_hist_data_bar_heights"] == f["logits_hist"]["counts"]
        assert sum(n["logits_hist_data_bar_heights"]) == 256                       # the byte vocabulary
        assert n["neuron_alignment_indices"] == [e["neuron"] for e in f["neurons"]["down"]]
        shown = [(w, None) for w in f["windows"]] + [(w, q) for q in bins(f) for w in q["windows"]]
        assert len(n["activations"]) == len(shown)
        for a, (w, q) in zip(n["activations"], shown):
            assert a["tokens"] == w["tokens"] and a["values"] == w["values"]
            assert "".join(a["tokens"]) == w["text"].replace("[[", "").replace("]]", "")
            assert a["maxValue"] == max(w["values"]) and a["values"][a["maxValueTokenIndex"]] == a["maxValue"]
            assert a["tokens"][a["qualifyingTokenIndex"]] == marked(w)
            assert a["values"][a["qualifyingTokenIndex"]] == w["value"]
            if q is None:
                assert "binMin" not in a
            else:
                assert [a["binMin"], a["binMax"], a["binContains"]] == [*q["range"], q["contains"]]


def _one_line_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "error:" in err, err
    return err


@pytest.mark.parametrize("case", ["file", "under a file", "read-only"])
def test_a_bad_outdir_is_one_line_and_nothing_is_written(argv, tmp_path, capsys, case):
    if case == "read-only" and os.geteuid() == 0:
        pytest.skip("running as root, which no folder refuses: the read-only case needs a non-root user")
    (tmp_path / "taken").write_text("mine")
    outdir = {"file": tmp_path / "taken", "under a file": tmp_path / "taken" / "np",
              "read-only": tmp_path / "ro" / "np"}[case]
    if case == "read-only":
        (tmp_path / "ro").mkdir(mode=0o500)
    before = sorted(os.listdir(tmp_path))
    err = _one_line_error(capsys, argv + ["--neuronpedia", str(outdir)])
    assert f"--neuronpedia {outdir}" in err
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "taken").read_text() == "mine"
    if case == "read-only":
        assert os.listdir(tmp_path / "ro") == []


def test_a_write_that_fails_midway_leaves_no_folder(run, tmp_path, monkeypatch):
    from ffnlab.features import neuronpedia
    pages, _, _ = run
    real, calls = json.dump, []

    def disk_full(obj, fh, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        real(obj, fh, **kw)
    monkeypatch.setattr(neuronpedia.json, "dump", disk_full)
    with pytest.raises(OSError):
        neuronpedia.write_features(str(tmp_path / "np"), pages, "tiny", "1-tc")
    assert os.listdir(tmp_path) == []


def test_the_source_is_cfg_jsons_neuronpedia_id_where_it_has_one():
    from ffnlab.features.neuronpedia import source_of
    assert source_of({"metadata": {"neuronpedia_id": "gpt2-small/0-res-jb", "model_name": "gpt2"}}, "d", "l_out-0",
                     "x.gguf") == ("gpt2-small", "0-res-jb")
    assert source_of({"metadata": {}}, "runs/tc12/", "ffn_out-12", "x.gguf") == ("x.gguf", "12-tc12")
