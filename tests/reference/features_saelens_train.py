"""SAELens's own trainer (SAETrainer, TopKTrainingSAE) on saved activation rows, for scripts/saelens_quality.py:
the SAE that SAELens trains with ffnlab's recipe on the same activations and budget. Run by an interpreter where
sae_lens imports; prints one JSON object; writes the SAE (scaling folded in, SAELens's format) into OUT_DIR.

    python features_saelens_train.py ROWS.npy OUT_DIR '{"d_sae": 4608, "k": 32, "batch": 512, ...}'

The recipe as SAELens expresses it: Adam (0.9, 0.999), linear warm-up over `warmup` steps then cosine decay to
lr / 10, gradient norm clipped at 1 (SAETrainer's own), AuxK with coefficient 1/32 on latents that did not fire
in `dead_steps` steps, TopK with the decoder treated as unit-norm (rescale_acts_by_decoder_norm) and started at
unit rows, the input scaled to mean norm sqrt(d_in) (expected_average_only_in, estimated on the first
`norm_batches` batches; fit() folds it into the weights at its end). The rows are read in order, cycling.
"""
import json
import sys
import time

import numpy as np
import torch

from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
from sae_lens.training.sae_trainer import SAETrainer
from sae_lens.config import SAETrainerConfig


def rows_in_order(x, batch):
    i = 0
    while True:
        if i + batch > len(x):
            i = 0
        yield x[i:i + batch]
        i += batch


def main():
    rows_path, out, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    torch.manual_seed(settings.get("seed", 0))
    torch.set_num_threads(settings.get("threads", 1))
    x = torch.from_numpy(np.load(rows_path))
    batch, steps = settings["batch"], settings["steps"]
    sae = TopKTrainingSAE(TopKTrainingSAEConfig(
        d_in=x.shape[1], d_sae=settings["d_sae"], k=settings["k"], aux_loss_coefficient=1 / 32,
        rescale_acts_by_decoder_norm=True, decoder_init_norm=1.0, normalize_activations="expected_average_only_in"))
    trainer = SAETrainer(SAETrainerConfig(
        total_training_samples=steps * batch, train_batch_size_samples=batch, lr=settings["lr"],
        lr_end=settings["lr"] / 10, lr_scheduler_name="cosineannealing", lr_warm_up_steps=settings["warmup"],
        dead_feature_window=settings["dead_steps"], feature_sampling_window=10 ** 9,
        n_batches_for_norm_estimate=settings["norm_batches"], device="cpu"), sae, rows_in_order(x, batch))
    folded = []
    fold = sae.fold_activation_norm_scaling_factor                # fit() folds the factor in at its end

    def record(factor):
        folded.append(float(factor))
        fold(factor)
    sae.fold_activation_norm_scaling_factor = record
    t = time.perf_counter()
    sae = trainer.fit()
    seconds = time.perf_counter() - t
    assert len(folded) == 1 and sae.cfg.normalize_activations == "none", (folded, sae.cfg.normalize_activations)
    sae.save_inference_model(out)
    print(json.dumps({"seconds": seconds, "scaling_factor": folded[0], "steps": trainer.n_training_steps,
                      "samples": trainer.n_training_samples}))


if __name__ == "__main__":
    main()
