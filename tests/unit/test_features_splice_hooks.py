"""ffnlab.features.splice_hooks: a dictionary directory spliced into the forward through ffnlab.hooks.

References: the clean forward (with the error term the logits are the same bit for bit), the dictionary's
equations (features/dictionary.py's docstring) written out here in float64 from the loaded weights, and
`features eval --json` run on the same model file and tokens (its CE spliced). On the 2-layer tiny Llama
of mlp_models.py (SwiGLU, d_model 64, the byte tokenizer)."""
import argparse

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.errors import UsageError
from ffnlab.features import saelens_io, splice_hooks
from ffnlab.features.dictionary import DictConfig, init_params
from ffnlab.features.evaluate import splice
from mlp_models import TEXT, tiny_gguf

D_MODEL, WIDTH, K, LAYER = 64, 96, 8, 1
U32 = np.finfo(np.float32).eps / 2                           # unit roundoff of float32, 2^-24
KINDS = [("transcoder", "topk", f"ffn_norm-{LAYER}", f"ffn_out-{LAYER}"),
         ("skip-transcoder", "relu", f"ffn_norm-{LAYER}", f"ffn_out-{LAYER}"),
         ("sae", "topk", "l_out-0", "l_out-0")]


def dictionary_dir(path, kind, act, site_in, site_out, d_in=D_MODEL, n_vocab=256, seed=0):
    """A dictionary with random biases (and skip) written as features train writes one -> its directory"""
    cfg = DictConfig(kind, act, d_in, WIDTH, d_in, k=K)
    rng = np.random.default_rng(seed)
    p = init_params(cfg, rng)
    p["b_enc"] = rng.normal(0, 0.2, WIDTH).astype(np.float32)
    p["b_dec"] = rng.normal(0, 0.2, d_in).astype(np.float32)
    if "W_skip" in p:
        p["W_skip"] = rng.normal(0, 0.05, p["W_skip"].shape).astype(np.float32)
    meta = saelens_io.cfg_dict(cfg, site_in, site_out, "tiny", {"site_in": site_in, "site_out": site_out,
                                                                  "n_vocab": n_vocab})
    path.mkdir(parents=True, exist_ok=True)
    saelens_io.save(str(path), p, cfg, meta)
    return str(path)


@pytest.fixture(scope="module")
def model():
    return ffnlab.load(tiny_gguf("f32"), progress=False)


@pytest.fixture(scope="module", params=KINDS, ids=[k[0] for k in KINDS])
def kind(request, tmp_path_factory):
    k, act, site_in, site_out = request.param
    return dictionary_dir(tmp_path_factory.mktemp(k) / "d", k, act, site_in, site_out), site_in, site_out


def ids(B=2, T=40, seed=5):
    return np.random.default_rng(seed).integers(0, 256, (B, T))


def traced(model, fns, nodes, x):
    """logits and the named nodes' values [B, T, d] of one forward with fns attached through ffnlab.hooks"""
    with ffnlab.hooks(model, fns), ffnlab.trace(model, filter="|".join(f"{n}$" for n in nodes)) as t:
        logits = model.forward(x)
    return logits, {n: t[n].reshape(*x.shape, -1) for n in nodes}


def test_with_the_error_term_the_logits_are_the_clean_ones_bit_for_bit(model, kind):
    d, _, _ = kind
    x = ids()
    clean = model.forward(x)
    with ffnlab.hooks(model, splice_hooks(model, d, error=True)):
        spliced = model.forward(x)
    assert np.array_equal(spliced, clean)
    with ffnlab.hooks(model, splice_hooks(model, d)):                      # without it the logits move
        assert not np.array_equal(model.forward(x), clean)


def reference(p, cfg, x):
    """The dictionary's equations in float64 on x [R, d_in] -> (out [R, d_out], |out - float32 out| bound [R, d_out],
    the float64 pre-activations' top-k margin over their float32 error [R] or None).

    Bound (Higham's gamma_n = n u / (1 - n u), u = 2^-24, for any float32 sum of n products, in any order, FMA
    or not: |fl(sum) - sum| <= gamma_n sum |terms|): the pre-activation, d_in products plus b_enc (and an SAE's
    x - b_dec, one more rounding), is off by dpre = gamma(d_in + 2) ((|x| + |b_dec|) @ |W_enc| + |b_enc|); relu
    (after the same top-k choice, which the margin asserts) passes it on at most 1:1, so the decode's input is
    off by dpre @ |W_dec|; the decode itself, b_dec plus at most d_sae products plus the skip's d_in and one add,
    by gamma(d_sae + d_in + 2) times the magnitude (|a| + dpre) @ |W_dec| + |b_dec| + |x| @ |W_skip.T|."""
    q = {n: a.astype(np.float64) for n, a in p.items()}
    x = x.astype(np.float64)
    sae_in = x - q["b_dec"] if cfg.kind == "sae" else x                                # [R, d_in]
    pre = sae_in @ q["W_enc"] + q["b_enc"]                                             # [R, d_in] -> [R, d_sae]
    keep = pre > 0
    margin = None
    dpre = (np.abs(x) + (np.abs(q["b_dec"]) if cfg.kind == "sae" else 0)) @ np.abs(q["W_enc"]) + np.abs(q["b_enc"])
    dpre *= gamma(cfg.d_in + 2)                                                        # [R, d_sae]
    if cfg.act == "topk":
        order = np.sort(pre, axis=1)[:, ::-1]
        keep &= pre >= order[:, cfg.k - 1:cfg.k]                                       # the k largest of each row
        margin = (order[:, cfg.k - 1] - order[:, cfg.k]) / (2 * dpre.max(1))
    a = np.where(keep, pre, 0.0)                                                       # [R, d_sae]
    out = a @ q["W_dec"] + q["b_dec"]                                                  # [R, d_sae] -> [R, d_out]
    mag = (np.abs(a) + dpre * keep) @ np.abs(q["W_dec"]) + np.abs(q["b_dec"])
    if cfg.kind == "skip-transcoder":
        out += x @ q["W_skip"].T                                                       # [R, d_in] -> [R, d_out]
        mag += np.abs(x) @ np.abs(q["W_skip"]).T
    bound = (dpre * keep) @ np.abs(q["W_dec"]) + gamma(cfg.d_sae + cfg.d_in + 2) * mag
    return out, bound, margin


def gamma(n):
    return n * U32 / (1 - n * U32)


@pytest.mark.parametrize("skip_first", [True, False])
def test_the_spliced_target_is_the_dictionarys_output_on_the_input_node(model, kind, skip_first):
    d, site_in, site_out = kind
    p, cfg, _ = saelens_io.load(d)
    x = ids()
    _, clean = traced(model, {}, [site_in, site_out], x)
    _, got = traced(model, splice_hooks(model, d, skip_first=skip_first), [site_in, site_out], x)
    if site_in != site_out:                                   # upstream of the target nothing moves
        assert np.array_equal(got[site_in], clean[site_in])
    first = 1 if skip_first else 0
    if skip_first:                                            # position 0 keeps the model's own value
        assert np.array_equal(got[site_out][:, 0], clean[site_out][:, 0])
    rows = clean[site_in][:, first:].reshape(-1, cfg.d_in)   # the input as the splice read it
    want, bound, margin = reference(p, cfg, rows)
    if margin is not None:                                    # the float32 top-k picks the float64 one
        assert margin.min() > 1, margin.min()
    err = np.abs(got[site_out][:, first:].reshape(-1, cfg.d_out).astype(np.float64) - want)
    assert (err <= bound).all(), float((err / bound).max())
    assert bound.max() < 1e-4 * (1 + np.abs(want).max())      # a bound that says something
    assert np.abs(want - clean[site_out][:, first:].reshape(want.shape)).max() > 1e-2   # a real replacement


def test_the_spliced_ce_is_what_features_eval_reports(model, tmp_path, capsys):
    import json

    from ffnlab.cli.features import _windows
    from ffnlab.evaluation.activations import batches
    from ffnlab.features.evaluate import log_softmax
    d = dictionary_dir(tmp_path / "tc", *KINDS[0][:2], *KINDS[0][2:])
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    flags = ["--ctx", "48", "--min-context", "4", "--windows", "3", "--tokens", "100000"]
    assert main(["features", "eval", d, "-m", tiny_gguf("f32"), "--data", str(data), "--json", *flags]) == 0
    m = json.loads(capsys.readouterr().out)
    cw, _ = _windows(argparse.Namespace(ctx=48, min_context=4, data=str(data)), model, TEXT)
    p, cfg, _ = saelens_io.load(d)
    ce = []
    for first, x in batches(cw.windows, 3):
        with ffnlab.hooks(model, splice_hooks(model, d)):
            logits = model.forward(x)                                              # [B, T, V]
        assert np.array_equal(logits, model.forward(x, hooks=splice(p, cfg, *KINDS[0][2:])))   # eval's forward
        _, scored = cw.positions(first, *x.shape)                                  # [B, T]
        for b, t in zip(*np.nonzero(scored[:, :-1])):                              # those with a next token
            ce.append(-log_softmax(logits[b, t])[x[b, t + 1]])
    assert m["tokens"] == int(sum(cw.positions(f, *w.shape)[1].sum() for f, w in batches(cw.windows, 3)))
    assert np.mean(ce) == pytest.approx(m["ce_spliced"], rel=1e-12)              # the order of the sum only


@pytest.mark.parametrize("spoil,words", [
    ("d_model", ["cfg.json: d_in 48 / d_out 48 do not fit"]),
    ("layer", ["cfg.json: ffnlab.site_in ffn_norm-5 is not a node", "layer 5 is out of range, 0..1"]),
])
def test_a_directory_that_does_not_fit_gives_features_evals_one_line(model, tmp_path, capsys, spoil, words):
    layer = 5 if spoil == "layer" else LAYER
    d = dictionary_dir(tmp_path / "d", "transcoder", "topk", f"ffn_norm-{layer}", f"ffn_out-{layer}",
                       d_in=48 if spoil == "d_model" else D_MODEL)
    with pytest.raises(UsageError) as e:
        splice_hooks(model, d)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and msg.startswith(f"{d}/cfg.json: ")
    for w in words:
        assert w in msg, msg
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    assert main(["features", "eval", d, "-m", tiny_gguf("f32"), "--data", str(data)]) == 1
    assert capsys.readouterr().err == f"ffnlab features: error: {msg}\n"             # the same line
