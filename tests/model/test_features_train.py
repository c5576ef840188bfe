"""The trainer (features/trainer.py) on synthetic activations with a known sparse structure: it learns, keeps
the decoder rows at unit norm, starts b_dec at the data's mean, marks dead latents by the window, runs
BatchTopK's threshold, folds the sites' constants into what it saves, and a resumed run equals an
uninterrupted one."""
import dataclasses
import os

import numpy as np
import pytest

from ffnlab.features import dictionary as D
from ffnlab.features.evaluate import reconstruct
from ffnlab.features.harvest import ActivationBuffer, ArrayHarvest
from ffnlab.features import saelens_io
from ffnlab.features.trainer import (TRAINER_FILE, FeatureSettings, Trainer, folded, project_out_radial,
                                    scale_to_sqrt_width)

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
    after, l0 = fvu(t.params(), t.cfg, x[:2000])
    assert after < 0.5 * before and after < 0.3, (before, after)
    if act != "relu":
        np.testing.assert_allclose(np.linalg.norm(t.p["W_dec"], axis=1), 1, rtol=1e-5)
    if act == "batchtopk":                 # inference by the learned threshold fires about k latents a token
        assert t.p["threshold"].min() > 0 and 2 <= l0 <= 8, l0
    for f in ("cfg.json", "sae_weights.safetensors", TRAINER_FILE):
        assert os.path.isfile(tmp_path / f)
    saved, _, _ = saelens_io.load(str(tmp_path))
    for n, a in t.params().items():                # the file holds the dictionary on the model's activations
        np.testing.assert_array_equal(saved[n], a, err_msg=n)


@pytest.mark.parametrize("normalize", ["scale", "none"])
def test_b_dec_starts_at_the_mean_of_the_first_buffer(normalize):
    t, _ = trainer(normalize=normalize)
    t.init_b_dec()
    b = t.harvest.buffer
    np.testing.assert_allclose(t.params()["b_dec"], b.y[:b.n].mean(0), rtol=1e-5)
    norm = np.linalg.norm(b.x[:b.n].astype(np.float64) * t.c_in, axis=1).mean()
    assert norm == pytest.approx(np.sqrt(D_IN) if normalize == "scale" else np.linalg.norm(b.x[:b.n], axis=1).mean(),
                                 rel=1e-6)


def test_b_dec_init_zero_leaves_b_dec_at_zero_and_still_scales():
    t, _ = trainer(b_dec_init="zero")
    t.init_b_dec()
    b = t.harvest.buffer
    assert not t.p["b_dec"].any()
    norm = np.linalg.norm(b.x[:b.n].astype(np.float64) * t.c_in, axis=1).mean()
    assert norm == pytest.approx(np.sqrt(D_IN), rel=1e-6)
    with pytest.raises(ValueError, match="b_dec_init 'median'"):
        trainer(b_dec_init="median")


def test_an_unknown_normalize_is_refused():
    with pytest.raises(ValueError, match="normalize 'std'"):
        trainer(normalize="std")


def test_the_projected_decoder_gradient_is_the_gradient_through_the_row_norms():
    """At unit rows W, d/dW f(W / ||W||) = g - (g . w) w per row, g = f's gradient at W: checked by central
    differences of f(V) = sum(C * V / ||V||) (float64, step h = 1e-6: truncation ~h^2 = 1e-12; rounding
    ~eps * (30 terms) * |f| / h, a few 1e-9 at |f| ~ 5, so the bound is 5e-8)."""
    rng = np.random.default_rng(3)
    W = rng.standard_normal((6, 5))
    W /= np.linalg.norm(W, axis=1, keepdims=True)
    C = rng.standard_normal((6, 5))
    f = (lambda V: float((C * V / np.linalg.norm(V, axis=1, keepdims=True)).sum()))
    fd = np.zeros_like(W)
    for i, j in np.ndindex(W.shape):
        e = np.zeros_like(W)
        e[i, j] = 1e-6
        fd[i, j] = (f(W + e) - f(W - e)) / 2e-6
    g = C.copy()                                       # f's gradient with the norms held at 1
    project_out_radial(g, W)
    np.testing.assert_allclose(g, fd, atol=5e-8)
    assert np.abs(np.einsum("ij,ij->i", g, W)).max() < 1e-12


def test_scale_to_sqrt_width_of_rows_that_are_all_zero_is_one():
    assert scale_to_sqrt_width(np.zeros((4, 8), np.float32)) == 1.0


EPS32 = float(np.finfo(np.float32).eps)


@pytest.mark.parametrize("kind,act", [("sae", "topk"), ("transcoder", "topk"), ("skip-transcoder", "jumprelu"),
                                      ("transcoder", "relu"), ("sae", "batchtopk")])
def test_the_folded_dictionary_on_x_is_the_trained_one_on_scaled_x(kind, act):
    """out_folded(x) = out(c_in x) / c_out, to float32 rounding: the bound is the error of the folded weights'
    rounding and of the sums' order, (terms + 4) eps of the sums of magnitudes, through pre and the decode."""
    rng = np.random.default_rng(3)
    d_in, d_sae, d_out, B = 24, 96, 24 if kind == "sae" else 20, 32
    cfg = D.DictConfig(kind, act, d_in, d_sae, d_out, k=6)
    p = D.init_params(cfg, rng, 1.0, 0.05)
    p["b_enc"][:] = rng.normal(0, 0.1, d_sae)
    p["b_dec"][:] = rng.normal(0, 1.0, d_out)
    if "W_skip" in p:
        p["W_skip"][:] = rng.normal(0, 0.2, p["W_skip"].shape)
    if "threshold" in p:
        p["threshold"][:] = 0.05
    c_in = float(np.float32(7.25))
    c_out = c_in if kind == "sae" else float(np.float32(0.8))
    x = (rng.normal(0, 0.4, (B, d_in)) + 0.3).astype(np.float32)
    want, acts = reconstruct(p, cfg, x * np.float32(c_in))
    q = folded(p, cfg, c_in, c_out)
    got, acts_q = reconstruct(q, cfg, x)
    np.testing.assert_array_equal(acts_q.idx, acts.idx)                                # the same latents fire
    # float64 magnitudes of every sum the two sides compute
    sae_in = np.abs(x.astype(np.float64) * c_in - (p["b_dec"] if cfg.apply_b_dec_to_input else 0))
    pre_mag = sae_in @ np.abs(p["W_enc"]) + np.abs(p["b_enc"])                         # [B, d_sae]
    da = (d_in + 4) * EPS32 * pre_mag                                                  # error of each activation
    mag = np.zeros((B, d_out))
    err_a = np.zeros((B, d_out))
    for b in range(B):
        sl = slice(acts.ptr[b], acts.ptr[b + 1])
        mag[b] = np.abs(acts.val[sl]) @ np.abs(p["W_dec"][acts.idx[sl]])
        err_a[b] = da[b, acts.idx[sl]] @ np.abs(p["W_dec"][acts.idx[sl]])
    mag += np.abs(p["b_dec"])
    if "W_skip" in p:
        mag += np.abs(x.astype(np.float64) * c_in) @ np.abs(p["W_skip"]).T
    bound = ((cfg.k + d_in + 4) * EPS32 * mag + err_a) / c_out
    assert np.all(np.abs(got - want / np.float32(c_out)) <= bound), np.max(np.abs(got - want / c_out) / bound)


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


@pytest.mark.parametrize("act,term", [("topk", "aux"), ("relu", "l1"), ("jumprelu", "l0_loss")])
def test_the_recorded_loss_is_the_sum_of_the_terms_the_step_minimised(act, term, monkeypatch):
    """history's loss = mse + the sparsity / AuxK term, each the trainer's own loss_and_grads term over c_out^2
    (here c_out != 1: the "scale" normalize); jumprelu's L0 term under its own name, beside the latents fired"""
    import ffnlab.features.trainer as trainer_module
    real, returned = trainer_module.loss_and_grads, []

    def spy(*args, **kw):                                   # the trainer's loss_and_grads, its terms kept
        out = real(*args, **kw)
        returned.append(out[0])
        return out
    monkeypatch.setattr(trainer_module, "loss_and_grads", spy)
    t, _ = trainer(act, steps=5)
    t.init_b_dec()
    t.since_fired[:32] = t.s.dead_window                   # half the latents dead: AuxK takes part (topk)
    rec = t.train_step()
    terms, c2 = returned[-1], t.c_out ** 2
    assert t.c_out != 1.0 and set(terms) == {"mse", term.replace("_loss", "")}
    assert rec[term] > 0 and rec[term] == pytest.approx(terms[term.replace("_loss", "")] / c2, abs=1e-6)
    assert rec["mse"] == pytest.approx(terms["mse"] / c2, abs=1e-6)
    assert rec["loss"] == pytest.approx(sum(terms.values()) / c2, abs=1e-6)        # the objective, over c_out^2
    assert rec["loss"] == pytest.approx(rec["mse"] + rec[term], abs=1.5e-6)       # each rounded to 1e-6
    assert t.history[-1] is rec
    if act == "jumprelu":                                   # the count is not the loss term
        assert rec["l0_loss"] == pytest.approx(t.s.coef * rec["l0"] / c2, rel=1e-3)


def test_the_train_progress_line_prints_the_recorded_loss(tmp_path, capsys):
    """`features train` on the tiny Llama: each plain progress line (stderr not a terminal) shows the step's loss
    and mse as trainer.json's history records them, and the loss there is mse + AuxK"""
    import json

    from ffnlab.cli.main import main
    from mlp_models import TEXT, tiny_gguf
    data, out = tmp_path / "text.txt", tmp_path / "out"
    data.write_text(TEXT)
    assert main(["features", "train", "-m", tiny_gguf("f32"), "--data", str(data), "--out", str(out), "--layer", "1",
                 "--width", "64", "--k", "4", "--tokens", "640", "--batch", "64", "--buffer-mb", "1", "--ctx", "48",
                 "--min-context", "4", "--ckpt-every", "5", "--dead-window", "64", "-t", "1"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("step ")]
    history = json.load(open(out / TRAINER_FILE))["history"]
    assert [line.split(":")[0] for line in lines] == ["step 5/10", "step 10/10"]
    for line in lines:
        h = history[int(line.split()[1].split("/")[0]) - 1]
        assert f"loss {h['loss']:.4g}, mse {h['mse']:.4g}, " in line, line
        assert h["loss"] == pytest.approx(h["mse"] + h.get("aux", 0.0), abs=1.5e-6)
    assert any(h.get("aux", 0) > 0 for h in history)       # dead latents within the run: the two differ
    assert f"last step loss {history[-1]['loss']:.4g}, mse {history[-1]['mse']:.4g}" in captured.out


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
