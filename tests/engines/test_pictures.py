"""Picture options (PNG, HTML) are checked before the work and never end in a traceback; the text
result is printed whatever happens to the picture."""
import os
import subprocess
import sys

import pytest

from ffnlab.cli.main import main
from mlp_models import TEXT, tiny_gguf, write_text

pytestmark = pytest.mark.slow

# `import matplotlib` raises ImportError in the child: a None entry in sys.modules is Python's own
# way of marking a module as unimportable
NO_MATPLOTLIB = ("import sys; sys.modules['matplotlib'] = None; "
                 "from ffnlab.cli.main import main; sys.exit(main(sys.argv[1:]))")


def run_without_matplotlib(argv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", NO_MATPLOTLIB, *argv], capture_output=True, text=True, env=env,
                          timeout=300)


def picture_commands(tmp, model, data):
    """Every command's picture option, as a new user would type it."""
    return {
        "patch": ["patch", "-m", model, "--clean", "abcd", "--corrupt", "abxd", "--target", "e", "--foil", "y",
                  "--node", "ffn_out", "--out", f"{tmp}/p.png"],
        "causal-trace": ["causal-trace", "-m", model, "-p", "abcd", "--subject", "bc", "--samples", "2",
                         "--out", f"{tmp}/ct.png"],
        "ablate": ["ablate", "--data", data, "--out", f"{tmp}/abl", "--ffn", "relu", "--mult", "1", "--seeds", "1",
                   "--steps", "2", "--eval-every", "1", "--warmup", "0"],
        "neurons": ["neurons", "-m", model, "--layer", "0", "--data", data, "--ctx", "64", "--hist", f"{tmp}/h.png"],
        "experts": ["experts", "-m", model, "--data", data, "--png", f"{tmp}/e.png"],
    }


@pytest.mark.parametrize("command", ["patch", "causal-trace", "ablate", "neurons", "experts"])
def test_png_without_matplotlib_is_one_line_before_any_work(tmp_path, command):
    r = run_without_matplotlib(picture_commands(tmp_path, tiny_gguf("f32"), write_text(tmp_path, TEXT))[command])
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "needs matplotlib" in r.stderr and "pip install matplotlib" in r.stderr
    assert r.stdout == ""                                         # nothing computed, nothing half-printed
    assert not (tmp_path / "abl").exists()                        # ablate trained nothing


def moe_checkpoint(tmp_path):
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import tokenizer_meta
    from moe_models import byte_moe_model
    m = byte_moe_model()
    save_model(str(tmp_path / "moe"), m.config, m.params, m.tokenizer, tokenizer_meta(m.tokenizer, "byte"))
    return str(tmp_path / "moe")


@pytest.mark.parametrize("command", ["lens", "neurons", "experts"])
def test_html_pages_need_no_matplotlib(tmp_path, command):
    model, page, data = tiny_gguf("f32"), str(tmp_path / "p.html"), write_text(tmp_path, TEXT)
    if command == "lens":
        argv = ["lens", "-m", model, "-p", "abcd", "--html", page]
    elif command == "neurons":
        argv = ["neurons", "-m", model, "--layer", "0", "--data", data, "--ctx", "64", "--html", page]
    else:
        argv = ["experts", "-m", moe_checkpoint(tmp_path), "--data", data, "--ctx", "64", "--html", page]
    r = run_without_matplotlib(argv)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert os.path.getsize(page) > 1000 and r.stdout


@pytest.mark.parametrize("command,flag", [("patch", "--out"), ("causal-trace", "--out"), ("neurons", "--hist")])
def test_png_into_a_missing_folder_is_one_line_before_any_work(tmp_path, capsys, command, flag):
    argv = picture_commands(tmp_path / "no-such-folder", tiny_gguf("f32"), write_text(tmp_path, TEXT))[command]
    assert main(argv) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and f"{flag} " in out.err and "no folder" in out.err, out.err


def test_html_into_a_missing_folder_is_one_line(tmp_path, capsys):
    assert main(["lens", "-m", tiny_gguf("f32"), "-p", "abcd", "--html", str(tmp_path / "nope" / "l.html")]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1 and "--html" in out.err


def test_patch_prints_its_table_when_the_picture_cannot_be_written(tmp_path, capsys, monkeypatch):
    import ffnlab.interventions.plots as plots

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(plots, "patch_heatmap", disk_full)
    argv = picture_commands(tmp_path, tiny_gguf("f32"), "")["patch"]
    assert main(argv) == 1
    out = capsys.readouterr()
    assert "effect of patching ffn_out-L" in out.out and out.out.count("\n") >= 4     # header + a row per layer
    assert out.err.count("\n") == 1 and "No space left on device" in out.err and "--out" in out.err


def test_ablate_prints_its_table_when_the_plots_cannot_be_written(tmp_path, capsys, monkeypatch):
    import ffnlab.training.plots as plots

    def disk_full(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(plots, "plot_all", disk_full)
    argv = picture_commands(tmp_path, tiny_gguf("f32"), write_text(tmp_path, TEXT * 4))["ablate"]
    assert main(argv + ["--seq-len", "16", "--batch", "2", "--eval-batches", "1", "--n-layer", "1",
                        "--d-model", "16"]) == 1
    out = capsys.readouterr()
    assert "| relu" in out.out and (tmp_path / "abl" / "results.csv").exists()
    assert out.err.strip().splitlines()[-1].startswith("ffnlab ablate: error: --out") and "Traceback" not in out.err
