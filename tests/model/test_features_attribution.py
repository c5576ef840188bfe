"""Latent attribution (interventions/attribution.py attribute_latents) against torch autograd in float64.

The reference, written from the weights and the traced values only: the target's logit as a function of the
transcoder's latent activations a [d_sae] at the last position, with every norm on the way frozen at the run's
own state (the final norm's 1/rms, or LayerNorm's centring and 1/std; Gemma's post-FFN norm at ffn_out's row)
and the error term held:
    y(a)      = a @ W_dec + b_dec [+ W_skip x] + (y0 - y_hat0)
    x_fin(a)  = x_fin0 - post(y0) + post(y(a))
    logit(a)  = head[t] . final_norm_frozen(x_fin(a))
attribution_j = a_j * d logit / d a_j, by torch.autograd. The terms must also add up: the latents, b_dec, the
skip and the error are ffn_out-L's direct effect, the MLP units' total of `attribute`.
"""
import numpy as np
import pytest
import torch

import ffnlab
from ffnlab.features.dictionary import DictConfig, encode, init_params
from ffnlab.interventions.attribution import attribute, attribute_latents
from ffnlab.model import Model
from ffnlab.model.params import lm_head_name
from block_checks import CONFIGS, random_params

IDS = np.array([3, 7, 1, 9, 4, 2, 11, 5])
TARGET = 5
EPS32 = np.finfo(np.float32).eps / 2                   # float32's unit roundoff


def frozen_norm(model, wname, x0):
    """-> f(v): the norm of x0's row with its statistics frozen at x0, applied to v (torch float64)"""
    cfg, p = model.config, model.params
    w = torch.from_numpy(np.asarray(p[wname + ".weight"], np.float64))
    x0 = torch.from_numpy(x0.astype(np.float64))
    if cfg.norm == "layernorm":
        std = torch.sqrt(((x0 - x0.mean()) ** 2).mean() + cfg.norm_eps)
        b = torch.from_numpy(np.asarray(p[wname + ".bias"], np.float64))
        return lambda v: w * (v - v.mean()) / std + b      # centring is linear: the mean of v, not of x0
    rms = torch.sqrt((x0 * x0).mean() + cfg.norm_eps)
    return lambda v: w * v / rms


def reference(model, p, cfg, il):
    """-> ({latent: attribution} by autograd, {latent: bound}): the activations here are float64, the splice's
    float32, which differ by the rounding of the encoder's sum, gamma(d_in + 1) (|x| @ |W_enc| + |b_enc|), times
    the gradient"""
    mc = model.config
    names = [f"ffn_norm-{il}", f"ffn_out-{il}", f"l_out-{mc.n_layer - 1}"]
    with ffnlab.trace(model, filter="(" + "|".join(names) + ")$") as t:
        model.forward(IDS)
    x, y0, xf0 = (t[n][-1] for n in names)
    T = (lambda a: torch.from_numpy(np.asarray(a, np.float64)))
    pre = T(x) @ T(p["W_enc"]) + T(p["b_enc"])
    top = torch.topk(pre, cfg.k).indices
    a0 = torch.zeros_like(pre)
    a0[top] = torch.relu(pre[top])                                   # TopK then ReLU (SAELens's order)
    skip = T(p["W_skip"]) @ T(x) if "W_skip" in p else 0.0
    y_hat0 = a0 @ T(p["W_dec"]) + T(p["b_dec"]) + skip
    post = frozen_norm(model, f"blk.{il}.post_ffw_norm", y0) if mc.post_ffn_norm else (lambda v: v)
    final = frozen_norm(model, "output_norm", xf0)
    head = T(model.params[lm_head_name(mc)][TARGET])
    a = a0.clone().requires_grad_(True)
    y = a @ T(p["W_dec"]) + T(p["b_dec"]) + skip + (T(y0) - y_hat0)
    logit = head @ final(T(xf0) - post(T(y0)) + post(y))
    (g,) = torch.autograd.grad(logit, a)
    attr = (a0 * g).numpy()
    n = cfg.d_in + 1
    gamma = n * EPS32 / (1 - n * EPS32)
    da = gamma * (np.abs(x.astype(np.float64)) @ np.abs(p["W_enc"].astype(np.float64)) + np.abs(p["b_enc"]))
    bound = da * np.abs(g.numpy()) + 1e-12 * np.abs(attr).max()                 # + the float64 sums' own rounding
    on = np.nonzero(a0.numpy() > 0)[0]
    return {int(j): float(attr[j]) for j in on}, {int(j): float(bound[j]) for j in on}


def dictionary(model, kind, seed=0):
    mc = model.config
    cfg = DictConfig(kind, "topk", mc.d_model, 96, mc.d_model, k=8)
    r = np.random.default_rng(seed)
    p = init_params(cfg, r)
    p["b_enc"] += np.float32(0.1)                                   # so that k latents fire
    p["b_dec"] = (0.3 * r.normal(size=mc.d_model)).astype(np.float32)
    if "W_skip" in p:
        p["W_skip"] = (0.1 * r.normal(size=p["W_skip"].shape)).astype(np.float32)
    return p, cfg


@pytest.mark.parametrize("kind", ["transcoder", "skip-transcoder"])
@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma3"])
def test_latent_attribution_is_activation_times_the_autograd_gradient(arch, kind):
    model = Model(CONFIGS[arch], random_params(CONFIGS[arch]))
    il = model.config.n_layer - 2
    p, cfg = dictionary(model, kind)
    (r,) = attribute_latents(model, IDS, TARGET, [("d", p, cfg, f"ffn_norm-{il}", f"ffn_out-{il}")], top=cfg.d_sae)
    got = {j: a for j, a, _ in r["latents"] + r["negative"]}
    want, bound = reference(model, p, cfg, il)
    assert r["firing"] == len(want) and set(got) == set(want)
    for j, v in want.items():
        assert abs(got[j] - v) <= bound[j], (j, got[j], v, bound[j])
    assert abs(r["total"] - sum(want.values())) <= sum(bound.values())
    # the terms add up to ffn_out's direct effect, which the units of `attribute` add up to as well
    assert r["total"] + r["b_dec"] + r["skip"] + r["error"] == pytest.approx(r["ffn_out"], rel=1e-9, abs=1e-9)
    assert (r["skip"] != 0.0) == (kind == "skip-transcoder")
    units = attribute(model, IDS, TARGET, top=model.config.d_ff)["layers"][il]
    # the float32 MLP output against the float64 sum of its units (as test_interventions' bound)
    bound = 4 * np.finfo(np.float32).eps * np.sqrt(model.config.d_ff) * sum(abs(a) for _, a, _ in units["units"]) + 1e-6
    assert abs(units["total"] - r["ffn_out"]) <= bound


def test_the_latents_are_the_transcoders_own_activations():
    model = Model(CONFIGS["llama"], random_params(CONFIGS["llama"]))
    p, cfg = dictionary(model, "transcoder")
    (r,) = attribute_latents(model, IDS, TARGET, [("d", p, cfg, "ffn_norm-1", "ffn_out-1")], top=cfg.d_sae)
    with ffnlab.trace(model, filter="ffn_norm-1$") as t:
        model.forward(IDS)
    a, _, _ = encode(p, cfg, t["ffn_norm-1"][-1:])
    assert sorted((j, v) for j, _, v in r["latents"] + r["negative"]) == sorted(
        (int(j), float(v)) for j, v in zip(a.idx, a.val) if v > 0)
    assert [e[1] for e in r["latents"]] == sorted((e[1] for e in r["latents"]), reverse=True)
