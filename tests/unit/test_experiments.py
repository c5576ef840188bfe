"""The experiment suite (experiments/, src/ffnlab/experiments/): its config files, its statistics
against scipy.stats and closed forms, a --quick grid that resumes and repeats bit for bit, plots
drawn from stored results only, MLP dropout's gradient against finite differences, and the
finetune grid against each fine-tune run alone."""
import itertools
import json
import math
import os
import shutil

import numpy as np
import pytest
from scipy import stats as sps

from ffnlab.cli.main import main
from ffnlab.errors import UsageError
from ffnlab.experiments import config, stats

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "docs", "data", "calib.txt")


# --- config files ------------------------------------------------------------------------------
CONFIGS = sorted(f[:-len(".toml")] for f in os.listdir(os.path.join(ROOT, "experiments")) if f.endswith(".toml"))


def test_each_claim_has_its_experiment():
    assert {"width", "compression", "activation", "dropout", "bias", "gating", "lora"} <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_claim_has_a_config_that_loads(name):
    exp = config.load(name, data=CORPUS)
    assert exp.claim and exp.seeds >= 5 and exp.kind in config.KINDS
    quick = config.load(name, quick=True, data=CORPUS)
    assert _steps(quick) < _steps(exp) and quick.seeds < exp.seeds


def _steps(exp):
    """the steps of the runs an experiment trains: its variants', or (a pretrained model's) its fine-tunes'"""
    if exp.variants:
        return exp.settings.steps
    if exp.kind == "lora":
        return exp.lora["settings"]["steps"]
    return exp.compression["smollm2"]["recovery"]["settings"]["steps"]


def _toml(tmp_path, text):
    p = tmp_path / "bad.toml"
    p.write_text(f'[experiment]\nclaim = "c"\ndata = "{CORPUS}"\n' + text)
    return str(p)


@pytest.mark.parametrize("text, field", [
    ('[train]\nsteps = -3\n[[variant]]\nname = "a"\nffn = "gelu"\nmult = 4\n', "train: --steps"),
    ('[[variant]]\nname = "a"\nffn = "gelu"\nmult = "four"\n', "variant 'a': mult: expected a number"),
    ('[[variant]]\nname = "a"\nffn = "swish"\nmult = 4\n', "variant 'a': ffn must be one of"),
    ('[train]\nstepz = 3\n[[variant]]\nname = "a"\nffn = "gelu"\nmult = 4\n', "train.stepz: unknown field"),
    ('[[variant]]\nname = "a"\nffn = "gelu"\nmult = 4\nmlp_dropout = 1.5\n', "variant 'a': mlp_dropout"),
    ('[[variant]]\nname = "a"\nffn = "gelu"\n', "variant 'a': mult: missing"),
    ('[experiment.x]\n', "experiment.x: unknown field"),
    ('kind = "compression"\n[compression]\nkeeps = [0.5]\n', "compression.smollm2: expected a table"),
    ('kind = "lora"\n[[variant]]\nname = "a"\nffn = "gelu"\nmult = 4\n[lora]\nbase = "a"\nmodel = "smollm2"\n'
     f'data = "{CORPUS}"\ntargets = ["q,v"]\n', "lora.model: expected either base"),
    ('kind = "lora"\n[lora]\nmodel = "smollm2"\ndata = "x.txt"\ntargets = ["q,v"]\n', "lora.data: expected an existing"),
    ('kind = "lora"\n[lora]\nmodel = "smollm2"\ndata_chars = -1\n'
     f'data = "{CORPUS}"\ntargets = ["q,v"]\n', "lora.data_chars: expected 0"),
    ('kind = "compression"\n[compression.smollm2]\ncalib = "' + CORPUS + '"\neval = "' + CORPUS + '"\n'
     '[compression.smollm2.recovery]\ndata = "' + CORPUS + '"\nmethods = ["magnitude"]\n',
     "compression.smollm2.recovery.methods: expected a list of activation, naive"),
    ('kind = "compression"\n[compression.smollm2]\ncalib = "' + CORPUS + '"\neval = "' + CORPUS + '"\n'
     '[compression.smollm2.recovery]\ndata = "' + CORPUS + '"\nsettings = { stepz = 3 }\n',
     "compression.smollm2.recovery.settings.stepz: unknown field"),
])
def test_a_bad_config_is_one_line_naming_the_file_and_the_field(tmp_path, text, field):
    path = _toml(tmp_path, text)
    with pytest.raises(UsageError) as e:
        config.load(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(path) and field in msg, msg


def test_the_command_reports_a_bad_config_in_one_line(tmp_path, capsys):
    path = _toml(tmp_path, '[experiment.x]\n')
    assert main(["experiment", path, "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and path in err


# --- statistics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [2, 3, 5, 8, 13])
def test_t_interval_is_scipys(n):
    x = np.random.default_rng(n).normal(2.0, 0.3, n)
    m, lo, hi = stats.t_interval(x)
    want = sps.t.interval(0.95, n - 1, loc=np.mean(x), scale=sps.sem(x))
    assert m == np.mean(x) and (lo, hi) == pytest.approx(want, rel=0, abs=1e-15)


def test_t_quantiles_match_closed_forms():
    # df 1 is the Cauchy law: t_p = tan(pi (p - 1/2)); df 2: t_p = (2p - 1) / sqrt(2 p (1 - p))
    assert stats.t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-13)
    assert stats.t_quantile(0.975, 2) == pytest.approx(0.95 / math.sqrt(2 * 0.975 * 0.025), rel=1e-13)
    # three values 1, 2, 3: mean 2, s = 1, half-width t(0.975, 2) / sqrt(3) = 4.302652.. / sqrt(3)
    m, lo, hi = stats.t_interval([1.0, 2.0, 3.0])
    h = 0.95 / math.sqrt(2 * 0.975 * 0.025) / math.sqrt(3)
    assert (m, lo, hi) == pytest.approx((2.0, 2.0 - h, 2.0 + h), rel=1e-13)


def test_exact_bootstrap_enumerates_every_resample():
    x = [0.3, -0.1, 0.7, 0.2, 0.05]
    means = sorted(sum(x[i] for i in idx) / 5 for idx in itertools.product(range(5), repeat=5))   # 3125
    assert sorted(stats.bootstrap_means(x)) == pytest.approx(means, abs=1e-15)
    lo, hi = stats.bootstrap_interval(x)
    assert (lo, hi) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])), abs=1e-15)


def test_monte_carlo_bootstrap_agrees_with_scipys_percentile_bootstrap():
    x = np.random.default_rng(3).normal(0.0, 1.0, 9)                       # 9^9 resamples: drawn, not enumerated
    lo, hi = stats.bootstrap_interval(x)
    ref = sps.bootstrap((x,), np.mean, method="percentile", n_resamples=20000, random_state=1).confidence_interval
    # two Monte Carlo estimates of the same quantiles: their sampling error is ~0.01 s of the mean's sd
    assert abs(lo - ref.low) < 0.05 and abs(hi - ref.high) < 0.05


def test_paired_is_the_t_interval_of_the_differences_by_seed():
    a = {0: 2.10, 1: 2.00, 2: 2.30, 3: 2.05, 4: 2.20}
    b = {0: 2.00, 1: 1.95, 2: 2.10, 3: 2.01, 4: 2.16, 5: 1.0}             # seed 5 has no partner: left out
    p = stats.paired(a, b)
    d = [a[s] - b[s] for s in range(5)]
    ref = sps.ttest_rel([a[s] for s in range(5)], [b[s] for s in range(5)]).confidence_interval(0.95)
    assert p["n"] == 5 and p["mean"] == pytest.approx(np.mean(d), abs=1e-15)
    assert (p["lo"], p["hi"]) == pytest.approx((ref.low, ref.high), abs=1e-14)
    assert p["excludes_zero"] == (ref.low > 0 or ref.high < 0)


@pytest.mark.parametrize("a,b", [([0.92, 0.91, 0.93], [0.94, 0.935, 0.9375, 0.93]),
                                 ([1.0, 1.2, 0.9, 1.4, 1.1], [1.05, 1.06])])
def test_unpaired_is_welchs_interval(a, b):
    u = stats.unpaired(a + [float("nan")], b)                                 # a nan run is left out
    ref = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert u["n"] == (len(a), len(b)) and u["mean"] == pytest.approx(np.mean(a) - np.mean(b), abs=1e-15)
    assert (u["lo"], u["hi"]) == pytest.approx((ref.low, ref.high), abs=1e-12)
    assert math.isnan(stats.unpaired([1.0], b)["lo"])


def test_oscillation_measures_the_jumps_around_the_trend():
    t = np.arange(300, dtype=np.float64)
    smooth = 3.0 * np.exp(-t / 100) + 1.0
    assert stats.oscillation(smooth, 25)["spikes"] == 0
    # a trend plus +-0.1 alternating: the residual of a step against the mean of the 25 before
    # (12 of one sign, 13 of the other) is 0.1 + 0.1/25 or -(0.1 - 0.1/25) plus the trend's part
    flat = np.full(300, 2.0) + 0.1 * (-1.0) ** t
    o = stats.oscillation(flat, 25)
    r = flat[25:] - np.convolve(flat, np.ones(25) / 25, "valid")[:-1]
    assert o["spread"] == pytest.approx(np.sqrt(np.mean(r ** 2)), rel=1e-12)
    assert o["spread"] == pytest.approx(0.1, abs=0.005)
    spiky = smooth.copy()
    spiky[[100, 150, 220]] *= 1.2                                         # three 20% jumps
    assert stats.oscillation(spiky, 25)["spikes"] == 3


def test_band_is_the_t_interval_at_every_step():
    c = np.random.default_rng(0).normal(size=(5, 7))
    m, lo, hi = stats.band(c)
    for j in range(7):
        assert (m[j], lo[j], hi[j]) == pytest.approx(stats.t_interval(c[:, j]), abs=1e-14)


# --- a --quick grid: resumable, deterministic, plotted from stored results ---------------------
def _quick(tmp_path, name, sub):
    out = tmp_path / sub / "runs" / name
    assert main(["experiment", name, "--quick", "--data", CORPUS, "--out", str(out), "--json"]) == 0
    with open(out / "results" / "results.json") as f:
        return out, json.load(f)


def _losses(res):
    return [(r["variant"], r["seed"], r["train"], r["eval"]) for r in res["runs"]]


def _numbers(unit):
    """A unit's result without its timings: the losses, evaluations and weights."""
    with open(unit / "result.json") as f:
        r = {k: v for k, v in json.load(f).items() if k not in ("tokens_per_s", "train_seconds", "seconds")}
    return r, {n: (unit / n).read_bytes() for n in sorted(os.listdir(unit)) if n.endswith(".npy")}


def test_a_quick_grid_resumes_and_repeats_bit_for_bit(tmp_path, capsys):
    out, first = _quick(tmp_path, "activation", "a")
    assert first["compute"]["runs"] == 4 and len(first["comparisons"]) == 1
    unit = out / "train" / "units" / "train-relu-x4-s01"
    before = _numbers(unit)
    shutil.rmtree(unit)                                                   # as if killed before this run finished
    shutil.rmtree(out.parent / "shared")
    _, again = _quick(tmp_path, "activation", "a")
    assert _numbers(unit) == before                                       # recomputed: the same bits
    assert _losses(again) == _losses(first)
    _, fresh = _quick(tmp_path, "activation", "b")                        # another folder, nothing to reuse
    assert _losses(fresh) == _losses(first)


def test_runs_of_one_experiment_are_reused_by_another(tmp_path, capsys):
    _quick(tmp_path, "activation", "a")
    out, res = _quick(tmp_path, "dropout", "a")                           # gelu-x4 is in both
    capsys.readouterr()
    assert res["compute"]["runs"] == 4
    assert sorted(os.listdir(out.parent / "shared")) and len(os.listdir(out.parent / "shared")) == 6


def test_another_configuration_in_the_same_folder_is_refused(tmp_path, capsys):
    out, _ = _quick(tmp_path, "activation", "a")
    code = main(["experiment", "activation", "--quick", "--seeds", "3", "--data", CORPUS, "--out", str(out)])
    assert code == 1 and "other arguments" in capsys.readouterr().err


def test_plot_draws_from_the_stored_results_only(tmp_path, capsys):
    out, res = _quick(tmp_path, "activation", "a")
    shutil.rmtree(out / "train")                                          # no runs left: only results.json
    docs = tmp_path / "docs"
    assert main(["experiment", "activation", "--quick", "--out", str(out), "--plot", "--docs", str(docs)]) == 0
    pngs = sorted(os.listdir(docs))
    assert pngs == ["experiments_activation-quick_curves.png", "experiments_activation-quick_diffs.png"]
    for p in pngs:
        assert (docs / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["experiment", "activation", "--plot", "--results", str(tmp_path / "none")]) == 1


def test_claim_runs_every_experiment_of_that_claim(tmp_path, capsys):
    """--claim: the experiments whose experiment.claim is NAME's, each as if named alone (here --plot, from the
    stored results: each one's own PNGs, the same bytes as `experiment N --plot`)"""
    from ffnlab.experiments import config as cfgmod
    claim = cfgmod.load("width", check_data=False).claim
    expected = [n for n in cfgmod.names() if cfgmod.load(n, check_data=False).claim == claim]
    assert "width" in expected and len(expected) >= 2 and "activation" not in expected
    together, alone = tmp_path / "together", tmp_path / "alone"
    assert main(["experiment", "width", "--claim", "--plot", "--docs", str(together)]) == 0
    assert f"experiments: {', '.join(expected)}" in capsys.readouterr().out
    for n in expected:
        assert main(["experiment", n, "--plot", "--docs", str(alone)]) == 0
    assert sorted(os.listdir(together)) == sorted(os.listdir(alone))
    for p in os.listdir(alone):
        assert (together / p).read_bytes() == (alone / p).read_bytes()
    capsys.readouterr()
    assert main(["experiment", "width", "--claim", "--out", str(tmp_path / "o")]) == 1
    assert "--claim" in capsys.readouterr().err
    assert main(["experiment", str(tmp_path / "x.toml"), "--claim"]) == 1
    assert "--claim takes the name" in capsys.readouterr().err


# --- dropout inside the MLP ----------------------------------------------------------------------
def test_mlp_dropout_gradient_matches_finite_differences():
    from ffnlab.training.mlp_dropout import DroppedInput
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 6))                                           # float64 [out, in]
    x = rng.normal(size=(5, 6))
    dy = rng.normal(size=(5, 3))
    d = DroppedInput(w, 0.3, seed=1, layer=0)
    d.training, d.step = True, 7
    y = d.forward(x)
    dx, dw = d.backward(dy, x)
    mask = d.mask
    assert set(np.unique(mask)) <= {0.0, 1 / 0.7} and (mask == 0).any()
    # float64, |x|, |w| ~ 1, 6 terms: any summation order is within 6 * 2.2e-16 * 6 of another
    assert np.allclose(y, (x * mask) @ w.T, rtol=1e-14)
    eps = 1e-6

    def loss(xx, ww):
        return float(np.sum(((xx * mask) @ ww.T) * dy))
    num_dx = np.array([(loss(x + eps * e, w) - loss(x - eps * e, w)) / (2 * eps)
                       for e in np.eye(x.size).reshape(-1, *x.shape)]).reshape(x.shape)
    num_dw = np.array([(loss(x, w + eps * e) - loss(x, w - eps * e)) / (2 * eps)
                       for e in np.eye(w.size).reshape(-1, *w.shape)]).reshape(w.shape)
    # the loss is linear in x and in w: central differences have no truncation error, only rounding,
    # ~2.2e-16 * |loss| (< 50) / eps = 1e-8 at most
    assert np.allclose(dx, num_dx, atol=1e-8) and np.allclose(dw, num_dw, atol=1e-8)
    d.training = False                                                    # evaluation: the plain product
    assert np.array_equal(d.forward(x), x @ w.T)


def test_mlp_dropout_masks_depend_on_seed_step_and_layer_only():
    from ffnlab.training.mlp_dropout import DroppedInput
    x = np.ones((4, 8), np.float32)
    w = np.eye(8, dtype=np.float32)

    def masked(seed, step, layer):
        d = DroppedInput(w, 0.5, seed, layer)
        d.training, d.step = True, step
        return d.forward(x)
    assert np.array_equal(masked(0, 3, 1), masked(0, 3, 1))
    assert not np.array_equal(masked(0, 3, 1), masked(0, 4, 1))
    assert not np.array_equal(masked(0, 3, 1), masked(0, 3, 0))


# --- the finetune grid ---------------------------------------------------------------------------
def test_the_finetune_grid_table_equals_each_finetune_run_alone(tmp_path):
    from dataclasses import asdict

    from ffnlab.config import ModelConfig
    from ffnlab.formats.load import load
    from ffnlab.model.params import init_params
    from ffnlab.runtime.executor import ModelSpec, OutputDir
    from ffnlab.training.finetune_grid import grid_units, run_grid, table
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import TokenData, data_info, make_tokenizer, read_text
    from ffnlab.training.finetune import FinetuneSettings, finetune

    cfg = ModelConfig(n_layer=1, d_model=16, n_head=2, d_ff=32, ffn="gelu", vocab_size=256, n_ctx=32, tie_embeddings=False)
    tok, meta = make_tokenizer("byte", "")
    base = str(tmp_path / "base")
    save_model(base, cfg, init_params(cfg, seed=0), tok, meta)
    settings = asdict(FinetuneSettings(steps=4, batch=2, seq_len=16, warmup=1, eval_every=2, eval_batches=1, ckpt_every=0))
    units = grid_units(["q,v", "up,down"], [1, 2], 2, [0])
    out = OutputDir(str(tmp_path / "grid"), "finetune-grid", {"t": 1}, [u.id for u in units])
    rows, outcome = run_grid(ModelSpec(base), CORPUS, settings, units, out=out)
    assert outcome.failures == [] and len(rows) == 8
    model = load(base, progress=False)
    text = read_text(CORPUS)
    ids = model.tokenizer.encode(text, add_bos=False)
    for u, row in zip(units, rows):
        s = FinetuneSettings.from_dict({**settings, "targets": u.payload["targets"], "r": u.payload["r"],
                                        "seed": u.payload["seed"]})
        data = TokenData.from_ids(ids, s.seq_len, s.val_frac, path=CORPUS)
        alone = finetune(model, s, data, str(tmp_path / u.id), data_info=data_info(CORPUS, text, len(ids)), progress=False)
        assert row["eval"] == alone["history"]["eval"] and row["final"] == alone["final"], u.id
    again, outcome = run_grid(ModelSpec(base), CORPUS, settings, units, out=out)      # resumed: nothing recomputed
    assert outcome.resumed == 8 and table(again) == table(rows)


def test_finetune_grid_flags_run_a_grid(tmp_path, capsys):
    from ffnlab.config import ModelConfig
    from ffnlab.model.params import init_params
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import make_tokenizer
    cfg = ModelConfig(n_layer=1, d_model=16, n_head=2, d_ff=32, ffn="gelu", vocab_size=256, n_ctx=32, tie_embeddings=False)
    tok, meta = make_tokenizer("byte", "")
    save_model(str(tmp_path / "base"), cfg, init_params(cfg, seed=0), tok, meta)
    args = ["finetune", "-m", str(tmp_path / "base"), "--data", CORPUS, "--out", str(tmp_path / "g"), "--grid-targets",
            "q,v;up,down", "--grid-ranks", "1", "--seeds", "2", "--steps", "2", "--batch", "2", "--seq-len", "16",
            "--warmup", "1", "--eval-every", "2", "--eval-batches", "1", "--quiet", "-t", "1"]
    assert main(args) == 0
    table = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| q,v") or ln.startswith("| up,down")]
    assert len(table) == 4
    bad = list(args)
    bad[bad.index("--grid-ranks") + 1] = "0"
    bad[bad.index("--out") + 1] = str(tmp_path / "bad")
    assert main(bad) == 1 and "--grid-ranks" in capsys.readouterr().err


# --- a pretrained model cut and recovered (compression.smollm2 with recovery) --------------------------
def test_a_gguf_cut_and_recovered_with_lora_resumes_and_its_figures_agree(tmp_path, capsys):
    from ffnlab.evaluation.perplexity import perplexity, text_chunks
    from ffnlab.formats.load import load
    from ffnlab.training.data import read_text
    from reference.models import tiny_gguf
    gguf_path = str(tmp_path / "tiny.gguf")
    tiny_gguf(gguf_path)
    toml = tmp_path / "smol.toml"
    toml.write_text(f'[experiment]\nclaim = "c"\nkind = "compression"\ndata = "{CORPUS}"\nseeds = 5\n'
                    f'[compression.smollm2]\nmodel = "{gguf_path}"\ncalib = "{CORPUS}"\neval = "{CORPUS}"\nctx = 32\n'
                    f'calib_chunks = 4\neval_chunks = 4\nkeeps = [0.5]\n'
                    f'[compression.smollm2.recovery]\ndata = "{CORPUS}"\ndata_chars = 6000\nr = 2\nseeds = 2\n'
                    'settings = { steps = 3, batch = 2, seq_len = 16, lr = 1e-2, warmup = 1, eval_every = 3, '
                    'eval_batches = 1, ckpt_every = 0 }\n')
    out = str(tmp_path / "runs")
    assert main(["experiment", str(toml), "--out", out, "-t", "1"]) == 0
    res = json.load(open(os.path.join(out, "results", "results.json")))
    sm = res["smollm2"]
    cells = {(c["method"], c["keep"]): c for c in sm["recovery"]["cells"]}
    assert set(cells) == {("uncut", 1.0), ("activation", 0.5), ("naive", 0.5)}
    model = load(gguf_path, progress=False)
    base = perplexity(model, text_chunks(model, read_text(CORPUS), 32, 4), 4)
    assert cells[("uncut", 1.0)]["ppl_cut"] == base.ppl == sm["ppl_base"]          # the uncut model, no adapter
    for cut in sm["cuts"]:                        # the cut before recovery: the no-recovery table's figure
        assert cells[(cut["method"], cut["keep"])]["ppl_cut"] == cut["ppl"]
        assert cells[(cut["method"], cut["keep"])]["d_ff_after"] == cut["d_ff_after"] == 32
    control = {r["seed"]: r for r in cells[("uncut", 1.0)]["runs"]}
    for c in cells.values():
        assert c["seeds"] == 2
        for r in c["runs"]:
            # ppl is exp of the same float64 mean (perplexity's): exp's own rounding apart, the same number
            assert math.isclose(r["ppl"], math.exp(r["mean_nll"]), rel_tol=1e-9)
            assert r["finetune_val_loss"] < r["finetune_val_loss_before"]          # lr 1e-2: the adapters learn
            assert r["tokens"] == 3 * 2 * 16
        if c["method"] != "uncut":
            want = [math.exp(r["mean_nll"] - control[r["seed"]]["mean_nll"]) for r in c["runs"]]
            # two float64 means of the same few numbers: they differ by the summation order's ulps at most
            assert math.isclose(c["ratio_to_control"]["mean"], float(np.mean(want)), rel_tol=1e-12)
    again = str(tmp_path / "again.json")
    assert main(["experiment", str(toml), "--out", out, "-t", "1", "--results", again]) == 0
    log = capsys.readouterr().out
    assert "6 units, 6 found" in log and "1 units, 1 found" in log                  # resumed: nothing recomputed
    assert json.load(open(os.path.join(again, "results.json")))["smollm2"] == sm
