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
