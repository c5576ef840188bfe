"""Corpus scans score only tokens with context (evaluation/activations.py's context_windows): every
text token past the first N is scored exactly once, with at least N text tokens before it in its own
window; BOS and a window's first N positions never are."""
import numpy as np
import pytest

from ffnlab.errors import UsageError
from ffnlab.evaluation.activations import context_windows


def scored_tokens(cw):
    """-> [(text index, text tokens before it in its window)] for every scored position, by brute force."""
    out = []
    for w, start, first in zip(cw.windows, cw.starts, cw.scored_from):
        for t in range(first, len(w)):
            out.append((start + t - cw.lead, t - cw.lead))
    return out


@pytest.mark.parametrize("bos", [None, 0])
@pytest.mark.parametrize("n,n_ctx,min_context", [(1000, 128, 16), (500, 64, 0), (129, 128, 16), (100, 128, 16),
                                                 (17, 128, 16), (300, 33, 31), (4096, 128, 100)])
def test_every_token_past_the_first_n_is_scored_once_with_n_tokens_of_context(n, n_ctx, min_context, bos):
    ids = np.arange(7, 7 + n)                                     # token id = text index + 7, so windows are checkable
    cw = context_windows(ids, n_ctx, min_context, bos)
    scored = scored_tokens(cw)
    assert sorted(p for p, _ in scored) == list(range(min_context, n))           # exactly once each
    assert all(before >= min_context for _, before in scored)
    for w, start in zip(cw.windows, cw.starts):
        assert len(w) <= n_ctx
        text = w[1:] if bos is not None else w
        assert np.array_equal(text, ids[start:start + len(text)])                 # consecutive text tokens
        if bos is not None:
            assert w[0] == bos


@pytest.mark.parametrize("bos", [None, 0])
def test_bos_and_a_windows_first_positions_are_never_scored(bos):
    cw = context_windows(np.arange(1000), 64, 16, bos)
    lead = 0 if bos is None else 1
    assert all(f >= lead + 16 for f in cw.scored_from)
    pos, scored = cw.positions(0, 2, 64)
    assert not scored[:, :lead + 16].any() and scored[:, lead + 16:].all()
    if bos is not None:
        assert (pos[:, 0] == -1).all()
    assert np.array_equal(pos[1, lead:], np.arange(cw.starts[1], cw.starts[1] + 64 - lead))


def test_windows_overlap_by_min_context_and_the_last_one_ends_at_the_text_end():
    cw = context_windows(np.arange(1000), 128, 16)
    assert np.all(np.diff(cw.starts[:-1]) == 128 - 16)
    assert all(len(w) == 128 for w in cw.windows)                 # equal lengths: one batch shape
    assert cw.starts[-1] + 128 == 1000
    assert cw.n_scored == 1000 - 16


def test_max_windows_stops_early():
    assert len(context_windows(np.arange(1000), 128, 16, max_windows=3).windows) == 3


def test_min_context_as_long_as_the_window_is_one_line():
    with pytest.raises(UsageError, match="--min-context 127 must be below the window's 127 text tokens"):
        context_windows(np.arange(1000), 128, 127, bos_id=0)


def window_start_hits(scan, min_context, n_ctx, max_windows, units=20):
    """-> (top windows of the `units` most active units that sit at a window's first scored token,
    how many top windows there are, the chance that a scored token is one)."""
    cw = context_windows(scan.ids, n_ctx, min_context, max_windows=max_windows)
    firsts = {s + f - cw.lead for s, f in zip(cw.starts, cw.scored_from)}
    pos = [p for u in scan.ranking[:units] for _, p, _ in scan.top.sorted(int(u))]
    return sum(p in firsts for p in pos), len(pos), len(cw.windows) / cw.n_scored


@pytest.mark.slow
def test_no_top_window_of_smollm2_sits_at_a_window_start_more_often_than_chance():
    """SmolLM2 adds no BOS, so a window's first token is an attention sink with outlier activations
    (tinyshakespeare, layer 10: a quarter of the top windows sat there when the text was cut into
    back-to-back chunks). With context windows the first scored token is an ordinary one: the number
    of top windows there stays within the binomial tail of chance (mean + 4 standard deviations + 1)."""
    import os

    from ffnlab.evaluation.neurons import scan_layer
    from mlp_models import smollm2
    m = smollm2()
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "data", "calib.txt"), encoding="utf-8") as f:
        text = f.read()
    assert m.tokenizer.bos_id is None or not m.tokenizer.add_bos             # the sink is the first text token
    for min_context, sink in ((16, False), (0, True)):                       # 0: back-to-back, the check must fail
        scan = scan_layer(m, text, 10, n_ctx=128, k=10, batch=4, max_windows=16, min_context=min_context)
        hits, n, p = window_start_hits(scan, min_context, 128, 16)
        bound = n * p + 4 * np.sqrt(n * p * (1 - p)) + 1
        assert (hits > bound) == sink, (min_context, hits, n, p, bound)
