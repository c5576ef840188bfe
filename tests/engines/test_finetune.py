"""`ffnlab finetune`: a PEFT adapter directory that PEFT applies to the same model as ffnlab does,
a frozen base, and crash-safe resume (SIGKILL mid-write, then --resume: the same losses)."""
import hashlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.formats.peft import read_adapter
from ffnlab.model import Model
from ffnlab.training.checkpoint import KILL_HOOK_ENV, save_model
from ffnlab.training.data import TokenData, byte_tokenizer, tokenizer_meta
from ffnlab.training.finetune import FinetuneSettings, finetune
from ffnlab.training.lora import attach
from ffnlab.training.presets import build_config

pytestmark = pytest.mark.slow

TEXT = "".join(f"{i}: the quick brown fox jumps over the lazy dog; pack my box with five dozen jugs.\n"
               for i in range(60))
ARGS = ["--lora-r", "4", "--lora-alpha", "8", "--target", "all", "--steps", "12", "--batch", "2", "--seq-len", "16",
        "--eval-every", "4", "--ckpt-every", "4", "--eval-batches", "1", "--lr", "1e-2", "--lora-dropout", "0.1",
        "--quiet"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random tiny Llama as an ffnlab checkpoint (byte tokenizer), its q/k rows in GGUF's order."""
    d = tmp_path_factory.mktemp("base")
    cfg = build_config("tiny-llama", 256, n_layer=2, d_model=32, n_head=2, d_ff=64)
    m = Model.random(cfg, seed=3)
    for n, a in m.params.items():        # RMSNorm weights of 1, matrices of unit-ish gain: a lively model
        a *= 3.0 if a.ndim == 2 else 1.0
    tok = byte_tokenizer()
    save_model(str(d / "ck"), cfg, m.params, tok, tokenizer_meta(tok, "byte"))
    (d / "text.txt").write_text(TEXT)
    return d


def run_cmd(base, out, *extra):
    return [sys.executable, "-m", "ffnlab.cli.main", "finetune", "-m", str(base / "ck"), "--data",
            str(base / "text.txt"), "--out", str(out), *ARGS, *extra]


def env_with(**kv):
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", **kv)


def trainer(out):
    with open(os.path.join(out, "trainer.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(base, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "lora"
    subprocess.run(run_cmd(base, out), check=True, env=env_with())
    return out


def test_the_adapter_directory_is_peft_and_gives_ffnlabs_logits(base, reference, tmp_path):
    """PeftModel.from_pretrained on the exported HF model gives ffnlab's adapted logits. The base
    model stored q/k rows permuted as a GGUF llama does: PEFT's B rows come out in HF order.
    Both sides float32; logits of scale ~10 agree to ~1e-6 relative, 1e-3 is the bound asked of it."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from torch_reference import assert_close
    assert sorted(os.listdir(reference)) == ["adapter_config.json", "adapter_model.safetensors",
                                             "ffnlab_adapter.json", "finetune.json", "state-000012.safetensors",
                                             "trainer.json"]
    m = ffnlab.load(str(base / "ck"))
    assert main(["export", str(base / "ck"), "--to", "hf", str(tmp_path / "hf")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(hf, str(reference))
    ids = np.frombuffer(b"the lazy dog jumps", np.uint8).astype(np.int64)
    with torch.no_grad():
        want = pm(torch.tensor(ids[None])).logits[0]
    ad, scale, conf = read_adapter(str(reference), m.config, m.params)
    assert conf["r"] == 4 and conf["lora_alpha"] == 8 and len(conf["target_modules"]) == 7
    got = ffnlab.model.transformer.forward(attach(m.params, ad, scale), m.config, ids[None])[0][0]
    assert_close(got, want, 1e-3, "adapted logits vs PEFT")
    assert np.abs(got - m.forward(ids)).max() > 1e-2            # and the adapter did change the model


def test_training_leaves_the_base_weights_bit_for_bit(base, tmp_path):
    m = ffnlab.load(str(base / "ck"))
    before = {n: a.copy() for n, a in m.params.items()}
    ids = np.frombuffer(TEXT.encode(), np.uint8).astype(np.int32)
    s = FinetuneSettings(steps=3, batch=2, seq_len=16, eval_every=3, eval_batches=1, r=2, alpha=4, targets="mlp")
    rec = finetune(m, s, TokenData.from_ids(ids, 16), str(tmp_path / "o"), progress=False)
    assert rec["done"] and rec["trainable_params"] == 2 * 2 * (3 * (32 + 64))
    for n, a in m.params.items():
        assert a.dtype == before[n].dtype and np.array_equal(a, before[n]), n
    assert rec["history"]["eval"][0][0] == 0                    # the curves start at the base model


@pytest.mark.parametrize("pattern,k", [("trainer.json", 2), ("state-*", 2), ("adapter_model.safetensors", 3)])
def test_kill_during_a_checkpoint_write_then_resume_gives_the_same_run(base, reference, tmp_path, pattern, k):
    out = tmp_path / "lora"
    r = subprocess.run(run_cmd(base, out), env=env_with(**{KILL_HOOK_ENV: f"{pattern}:{k}"}))
    assert r.returncode == -signal.SIGKILL
    assert trainer(out)["step"] < 12
    r = subprocess.run(run_cmd(base, out, "--resume"), env=env_with(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got, want = trainer(out), trainer(reference)
    assert got["step"] == 12
    for key in ("train", "eval", "grad_norm"):                  # bit-exact, dropout masks included
        assert got["history"][key] == want["history"][key], key
    sha = [hashlib.sha256((d / "adapter_model.safetensors").read_bytes()).hexdigest() for d in (out, reference)]
    assert sha[0] == sha[1]
    assert not [f for f in os.listdir(out) if ".tmp-" in f]


def test_resume_with_other_settings_is_one_line(base, reference, tmp_path, capsys):
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(reference, out)
    args = run_cmd(base, out, "--resume")[3:]
    args[args.index("--lora-r") + 1] = "8"
    assert main(args) != 0
    err = capsys.readouterr().err
    assert "--resume: setting r is 8 but the run in" in err and "Traceback" not in err


@pytest.mark.parametrize("flag, value, needle", [
    ("--lora-r", "0", "--lora-r must be > 0, got 0"),
    ("--target", "gate,wq", "--target: unknown target 'wq'"),
    ("--lora-dropout", "1.5", "--lora-dropout must be in [0, 1), got 1.5"),
])
def test_bad_flags_are_one_line(base, tmp_path, capsys, flag, value, needle):
    args = run_cmd(base, tmp_path / "x")[3:]
    args[args.index(flag) + 1] = value
    assert main(args) != 0
    err = capsys.readouterr().err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_merge_into_an_hf_model_equals_the_adapted_model(base, reference, tmp_path):
    """export --merge --to hf: transformers runs W + alpha/r B A as ffnlab runs the adapter
    (float32 both; logits of scale ~10 agree to ~1e-6 relative, 1e-4 leaves room for the summation order)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from torch_reference import assert_close
    assert main(["export", str(reference), "--merge", "--to", "hf", str(tmp_path / "merged"), "--base", str(base / "ck")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    ids = np.frombuffer(b"pack my box", np.uint8).astype(np.int64)
    with torch.no_grad():
        want = hf(torch.tensor(ids[None])).logits[0]
    got = ffnlab.load(str(base / "ck"), lora=str(reference)).forward(ids)
    assert_close(got, want, 1e-4, "merged HF logits vs the adapted model")


def test_export_of_an_adapter_without_a_target_format_is_one_line(reference, tmp_path, capsys):
    assert main(["export", str(reference), "--to", "hf", str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert "is a LoRA adapter: export it --to gguf-lora, or --merge it" in err and err.count("\n") == 0
