"""`ffnlab neurons`: streaming top-K / statistics / histograms against brute force over every
activation, the text and JSON output, the histogram PNG, and the HTML page -- parsed for
self-containedness, and rendered in headless Chromium when /usr/bin/chromium exists.
"""
import html.parser
import json
import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.evaluation.activations import DEFAULT_MIN_CONTEXT, context_windows
from ffnlab.evaluation.neurons import BEFORE, StreamingHistogram, scan_layer, unit_report, window_text
from ffnlab.model.transformer import forward
from ffnlab.model.hooks import Hooks
from ffnlab.tracing.tracer import Tracer
from mlp_models import TEXT, tiny_gguf, write_text

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"


def all_activations(m, layer, n_ctx, min_context=DEFAULT_MIN_CONTEXT):
    """Brute force: every window alone, the whole traced node kept -> [(text index of the window's
    first text token, its first scored text index, acts [T_text, d_ff] of its text tokens)]."""
    tok = m.tokenizer
    bos = tok.bos_id if tok.add_bos else None
    cw = context_windows(tok.encode(TEXT, add_bos=False), n_ctx, min_context, bos)
    rows = []
    for w, start, first in zip(cw.windows, cw.starts, cw.scored_from):
        t = Tracer(filter=f"ffn_swiglu-{layer}$")
        forward(m.params, m.config, w[None], hooks=Hooks(t))
        rows.append((start, start + first - cw.lead, t[f"ffn_swiglu-{layer}"][cw.lead:]))   # BOS dropped
    return rows


def scored_acts(rows):
    """-> [N, d_ff] the scored tokens' activations in text order, and their text indices [N]."""
    acts = np.concatenate([a[first - start:] for start, first, a in rows])
    pos = np.concatenate([np.arange(first, start + len(a)) for start, first, a in rows])
    return acts, pos


def f32_atol(m, acts):
    """How far two float32 forwards of the same window may differ when only the summation order
    differs (the scan runs windows in batches of 3, the brute force one at a time, so BLAS blocks the
    products differently, and each CPU's kernels block them their own way). Each element of a
    product is a sum of d_model terms, each rounded with relative error eps = 2^-24; in the worst
    case those errors add up to d_model * eps times the size of the terms, and the terms here are of
    the order of the layer's largest activation. An element's own magnitude says nothing about its
    error (a unit near zero carries the rounding of its large terms), hence an absolute bound."""
    return m.config.d_model * np.finfo(np.float32).eps / 2 * float(np.abs(acts).max())


@pytest.fixture(scope="module", params=["f32", "bos"])
def scanned(request):
    m = ffnlab.load(tiny_gguf(request.param))
    scan = scan_layer(m, TEXT, layer=1, n_ctx=64, k=4, batch=3, bins=16)      # 16 overlapping windows, merged 6 times
    return m, scan, all_activations(m, 1, 64)


def assert_top_k(got, score, k, atol, what):
    """got: indices the streaming code ranked first; score: the brute-force scores. The indices must be
    the brute force's top k in its order, except that two scores within 2 * atol of each other may
    swap (the rounding of either side can order them either way)."""
    want = np.argsort(-score, kind="stable")[:k]
    assert len(set(got)) == len(got) == k, what
    kth = score[want[-1]]
    assert all(score[g] >= kth - 2 * atol for g in got), (what, list(got), list(want))
    assert all(score[a] >= score[b] - 2 * atol for a, b in zip(got, got[1:])), (what, list(got))
    clear = [i for i, w in enumerate(want) if np.sum(np.abs(score - score[w]) <= 2 * atol) == 1]
    assert [got[i] for i in clear] == [want[i] for i in clear], (what, list(got), list(want))


def test_top_k_per_unit_equals_brute_force(scanned):
    m, scan, rows = scanned
    acts, pos = scored_acts(rows)                                     # [N, d_ff], [N]
    assert scan.n_tokens == len(acts) == len(scan.ids) - DEFAULT_MIN_CONTEXT
    assert np.array_equal(pos, np.arange(DEFAULT_MIN_CONTEXT, len(scan.ids)))   # each scored once, in order
    atol = f32_atol(m, acts)
    for u in range(m.config.d_ff):
        got = scan.top.sorted(u)
        positions = [p - DEFAULT_MIN_CONTEXT for _, p, _ in got]      # rows of acts
        assert_top_k(positions, np.abs(acts[:, u]), 4, atol, u)
        np.testing.assert_allclose([v for v, _, _ in got], acts[positions, u], rtol=0, atol=atol)


def test_context_activations_are_the_units_activations_around_the_top_token(scanned):
    m, scan, rows = scanned
    atol = f32_atol(m, scored_acts(rows)[0])
    for u in (0, 17, 95):
        for v, p, ctx in scan.top.sorted(u):
            start, _, a = next(r for r in rows if r[1] <= p < r[0] + len(r[2]))   # the window that scored p
            t = p - start
            for j, c in enumerate(ctx):
                tt = t + j - BEFORE
                if 0 <= tt < len(a):                                  # context tokens show too, scored or not
                    np.testing.assert_allclose(c, a[tt, u], rtol=0, atol=atol)
                else:
                    assert np.isnan(c)                                # another window: not this token's context


def test_statistics_and_histogram_equal_numpy(scanned):
    m, scan, rows = scanned
    acts = scored_acts(rows)[0].astype(np.float64)
    # the sums are float64 on both sides, so what differs is the activations themselves: each by at
    # most f32_atol, which moves a mean |a|, a max, and a standard deviation by at most as much
    atol = f32_atol(m, acts)
    np.testing.assert_allclose(scan.stats.mean_abs, np.abs(acts).mean(0), rtol=0, atol=atol)
    np.testing.assert_allclose(scan.stats.std, acts.std(0), rtol=0, atol=atol)
    np.testing.assert_allclose(scan.stats.max, acts.max(0), rtol=0, atol=atol)
    assert_top_k(list(scan.ranking[:5]), np.abs(acts).mean(0), 5, atol, "ranking")
    for u in range(m.config.d_ff):
        # a value within atol of a bin edge may fall on either side: the scan's cumulative counts
        # must lie between those of the brute force's values shifted down and up by atol
        edges = scan.hist.edges(u)
        lo, _ = np.histogram(np.clip(acts[:, u] - atol, edges[0], edges[-1]), bins=edges)
        hi, _ = np.histogram(np.clip(acts[:, u] + atol, edges[0], edges[-1]), bins=edges)
        got = np.cumsum(scan.hist.counts[u])
        assert got[-1] == len(acts), u
        assert np.all(np.cumsum(hi) <= got) and np.all(got <= np.cumsum(lo)), u
        assert scan.hist.R[u] >= np.abs(acts[:, u]).max() - atol


def test_histogram_range_doubles_without_moving_counts():
    h = StreamingHistogram(1, bins=8)
    h.update(np.array([[0.3], [-0.9]]))                               # R = 1
    h.update(np.array([[3.5]]))                                      # R -> 4: pairs merge
    assert h.R[0] == 4
    counts, _ = np.histogram([0.3, -0.9, 3.5], bins=h.edges(0))
    assert np.array_equal(h.counts[0], counts)


def test_unit_report_window_marks_the_top_token(scanned):
    m, scan, _ = scanned
    u = int(scan.ranking[0])
    r = unit_report(scan, m.tokenizer, u)
    w = r["windows"][0]
    assert w["acts"][w["center"]] == pytest.approx(w["value"])
    assert w["ids"][w["center"]] == scan.ids[w["position"]]
    assert f"[[{m.tokenizer.decode([w['ids'][w['center']]])}]]".replace("\n", "\u21b5") in window_text(w)


# --- the command ----------------------------------------------------------------------------
def test_cli_text_json_and_histogram_png(tmp_path, capsys):
    data = write_text(tmp_path, TEXT)
    png = str(tmp_path / "h.png")
    assert main(["neurons", "-m", tiny_gguf("f32"), "--layer", "0", "--data", data, "--ctx", "64", "--top", "3",
                 "--units", "2", "--hist", png]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ffn_swiglu-0: 96 units") and out.count("\nunit ") == 2
    assert len(re.findall(r"^ +[-+][\d.e+-]+  .*\[\[.+?\]\]", out, re.M)) == 6      # 3 windows per unit
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert main(["neurons", "-m", tiny_gguf("f32"), "--layer", "1", "--data", data, "--ctx", "64", "--top", "3",
                 "--neuron", "5", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["node"] == "ffn_swiglu-1" and [u["unit"] for u in r["units"]] == [5] and len(r["units"][0]["windows"]) == 3
    # byte tokenizer: a token per byte; the first --min-context of them are only context
    assert sum(r["units"][0]["hist"]["counts"]) == r["n_tokens"] == len(TEXT) - DEFAULT_MIN_CONTEXT


class _Page(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags, self.attrs, self.scripts, self._in = [], [], [], None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += attrs
        self._in = dict(attrs).get("type", "js") if tag == "script" else None

    def handle_data(self, data):
        if self._in:
            self.scripts.append((self._in, data))

    def handle_endtag(self, tag):
        self._in = None


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    d = tmp_path_factory.mktemp("html")
    data = write_text(d, TEXT + "</script><b>not a tag</b>\n")        # text that must not break the page
    path = str(d / "units.html")
    assert main(["neurons", "-m", tiny_gguf("f32"), "--layer", "1", "--data", data, "--ctx", "64", "--top", "4",
                 "--units", "1", "--html", path]) == 0
    with open(path, encoding="utf-8") as f:
        return path, f.read()


def test_html_page_is_self_contained(page):
    _, text = page
    p = _Page()
    p.feed(text)
    assert not [a for a in p.attrs if a[0] in ("src", "href")], "no external resources"
    assert not re.search(r"https?:|url\(|@import|<link", text)
    assert "link" not in p.tags and "iframe" not in p.tags and "img" not in p.tags
    data = json.loads(next(s for t, s in p.scripts if t == "application/json"))
    assert data["node"] == "ffn_swiglu-1" and len(data["units"]) == data["d_ff"] == 96
    assert [u["unit"] for u in data["units"]][:3] == sorted((u["unit"] for u in data["units"]),
                                                           key=lambda i: -next(x["mean_abs"] for x in data["units"]
                                                                               if x["unit"] == i))[:3]
    assert all(len(u["windows"]) == 4 and all(str(i) in data["vocab"] for w in u["windows"] for i in w["ids"])
               for u in data["units"])
    assert sum(1 for t, _ in p.scripts if t == "js") == 1


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install chromium): "
                    "the HTML page is only checked structurally")
def test_html_page_renders_a_unit_in_headless_chromium(page):
    path, text = page
    data = json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', text, re.S).group(1))
    unit = data["units"][7]
    profile = tempfile.mkdtemp()
    try:
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                              f"--user-data-dir={profile}", "--dump-dom", f"file://{path}#unit-{unit['unit']}"],
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    detail = re.search(r'<div id="detail" data-unit="(\d+)">(.*?)</div></div>', dom, re.S)
    assert detail and int(detail.group(1)) == unit["unit"], "the #unit-N fragment selects the unit"
    body = detail.group(2)
    assert f"unit {unit['unit']} of ffn_swiglu-1" in body
    # the browser keeps alpha in 8 bits, prints it with 2-3 decimals, and an opaque rgba(r, g, b, 1) as rgb(r, g, b)
    spans = re.findall(r'<span class="tok( center)?" title="a = [^"]*" data-a="([^"]+)" style="background: rgba?\((\d+), '
                       r'\d+, \d+(?:, ([\d.]+))?\);">', body)
    assert len(spans) == sum(len(w["ids"]) for w in unit["windows"])  # every token of every window, shaded
    assert sum(1 for c, *_ in spans if c) == len(unit["windows"])     # one highlighted token per window
    peak = max(abs(w["value"]) for w in unit["windows"])
    for _, a, red, alpha in spans:
        alpha = alpha or "1"
        assert (red == "220") == (float(a) >= 0) and float(alpha) == pytest.approx(min(1, abs(float(a)) / peak), abs=6e-3)
    assert body.count("<rect") == len(unit["counts"])                 # the histogram's bars
    assert len(re.findall(r'<div class="row', dom)) == data["d_ff"]   # the unit list


@pytest.mark.parametrize("flags,needle", [
    (["--layer", "2"], "--layer 2 is out of range: "),
    (["--layer", "-1"], "--layer -1 is out of range"),
    (["--layer", "0", "--neuron", "96"], "--neuron 96 is out of range: layer 0 has d_ff = 96 units (0..95)"),
    (["--layer", "0", "--ctx", "129"], "--ctx 129 is longer than the model's context length 128"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, needle):
    data = write_text(tmp_path, TEXT)
    assert main(["neurons", "-m", tiny_gguf("f32"), "--data", data] + flags) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("ffnlab neurons: error:")


def test_empty_and_non_utf8_data_are_one_line(tmp_path, capsys):
    for content, needle in ((b"  \n", "empty"), (b"\xff\xfe abc", "not UTF-8")):
        p = tmp_path / "bad.txt"
        p.write_bytes(content)
        assert main(["neurons", "-m", tiny_gguf("f32"), "--layer", "0", "--data", str(p)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0]
