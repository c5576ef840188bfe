"""Sizing a mixture of experts: total parameters (memory), active parameters (what one token
touches; FLOPs), against the published figures and against the from-scratch model itself."""
import numpy as np
import pytest

from ffnlab.analysis.flops import flops_per_token
from ffnlab.analysis.params import param_counts
from ffnlab.analysis.presets import preset_config
from ffnlab.analysis.report import analyze, compare_row
from ffnlab.analysis.source import load_source
from ffnlab.model.params import count_params, init_params
from ffnlab.model.transformer import backward, forward
from moe_models import moe_config, random_params

# (total, active) as their model cards give them: Mixtral-8x7B's 46.7B / 12.9B, Qwen3-30B-A3B's 30.5B / 3.3B,
# OLMoE-1B-7B's 6.9B / 1.3B
PUBLISHED = {"mixtral-8x7b": (46_702_792_704, 12_879_925_248), "qwen3-30b-a3b": (30_532_122_624, 3_353_032_704),
             "olmoe-1b-7b": (6_919_161_856, 1_282_017_280)}


@pytest.mark.parametrize("alias", list(PUBLISHED))
def test_moe_presets_have_the_published_total_and_active_counts(alias):
    total, active = PUBLISHED[alias]
    r = analyze(load_source(alias), quants=("Q8_0",))
    assert (r["params"]["total"], r["params"]["active"]) == (total, active)
    row = compare_row(load_source(alias))
    assert (row["params_total"], row["params_active"]) == (total, active)
    # memory follows total: every weight is stored, even the experts a token skips
    assert r["memory"]["weights"]["Q8_0"]["bits_per_weight"] * total / 8 == pytest.approx(
        r["memory"]["weights_bytes"]["Q8_0"], rel=1e-9)


@pytest.mark.parametrize("alias", list(PUBLISHED))
def test_flops_per_token_follow_the_active_parameters(alias):
    """Every weight a token uses is one multiply-add (2 FLOPs): the MLP's FLOPs per token are twice
    its active parameters, router and shared expert included."""
    cfg, _ = preset_config(alias)
    p, f = param_counts(cfg), flops_per_token(cfg, 1)
    assert f["mlp"] == 2 * p["mlp_active"]
    assert f["mlp"] < 2 * p["mlp"] / 2                  # far from the total: at most half the experts run


@pytest.mark.parametrize("kw", [dict(), dict(shared=True, norm=False),
                                dict(qk_norm=True, qk_norm_full=True, attn_bias=True, attn_out_bias=True),
                                dict(qk_norm=True, head_dim=6, tie_embeddings=True)])
def test_analyzer_counts_equal_the_from_scratch_model(kw):
    cfg = moe_config(**kw)
    assert param_counts(cfg)["total"] == count_params(init_params(cfg))


@pytest.mark.parametrize("kw", [dict(), dict(shared=True, norm=False)])
def test_active_counts_the_weights_one_token_gets_gradient_for(kw):
    """One token's backward reaches exactly the active MLP weights: the router (every row, through
    the softmax), the k chosen experts of each layer and the shared expert. (Attention's q and k
    get none from a single token, whose softmax over one key is constant: the rest of `active`
    is every non-expert weight, counted in full.)"""
    cfg = moe_config(**kw, E=5, K=2)
    p = random_params(cfg, np.float64)
    logits, cache = forward(p, cfg, np.array([[7]]), train=True)
    grads = backward(np.random.default_rng(0).normal(size=logits.shape), p, cfg, cache)
    mlp = [k for k in grads if ".ffn_" in k and "norm" not in k]
    touched = sum(int(np.count_nonzero(grads[k])) for k in mlp)
    counts = param_counts(cfg)
    assert touched == counts["mlp_active"] < counts["mlp"] == sum(p[k].size for k in mlp)
    assert counts["active"] == counts["total"] - (counts["mlp"] - counts["mlp_active"])
