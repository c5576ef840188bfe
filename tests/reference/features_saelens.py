"""The SAELens side of tests/engines/test_features_vs_saelens.py, run as a script by an interpreter where
sae_lens imports (its own venv: scripts/install.sh --test makes one). Prints one JSON object.

    python features_saelens.py WORKDIR

1. files: ffnlab saves TopK, JumpReLU, ReLU SAEs; SAELens's SAE.load_from_disk reads them and reconstructs the
   same inputs; SAELens saves a TopK SAE, a transcoder and a skip-transcoder, ffnlab reads them.
2. training: 100 steps of a TopK SAE (with AuxK) and of a ReLU-L1 SAE, each side from the same initial weights on
   the same batches: SAELens's training_forward_pass + clip_grad_norm_(1.0) + torch.optim.Adam (SAETrainer's
   _train_step) against ffnlab's loss_and_grads + clip_grad_norm + AdamW (weight decay 0) -- the trainer's
   pieces, without its buffer, so that the batches are the same.
"""
import json
import sys

import numpy as np
import torch

import sae_lens
from sae_lens import (SAE, SkipTranscoder, SkipTranscoderConfig, StandardTrainingSAE, StandardTrainingSAEConfig,
                      TopKTrainingSAE, TopKTrainingSAEConfig, Transcoder, TranscoderConfig)
from sae_lens.saes.sae import TrainStepInput

from ffnlab.features import saelens_io
from ffnlab.features.dictionary import DictConfig, init_params
from ffnlab.features.evaluate import reconstruct
from ffnlab.features.losses import loss_and_grads
from ffnlab.training.optim import AdamW, clip_grad_norm

D_IN, D_SAE, K, B, STEPS = 48, 256, 8, 64, 100
DEAD_STEPS = 1                         # SAETrainer: dead once more than this many steps passed without firing (1: AuxK is on)


def data(seed=0):
    """sparse codes on a random dictionary, plus a mean: activations with structure an SAE can find"""
    rng = np.random.default_rng(seed)
    atoms = rng.standard_normal((512, D_IN)).astype(np.float32)
    codes = (rng.random((STEPS * B, 512)) < 0.02) * rng.exponential(1.0, (STEPS * B, 512))
    return (codes @ atoms + 0.5).astype(np.float32)


def files(work):
    out = {}
    x = data(1)[:200]
    for act, arch_k in (("topk", K), ("jumprelu", None), ("relu", None)):
        cfg = DictConfig("sae", act, D_IN, D_SAE, D_IN, k=K)
        p = init_params(cfg, np.random.default_rng(2), threshold=0.05)
        p["b_enc"] += np.float32(0.01)
        p["b_dec"] += np.float32(0.1)
        d = f"{work}/ours-{act}"
        import os
        os.makedirs(d, exist_ok=True)
        saelens_io.save(d, p, cfg, saelens_io.cfg_dict(cfg, "blocks.0.hook_resid_post", None, "m", {}))
        sae = SAE.load_from_disk(d)
        theirs = sae(torch.tensor(x)).detach().numpy()
        ours, _ = reconstruct(p, cfg, x)
        out[f"ours_{act}_in_saelens"] = {"class": type(sae).__name__, "max_abs_diff": float(np.abs(theirs - ours).max()),
                                         "scale": float(np.abs(ours).max())}
    torch.manual_seed(0)
    made = {"topk": TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K)),
            "transcoder": Transcoder(TranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_IN - 8, apply_b_dec_to_input=False)),
            "skip_transcoder": SkipTranscoder(SkipTranscoderConfig(d_in=D_IN, d_sae=D_SAE, d_out=D_IN - 8, apply_b_dec_to_input=False))}
    for name, sae in made.items():
        with torch.no_grad():
            for prm in sae.parameters():
                prm.add_(0.01 * torch.randn_like(prm))
        d = f"{work}/theirs-{name}"
        if hasattr(sae, "save_inference_model"):
            sae.save_inference_model(d)
        else:
            sae.save_model(d)
        p, cfg, _ = saelens_io.load(d)
        ours, _ = reconstruct(p, cfg, x)
        with torch.no_grad():
            theirs = (sae.decode(sae.encode(torch.tensor(x))) if name == "topk" else sae(torch.tensor(x))).numpy()
        out[f"saelens_{name}_in_ffnlab"] = {"kind": cfg.kind, "act": cfg.act,
                                            "max_abs_diff": float(np.abs(theirs - ours).max()),
                                            "scale": float(np.abs(ours).max())}
    return out


def train(act):
    xs = data(0)
    cfg = DictConfig("sae", act, D_IN, D_SAE, D_IN, k=K)
    p = init_params(cfg, np.random.default_rng(5), decoder_norm=1.0 if act == "topk" else 0.1)
    p["b_dec"][:] = xs[:1024].mean(0)
    coef = 0.0 if act == "topk" else 0.05
    if act == "topk":
        sae = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, k=K, aux_loss_coefficient=1 / 32,
                                                    rescale_acts_by_decoder_norm=False, decoder_init_norm=None))
    else:
        sae = StandardTrainingSAE(StandardTrainingSAEConfig(d_in=D_IN, d_sae=D_SAE, l1_coefficient=coef,
                                                            decoder_init_norm=None))
    with torch.no_grad():
        for n, a in p.items():
            getattr(sae, n).copy_(torch.tensor(a))
    opt = torch.optim.Adam(sae.parameters(), lr=1e-3, betas=(0.9, 0.999))
    ours = AdamW(p, weight_decay=0.0, betas=(0.9, 0.999))
    since_t = torch.zeros(D_SAE)
    since_o = np.zeros(D_SAE)
    losses_t, losses_o = [], []
    for step in range(STEPS):
        x = xs[step * B:(step + 1) * B]
        dead_t = since_t > DEAD_STEPS
        o = sae.training_forward_pass(TrainStepInput(sae_in=torch.tensor(x), coefficients={"l1": coef},
                                                     dead_neuron_mask=dead_t, n_training_steps=step,
                                                     is_logging_step=False))
        fired = o.feature_acts.bool().float().sum(-2).bool()
        since_t += 1
        since_t[fired] = 0
        o.loss.backward()
        torch.nn.utils.clip_grad_norm_(sae.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        losses_t.append(float(o.loss.detach()))
        terms, g, _, acts = loss_and_grads(p, cfg, x, x, since_o > DEAD_STEPS, coef, aux_coef=1 / 32)
        clip_grad_norm(g, 1.0)
        ours.step(p, g, 1e-3)
        fired_o = np.bincount(acts.idx[acts.val > 0], minlength=D_SAE) > 0
        since_o += 1
        since_o[fired_o] = 0
        losses_o.append(sum(terms.values()))
    w = {n: getattr(sae, n).detach().numpy() for n in p}
    return {"losses_saelens": losses_t, "losses_ffnlab": losses_o,
            "max_abs_diff": {n: float(np.abs(w[n] - p[n]).max()) for n in p},
            "scale": {n: float(np.abs(p[n]).max()) for n in p}, "dead_masks_equal": bool(((since_t > DEAD_STEPS).numpy()
                                                                                         == (since_o > DEAD_STEPS)).all()),
            "aux_used": bool((since_o > DEAD_STEPS).any())}


if __name__ == "__main__":
    work = sys.argv[1]
    print(json.dumps({"sae_lens": sae_lens.__version__, "files": files(work), "topk": train("topk"),
                      "relu": train("relu")}))
