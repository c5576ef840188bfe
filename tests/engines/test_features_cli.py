"""`ffnlab features` on SmolLM2-135M: a fixed seed gives the same directory bit for bit, --resume after a
SIGKILL mid-checkpoint writes what the uninterrupted run writes, the splice with its error term gives the
model's logits exactly, and each bad input is one line with nothing written."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from ffnlab.cli.main import main
from ffnlab.training.checkpoint import KILL_HOOK_ENV
from models import model_path

pytestmark = pytest.mark.slow

ARGS = ["--layer", "1", "--width", "576", "--k", "8", "--tokens", "3072", "--batch", "128", "--buffer-mb", "2",
        "--ctx", "48", "--min-context", "8", "--ckpt-every", "6", "--seed", "3", "-t", "1"]


@pytest.fixture(scope="module")
def smollm2():
    return model_path("smollm2")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    with open("/work/shared/data/tinyshakespeare.txt" if os.path.exists("/work/shared/data/tinyshakespeare.txt")
              else os.devnull, encoding="utf-8") as f:
        text = f.read()[:40_000]
    if len(text) < 40_000:                       # no corpus file: a text of its own, as varied as it needs to be
        rng = np.random.default_rng(0)
        words = "the king queen lord of a to and my is in that you with his not be it for this".split()
        text = " ".join(rng.choice(words, 8000)) + "."
    p = tmp_path_factory.mktemp("data") / "text.txt"
    p.write_text(text)
    return str(p)


def train_cmd(smollm2, data, out, *extra):
    return [sys.executable, "-m", "ffnlab.cli.main", "features", "train", "-m", smollm2, "--data", data,
            "--out", str(out), *ARGS, *extra]


def env_with(**kv):
    return dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1", **kv)


def contents(d):
    return {f: open(os.path.join(d, f), "rb").read() for f in sorted(os.listdir(d))}


@pytest.fixture(scope="module")
def reference_run(smollm2, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    p = subprocess.run(train_cmd(smollm2, data, out), check=True, env=env_with(), capture_output=True, text=True)
    return str(out), p.stderr


@pytest.fixture(scope="module")
def reference(reference_run):
    return reference_run[0]


def test_a_log_file_gets_a_line_at_each_checkpoint(reference_run):
    out, stderr = reference_run                         # stderr a pipe, not a terminal: no bar, plain lines
    lines = [line for line in stderr.splitlines() if line.startswith("step ")]
    assert [line.split(":")[0] for line in lines] == ["step 6/24", "step 12/24", "step 18/24", "step 24/24"]
    last = json.load(open(os.path.join(out, "trainer.json")))["history"][-1]
    assert f"FVU {last['fvu']:.3f}, dead {100 * last['dead']:.1f}%" in lines[-1]
    assert f"loss {last['loss']:.4g}, mse {last['mse']:.4g}, " in lines[-1]       # loss: mse + AuxK, as trained


def test_fixed_seed_gives_the_same_directory_bit_for_bit(smollm2, data, reference, tmp_path):
    out = tmp_path / "again"
    subprocess.run(train_cmd(smollm2, data, out), check=True, env=env_with(), capture_output=True)
    a, b = contents(reference), contents(out)
    assert set(a) == {"cfg.json", "sae_weights.safetensors", "trainer.json", "state-000024.safetensors"}
    assert a == b


def test_resume_after_a_kill_mid_checkpoint_equals_the_uninterrupted_run(smollm2, data, reference, tmp_path):
    out = tmp_path / "killed"
    p = subprocess.run(train_cmd(smollm2, data, out), env=env_with(**{KILL_HOOK_ENV: "trainer.json:2"}),
                       capture_output=True)
    assert p.returncode == -9, p.stderr.decode()[-2000:]
    assert json.load(open(out / "trainer.json"))["step"] == 6          # the second commit (step 12) never landed
    subprocess.run(train_cmd(smollm2, data, out, "--resume"), check=True, env=env_with(), capture_output=True)
    assert contents(out) == contents(reference)


def test_resume_reads_a_record_from_before_a_setting_existed_and_refuses_other_flags(smollm2, data, reference,
                                                                                   tmp_path):
    out = tmp_path / "old"
    shutil.copytree(reference, out)
    record = json.load(open(out / "trainer.json"))
    assert record["settings"]["b_dec_init"] == "mean"
    del record["settings"]["b_dec_init"], record["settings"]["project_decoder_grad"]    # a record of an earlier version
    (out / "trainer.json").write_text(json.dumps(record))
    p = subprocess.run(train_cmd(smollm2, data, out, "--resume", "--b-dec-init", "zero"), env=env_with(),
                       capture_output=True, text=True)
    assert p.returncode != 0 and "--resume: the flags differ" in p.stderr and "Traceback" not in p.stderr
    subprocess.run(train_cmd(smollm2, data, out, "--resume"), check=True, env=env_with(), capture_output=True)
    assert json.load(open(out / "cfg.json"))["ffnlab"]["b_dec_init"] == "mean"


def test_eval_and_show_read_the_trained_directory(smollm2, data, reference, capsys):
    assert main(["features", "eval", reference, "-m", smollm2, "--data", data, "--tokens", "300", "--ctx", "48",
                 "--min-context", "8", "--json", "-t", "1"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["tokens"] >= 300 and m["l0"] <= 8
    assert m["fvu"] == pytest.approx(1 - m["explained_variance"])
    assert m["ce_clean"] < m["ce_ablated"] and np.isfinite(m["ce_loss_score"]) and np.isfinite(m["kl_score"])
    assert m["same_model_file"] is True
    assert main(["features", "show", reference, "-m", smollm2, "--data", data, "--tokens", "300", "--ctx", "48",
                 "--min-context", "8", "--top-n", "3", "--json", "-t", "1"]) == 0
    pages = json.loads(capsys.readouterr().out)
    assert len(pages["features"]) == 3
    for f in pages["features"]:
        assert 0 < f["density"] <= 1 and sum(f["hist"]["counts"]) == f["count"]
        assert all("[[" in w["text"] for w in f["windows"]) and len(f["logits_pos"]) == 10


@pytest.mark.parametrize("kind,site", [("transcoder", None), ("skip-transcoder", None), ("sae", "l_out-2"),
                                       ("sae", "ffn_out-2")])
def test_splice_with_the_error_term_gives_the_models_logits_bit_for_bit(smollm2, kind, site):
    import ffnlab
    from ffnlab.features.dictionary import DictConfig, init_params
    from ffnlab.features.evaluate import splice
    from ffnlab.features.harvest import sites
    model = ffnlab.load(smollm2)
    cfg = DictConfig(kind, "topk", 576, 1152, 576, k=16)
    p = init_params(cfg, np.random.default_rng(0))
    if "W_skip" in p:
        p["W_skip"] += np.float32(0.01)
    ids = np.array(model.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3), dtype=np.int64)
    clean = model.forward(ids)
    in_node, out_node = sites(kind, 2, site)
    record = []
    exact = model.forward(ids, hooks=splice(p, cfg, in_node, out_node, error=True, record=record))
    assert record and not np.array_equal(record[0][1], record[0][2]), "the reconstruction should differ from the node"
    assert np.array_equal(exact, clean)
    rough = model.forward(ids, hooks=splice(p, cfg, in_node, out_node, error=False))
    assert not np.array_equal(rough, clean)


def _one_line_error(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1 and "error:" in err, err
    return err


@pytest.mark.parametrize("extra,words", [
    (["--layer", "99"], "out of range"),
    (["--kind", "sae", "--site", "ffn_nope-1"], "not a node"),
    (["--k", "5000"], "larger than the dictionary's width"),
    (["--kind", "transcoder", "--site", "l_out-1"], "--site names an SAE's node"),
])
def test_bad_train_input_is_one_line_and_writes_nothing(smollm2, data, tmp_path, capsys, extra, words):
    out = tmp_path / "out"
    flags = dict(zip(ARGS[::2], ARGS[1::2]))
    flags.update(dict(zip(extra[::2], extra[1::2])))
    args = [a for kv in flags.items() for a in kv]
    err = _one_line_error(capsys, ["features", "train", "-m", smollm2, "--data", data, "--out", str(out), *args, *extra])
    assert words in err
    assert not out.exists()


def _dictionary_dir(path, d_in=576, n_vocab=None, site="ffn_norm-1", site_out="ffn_out-1"):
    from ffnlab.features import saelens_io
    from ffnlab.features.dictionary import DictConfig, init_params
    cfg = DictConfig("transcoder", "topk", d_in, 64, d_in, k=4)
    os.makedirs(path, exist_ok=True)
    meta = saelens_io.cfg_dict(cfg, site, site_out, "m", {"site_in": site, "site_out": site_out, "n_vocab": n_vocab})
    saelens_io.save(str(path), init_params(cfg, np.random.default_rng(0)), cfg, meta)
    return str(path)


@pytest.mark.parametrize("spoil,words", [
    ("d_model", "do not fit"),
    ("vocab", "another model"),
    ("cfg", "not valid JSON"),
    ("weights", "not a readable safetensors"),
    ("shape", "has shape"),
    ("site", "not a node"),
])
def test_bad_dictionary_directory_is_one_line(smollm2, data, tmp_path, capsys, spoil, words):
    d = _dictionary_dir(tmp_path / "d", d_in=64 if spoil == "d_model" else 576,
                        n_vocab=1000 if spoil == "vocab" else None, site="ffn_nope-1" if spoil == "site" else "ffn_norm-1")
    if spoil == "cfg":
        open(os.path.join(d, "cfg.json"), "w").write('{"d_in": 576, ')
    if spoil == "weights":
        open(os.path.join(d, "sae_weights.safetensors"), "wb").write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    if spoil == "shape":
        c = json.load(open(os.path.join(d, "cfg.json")))
        c["d_sae"] = 65
        json.dump(c, open(os.path.join(d, "cfg.json"), "w"))
    before = contents(d)
    err = _one_line_error(capsys, ["features", "eval", d, "-m", smollm2, "--data", data, "--tokens", "50",
                                   "--ctx", "48", "--min-context", "8"])
    assert words in err
    assert contents(d) == before


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} not installed (apt-get install chromium): "
                    "the HTML page is not rendered")
def test_html_feature_pages_render_in_headless_chromium(smollm2, data, reference, tmp_path, capsys):
    import re
    import shutil
    import tempfile
    page = tmp_path / "f.html"
    assert main(["features", "show", reference, "-m", smollm2, "--data", data, "--tokens", "300", "--ctx", "48",
                 "--min-context", "8", "--features", "0,1,2,3", "--html", str(page), "--json", "-t", "1"]) == 0
    pages = json.loads(capsys.readouterr().out)
    profile = tempfile.mkdtemp()
    try:
        dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                              f"--user-data-dir={profile}", "--dump-dom", f"file://{page}"],
                             capture_output=True, text=True, timeout=120).stdout
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    for f in pages["features"]:
        block = re.search(rf"<div class=\"f\" id=\"latent-{f['latent']}\">(.*?)</div>\s*(?=<div class=\"f\"|</body>)",
                          dom, re.S)
        assert block, f"latent {f['latent']} is on the page"
        body = block.group(1)
        shown = len(f["windows"]) + sum(len(q["windows"]) for q in f["quantiles"])
        assert body.count('<b class="tok">') == shown                         # one marked token per window
        assert body.count("<rect") == sum(1 for c in f["hist"]["counts"] if c)  # a bar per non-empty bin
