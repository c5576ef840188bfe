"""On SmolLM2, whose window starts are attention sinks: a corpus scan's top windows do not sit at a
window's first scored token more often than chance (tests/unit/test_context_windows.py holds the
windowing rule itself)."""
import numpy as np
import pytest

from ffnlab.evaluation.activations import context_windows

pytestmark = pytest.mark.slow


def window_start_hits(scan, min_context, n_ctx, max_windows, units=20):
    """-> (top windows of the `units` most active units that sit at a window's first scored token,
    how many top windows there are, the chance that a scored token is one)."""
    cw = context_windows(scan.ids, n_ctx, min_context, max_windows=max_windows)
    firsts = {s + f - cw.lead for s, f in zip(cw.starts, cw.scored_from)}
    pos = [p for u in scan.ranking[:units] for _, p, _ in scan.top.sorted(int(u))]
    return sum(p in firsts for p in pos), len(pos), len(cw.windows) / cw.n_scored


def test_no_top_window_of_smollm2_sits_at_a_window_start_more_often_than_chance():
    """SmolLM2 adds no BOS, so a window's first token is an attention sink with outlier activations
    (tinyshakespeare, layer 10: a quarter of the top windows sat there when the text was cut into
    back-to-back chunks). With context windows the first scored token is an ordinary one: the number
    of top windows there stays within the binomial tail of chance (mean + 4 standard deviations + 1)."""
    import os

    from ffnlab.evaluation.neurons import scan_layer
    from mlp_models import smollm2
    m = smollm2()
    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "data", "calib.txt"), encoding="utf-8") as f:
        text = f.read()
    assert m.tokenizer.bos_id is None or not m.tokenizer.add_bos             # the sink is the first text token
    for min_context, sink in ((16, False), (0, True)):                       # 0: back-to-back, the check must fail
        scan = scan_layer(m, text, 10, n_ctx=128, k=10, batch=4, max_windows=16, min_context=min_context)
        hits, n, p = window_start_hits(scan, min_context, 128, 16)
        bound = n * p + 4 * np.sqrt(n * p * (1 - p)) + 1
        assert (hits > bound) == sink, (min_context, hits, n, p, bound)
