"""Training a mixture of experts: the load-balancing loss against transformers' formula and its
gradient against finite differences; `ffnlab train --ffn moe` end to end."""
import numpy as np
import pytest

import ffnlab
from ffnlab.model import Model
from ffnlab.model.transformer import forward
from ffnlab.training.moe_loss import load_balancing_loss
from ffnlab.training.trainer import loss_and_grads
from finite_differences import FD_TOL, numerical_grad
from moe_models import moe_config, random_params

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("K", [1, 2, 3])
def test_aux_loss_equals_transformers_load_balancing_loss_for_one_layer(K):
    """transformers' load_balancing_loss_func (Mixtral; Switch Transformer eq. 4-6) is the reference."""
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
    cfg = moe_config(n_layer=1, E=5, K=K, norm=K > 1)
    p = random_params(cfg, np.float64)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9))
    _, cache = forward(p, cfg, ids, train=True)
    aux, per_layer = load_balancing_loss(cache, cfg, 0.0)
    logits = torch.from_numpy(np.log(cache.blocks[0].ffn.probs))       # softmax(log p) = p
    ref = load_balancing_loss_func((logits,), cfg.n_expert, K).item()
    assert per_layer[0] == pytest.approx(ref, rel=1e-6)                # transformers sums in float32
    assert aux == 0.0                                                  # coef 0: reported, not added


def test_aux_loss_of_balanced_routing_is_k():
    """f_e = k/E and P_e = 1/E give E * sum_e (k/E)(1/E) = k, the minimum."""
    cfg = moe_config(n_layer=1, E=4, K=2)
    p = random_params(cfg, np.float64)
    p["blk.0.ffn_gate_inp.weight"][:] = 0.0                             # uniform router: P_e = 1/4
    ids = np.arange(8)[None]
    _, cache = forward(p, cfg, ids, train=True)
    # a uniform router breaks ties toward the lower experts: every token picks 0 and 1
    _, per_layer = load_balancing_loss(cache, cfg, 0.0)
    assert per_layer[0] == pytest.approx(4 * (0.25 * 1 + 0.25 * 1))    # f = (1, 1, 0, 0), P = 1/4 each


def test_aux_loss_gradient_matches_finite_differences():
    """grads(LM + coef * aux) - grads(LM) is coef * d aux / d params: checked on both routers and
    on a layer-0 weight (layer 1's aux reaches it through the residual stream)."""
    cfg = moe_config(n_layer=2, E=4, K=2, d_model=8, d_ff=6, n_head=2, n_kv_head=1, vocab_size=11)
    p = random_params(cfg, np.float64, seed=3)
    x = np.random.default_rng(4).integers(0, 11, (1, 5))
    y = np.random.default_rng(5).integers(0, 11, (1, 5))
    coef = 0.5
    _, g_aux = loss_and_grads(Model(cfg, p), x, y, coef)
    _, g_lm = loss_and_grads(Model(cfg, p), x, y, 0.0)
    _, c0 = forward(p, cfg, x, train=True)
    routing = [b.ffn.topk.copy() for b in c0.blocks]

    def aux():
        _, c = forward(p, cfg, x, train=True)
        assert all(np.array_equal(b.ffn.topk, r) for b, r in zip(c.blocks, routing)), "routing changed"
        return load_balancing_loss(c, cfg, coef)[0]

    for name in ("blk.0.ffn_gate_inp.weight", "blk.1.ffn_gate_inp.weight", "blk.0.attn_v.weight"):
        num = numerical_grad(aux, p[name])
        got = g_aux[name] - g_lm[name]
        err = np.abs(got - num).max() / np.abs(num).max()
        assert err <= FD_TOL, f"{name}: relative error {err:.2e}"


def test_train_cli_trains_a_mixture_of_experts(tmp_path):
    from ffnlab.cli.main import main
    data = tmp_path / "d.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    out = tmp_path / "ckpt"
    rc = main(["train", "--data", str(data), "--out", str(out), "--ffn", "moe", "--experts", "3", "--top-k", "2",
               "--aux-loss", "0.02", "--steps", "3", "--batch", "2", "--seq-len", "16", "--n-layer", "1",
               "--d-model", "32", "--eval-every", "3", "--quiet", "-t", "1"])
    assert rc == 0
    m = ffnlab.load(str(out), progress=False)
    c = m.config
    assert (c.ffn, c.n_expert, c.n_expert_used, c.expert_norm) == ("moe", 3, 2, True)
    assert m.params["blk.0.ffn_up_exps.weight"].shape == (3, c.d_ff, 32)
    assert np.isfinite(m.forward([1, 2, 3])).all()


def test_train_cli_refuses_top_k_above_experts_in_one_line(tmp_path, capsys):
    from ffnlab.cli.main import main
    data = tmp_path / "d.txt"
    data.write_text("abc " * 100)
    rc = main(["train", "--data", str(data), "--out", str(tmp_path / "bad"), "--ffn", "moe", "--experts", "3",
               "--top-k", "4", "--steps", "1", "--quiet"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(lines) == 1, lines
    assert "n_expert_used (top-k) must be between 1 and n_expert = 3, got 4" in lines[0]


def test_ablate_plans_moe_at_equal_active_and_equal_total_parameters():
    """--ffn swiglu,moe --match-params: the 'active' MoE runs k experts holding what the dense
    SwiGLU holds (equal FLOPs per token); the 'total' MoE holds it across all E experts (equal memory)."""
    from ffnlab.training.ablate import flops_per_token, n_params, n_params_active, plan
    base = {"model": dict(arch="llama", n_layer=2, d_model=48, n_head=4, d_ff=48, norm="rmsnorm", positions="rope",
                          vocab_size=256, n_ctx=64, tie_embeddings=False), "settings": {"seq_len": 64}}
    runs = {r["variant"]: r for r in plan(base, ["swiglu", "moe"], [4], 1, True, (4, 1, ["active", "total"]))}
    from ffnlab.config import ModelConfig
    dense, active, total = (ModelConfig.from_dict(runs[v]["config"])
                            for v in ("swiglu-x4", "moe4k1-active-x4", "moe4k1-total-x4"))
    assert dense.d_ff == 128 and active.d_ff == 128 and total.d_ff == 32
    router = 2 * 4 * 48                                              # 2 layers of a [4, 48] router
    assert n_params_active(active) == n_params(dense, embeddings=False) + router
    assert n_params(total, embeddings=False) == n_params(dense, embeddings=False) + router
    assert flops_per_token(active, 64) == flops_per_token(dense, 64) + 3 * 2 * router
