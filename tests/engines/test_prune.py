"""`ffnlab prune`: structured MLP-unit pruning and the pruned GGUF.

References: a PyTorch forward (tests/reference/torch_reference.py) of the *unpruned* model with the dropped
units' ffn_down columns zeroed (removing a unit must be exactly that), activations recorded in
PyTorch at ffn_down's input, gguf's own quantizer, the source file's bytes, and llama.cpp
(llama-cpp-python) running the written file.
"""
import json

import numpy as np
import pytest
import torch

import ffnlab
import torch_reference as ref
from ffnlab.cli.main import main
from ffnlab.evaluation.activations import context_windows
from ffnlab.formats.gguf_meta import open_gguf
from ffnlab.pruning.gguf_rewrite import write_pruned_gguf
from ffnlab.pruning.prune import (activation_scores, alignment, kept_width, prune_params, select_units,
                                  weight_scores)
from mlp_models import TEXT, smollm2, tiny_gguf, write_text

pytestmark = pytest.mark.slow

PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak."


def masked(params, cfg, keep_idx):
    """The full-width model with every dropped unit's ffn_down column zeroed."""
    out = dict(params)
    for il, idx in enumerate(keep_idx):
        name = f"blk.{il}.ffn_down.weight"
        m = np.zeros(cfg.d_ff, dtype=bool)
        m[idx] = True
        out[name] = np.where(m, out[name], 0).astype(np.float32)
    return out


def fields(path):
    r = open_gguf(path)
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


def test_kept_width_rounds_to_whole_quant_blocks():
    assert [kept_width(1536, k) for k in (1.0, 0.9, 0.75, 0.5, 0.01)] == [1536, 1376, 1152, 768, 32]
    assert kept_width(2048, 0.75) == 1536 and kept_width(96, 0.5) == 64
    assert alignment(1152) == {32: True, 64: True, 128: True, 256: False}
    assert alignment(1376) == {32: True, 64: False, 128: False, 256: False}


def test_weight_scores_are_products_of_row_and_column_norms():
    m = ffnlab.load(tiny_gguf("f32"))
    tp = ref.params_to_torch(m.params, requires_grad=False)
    s = weight_scores(m.params, m.config)
    for il in range(m.config.n_layer):
        b = f"blk.{il}."
        want = (torch.linalg.vector_norm(tp[b + "ffn_up.weight"], dim=1) * torch.linalg.vector_norm(tp[b + "ffn_gate.weight"], dim=1)
                * torch.linalg.vector_norm(tp[b + "ffn_down.weight"], dim=0))
        # three float32 norms of at most max(d_model, d_ff) squares each, summed in another order by
        # torch: each relatively within (n/2 + 1) eps, the product within three times that
        n = max(m.config.d_model, m.config.d_ff)
        np.testing.assert_allclose(s[il], want.numpy(), rtol=3 * (n / 2 + 1) * np.finfo(np.float32).eps)
    keep = select_units(s, 32)
    assert np.all(np.diff(keep, axis=1) > 0)                          # kept in their original order
    for il in range(m.config.n_layer):                                # and exactly the 32 best
        assert set(keep[il]) == set(np.argsort(-s[il])[:32])


@pytest.mark.parametrize("kind", ["f32", "bos"])
def test_activation_scores_equal_mean_abs_of_ffn_down_input_in_torch(kind, monkeypatch):
    m = ffnlab.load(tiny_gguf(kind))
    tok = m.tokenizer
    bos = tok.bos_id if tok.add_bos else None
    cw = context_windows(tok.encode(TEXT, add_bos=False), 128, 16, bos)   # overlapping by 16 tokens
    windows = cw.windows
    assert len(windows) >= 6
    got, n = activation_scores(m, cw, batch=2)
    tp = ref.params_to_torch(m.params, requires_grad=False)
    downs = {id(tp[f"blk.{il}.ffn_down.weight"]): il for il in range(m.config.n_layer)}
    sums = np.zeros_like(got)
    linear = torch.nn.functional.linear

    scored_from = [0]

    def recording_linear(x, w, b=None):                               # ffn_down's input is the activation node
        if id(w) in downs:                                            # only the window's scored positions count
            sums[downs[id(w)]] += x[:, scored_from[0]:].abs().sum(dim=(0, 1)).numpy()
        return linear(x, w, b)

    monkeypatch.setattr(ref.F, "linear", recording_linear)
    for w, f in zip(windows, cw.scored_from):
        scored_from[0] = f
        ref.forward(tp, m.config, w[None])
    n_text = len(tok.encode(TEXT, add_bos=False)) - 16                  # every text token past the first 16, once
    assert n == n_text
    np.testing.assert_allclose(got, sums / n_text, rtol=1e-4)


def test_pruned_gguf_is_the_masked_model_and_copies_the_rest(tmp_path):
    src = tiny_gguf("f32")
    m = ffnlab.load(src)
    cfg = m.config
    keep = select_units(weight_scores(m.params, cfg), kept_width(cfg.d_ff, 0.5))        # 96 -> 64
    rep = write_pruned_gguf(src, str(tmp_path / "p.gguf"), keep, "f32")
    back = ffnlab.load(str(tmp_path / "p.gguf"))
    assert back.config.d_ff == 64
    pruned, _ = prune_params(m.params, cfg, keep)
    assert back.params.keys() == pruned.keys()
    for name, a in pruned.items():
        assert np.array_equal(back.params[name], a), name
    ids = np.array(m.tokenizer.encode(PROMPT))
    want = ref.forward(ref.params_to_torch(masked(m.params, cfg, keep), requires_grad=False), cfg, ids[None])[0]
    ref.assert_close(back.forward(ids), want, 1e-5, "pruned logits vs masked full model")
    before, after = fields(src), fields(str(tmp_path / "p.gguf"))
    assert after.pop("llama.feed_forward_length") == 64 and before.pop("llama.feed_forward_length") == 96
    assert after == before                                            # tokenizer, file type, everything else
    n_ffn = cfg.n_layer * 3 * cfg.d_model
    assert rep["params_before"] - rep["params_after"] == n_ffn * 32
    assert back.n_params == rep["params_after"]


def test_untouched_and_same_type_rows_are_copied_byte_for_byte(tmp_path):
    import gguf
    src = tiny_gguf("q8_0")
    m = ffnlab.load(src)
    keep = select_units(weight_scores(m.params, m.config), 64)
    write_pruned_gguf(src, str(tmp_path / "p.gguf"), keep, "q8_0")
    a = {t.name: t for t in open_gguf(src).tensors}
    b = {t.name: t for t in open_gguf(str(tmp_path / "p.gguf")).tensors}
    assert list(a) == list(b)                                         # same tensors, same order
    for name, t in a.items():
        if "ffn_" not in name or "ffn_norm" in name:
            assert t.tensor_type == b[name].tensor_type and np.array_equal(t.data, b[name].data), name
    il = 1
    up = f"blk.{il}.ffn_up.weight"
    assert np.array_equal(b[up].data, a[up].data[keep[il]])          # whole q8_0 rows: the same bytes
    down = f"blk.{il}.ffn_down.weight"                               # cut rows: requantized by gguf
    cols = gguf.quants.dequantize(a[down].data, a[down].tensor_type).reshape(m.config.d_model, -1)[:, keep[il]]
    assert np.array_equal(b[down].data, gguf.quants.quantize(cols, gguf.GGMLQuantizationType.Q8_0))


def test_pruned_f32_gguf_gives_the_same_logits_in_llama_cpp(tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    src = tiny_gguf("f32")
    m = ffnlab.load(src)
    write_pruned_gguf(src, str(tmp_path / "p.gguf"), select_units(weight_scores(m.params, m.config), 32), "f32")
    back = ffnlab.load(str(tmp_path / "p.gguf"))
    ids = m.tokenizer.encode(PROMPT)
    llm = llama_cpp.Llama(model_path=str(tmp_path / "p.gguf"), n_ctx=64, logits_all=True, n_threads=1,
                          verbose=False, type_k=0, type_v=0)          # f32 KV cache: no f16 rounding
    llm.eval(ids)
    assert llm.metadata["llama.feed_forward_length"] == "32"
    ours = back.forward(ids)
    assert np.abs(ours).max() > 3
    assert np.abs(np.array(llm.scores[:len(ids)]) - ours).max() < 1e-3


@pytest.mark.slow
def test_pruned_smollm2_runs_in_llama_cpp_and_ffnlab(tmp_path):
    """Keep 0.75 of SmolLM2's 1536 units by activation, q8_0: untouched Q8_0/Q4_1 tensors keep their
    bytes, and llama.cpp agrees with ffnlab on the pruned file as closely as on the original
    (measured: 3.3% of the largest logit on the original, 3.4% pruned; argmax equal)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    m = smollm2()
    cw = context_windows(m.tokenizer.encode(TEXT, add_bos=False), 32, 8, None, max_windows=2)
    scores, _ = activation_scores(m, cw, batch=2)
    keep = select_units(scores, kept_width(m.config.d_ff, 0.75))
    out = str(tmp_path / "smol75.gguf")
    rep = write_pruned_gguf(m.source, out, keep, "q8_0")
    assert rep["params_before"] - rep["params_after"] == 30 * 3 * 576 * 384
    a = {t.name: t for t in open_gguf(m.source).tensors}
    b = {t.name: t for t in open_gguf(out).tensors}
    assert b["token_embd.weight"].tensor_type.name == "Q8_0" and b["blk.0.attn_q.weight"].tensor_type.name == "Q4_1"
    for name, t in a.items():
        if not name.split(".")[-2].startswith("ffn_") or "ffn_norm" in name:
            assert np.array_equal(t.data, b[name].data), name
    assert b["blk.7.ffn_down.weight"].tensor_type.name == "Q8_0" and tuple(b["blk.7.ffn_down.weight"].shape) == (1152, 576)

    ids = m.tokenizer.encode(PROMPT)

    def agreement(path, model):
        llm = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, n_threads=1, verbose=False,
                              type_k=0, type_v=0)
        llm.eval(ids)
        theirs, ours = np.array(llm.scores[:len(ids)]), model.forward(ids)
        return np.abs(theirs - ours).max() / np.abs(ours).max(), (theirs.argmax(-1) == ours.argmax(-1)).mean()

    err0, _ = agreement(m.source, m)
    pruned = ffnlab.load(out)
    assert pruned.config.d_ff == 1152
    err, agree = agreement(out, pruned)
    assert err <= 1.5 * err0 and agree >= 0.85, f"pruned: {err:.2%} (original {err0:.2%}), argmax agreement {agree:.0%}"


def test_closest_type_keeps_bits_and_never_grows_a_tensor():
    """gguf-py writes no K-quant: a cut Q6_K / Q4_K / Q5_K tensor becomes the 32-block type with the
    fewest bits per weight at or above its own (Q6_K 6.56 -> q8_0 8.5, Q4_K 4.5 -> q4_0 4.5, Q5_K
    5.5 -> q5_0 5.5) unless that makes it bigger than the source tensor; then the most bits that fit."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

    from ffnlab.pruning.gguf_rewrite import closest_type

    def nbytes(t, rows, cols):
        block, size = GGML_QUANT_SIZES[t]
        return rows * cols // block * size
    src = nbytes(Q.Q6_K, 640, 2048)                                   # Gemma 3's ffn_down, d_ff 2048
    assert closest_type(Q.Q6_K, 640, 1024, src) == "q8_0"             # half the units: 8.5 bits fit
    assert closest_type(Q.Q6_K, 640, 2048, src) == "q5_1"             # all units: q8_0 would be 30% bigger
    assert closest_type(Q.Q4_K, 640, 1024, nbytes(Q.Q4_K, 640, 2048)) == "q4_0"
    assert closest_type(Q.Q5_K, 640, 1024, nbytes(Q.Q5_K, 640, 2048)) == "q5_0"
    assert closest_type(Q.Q4_1, 576, 1152, nbytes(Q.Q4_1, 576, 1536)) == "q4_1"   # writable: kept


@pytest.mark.slow
def test_default_type_keeps_smollm2_q4_1_and_shrinks_the_file(tmp_path):
    """The default (no --type): SmolLM2's Q4_1 MLP stays Q4_1 (up/gate rows byte for byte), so the
    file shrinks by the dropped units' Q4_1 bytes -- before, the q8_0 default made it 14% bigger."""
    from ffnlab.formats.load import default_model_path
    src = default_model_path()
    keep = np.sort(np.random.default_rng(0).permutation(1536)[:1152])[None].repeat(30, 0)    # [30, 1152]
    out = str(tmp_path / "smol75.gguf")
    rep = write_pruned_gguf(src, out, keep)
    assert rep["conversions"] == [] and set(rep["types"].values()) == {"q4_1"}
    a = {t.name: t for t in open_gguf(src).tensors}
    b = {t.name: t for t in open_gguf(out).tensors}
    assert np.array_equal(b["blk.3.ffn_up.weight"].data, a["blk.3.ffn_up.weight"].data[keep[3]])
    q4_1_bytes_per_unit = 30 * 3 * 576 // 32 * 20                    # a unit: one row/column of 576 per matrix
    assert rep["bytes_before"] - rep["bytes_after"] == 384 * q4_1_bytes_per_unit


# --- the command ----------------------------------------------------------------------------
def test_cli_reports_sizes_alignment_and_perplexity(tmp_path, capsys):
    data = write_text(tmp_path, TEXT)
    out = str(tmp_path / "p.gguf")
    assert main(["prune", "-m", tiny_gguf("f32"), "--keep", "0.75", "--by", "activation", "--calib", data,
                 "--eval", data, "--ctx", "64", "--calib-chunks", "4", "--eval-chunks", "4", "--type", "f32",
                 "--out", out, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["d_ff"] == 96 and r["d_ff_after"] == 64 and r["alignment"] == {"32": True, "64": True, "128": False, "256": False}
    assert r["mlp_params"] - r["mlp_params_after"] == 2 * 3 * 64 * 32
    assert r["params"] - r["params_after"] == r["mlp_params"] - r["mlp_params_after"]
    assert r["bytes"] > r["bytes_after"]
    assert r["calib_tokens"] == 4 * (64 - 16)      # 4 windows overlapping by --min-context 16: 48 scored each
    ev = r["eval"]
    assert ev["tokens_scored"] == 4 * 31 and ev["before"]["ppl"] > 1 and ev["after"]["ppl"] > 1
    assert ev["ppl_ratio"] == pytest.approx(ev["after"]["ppl"] / ev["before"]["ppl"], rel=1e-9)
    assert 0 < ev["ppl_ratio_stderr"] < 0.5 * ev["ppl_ratio"]
    assert ffnlab.load(out).config.d_ff == 64


@pytest.mark.parametrize("flags,needle", [
    (["--keep", "0", "--by", "weight"], "--keep must be in (0, 1], got 0.0"),
    (["--keep", "1.5", "--by", "weight"], "--keep must be in (0, 1], got 1.5"),
    (["--keep", "0.5", "--by", "activation"], "--by activation needs --calib"),
    (["--keep", "0.5", "--by", "weight", "--ctx", "4096"], "longer than the model's context length 128"),
    (["--keep", "0.5", "--by", "activation", "--calib", "empty.txt"], "the data file is empty"),
    (["--keep", "0.5", "--by", "weight", "--eval", "latin1.txt"], "not UTF-8 text"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, needle):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 " * 50)
    flags = [str(tmp_path / f) if f in ("empty.txt", "latin1.txt") else f for f in flags]
    assert main(["prune", "-m", tiny_gguf("f32"), "--out", str(tmp_path / "o.gguf")] + flags) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and err[0].startswith("ffnlab prune: error:")
