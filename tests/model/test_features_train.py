"""The trainer (features/trainer.py) on synthetic activations with a known sparse structure: it learns, keeps
the decoder rows at unit norm, starts b_dec at the data's mean, marks dead latents by the window, runs
BatchTopK's threshold, and a resumed run equals an uninterrupted one."""
import dataclasses
import os

import numpy as np
import pytest

from ffnlab.features import dictionary as D
from ffnlab.features.evaluate import reconstruct
from ffnlab.features.harvest import ActivationBuffer, ArrayHarvest
from ffnlab.features.trainer import TRAINER_FILE, FeatureSettings, Trainer

D_IN, N_ATOMS = 16, 48


def rows(n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    atoms = rng.standard_normal((N_ATOMS, D_IN))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    codes = (rng.random((n, N_ATOMS)) < 3 / N_ATOMS) * rng.exponential(2.0, (n, N_ATOMS))
    return (codes @ atoms + 1.0).astype(np.float32)


def trainer(act="topk", steps=300, seed=0, **kw):
    x = rows()
    cfg = D.DictConfig("sae", act, D_IN, 64, D_IN, k=4, bandwidth=0.1)
    s = FeatureSettings(tokens=steps * 64, batch=64, lr=3e-3, seed=seed, dead_window=64 * 50,
                        coef={"relu": 0.01, "jumprelu": 0.05}.get(act, 0.0), **{"ckpt_every": 0, **kw})
    h = ArrayHarvest(x, x, ActivationBuffer(2048, D_IN, D_IN, seed + 1))
    meta = {"model_name": "synthetic", "hook_name": "x", "hook_name_out": "x", "ffnlab": {}}
    return Trainer(cfg, s, h, meta), x


def fvu(p, cfg, x):
    y_hat, acts = reconstruct(p, cfg, x)
    return float(((x - y_hat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum()), float(acts.l0().mean())


@pytest.mark.parametrize("act", ["topk", "batchtopk", "jumprelu", "relu"])
def test_training_learns_the_sparse_structure(act, tmp_path):
    t, x = trainer(act)
    before, _ = fvu(t.p, t.cfg, x[:2000])
    t.run(str(tmp_path))
    after, l0 = fvu(t.p, t.cfg, x[:2000])
    assert after < 0.5 * before and after < 0.3, (before, after)
    if act != "relu":
        np.testing.assert_allclose(np.linalg.norm(t.p["W_dec"], axis=1), 1, rtol=1e-5)
    if act == "batchtopk":                 # inference by the learned threshold fires about k latents a token
        assert t.p["threshold"].min() > 0 and 2 <= l0 <= 8, l0
    for f in ("cfg.json", "sae_weights.safetensors", TRAINER_FILE):
        assert os.path.isfile(tmp_path / f)


def test_b_dec_starts_at_the_mean_of_the_first_buffer():
    t, _ = trainer()
    t.init_b_dec()
    b = t.harvest.buffer
    np.testing.assert_allclose(t.p["b_dec"], b.y[:b.n].mean(0), rtol=1e-5)


def test_a_latent_is_dead_after_the_window_without_firing():
    t, _ = trainer(steps=60)
    t.init_b_dec()
    t.p["b_enc"][7] = -1e6                 # latent 7 can never win a top-k place
    for _ in range(49):
        t.train_step()
        t.p["b_enc"][7] = -1e6
    assert not t.dead()[7]                 # 49 * 64 tokens < the window of 50 * 64
    t.train_step()
    assert t.dead()[7]
    assert t.since_fired[7] == 50 * 64


def test_resume_from_a_checkpoint_equals_the_uninterrupted_run(tmp_path):
    full, _ = trainer(steps=40, ckpt_every=0)
    full.run(str(tmp_path / "full"))
    part, _ = trainer(steps=40)
    part.s = dataclasses.replace(part.s, ckpt_every=15)
    os.makedirs(tmp_path / "part")
    part.init_b_dec()
    for _ in range(15):
        part.train_step()
    part.save(str(tmp_path / "part"))
    import json
    again, _ = trainer(steps=40)
    again.load(str(tmp_path / "part"), json.load(open(tmp_path / "part" / TRAINER_FILE)))
    again.run(str(tmp_path / "part"))
    for n in full.p:
        np.testing.assert_array_equal(again.p[n], full.p[n], err_msg=n)
    assert again.history == full.history
