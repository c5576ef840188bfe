"""The dictionaries' loss and gradients (features/losses.py) against torch autograd in float64
(tests/reference/features_torch.py, written from the papers) and against finite differences.

Tolerances: ffnlab runs in float32; each gradient entry is a sum over B rows of products of O(1)
terms (x ~ N(0, 1), unit decoder rows), so its float32 error is ~ B * eps32 * max|term|. With B = 16,
eps32 = 1.2e-7 and the terms below ~10, 1e-4 relative to the gradient's largest entry bounds it with room.
"""
import numpy as np
import pytest
import torch

from ffnlab.features import losses
from ffnlab.features.dictionary import DictConfig, init_params
from features_torch import loss as torch_loss

CASES = [
    DictConfig("sae", "topk", 12, 40, 12, k=5),
    DictConfig("transcoder", "topk", 12, 40, 10, k=5),
    DictConfig("skip-transcoder", "topk", 12, 40, 12, k=5),
    DictConfig("sae", "batchtopk", 12, 40, 12, k=4),
    DictConfig("transcoder", "batchtopk", 12, 40, 12, k=4),
    DictConfig("sae", "relu", 12, 40, 12),
    DictConfig("transcoder", "relu", 12, 30, 10),
    DictConfig("sae", "jumprelu", 12, 40, 12, bandwidth=0.5),
    DictConfig("skip-transcoder", "jumprelu", 12, 40, 12, bandwidth=0.5, ste_to_input=True),
]
B = 16


def setup(cfg, seed=0):
    rng = np.random.default_rng(seed)
    p = init_params(cfg, rng, decoder_norm=1.0, threshold=0.3)
    for n in p:                                   # away from the init's symmetries: every gradient term nonzero
        p[n] = (p[n] + 0.05 * rng.standard_normal(p[n].shape)).astype(np.float32)
    if "threshold" in p:
        p["threshold"] = np.abs(p["threshold"]).astype(np.float32)
    x = rng.standard_normal((B, cfg.d_in)).astype(np.float32)
    y = x.copy() if cfg.kind == "sae" else rng.standard_normal((B, cfg.d_out)).astype(np.float32)
    dead = rng.random(cfg.d_sae) < 0.5
    return p, x, y, dead


def coef_of(cfg):
    return {"relu": 0.3, "jumprelu": 0.2}.get(cfg.act, 0.0)


def reference(p, cfg, x, y, dead):
    tp = {n: torch.tensor(a, dtype=torch.float64, requires_grad=True) for n, a in p.items()}
    total, terms = torch_loss(tp, cfg, torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64),
                              torch.tensor(dead), coef_of(cfg), aux_coef=0.7)
    total.backward()
    return ({k: float(v.detach()) for k, v in terms.items()},
            {n: t.grad.numpy() for n, t in tp.items() if t.grad is not None})


@pytest.mark.parametrize("cfg", CASES, ids=lambda c: f"{c.kind}-{c.act}")
def test_loss_and_grads_match_torch_autograd(cfg):
    p, x, y, dead = setup(cfg)
    terms, grads, _, _ = losses.loss_and_grads(p, cfg, x, y, dead, coef_of(cfg), aux_coef=0.7)
    ref_terms, ref_grads = reference(p, cfg, x, y, dead)
    assert terms.keys() == ref_terms.keys()
    if cfg.act in ("topk", "batchtopk"):
        assert "aux" in terms, "the AuxK term should be on: half the latents are marked dead"
    for k in terms:
        assert terms[k] == pytest.approx(ref_terms[k], rel=1e-5), k
    assert grads.keys() == ref_grads.keys()
    for n in grads:
        scale = np.abs(ref_grads[n]).max()
        assert scale > 0, f"{n}: the reference gradient is zero, the case tests nothing"
        np.testing.assert_allclose(grads[n], ref_grads[n], atol=1e-4 * scale, err_msg=n)


SMOOTH = [c for c in CASES if c.act in ("topk", "relu", "batchtopk")]


@pytest.mark.parametrize("cfg", SMOOTH, ids=lambda c: f"{c.kind}-{c.act}")
def test_grads_match_finite_differences_in_float64(cfg):
    """Central differences of ffnlab's own loss in float64, h = 1e-6: where the selection does not change
    under the step (it is piecewise smooth), the error is O(h^2) + eps64 / h ~ 1e-10, relative 1e-5 is ample.
    AuxK is off here: its residual is a stop-gradient constant by definition, which differences cannot see
    (its gradient is held to torch's above)."""
    p, x, y, dead = setup(cfg, seed=1)
    p = {n: a.astype(np.float64) for n, a in p.items()}
    x, y = x.astype(np.float64), y.astype(np.float64)
    _, grads, _, _ = losses.loss_and_grads(p, cfg, x, y, None, coef_of(cfg))
    rng = np.random.default_rng(2)
    h = 1e-6

    def total(q):
        t, _, _, _ = losses.loss_and_grads(q, cfg, x, y, None, coef_of(cfg))
        return sum(t.values())

    for n in grads:
        for flat in rng.choice(p[n].size, 4, replace=False):
            i = np.unravel_index(flat, p[n].shape)
            q_plus = {m: a.copy() for m, a in p.items()}
            q_minus = {m: a.copy() for m, a in p.items()}
            q_plus[n][i] += h
            q_minus[n][i] -= h
            fd = (total(q_plus) - total(q_minus)) / (2 * h)
            assert grads[n][i] == pytest.approx(fd, rel=1e-5, abs=1e-7), (n, i)
