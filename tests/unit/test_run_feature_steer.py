"""`ffnlab run --features DIR --feature-steer L:LATENT:SCALE` (features/steer.py).

References: the clean forward (a steer of 0 is no steer: the same logits bit for bit and the same tokens), and the
traced target node itself (the steered ffn_out-L is the clean one plus SCALE x W_dec[LATENT], one float32 add;
nothing upstream of it moves)."""
import json

import numpy as np
import pytest

import ffnlab
import ffnlab.errors
from ffnlab.cli.main import main
from ffnlab.features import saelens_io
from ffnlab.features.dictionary import DictConfig, init_params
from ffnlab.features.steer import feature_steer_editor
from mlp_models import tiny_gguf

PROMPT = "First Citizen:\nBefore we"
LAYER, WIDTH = 1, 96


def dictionary_dir(path, d_model=64, n_vocab=None, layer=LAYER, seed=0):
    cfg = DictConfig("transcoder", "topk", d_model, WIDTH, d_model, k=4)
    site, site_out = f"ffn_norm-{layer}", f"ffn_out-{layer}"
    meta = saelens_io.cfg_dict(cfg, site, site_out, "tiny", {"site_in": site, "site_out": site_out, "n_vocab": n_vocab})
    path.mkdir(parents=True, exist_ok=True)
    p = init_params(cfg, np.random.default_rng(seed))
    saelens_io.save(str(path), p, cfg, meta)
    return str(path), p


@pytest.fixture(scope="module")
def model():
    return ffnlab.load(tiny_gguf("f32"), progress=False)


@pytest.fixture(scope="module")
def tc(model, tmp_path_factory):
    return dictionary_dir(tmp_path_factory.mktemp("tc") / "d", n_vocab=model.config.vocab_size)


def run_json(capsys, *flags):
    code = main(["run", "-m", tiny_gguf("f32"), "-p", PROMPT, "-n", "12", "--temp", "0", "--json", *flags])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_a_steer_of_zero_changes_no_logit_and_no_token(model, tc, capsys):
    d, _ = tc
    ids = np.array(model.tokenizer.encode(PROMPT))
    editor, record = feature_steer_editor(model, [d], [f"{LAYER}:7:0"])
    assert np.array_equal(model.forward(ids, hooks=editor), model.forward(ids))
    assert record == [{"kind": "feature-steer", "node": f"ffn_out-{LAYER}", "features": d, "latent": 7, "scale": 0.0}]
    plain = run_json(capsys)
    zero = run_json(capsys, "--features", d, "--feature-steer", f"{LAYER}:7:0")
    assert zero["ids"] == plain["ids"] and zero["interventions"] == record


def test_a_steer_adds_scale_times_the_decoder_row_to_ffn_out(model, tc, capsys):
    d, p = tc
    ids = np.array(model.tokenizer.encode(PROMPT))
    j, scale = 11, 6.0
    from ffnlab.tracing import Tracer
    names = [f"ffn_norm-{LAYER}", f"ffn_out-{LAYER}", f"ffn_out-{LAYER - 1}"]

    def run(extra):
        t = Tracer(filter="(" + "|".join(names) + ")$", keep=True)
        logits = model.forward(ids, hooks=[*extra, t])
        return {"logits": logits, **{n: t[n] for n in names}}
    clean = run([])
    editor, _ = feature_steer_editor(model, [d], [f"{LAYER}:{j}:{scale}"])
    steered = run([editor])
    vec = p["W_dec"][j] * np.float32(scale)                         # one float32 rounding, as the float64 product's
    assert np.array_equal(steered[f"ffn_out-{LAYER}"], clean[f"ffn_out-{LAYER}"] + vec)
    effect = steered[f"ffn_out-{LAYER}"].astype(np.float64) - clean[f"ffn_out-{LAYER}"]
    exact = scale * p["W_dec"][j].astype(np.float64)
    # two float32 roundings (the product, the add): each at most half an ulp of its result
    bound = np.finfo(np.float32).eps / 2 * (np.abs(exact) + np.abs(steered[f"ffn_out-{LAYER}"]))
    assert (np.abs(effect - exact) <= bound).all()
    for n in (f"ffn_norm-{LAYER}", f"ffn_out-{LAYER - 1}"):                  # upstream of the edit: untouched
        assert np.array_equal(steered[n], clean[n])
    assert not np.array_equal(steered["logits"], clean["logits"])
    big = run_json(capsys, "--features", d, "--feature-steer", f"{LAYER}:{j}:60")
    assert big["ids"] != run_json(capsys)["ids"]                              # a strong steer changes the text


def test_two_layers_steer_in_one_run(model, tmp_path):
    a, pa = dictionary_dir(tmp_path / "a", layer=0)
    b, pb = dictionary_dir(tmp_path / "b", layer=1, seed=1)
    editor, record = feature_steer_editor(model, [a, b], ["0:3:2", "1:5:-2", "1:6:1"])
    assert [(r["node"], r["features"]) for r in record] == [("ffn_out-0", a), ("ffn_out-1", b), ("ffn_out-1", b)]
    value = np.ones((4, 64), np.float32)
    assert np.array_equal(editor.edit("ffn_out-0", value, np.arange(4)), value + pa["W_dec"][3] * np.float32(2))
    assert np.array_equal(editor.edit("ffn_out-1", value, np.arange(4)),
                          value + pb["W_dec"][5] * np.float32(-2) + pb["W_dec"][6])
    with pytest.raises(ffnlab.errors.UsageError, match="both write block 1"):
        feature_steer_editor(model, [b, b], ["1:5:1"])


def one_line(capsys, *flags):
    code = main(["run", "-m", tiny_gguf("f32"), "-p", PROMPT, "-n", "2", *flags])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("spec,msg", [
    (f"{LAYER}:{WIDTH}:1", f"latent {WIDTH} is out of range"),
    ("9:1:1", "layer 9 is out of range"),
    ("0:1:1", "no --features directory writes block 0"),
    (f"{LAYER}:1", "expected L:LATENT:SCALE"),
    (f"{LAYER}:x:1", "must be integers"),
    (f"{LAYER}:1:big", "scale 'big' is not a number"),
    (f"{LAYER}:1:nan", "scale must be finite"),
])
def test_bad_specs_are_one_line(tc, capsys, spec, msg):
    assert msg in one_line(capsys, "--features", tc[0], "--feature-steer", spec)


@pytest.mark.parametrize("spoil,msg", [("vocab", "trained on another model"), ("d_model", "do not fit"),
                                       ("missing", "no cfg.json")])
def test_a_directory_that_does_not_fit_the_model_is_one_line(tmp_path, capsys, spoil, msg):
    d, _ = dictionary_dir(tmp_path / "d", d_model=48 if spoil == "d_model" else 64,
                          n_vocab=1000 if spoil == "vocab" else None)
    if spoil == "missing":
        d = str(tmp_path / "nowhere")
    assert msg in one_line(capsys, "--features", d, "--feature-steer", f"{LAYER}:1:1")


def test_the_flags_need_each_other(tc, capsys):
    assert "--feature-steer needs --features" in one_line(capsys, "--feature-steer", f"{LAYER}:1:1")
    assert "--features needs --feature-steer" in one_line(capsys, "--features", tc[0])
