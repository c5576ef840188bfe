"""`ffnlab shapes`: the MLP shape table, computed by running ffn_forward, checked against the configs."""
import json

import pytest

from ffnlab.analysis.ffn_shapes import ffn_config, ffn_shape_table
from ffnlab.cli.main import main


def shapes_json(capsys, *argv):
    assert main(["shapes", *argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    return out, {s["step"]: s for s in out["steps"]}


def test_gpt2_small_table(capsys):
    out, st = shapes_json(capsys, "--preset", "gpt2")
    D, F = 768, 3072
    assert out["flow"] == "[T,768] -> up [T,3072] -> gelu [T,3072] -> down [T,768]"
    assert st["up"]["weight"] == [F, D] and st["up"]["weight_params"] == D * F
    assert st["up"]["bias"] == [F] and st["up"]["bias_params"] == F
    assert st["gelu"]["shape"] == ["T", F] and st["gelu"]["op"] == "GELU"
    assert st["down"]["weight"] == [D, F] and st["down"]["bias"] == [D] and st["down"]["shape"] == ["T", D]
    assert out["params_per_layer"] == 2 * D * F + F + D == 4_722_432
    assert out["params_all_layers"] == 12 * 4_722_432


def test_llama2_7b_swiglu_table(capsys):
    out, st = shapes_json(capsys, "--preset", "llama")
    D, F = 4096, 11008
    assert out["flow"] == "[T,4096] -> gate [T,11008], up [T,11008] -> silu(gate)*up [T,11008] -> down [T,4096]"
    for step in ("gate", "up"):
        assert st[step]["weight"] == [F, D] and st[step]["bias"] is None and st[step]["params"] == D * F
    assert st["silu(gate)"]["shape"] == st["silu(gate)*up"]["shape"] == ["T", F]
    assert st["silu(gate)*up"]["node"] == "ffn_swiglu"
    assert st["down"]["weight"] == [D, F]
    assert out["params_per_layer"] == 3 * D * F


@pytest.mark.parametrize("preset,D,F,kind", [("smollm2", 576, 1536, "swiglu"), ("gemma3", 640, 2048, "geglu")])
def test_small_presets(capsys, preset, D, F, kind):
    out, st = shapes_json(capsys, "--preset", preset)
    assert out["config"]["ffn"] == kind and out["params_per_layer"] == 3 * D * F
    assert st["down"]["shape"] == ["T", D]


def test_custom_config_with_token_count(capsys):
    # odd sizes nobody would type into a table: the numbers must come from the forward
    out, st = shapes_json(capsys, "--d-model", "37", "--d-ff", "101", "--ffn", "geglu", "--bias", "-T", "5")
    assert out["flow"] == "[5,37] -> gate [5,101], up [5,101] -> gelu(gate)*up [5,101] -> down [5,37]"
    assert st["gate"]["node"] == "ffn_gate_b" and st["gate"]["bias"] == [101]
    assert out["params_per_layer"] == 3 * 37 * 101 + 2 * 101 + 37


def test_text_output(capsys):
    assert main(["shapes", "--preset", "gpt2"]) == 0
    text = capsys.readouterr().out
    assert "[T,768] -> up [T,3072] -> gelu [T,3072] -> down [T,768]" in text
    assert "2,359,296 + 3,072" in text and "4,722,432" in text


def test_table_reads_the_forward_arrays(monkeypatch):
    # a forward that emitted a different shape would change the table: it is read, not typed
    import ffnlab.analysis.ffn_shapes as fs
    real = fs.ffn_forward

    def widened(x, w, kind, hook):
        def narrowed(name, a, op=None, srcs=None, bare=False):       # the table's hook sees a narrower ffn_gelu
            hook(name, a[..., :1] if name == "ffn_gelu" else a, op, srcs, bare)
            return a
        return real(x, w, kind, narrowed)
    monkeypatch.setattr(fs, "ffn_forward", widened)
    steps, flow = ffn_shape_table(ffn_config(8, 16, "gelu"))
    assert "gelu [T,1]" in flow


@pytest.mark.parametrize("argv,msg", [([], "--preset NAME"), (["--d-model", "8"], "--preset NAME"),
                                      (["--d-model", "8", "--d-ff", "16", "--ffn", "tanh"], "--ffn must be one of"),
                                      (["--preset", "gpt2", "-T", "0"], "-T must be > 0"),
                                      (["--preset", "no-such-model"], "no-such-model")])
def test_bad_input_is_one_line(capsys, argv, msg):
    assert main(["shapes", *argv]) == 1
    err = capsys.readouterr().err
    assert msg in err and err.count("\n") == 1 and "Traceback" not in err
