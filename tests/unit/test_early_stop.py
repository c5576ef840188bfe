"""`ablate --early-stop`'s pieces that need no cluster: the rungs are Ray's ASHA milestones, the
flags' grammar, the stopped runs in the results, and the one line without Ray. The scheduler on a
real cluster: tests/engines/test_ray_cluster.py."""
import json
import os
import subprocess
import sys

import pytest

from ffnlab.cli.main import main
from ffnlab.training.ablate import markdown_table
from ffnlab.training.tune_grid import default_grace_period, rungs
from mlp_models import TEXT, write_text


@pytest.mark.parametrize("steps, grace, rf", [(16, 8, 2), (300, 100, 3), (300, 50, 3), (100, 10, 4), (90, 10, 1.5)])
def test_rungs_are_ashas_own_milestones_below_the_last_step(steps, grace, rf):
    tune = pytest.importorskip("ray.tune", reason="Ray Tune is an optional extra: pip install ffnlab[ray]")
    asha = tune.schedulers.ASHAScheduler(time_attr="step", metric="val_loss", mode="min", max_t=steps,
                                         grace_period=grace, reduction_factor=rf)
    milestones = sorted(m for m, _ in asha._brackets[0]._rungs if m < steps)   # at max_t a run is done, not compared
    assert rungs(steps, grace, rf) == pytest.approx(milestones)


def test_default_grace_period_is_the_first_evaluation_past_a_quarter():
    assert default_grace_period(300, 50) == 100
    assert default_grace_period(16, 4) == 4
    assert default_grace_period(10, 50) == 10                                # never past the last step


@pytest.mark.parametrize("flags, line", [
    (["--grace-period", "4"], "--grace-period needs --early-stop"),
    (["--reduction-factor", "2"], "--reduction-factor needs --early-stop"),
    (["--early-stop", "--jobs", "2"], "--early-stop and --jobs do not go together"),
    (["--early-stop", "--reduction-factor", "1"], "--reduction-factor must exceed 1"),
    (["--early-stop", "--grace-period", "40"], "--grace-period 40 exceeds --steps 16"),
])
def test_early_stop_flags_are_refused_in_one_line(tmp_path, capsys, flags, line):
    data = write_text(tmp_path, TEXT)
    assert main(["ablate", "--data", data, "--out", str(tmp_path / "out"), "--steps", "16", *flags]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert line in err[-1]


def test_early_stop_without_ray_says_how_to_install(tmp_path):
    data = write_text(tmp_path, TEXT)
    code = ("import sys; sys.modules['ray'] = None; from ffnlab.cli.main import main; "   # as if Ray were absent
            f"sys.exit(main(['ablate', '--data', {data!r}, '--out', {str(tmp_path / 'out')!r}, '--early-stop']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1].endswith("--early-stop needs Ray Tune, an optional extra: "
                                                      "pip install 'ffnlab[ray]'")


def _row(**kw):
    row = dict(variant="gelu-x4", d_ff=64, params_nonembed=100, flops_per_token=1e6, seeds=2, train_loss_mean=2.0,
               train_loss_std=0.0, val_loss_mean=2.5, val_loss_std=0.0, tokens_per_s=1000.0, diverged=0)
    return {**row, **kw}


def test_table_has_a_stopped_column_only_when_a_run_was_stopped():
    assert "stopped" not in markdown_table([_row(), _row(stopped=0)])
    table = markdown_table([_row(), _row(variant="gelu-x0.0625", stopped=1)]).splitlines()
    assert table[0].endswith("| stopped |") and table[1].count("|") == table[0].count("|")
    assert table[2].endswith("| 0/2 |") and table[3].endswith("| 1/2 |")
    assert "±" not in table[3]                                            # one finished seed: no spread


def test_a_stopped_run_counts_as_finished_and_leaves_the_means(tmp_path):
    from ffnlab.training.ablate import STOPPED_FILE, collect, plan, run_dir, run_state
    base = {"model": dict(arch="llama", n_layer=1, d_model=16, n_head=2, d_ff=16, norm="rmsnorm", positions="rope",
                          vocab_size=256, n_ctx=16, tie_embeddings=False),
            "settings": {"steps": 16, "seq_len": 16}}
    spec = plan(base, ["gelu"], [1], 1, False)[0]
    os.makedirs(run_dir(tmp_path, spec))
    with open(os.path.join(run_dir(tmp_path, spec), STOPPED_FILE), "w") as f:
        json.dump({"step": 8, "val_loss": 3.0, "train_loss": 2.9, "eval": [[4, 3.1, 3.2], [8, 2.9, 3.0]],
                   "train": [3.5] * 8}, f)
    assert run_state(tmp_path, spec) == "stopped"
    [row] = collect(tmp_path, [spec], 16)
    assert row["stopped"] == 1 and row["per_seed"][0]["stopped_at"] == 8
    assert row["val_loss_mean"] != row["val_loss_mean"]                   # NaN: no finished seed
    assert row["curves"][0]["eval"] == [[4, 3.1, 3.2], [8, 2.9, 3.0]]


def test_early_stop_refuses_ray_client_addresses_in_one_line(tmp_path, capsys):
    pytest.importorskip("ray.tune", reason="Ray Tune is an optional extra: pip install ffnlab[ray]")
    data = write_text(tmp_path, TEXT)
    assert main(["ablate", "--data", data, "--out", str(tmp_path / "out"), "--steps", "16", "--warmup", "1",
                 "--early-stop", "--ray", "ray://127.0.0.1:10001"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert "--early-stop with --ray ray://127.0.0.1:10001: Ray Client runs Tune on the head" in err[-1]
