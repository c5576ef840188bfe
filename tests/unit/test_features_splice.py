"""Splicing a dictionary into the forward (features/evaluate.py splice) on small models made here.

A model whose MLP is linear: ffn relu with up = [I; -I] and down = [S, -S], S a signed permutation times 1/2,
so h = (relu(x), relu(-x)) and ffn_out = S relu(x) - S relu(-x) = S x. Its identity transcoder (the MLP's own
units as latents: W_enc = up.T, W_dec = down.T, relu, no biases) computes the same products, each output a
single nonzero term x_i * (+-1/2) that float32 holds exactly, so the splice is the clean forward bit for bit.
A ReLU MLP with random weights and biases: the same neurons-as-latents transcoder is the MLP in exact
arithmetic; in float32 the two differ by the rounding of two sums of products, bounded from the float64 values.
"""
import numpy as np
import pytest
from block_checks import random_params

import ffnlab
from ffnlab.config import ModelConfig
from ffnlab.evaluation.activations import context_windows
from ffnlab.features.dictionary import DictConfig
from ffnlab.features.evaluate import evaluate_dictionary, splice

D_MODEL, LAYER = 16, 1
EPS32 = np.finfo(np.float32).eps / 2                       # unit roundoff of float32, 2^-24


def relu_model(d_ff, ffn_bias, seed=0):
    cfg = ModelConfig(arch="llama", n_layer=3, d_model=D_MODEL, n_head=2, d_ff=d_ff, ffn="relu", ffn_bias=ffn_bias,
                      vocab_size=64, n_ctx=32, tie_embeddings=True)
    return ffnlab.Model(cfg, random_params(cfg, seed=seed))


def linear_mlp_model(seed=0):
    """-> (model whose layer-LAYER MLP is x -> S x, S [d_model, d_model] a signed permutation / 2)"""
    model = relu_model(2 * D_MODEL, ffn_bias=False, seed=seed)
    r = np.random.default_rng(seed + 1)
    eye = np.eye(D_MODEL, dtype=np.float32)
    S = (eye[r.permutation(D_MODEL)] * r.choice([-0.5, 0.5], D_MODEL)[:, None]).astype(np.float32)
    model.params[f"blk.{LAYER}.ffn_up.weight"] = np.concatenate([eye, -eye])        # [2 d_model, d_model]
    model.params[f"blk.{LAYER}.ffn_down.weight"] = np.concatenate([S, -S], axis=1)  # [d_model, 2 d_model]
    return model, S


def neurons_as_latents(model, layer):
    """The MLP's own units as a relu transcoder: W_enc = up.T [d_model, d_ff], W_dec = down.T [d_ff, d_model]"""
    p, cfg = model.params, model.config
    blk = f"blk.{layer}."
    zeros = (lambda n: np.zeros(n, np.float32))
    d = {"W_enc": np.ascontiguousarray(p[blk + "ffn_up.weight"].T), "W_dec": np.ascontiguousarray(p[blk + "ffn_down.weight"].T),
         "b_enc": p.get(blk + "ffn_up.bias", zeros(cfg.d_ff)).copy(),
         "b_dec": p.get(blk + "ffn_down.bias", zeros(cfg.d_model)).copy()}
    return d, DictConfig("transcoder", "relu", cfg.d_model, cfg.d_ff, cfg.d_model)


def ids(T=24, B=3, seed=7):
    return np.random.default_rng(seed).integers(0, 64, (B, T))


SITES = (f"ffn_norm-{LAYER}", f"ffn_out-{LAYER}")


def test_the_mlp_built_to_be_linear_is_linear():
    model, S = linear_mlp_model()
    from ffnlab.interventions.api import capture
    _, got = capture(model, ids(B=1)[0], list(SITES))
    assert np.array_equal(got[SITES[1]], got[SITES[0]] @ S.T)                     # exact: one term x_i / 2 each


@pytest.mark.parametrize("skip_first", [True, False])
def test_splicing_the_identity_transcoder_of_a_linear_mlp_is_exact(skip_first):
    model, _ = linear_mlp_model()
    p, cfg = neurons_as_latents(model, LAYER)
    x = ids()
    clean = model.forward(x)
    record = []
    spliced = model.forward(x, hooks=splice(p, cfg, *SITES, skip_first=skip_first, record=record))
    assert len(record) == 1 and np.array_equal(record[0][1], record[0][2])        # y_hat == ffn_out, bit for bit
    assert np.array_equal(spliced, clean)
    p["W_dec"][3] *= np.float32(1.5)                                             # one latent's decoder changed
    assert not np.array_equal(model.forward(x, hooks=splice(p, cfg, *SITES, skip_first=skip_first)), clean)


def test_the_identity_transcoder_scores_one_and_zero_kl_in_the_evaluation():
    model, _ = linear_mlp_model()
    p, cfg = neurons_as_latents(model, LAYER)
    text = np.random.default_rng(3).integers(2, 64, 200)
    cw = context_windows(text, 32, 4, bos_id=0)
    m = evaluate_dictionary(model, p, cfg, cw, *SITES, max_tokens=10_000, batch=4)
    assert m["ce_spliced"] == m["ce_clean"] and m["kl_spliced"] == 0.0
    assert m["ce_loss_score"] == 1.0 and m["kl_score"] == 1.0
    assert m["mse"] == 0.0 and m["fvu"] == 0.0
    assert m["l0"] == D_MODEL                              # one unit of each pair fires: relu(x_i) or relu(-x_i)


def gamma(n):
    return n * EPS32 / (1 - n * EPS32)


def test_the_neurons_of_a_relu_mlp_as_a_transcoder_reproduce_it_within_rounding():
    """|y_hat - ffn_out| <= 2 (forward error of the float32 MLP against float64 on the same input): the error of
    the up product and bias, gamma(d_model + 1) sum |up||x| + |b_up|, carried through relu (1-Lipschitz) and down,
    plus the down product's own gamma(d_ff + 1) sum |down||h| + |b_down|."""
    model = relu_model(48, ffn_bias=True)
    p, cfg = neurons_as_latents(model, LAYER)
    record = []
    model.forward(ids(), hooks=splice(p, cfg, *SITES, record=record))
    x, y, y_hat = (a.reshape(-1, a.shape[-1]).astype(np.float64) for a in record[0])
    up, down = p["W_enc"].astype(np.float64), p["W_dec"].astype(np.float64)      # [d_model, d_ff], [d_ff, d_model]
    b_up, b_down = p["b_enc"].astype(np.float64), p["b_dec"].astype(np.float64)
    pre = x @ up + b_up
    h = np.maximum(pre, 0)
    dh = gamma(D_MODEL + 1) * (np.abs(x) @ np.abs(up) + np.abs(b_up))            # [R, d_ff]
    bound = 2 * (dh @ np.abs(down) + gamma(cfg.d_sae + 1) * (h @ np.abs(down) + np.abs(b_down)))
    err = np.abs(y_hat - y)
    assert (err <= bound).all(), float((err / bound).max())
    ref = h @ down + b_down                                                      # float64 on the same x
    assert np.abs(ref - y).max() > 0, "the float32 MLP should differ from float64 somewhere (else the bound is idle)"


def test_ce_counts_the_scored_positions_with_a_next_token_and_kl_every_scored_position():
    """run_evals' masks: CE at the positions whose next token is in the window, KL at every scored position
    (each window's last included), both in float64 from the same log-softmax."""
    from ffnlab.features.evaluate import log_softmax, next_token_terms
    rng = np.random.default_rng(0)
    logits, other = rng.standard_normal((2, 2, 5, 7)).astype(np.float32)      # [B, T, V] twice
    ids = rng.integers(0, 7, (2, 5))
    scored = np.array([[False, True, True, True, True], [False, False, True, True, True]])
    want_ce = [-log_softmax(other[b, t])[ids[b, t + 1]] for b in range(2) for t in range(4) if scored[b, t]]
    p, q = log_softmax(logits[scored]), log_softmax(other[scored])
    for rows in (1, 3, 64):                                              # the same values in any grouping
        ce, kl = next_token_terms(other, ids, scored, logits, rows=rows)
        np.testing.assert_array_equal(ce, want_ce)                        # 3 + 2 positions: none at t = 4
        np.testing.assert_array_equal(kl, (np.exp(p) * (p - q)).sum(-1))  # 4 + 3 positions: t = 4 included
        assert len(ce) == 5 and len(kl) == 7
