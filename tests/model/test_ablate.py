"""`ffnlab ablate`: the grid, equal-parameter widths, FLOPs per token, results, plots, resuming."""
import csv
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import torch_reference as R
from ffnlab.cli.main import main
from ffnlab.config import ModelConfig
from ffnlab.model.params import init_params
from ffnlab.training.ablate import flops_per_token, n_params, plan

BASE_MODEL = dict(arch="llama", n_layer=2, d_model=48, n_head=4, d_ff=48, norm="rmsnorm", positions="rope",
                  vocab_size=256, n_ctx=32, tie_embeddings=False)
BASE = {"model": BASE_MODEL, "settings": {"steps": 10, "batch": 2, "seq_len": 32}}


def test_match_params_gives_gated_ffns_two_thirds_of_the_width():
    runs = plan(BASE, ["gelu", "swiglu"], [4], 1, match_params=True)
    dense, gated = (ModelConfig.from_dict(r["config"]) for r in runs)
    assert (dense.d_ff, gated.d_ff) == (192, 128)                     # 4 x 48 and 8/3 x 48
    assert n_params(dense) == n_params(gated)
    runs = plan(BASE, ["relu", "geglu"], [1, 2, 8], 1, match_params=True)
    for d, g in zip(runs[:3], runs[3:]):
        d, g = ModelConfig.from_dict(d["config"]), ModelConfig.from_dict(g["config"])
        # 2/3 of mult*d_model rounds to an integer: at most half a unit of width in each of 3 matrices per layer
        assert abs(n_params(d) - n_params(g)) <= 1.5 * d.d_model * d.n_layer
    unmatched = plan(BASE, ["swiglu"], [4], 1, match_params=False)
    assert ModelConfig.from_dict(unmatched[0]["config"]).d_ff == 192


@pytest.mark.parametrize("ffn,tie", [("swiglu", False), ("gelu", True)])
def test_flops_per_token_matches_torch_flop_counter(ffn, tie):
    """torch's FlopCounterMode counts every matmul of a forward+backward step. It counts the full
    T x T attention matmuls; FLOPs/token counts the causal half that can matter (Kaplan et al.),
    so the dense count exceeds it by 3 (fwd+bwd) x 2 (qk, pv) x n_layer x T x q_dim per token."""
    cfg = ModelConfig(**{**BASE_MODEL, "ffn": ffn, "d_ff": 96, "tie_embeddings": tie})
    B, T = 2, 32
    tp = R.params_to_torch(init_params(cfg), torch.float32)
    ids = torch.randint(0, 256, (B, T))
    with FlopCounterMode(display=False) as counter:
        logits = R.forward(tp, cfg, ids)
        F.cross_entropy(logits.reshape(-1, 256), ids.reshape(-1)).backward()
    dense_attention_extra = 3 * 2 * cfg.n_layer * T * cfg.q_dim
    assert counter.get_total_flops() / (B * T) == flops_per_token(cfg, T) + dense_attention_extra


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "text.txt"
    p.write_text("".join(f"{i}: Shall I compare thee to a summer's day? Thou art more lovely.\n" for i in range(150)))
    return p


ARGS = ["--ffn", "gelu,swiglu", "--mult", "1,4", "--match-params", "--seeds", "2", "--jobs", "2", "--n-layer", "1",
        "--d-model", "24", "--n-head", "2", "--steps", "12", "--batch", "2", "--seq-len", "16", "--warmup", "2",
        "--eval-every", "6", "--eval-batches", "2", "--ckpt-every", "6"]


def test_ablation_writes_results_and_plots_and_resumes(text_file, tmp_path, capsys):
    out = tmp_path / "abl"
    assert main(["ablate", "--data", str(text_file), "--out", str(out), *ARGS]) == 0
    assert "8 to train" in capsys.readouterr().out
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["variant"] for r in rows] == ["gelu-x1", "gelu-x4", "swiglu-x1", "swiglu-x4"]
    assert [int(r["d_ff"]) for r in rows] == [24, 96, 16, 64]
    results = json.load(open(out / "results.json"))["rows"]
    for row, res in zip(rows, results):
        # mean and sample std over seeds, recomputed from each run's own trainer record
        finals, tokens = [], set()
        for seed in (0, 1):
            rec = json.load(open(out / "runs" / f"{row['variant']}-s{seed}" / "trainer.json"))
            finals.append(rec["final"]["val_loss"])
            tokens.add(len(rec["history"]["train"]) * 2 * 16)
        assert tokens == {12 * 2 * 16}                                   # the same token budget for every run
        assert res["val_loss_mean"] == pytest.approx(np.mean(finals), rel=1e-12)
        assert res["val_loss_std"] == pytest.approx(np.std(finals, ddof=1), rel=1e-9)
        assert float(row["val_loss_mean"]) == pytest.approx(np.mean(finals), abs=1e-4)
        assert res["val_loss_std"] > 0                                   # two seeds really differ
        assert int(row["params"]) > 0 and int(row["flops_per_token"]) > 0 and float(row["tokens_per_s"]) > 0
    for png in ("val_loss_vs_params.png", "val_loss_vs_flops.png", "loss_curves.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stamp = os.stat(out / "runs" / "gelu-x1-s0" / "trainer.json").st_mtime_ns
    assert main(["ablate", "--data", str(text_file), "--out", str(out), *ARGS, "--ffn", "gelu", "--seeds", "3"]) == 0
    assert "4 already finished, 2 to train" in capsys.readouterr().out     # only the new seed trains
    assert os.stat(out / "runs" / "gelu-x1-s0" / "trainer.json").st_mtime_ns == stamp
    assert main(["ablate", "--data", str(text_file), "--out", str(out), *ARGS, "--steps", "13"]) == 1
    assert "settings.steps is 13, was 12" in capsys.readouterr().err


def test_a_diverging_variant_is_reported_not_fatal(text_file, tmp_path, capsys):
    out = tmp_path / "abl"
    args = [a for a in ARGS]
    args[args.index("--ffn") + 1] = "relu"
    args[args.index("--mult") + 1] = "2"
    assert main(["ablate", "--data", str(text_file), "--out", str(out), *args, "--lr", "1e30"]) == 0
    printed = capsys.readouterr().out
    assert "| relu-x2 |" in printed and "| 2/2 |" in printed
    d = json.load(open(out / "runs" / "relu-x2-s0" / "diverged.json"))
    assert d["step"] == 2 and "first non-finite node" in d["message"]
