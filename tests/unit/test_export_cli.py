"""`ffnlab export` and the ablation's outputs as a user meets them: file modes like the other
files, paths printed as given (no '//'), no silent overwrite, a --to hf hint only where --to hf
works; plots whose y range holds every final validation point and whose log-axis labels do not
run into each other; no '± 0.0000' for a single seed."""
import os
import stat

import pytest

from export_helpers import LLAMA, config, make_checkpoint
from ffnlab.cli.main import main
from ffnlab.errors import UsageError


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("export") / "ckpt"
    make_checkpoint(d, config(LLAMA))
    return str(d)


def test_hf_export_files_share_one_mode_and_the_path_prints_once(ckpt, tmp_path, capsys):
    out = str(tmp_path / "hf") + "/"
    assert main(["export", ckpt, "--to", "hf", out]) == 0
    printed = capsys.readouterr().out
    assert "//" not in printed and f"wrote {tmp_path / 'hf'}/ " in printed
    umask = os.umask(0)
    os.umask(umask)
    modes = {f: stat.S_IMODE(os.stat(tmp_path / "hf" / f).st_mode) for f in os.listdir(tmp_path / "hf")}
    assert set(modes.values()) == {0o666 & ~umask}, modes


@pytest.mark.parametrize("to,name", [("gguf", "m.gguf"), ("hf", "hf")])
def test_existing_output_is_refused_without_force(ckpt, tmp_path, capsys, to, name):
    out = str(tmp_path / name)
    assert main(["export", ckpt, "--to", to, out]) == 0
    before = os.stat(out).st_mtime_ns
    assert main(["export", ckpt, "--to", to, out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ffnlab export: error: {out} already exists; add --force to overwrite it or choose another output"]
    assert os.stat(out).st_mtime_ns == before
    assert main(["export", ckpt, "--to", to, out, "--force"]) == 0


def test_gguf_refusal_suggests_hf_only_when_hf_holds_the_model():
    from ffnlab.formats.export_gguf import gguf_arch
    with pytest.raises(UsageError) as geglu:                    # HF's Llama has gelu_pytorch_tanh
        gguf_arch(config(LLAMA, ffn="geglu"))
    assert str(geglu.value).endswith("-- use --to hf")
    with pytest.raises(UsageError) as relu:                     # the ablation's RMSNorm + RoPE + ReLU block
        gguf_arch(config(LLAMA, ffn="relu"))
    assert "--to hf cannot either" in str(relu.value) and "use --to hf" not in str(relu.value)


def test_loss_curve_range_holds_the_final_validation_points():
    from ffnlab.training.plots import curve_ylim
    lo, hi = curve_ylim([4.3, 4.35], [3.9, 3.95])               # a short run: val already below train
    assert lo <= 3.9 - 0.1 and hi >= 4.3 + 1.0
    lo, hi = curve_ylim([2.0], [3.6])                            # val far above: the axis widens to show it
    assert hi >= 3.6 + 0.1 and lo <= 1.9


@pytest.mark.parametrize("values", [[9.2e4, 1.55e5], [1e5, 4.2e6], [2.3e3, 3.1e3]])
def test_log_axis_tick_labels_do_not_overlap(values):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ffnlab.training.plots import _log_ticks
    fig, ax = plt.subplots(figsize=(6.4, 4.4), dpi=120)
    ax.plot(values, [1] * len(values), "o")
    ax.set_xscale("log")
    _log_ticks(ax, values)
    fig.canvas.draw()
    lo, hi = ax.get_xlim()
    labels = [t for t in ax.get_xticklabels(which="both") if t.get_text() and lo <= t.get_position()[0] <= hi]
    boxes = sorted((t.get_window_extent() for t in labels), key=lambda b: b.x0)
    assert len(boxes) >= 1
    assert all(a.x1 < b.x0 for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in labels]
    plt.close(fig)


def test_markdown_table_has_no_spread_for_one_seed():
    from ffnlab.training.ablate import markdown_table
    row = dict(variant="gelu-x1", d_ff=32, params_nonembed=6240, flops_per_token=9e4, train_loss_mean=4.1471,
               train_loss_std=0.0, val_loss_mean=3.9423, val_loss_std=0.0, tokens_per_s=1000.0, diverged=0, seeds=1)
    line = markdown_table([row]).splitlines()[-1]
    assert "±" not in line and "| 4.1471 | 3.9423 |" in line
    two = markdown_table([dict(row, seeds=2, train_loss_std=0.01, val_loss_std=0.02)]).splitlines()[-1]
    assert "4.1471 ± 0.0100" in two and "3.9423 ± 0.0200" in two
