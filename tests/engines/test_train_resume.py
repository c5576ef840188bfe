"""Crash safety: kill `ffnlab train` (SIGKILL, no chance to clean up) mid-run and in the middle of
a checkpoint write, resume with --resume, and get exactly the losses of an uninterrupted run."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ffnlab.cli.main import main
from ffnlab.formats.checkpoint import load_checkpoint
from ffnlab.training.checkpoint import KILL_HOOK_ENV

pytestmark = pytest.mark.slow

STEPS = 40
ARGS = ["--n-layer", "1", "--d-model", "32", "--n-head", "2", "--seq-len", "16", "--batch", "4",
        "--steps", str(STEPS), "--eval-every", "10", "--ckpt-every", "10", "--warmup", "4", "--lr", "3e-3",
        "--seed", "5", "--quiet"]
TEXT = "".join(f"{i}: the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs.\n"
               for i in range(120))


def train_cmd(data, out, *extra, steps=STEPS):
    args = [str(steps) if a == str(STEPS) else a for a in ARGS]
    return [sys.executable, "-m", "ffnlab.cli.main", "train", "--data", str(data), "--out", str(out), *args, *extra]


def env_with(**kv):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.update(kv)
    return env


def history(out):
    with open(os.path.join(out, "trainer.json")) as f:
        rec = json.load(f)
    return rec["step"], rec["history"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    p = tmp_path_factory.mktemp("data") / "text.txt"
    p.write_text(TEXT)
    return p


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory):
    """The uninterrupted run."""
    out = tmp_path_factory.mktemp("ref") / "run"
    subprocess.run(train_cmd(data, out), check=True, env=env_with())
    step, hist = history(out)
    assert step == STEPS and len(hist["train"]) == STEPS
    return hist


def resume_and_compare(data, out, reference, steps=STEPS):
    r = subprocess.run(train_cmd(data, out, "--resume", steps=steps), env=env_with(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    step, hist = history(out)
    assert step == steps
    assert hist["train"] == reference["train"]          # bit-exact: every step's loss
    assert hist["eval"] == reference["eval"]
    assert hist["grad_norm"] == reference["grad_norm"]
    assert not [f for f in os.listdir(out) if ".tmp-" in f]   # the killed writer's temp file is cleaned up


@pytest.mark.parametrize("pattern,k,committed", [
    ("trainer.json", 2, 10),          # temp commit record written, rename not done: step 20 never committed
    ("state-*", 3, 20),               # the step-30 resume state half-committed
    ("model.safetensors", 2, 10),     # the step-20 weights for `ffnlab run` not yet in place
])
def test_kill_during_checkpoint_write_then_resume_gives_same_losses(data, tmp_path, reference, pattern, k, committed):
    out = tmp_path / "run"
    r = subprocess.run(train_cmd(data, out), env=env_with(**{KILL_HOOK_ENV: f"{pattern}:{k}"}))
    assert r.returncode == -signal.SIGKILL
    assert [f for f in os.listdir(out) if ".tmp-" in f], "the kill should leave a temp file behind"
    step, hist = history(out)
    assert step == committed and len(hist["train"]) == committed
    load_checkpoint(str(out))                          # what is there is a complete, loadable checkpoint
    resume_and_compare(data, out, reference)


def test_kill_mid_run_then_resume_gives_same_losses(data, tmp_path):
    steps = 150                                                  # long enough to be caught mid-run
    ref_out = tmp_path / "ref"
    subprocess.run(train_cmd(data, ref_out, steps=steps), check=True, env=env_with())
    _, reference = history(ref_out)
    out = tmp_path / "run"
    p = subprocess.Popen(train_cmd(data, out, steps=steps), env=env_with())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and p.poll() is None:      # at the first commit (step 10 of 150), kill
        if os.path.exists(out / "trainer.json"):
            p.send_signal(signal.SIGKILL)
            break
        time.sleep(0.001)
    p.wait()
    assert p.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    step, _ = history(out)
    assert 10 <= step < steps
    resume_and_compare(data, out, reference, steps)


def test_resume_of_a_finished_run_changes_nothing(data, tmp_path, reference):
    out = tmp_path / "run"
    subprocess.run(train_cmd(data, out), check=True, env=env_with())
    before = (out / "model.safetensors").read_bytes()
    resume_and_compare(data, out, reference)
    assert (out / "model.safetensors").read_bytes() == before


def test_resume_refuses_other_settings(data, tmp_path, capsys):
    out = tmp_path / "run"
    cmd = train_cmd(data, out, steps=10)[3:]                     # in-process: ffnlab.cli.main.main(argv)
    assert main(cmd) == 0
    capsys.readouterr()
    assert main(cmd + ["--resume", "--lr", "0.01"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "lr" in err and "0.003" in err
    assert main(cmd) == 1                                        # no --resume: refuse to overwrite
    assert "already holds a checkpoint at step 10" in capsys.readouterr().err


def test_resume_with_more_steps_extends_a_finished_run(data, tmp_path, capsys):
    """--resume --steps 14 on a finished 10-step run: the first 10 steps are untouched, the added 4
    run at the schedule's final rate (min_lr_frac * lr), and the result is bit for bit a fresh run
    told the same thing (steps 14, schedule over 10); shortening is refused."""
    out = tmp_path / "run"
    cmd = train_cmd(data, out, steps=10)[3:]
    assert main(cmd) == 0
    _, first = history(out)
    assert main(cmd + ["--resume", "--steps", "14"]) == 0
    step, hist = history(out)
    assert step == 14 and hist["train"][:10] == first["train"] and len(hist["train"]) == 14

    from ffnlab.training.trainer import TrainSettings
    meta = json.loads((out / "ffnlab.json").read_text())["train"]["settings"]
    assert meta["steps"] == 14 and meta["schedule_steps"] == 10
    s = TrainSettings.from_dict(meta)
    assert [s.lr_at(i) for i in range(10, 14)] == [s.lr_at(9)] * 4 == [pytest.approx(3e-3 * 0.1)] * 4

    from ffnlab.formats.checkpoint import read_meta, read_tokenizer
    from ffnlab.training.data import TokenData, encode
    from ffnlab.training.trainer import train
    from ffnlab.config import ModelConfig
    m = read_meta(out)
    tok = read_tokenizer(out, m)
    token_data = TokenData.from_ids(encode(tok, m["tokenizer"], TEXT), s.seq_len, s.val_frac, path=str(data))
    fresh = train(ModelConfig.from_dict(m["config"]), TrainSettings.from_dict(meta), token_data, tok, m["tokenizer"],
                  str(tmp_path / "fresh"), data_info=m["train"]["data"], progress=False)
    assert fresh["history"]["train"] == hist["train"]

    assert main(cmd + ["--resume", "--steps", "12"]) == 1
    assert "a run can be extended, not shortened" in capsys.readouterr().err


def test_warmup_longer_than_the_run_is_warned_about(data, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(train_cmd(data, out, "--warmup", "20", steps=8)[3:]) == 0
    err = capsys.readouterr().err
    line = next(x for x in err.splitlines() if x.startswith("warning:"))
    # the last of 8 warmup steps of 20 reaches 8/20 of --lr
    assert "--warmup 20 >= --steps 8" in line and "1.20e-03 (40% of --lr 0.003)" in line and "never decays" in line
