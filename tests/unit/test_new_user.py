"""What a new user trips over, one behaviour per test: a trace filter that matches nothing, --chat on
a model whose file has no template, attribution's negative side and a target the model does not
predict, the logit lens's rendering, and the smaller papercuts (train/finetune into an existing
--out, finetune's warmup warning, a checkpoint's load time, the threads line, experts on a dense model)."""
import json
import struct

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from mlp_models import TEXT, tiny_gguf, write_text


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# --- trace --filter ------------------------------------------------------------------------------
def test_trace_filter_matching_nothing_is_one_line_naming_the_node_that_contains_it(capsys):
    code, out, err = run_cli(capsys, "trace", "-m", tiny_gguf("f32"), "-p", "hi", "--filter", "up-0")
    assert code == 1 and out == "" and err.count("\n") == 1, err
    assert "matches none of the" in err and "ffn_up-0" in err and "'.*up-0'" in err


def test_trace_filter_with_a_typo_suggests_the_nearest_name(capsys):
    code, out, err = run_cli(capsys, "trace", "-m", tiny_gguf("f32"), "-p", "hi", "--filter", "ffn_upp-0")
    assert code == 1 and "did you mean ffn_up-0" in err and err.count("\n") == 1


def test_trace_filter_that_matches_prints_its_nodes(capsys):
    code, out, err = run_cli(capsys, "trace", "-m", tiny_gguf("f32"), "-p", "hi", "--filter", "ffn_up-0")
    assert code == 0 and out.count("\n") == 1 and " ffn_up-0 = " in out


# --- --chat without a template in the file ------------------------------------------------------
class _NoTemplate:                                      # what resolve_template and render_chat read
    chat_template, bos_id, eos_id = None, None, None

    def token_text(self, i):
        return ""


@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_a_gemma_without_a_template_gets_gemmas_format_with_a_notice(arch):
    from ffnlab.generation.chat_templates import BUILTIN, resolve_template
    template, label, notice = resolve_template(None, _NoTemplate(), arch)
    assert template == BUILTIN["gemma"] and label == "gemma"
    assert f"using gemma, the format of its architecture ({arch})" in notice


def test_an_architecture_of_several_formats_falls_back_to_chatml():
    from ffnlab.generation.chat_templates import BUILTIN, FALLBACK, resolve_template
    template, label, notice = resolve_template(None, _NoTemplate(), "llama")
    assert template == BUILTIN[FALLBACK] and "llama.cpp's fallback" in notice


def test_gemma_prompt_has_no_chatml_markers():
    from ffnlab.generation.chat import render_chat
    from ffnlab.generation.chat_templates import resolve_template
    template, _, _ = resolve_template(None, _NoTemplate(), "gemma3")
    text = render_chat(_NoTemplate(), [{"role": "user", "content": "Hi"}], template=template)
    assert text == "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n" and "<|im" not in text


# --- attribute -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    return ffnlab.load(tiny_gguf("f32"))


def test_attribution_lists_the_most_negative_units_most_negative_first(tiny):
    from ffnlab.interventions.attribution import attribute
    ids = np.array(tiny.tokenizer.encode("abcd"))
    every = attribute(tiny, ids, 101, top=tiny.config.d_ff)          # every unit, by attribution
    some = attribute(tiny, ids, 101, top=3)
    for all_units, lay in zip(every["layers"], some["layers"]):
        want = [u for u in reversed(all_units["units"]) if u[1] < 0][:3]
        assert lay["negative"] == want and len(want) == 3
        assert lay["units"] == all_units["units"][:3]


def test_attribute_prints_both_sides_of_each_layer(capsys):
    code, out, err = run_cli(capsys, "attribute", "-m", tiny_gguf("f32"), "-p", "abcd", "--target", "e", "--top", "2")
    assert code == 0, err
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    assert len(rows) == 2 and all(" | " in r and r.split("|")[1].count(": -") == 2 for r in rows), out


def test_a_target_the_model_does_not_predict_gets_a_note_naming_its_top_prediction(tiny, capsys):
    from ffnlab.interventions.attribution import attribute
    ids = np.array(tiny.tokenizer.encode("abcd"))
    r = attribute(tiny, ids, 101, top=1)
    assert r["rank"] >= 5                                             # 'e' is far down for this random model
    top = tiny.tokenizer.decode([r["top_id"]])
    code, out, err = run_cli(capsys, "attribute", "-m", tiny_gguf("f32"), "-p", "abcd", "--target", "e", "--json")
    assert code == 0 and "note:" in err and f"#{r['top_id']}" in err
    assert json.loads(out)["note"].endswith(f"logit {r['top_logit']:.2f})") and top


def test_the_models_own_prediction_gets_no_note(tiny, capsys):
    from ffnlab.interventions.attribution import attribute
    top_id = attribute(tiny, np.array(tiny.tokenizer.encode("abcd")), 101, top=1)["top_id"]
    code, out, err = run_cli(capsys, "attribute", "-m", tiny_gguf("f32"), "-p", "abcd", "--target", f"#{top_id}")
    assert code == 0 and "note:" not in err


class _Vocab:
    """A tokenizer where ' Paris' is one token and 'Paris' another."""
    ids = {" Paris": [7], "Paris": [8]}

    def encode(self, text, add_bos=False):
        return self.ids.get(text, [1, 2])

    def decode(self, ids):
        return {7: " Paris", 8: "Paris", 9: " Rome"}.get(ids[0], "?")


def test_a_target_without_its_leading_space_is_pointed_at_the_spaced_token():
    from ffnlab.cli.attribute import target_note

    class M:
        tokenizer = _Vocab()
    note = target_note(M(), "Paris", 8, {"rank": 40, "logit": 5.6, "top_id": 7, "top_logit": 12.8})
    assert "is the model's prediction #41" in note and "top prediction is ␣Paris (#7, logit 12.80)" in note
    assert note.endswith("did you mean ' Paris', with its leading space (#7)?")


# --- the logit lens's rendering -----------------------------------------------------------------
def test_token_labels_show_whitespace_and_never_double_escapes():
    from ffnlab.token_text import visible
    assert visible(" Paris") == "␣Paris" and visible("\n") == "↵" and visible("\t") == "⇥"
    assert visible('\\":\\"') == '\\":\\"'                            # the text itself, not repr()
    assert visible("\x07") == "<0x07>" and visible("") == "∅"
    assert visible("\ue000") == "<U+E000>"                             # private use: no font draws it


def test_a_token_that_is_part_of_a_utf8_character_shows_its_bytes(tiny):
    from ffnlab.token_text import token_label
    ids = tiny.tokenizer.encode("机", add_bos=False)                  # three byte tokens
    assert [token_label(tiny.tokenizer, i) for i in ids] == ["<0xE6>", "<0x9C>", "<0xBA>"]


def test_long_tokens_are_cut_with_an_ellipsis_and_wide_characters_count_twice():
    from ffnlab.token_text import columns, fit
    assert fit("collectively", 12) == "collectively" and fit("collectivelyX", 12) == "collectivel…"
    assert fit("<start_of_image>", 12) == "<start_of_i…"
    assert columns("机器") == 4 and fit("机器学习是", 6) == " 机器…" and columns(fit("机器学习是", 6)) == 6


def test_lens_text_names_model_prompt_and_the_next_token_reading(capsys):
    code, out, err = run_cli(capsys, "lens", "-m", tiny_gguf("f32"), "-p", "a b")
    assert code == 0, err
    head = out.splitlines()
    assert "tiny-f32.gguf" in head[0] and "'a b'" in head[0] and "the token after it" in head[1]
    assert head[2].split() == ["layer", "a", "␣", "b"]                 # the space token is a visible cell


def test_lens_html_uses_white_text_on_dark_cells_and_names_model_and_prompt(tmp_path, capsys):
    import re
    page = tmp_path / "l.html"
    code, _, err = run_cli(capsys, "lens", "-m", tiny_gguf("f32"), "-p", "a b", "--html", str(page))
    assert code == 0, err
    text = page.read_text()
    assert "tiny-f32.gguf" in text and "<code>a b</code>" in text and "<i>after</i>" in text
    cells = re.findall(r"background:rgba\(40,90,200,([\d.]+)\);color:(#\w+)", text)
    assert cells and all((ink == "#fff") == (float(a) > 0.55) for a, ink in cells)
    assert "<th>␣</th>" in text


# --- the papercuts -------------------------------------------------------------------------------
TRAIN = ["--n-layer", "1", "--d-model", "16", "--n-head", "2", "--seq-len", "16", "--batch", "2", "--steps", "2",
         "--eval-every", "1", "--eval-batches", "1", "--warmup", "0"]


def test_train_into_an_existing_out_refuses_before_printing_anything(tmp_path, capsys):
    data = write_text(tmp_path, TEXT * 2)
    assert main(["train", "--data", data, "--out", str(tmp_path / "ck"), *TRAIN]) == 0
    capsys.readouterr()
    code, out, err = run_cli(capsys, "train", "--data", data, "--out", str(tmp_path / "ck"), *TRAIN[:-2],
                             "--warmup", "5")                         # a warmup that would warn
    assert code == 1 and out == "" and err.count("\n") == 1 and "already holds a checkpoint at step 2" in err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import byte_tokenizer, tokenizer_meta
    from ffnlab.training.presets import build_config
    d = tmp_path_factory.mktemp("ck")
    cfg = build_config("tiny-llama", 256, n_layer=1, d_model=16, n_head=2, d_ff=32)
    tok = byte_tokenizer()
    save_model(str(d / "ck"), cfg, ffnlab.Model.random(cfg, seed=1).params, tok, tokenizer_meta(tok, "byte"))
    return str(d / "ck")


def test_finetune_warns_when_warmup_covers_the_run(checkpoint, tmp_path, capsys):
    data = write_text(tmp_path, TEXT * 2)
    code, out, err = run_cli(capsys, "finetune", "-m", checkpoint, "--data", data, "--out", str(tmp_path / "lora"),
                             "--steps", "2", "--warmup", "5", "--batch", "2", "--seq-len", "16", "--eval-every", "1",
                             "--eval-batches", "1", "--quiet")
    assert code == 0, err
    assert "warning: --warmup 5 >= --steps 2" in err


def test_run_reports_a_checkpoints_load_time(checkpoint, capsys):
    code, out, err = run_cli(capsys, "run", "-m", checkpoint, "-p", "ab", "-n", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["timings"]["load_ms"] > 0
    assert "load time =       0.00 ms" not in err


def test_the_threads_report_lists_libraries_in_a_fixed_order(monkeypatch):
    import threadpoolctl

    from ffnlab import threads
    pools = [{"internal_api": "openmp", "num_threads": 2}, {"internal_api": "openblas", "num_threads": 2}]
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: pools)
    first = list(threads.report()["libraries"])
    pools.reverse()
    assert list(threads.report()["libraries"]) == first == ["openblas", "openmp"]


@pytest.mark.parametrize("kind", ["gguf", "checkpoint"])
def test_experts_refuses_a_dense_model_without_loading_it(kind, checkpoint, tmp_path, capsys, monkeypatch):
    import ffnlab.formats.load as load

    def must_not_load(*a, **kw):
        raise AssertionError("the model was loaded")
    monkeypatch.setattr(load, "load", must_not_load)
    model = tiny_gguf("f32") if kind == "gguf" else checkpoint
    code, out, err = run_cli(capsys, "experts", "-m", model, "--data", write_text(tmp_path, TEXT))
    assert code == 1 and err.count("\n") == 1 and "not a mixture of experts" in err, err


def test_gguf_header_peek_equals_gguf_readers_scalars():
    import gguf

    from ffnlab.formats.gguf_peek import scalar_metadata
    path = tiny_gguf("f32")
    r = gguf.GGUFReader(path)
    want = {}
    for k, f in r.fields.items():
        if f.types and f.types[0] not in (gguf.GGUFValueType.ARRAY,) and not k.startswith("GGUF."):
            want[k] = f.contents()
    got = scalar_metadata(path)
    assert set(got) == set(want)
    assert all(got[k] == pytest.approx(want[k]) if isinstance(want[k], float) else got[k] == want[k] for k in want)


def test_experts_heatmap_is_large_enough_to_read(tmp_path):
    from ffnlab.cli.experts import write_heatmap

    class Cfg:                                                        # all the heat map reads of a config
        n_expert = 4
    cfg = Cfg()
    reports = {il: {"experts": [{"share": s} for s in (0.1, 0.2, 0.3, 0.4)]} for il in range(2)}
    write_heatmap(str(tmp_path / "e.png"), reports, cfg, "title")
    with open(tmp_path / "e.png", "rb") as f:
        head = f.read(24)
    w, h = struct.unpack(">II", head[16:24])                          # the PNG's IHDR width and height
    assert w >= 700 and h >= 450


def test_causal_trace_and_patch_figures_name_the_model_and_the_prompt(tmp_path, capsys, monkeypatch):
    import ffnlab.interventions.plots as plots
    titles = []
    monkeypatch.setattr(plots, "causal_trace_figure", lambda path, r, window, title: titles.append(title))
    monkeypatch.setattr(plots, "patch_heatmap", lambda path, r, tokens, title: titles.append(title))
    model = tiny_gguf("f32")
    assert main(["causal-trace", "-m", model, "-p", "abcd", "--subject", "bc", "--samples", "1", "--window", "2",
                 "--out", str(tmp_path / "ct.png")]) == 0
    assert main(["patch", "-m", model, "--clean", "abcd", "--corrupt", "abxd", "--target", "e", "--foil", "y",
                 "--out", str(tmp_path / "p.png")]) == 0
    assert all("tiny-f32.gguf" in t and "'abcd'" in t for t in titles) and len(titles) == 2
