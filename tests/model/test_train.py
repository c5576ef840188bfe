"""Training step vs PyTorch -- the llm.c test in Python.

The same init and the same batches go through ffnlab's trainer and through an independent
PyTorch model (tests/reference/torch_reference.py) driven by torch.optim.AdamW and
torch.nn.utils.clip_grad_norm_:
  * one step's gradients agree within 1e-4 relative per tensor (float32);
  * the losses of 10 AdamW steps (warmup + cosine lr, weight decay on matrices only, clipping
    active) agree within 1e-5 relative.
for a GPT-2-style and a Llama-style config.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_reference as R
from ffnlab.config import ModelConfig
from ffnlab.model import Model
from ffnlab.model.params import init_params
from ffnlab.training.data import TokenData, byte_tokenizer, sample_batch
from ffnlab.training.optim import AdamW, clip_grad_norm, decays, lr_at
from ffnlab.training.trainer import TrainSettings, loss_and_grads, train

GRAD_TOL = 1e-4
LOSS_TOL = 1e-5

CONFIGS = {
    "gpt2": ModelConfig(arch="gpt2", n_layer=2, d_model=32, n_head=4, d_ff=128, ffn="gelu_tanh", ffn_bias=True,
                        attn_bias=True, attn_out_bias=True, fused_qkv=True, norm="layernorm", positions="learned",
                        vocab_size=256, n_ctx=32, tie_embeddings=True),
    "llama": ModelConfig(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=88, ffn="swiglu",
                         norm="rmsnorm", positions="rope", rope_pairing="normal", vocab_size=256, n_ctx=32,
                         tie_embeddings=False),
}

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 8


def token_data(seq_len):
    ids = byte_tokenizer().encode(TEXT)
    return TokenData.from_ids(ids, seq_len)


# the ablation's variants: the Llama block with each FFN kind (tests/model/test_ablate.py runs them)
ABLATION_CONFIGS = {f"llama-{ffn}": ModelConfig(**{**CONFIGS["llama"].to_dict(), "ffn": ffn, "n_kv_head": 4,
                                                   "head_dim": 0})
                    for ffn in ("gelu", "relu", "geglu")}


@pytest.mark.parametrize("arch", list(CONFIGS) + list(ABLATION_CONFIGS))
def test_one_step_gradients_match_torch(arch):
    cfg = {**CONFIGS, **ABLATION_CONFIGS}[arch]
    params = init_params(cfg, seed=3)
    x, y = sample_batch(token_data(16).train, 4, 16, np.random.default_rng(0))
    loss, grads = loss_and_grads(Model(cfg, params), x, y)
    ref_loss, ref_grads = R.loss_and_grads(params, cfg, x, y.astype(np.int64), torch.float32)
    assert abs(loss - ref_loss) <= 1e-6 * ref_loss
    assert set(grads) == set(params)
    for name in params:
        R.assert_close(grads[name], ref_grads[name], GRAD_TOL, f"{arch} d{name}")


def torch_training_losses(params, cfg, s: TrainSettings, batches):
    """The reference loop: torch_reference forward, F.cross_entropy, autograd, clip_grad_norm_,
    torch.optim.AdamW with a decay group (matrices) and a no-decay group."""
    tp = R.params_to_torch(params, torch.float32)
    groups = [{"params": [t for n, t in tp.items() if decays(n)], "weight_decay": s.weight_decay},
              {"params": [t for n, t in tp.items() if not decays(n)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=s.lr, betas=(s.beta1, s.beta2), eps=1e-8, foreach=False)
    losses = []
    for step, (x, y) in enumerate(batches):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, s.lr, s.steps, s.warmup, s.min_lr_frac)
        opt.zero_grad()
        logits = R.forward(tp, cfg, x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(y.astype(np.int64)).reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(tp.values()), s.grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("arch", list(CONFIGS))
def test_ten_adamw_steps_match_torch(arch, tmp_path):
    cfg = CONFIGS[arch]
    s = TrainSettings(steps=10, batch=4, seq_len=16, lr=1e-2, warmup=3, weight_decay=0.1, grad_clip=0.5, seed=7,
                      eval_every=10, eval_batches=1, ckpt_every=0)
    data = token_data(s.seq_len)
    tok = byte_tokenizer()
    rec = train(cfg, s, data, tok, {"kind": "byte"}, str(tmp_path / "run"), progress=False)
    ours = rec["history"]["train"]
    # the trainer's batches: its Generator seeded [seed, 1], one sample_batch per step
    rng = np.random.default_rng([s.seed, 1])
    batches = [sample_batch(data.train, s.batch, s.seq_len, rng) for _ in range(s.steps)]
    ref = torch_training_losses(init_params(cfg, seed=s.seed), cfg, s, batches)
    assert len(ours) == 10
    assert ref[-1] < ref[0] - 0.5                               # it trained: the comparison is not vacuous
    assert max(rec["history"]["grad_norm"]) > s.grad_clip       # clipping was active
    for step, (a, b) in enumerate(zip(ours, ref), 1):
        assert abs(a - b) <= LOSS_TOL * abs(b), f"{arch} step {step}: loss {a:.7f}, torch {b:.7f}"


def test_adamw_update_matches_torch_for_each_group():
    r = np.random.default_rng(0)
    params = {"blk.0.ffn_up.weight": r.normal(size=(6, 4)).astype(np.float32),
              "blk.0.ffn_norm.weight": (1 + r.normal(size=4)).astype(np.float32),
              "token_embd.weight": r.normal(size=(5, 4)).astype(np.float32)}
    tp = R.params_to_torch(params, torch.float32)
    opt = AdamW(params, weight_decay=0.3, betas=(0.8, 0.9), eps=1e-6)
    topt = torch.optim.AdamW([{"params": [tp["blk.0.ffn_up.weight"]], "weight_decay": 0.3},
                              {"params": [tp["blk.0.ffn_norm.weight"], tp["token_embd.weight"]], "weight_decay": 0.0}],
                             lr=0.05, betas=(0.8, 0.9), eps=1e-6)
    for _ in range(5):
        grads = {n: r.normal(size=p.shape).astype(np.float32) for n, p in params.items()}
        for n, t in tp.items():
            t.grad = torch.from_numpy(grads[n].copy())
        opt.step(params, grads, 0.05)
        topt.step()
    for n in params:
        R.assert_close(params[n], tp[n], 1e-6, n)


def test_clip_grad_norm_matches_torch():
    r = np.random.default_rng(1)
    grads = {f"g{i}": r.normal(size=(7, 3)).astype(np.float32) for i in range(3)}
    ts = [torch.zeros(7, 3, requires_grad=True) for _ in range(3)]
    for t, g in zip(ts, grads.values()):
        t.grad = torch.from_numpy(g.copy())
    ref_norm = torch.nn.utils.clip_grad_norm_(ts, 1.5)
    norm = clip_grad_norm(grads, 1.5)
    assert abs(norm - ref_norm.item()) <= 1e-6 * norm
    for t, g in zip(ts, grads.values()):
        R.assert_close(g, t.grad, 1e-6, "clipped grad")


def test_no_weight_decay_on_norms_biases_embeddings():
    assert decays("blk.0.ffn_up.weight") and decays("blk.1.attn_qkv.weight") and decays("output.weight")
    assert not decays("blk.0.ffn_norm.weight") and not decays("blk.0.ffn_up.bias") and not decays("output_norm.bias")
    assert not decays("token_embd.weight") and not decays("position_embd.weight")
    assert decays("token_embd.weight", decay_embeddings=True)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    lrs = [lr_at(s, 1.0, 100, 10, 0.1) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))              # rising warmup
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))             # monotone decay
    assert lrs[-1] == pytest.approx(0.1)
    assert lrs[10 + 45] == pytest.approx(0.55, abs=0.01)                # cosine midpoint: halfway to the floor
