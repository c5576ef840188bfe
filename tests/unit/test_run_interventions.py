"""`ffnlab run --ablate / --scale / --steer` (interventions/flags.py).

Reference: ablating units of the MLP activation is zeroing those columns of ffn_down, so the
hooked generation must produce the tokens of a model whose weights were edited that way (and the
edit must be recorded in --json)."""
import json

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.generation import SamplingParams
from mlp_models import tiny_gguf

PROMPT = "First Citizen:\nBefore we"


def run_json(capsys, *flags):
    code = main(["run", "-m", tiny_gguf("f32"), "-p", PROMPT, "-n", "12", "--temp", "0", "--json", *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_ablate_is_zeroing_down_columns_and_is_recorded(capsys):
    plain = run_json(capsys)
    m = ffnlab.load(tiny_gguf("f32"), progress=False)
    # the units that write most into the stream at this prompt, so that zeroing them shows
    with ffnlab.trace(m, filter="ffn_swiglu-1$") as t:
        m.forward(np.array(m.tokenizer.encode(PROMPT)))
    units = [int(u) for u in np.argsort(-np.abs(t["ffn_swiglu-1"]).max(0))[:8]]
    got = run_json(capsys, "--ablate", "ffn_swiglu-1:" + ",".join(map(str, units)))
    assert got["interventions"] == [{"kind": "ablate", "node": "ffn_swiglu-1", "units": units}]
    down = m.params["blk.1.ffn_down.weight"].copy()
    down[:, units] = 0
    m.params["blk.1.ffn_down.weight"] = down
    want = m.generate(m.tokenizer.encode(PROMPT), 12, SamplingParams(temp=0)).ids
    assert got["ids"] == want
    assert got["ids"] != plain["ids"]


def test_scale_by_one_and_steer_by_zero_change_nothing(capsys, tmp_path):
    plain = run_json(capsys)
    np.save(tmp_path / "zero.npy", np.zeros(64, np.float32))
    got = run_json(capsys, "--scale", "ffn_swiglu-0:3:1", "--steer", f"l_out-0:{tmp_path / 'zero.npy'}")
    assert got["ids"] == plain["ids"]
    assert [i["kind"] for i in got["interventions"]] == ["scale", "steer"]


@pytest.mark.parametrize("flag,msg", [
    (["--ablate", "ffn_swiglu-9:1"], "no node named 'ffn_swiglu-9'"),
    (["--ablate", "ffn_swiglu-1:1,99999"], "unit 99999 is out of range"),
    (["--ablate", "ffn_swiglu-1"], "expected NODE:U1,U2"),
    (["--scale", "ffn_swiglu-1:2:big"], "factor 'big' is not a number"),
    (["--steer", "l_out-0:/no/such.npy"], "no such file"),
])
def test_bad_flags_are_one_line(capsys, flag, msg):
    code = main(["run", "-m", tiny_gguf("f32"), "-p", PROMPT, "-n", "2", *flag])
    err = capsys.readouterr().err
    assert code == 1 and msg in err and err.count("\n") == 1, err


def test_steer_vector_of_the_wrong_width_is_one_line(capsys, tmp_path):
    np.save(tmp_path / "v.npy", np.zeros(7, np.float32))
    code = main(["run", "-m", tiny_gguf("f32"), "-p", PROMPT, "-n", "2", "--steer", f"l_out-0:{tmp_path / 'v.npy'}"])
    err = capsys.readouterr().err
    assert code == 1 and "expected a float vector of the node's width (64,)" in err and err.count("\n") == 1, err
