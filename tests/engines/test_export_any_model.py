"""`ffnlab export MODEL --to gguf|hf` for any model ffnlab loads: an HF directory, a GGUF file, a
checkpoint (tests/unit/test_export_cli.py), for Mistral, Llama 3.x, Qwen3 and Phi-3.

The reference for an HF export is transformers itself: AutoModelForCausalLM.from_pretrained on the
exported directory gives the source's logits within 1e-4 (float32 on both sides, sums <= 96 long,
logits ~5: a port differs by ~1e-5). The reference for a GGUF export is ffnlab reading the file
back (1e-5: the same float32 weights, only q/k row order differs) and llama.cpp
(tests/engines/test_gguf_mistral_llama3_qwen3_phi3.py runs it on the same exports).
"""
import json

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.training.data import byte_tokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from gguf_family_models import COMMON, FAMILIES, IDS, randomize  # noqa: E402

pytestmark = pytest.mark.slow


def hf_dir(path, name, seed=7):
    cfg_cls, model_cls, kw = FAMILIES[name]
    model = randomize(getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**COMMON, **kw)), seed)
    model.save_pretrained(path, safe_serialization=True)
    byte_tokenizer().tk.save(str(path / "tokenizer.json"))
    return str(path)


def transformers_logits(path, ids=IDS):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hf_dir_to_gguf_and_back_to_hf(name, tmp_path, capsys):
    src = hf_dir(tmp_path / "src", name)
    gguf_path, out = str(tmp_path / "m.gguf"), str(tmp_path / "hf")
    assert main(["export", src, "--to", "gguf", gguf_path]) == 0
    err = capsys.readouterr().err
    assert ("ignores attention.sliding_window=8" in err) == (name == "mistral")
    ref = ffnlab.load(src, progress=False).forward(IDS)
    assert np.abs(ffnlab.load(gguf_path, progress=False).forward(IDS) - ref).max() <= 1e-5
    if name == "llama3":               # head_dim 16: one divisor in the interpolated band, too few to fit
        assert main(["export", gguf_path, "--to", "hf", out]) == 1
        assert "rope_freq_factors that no llama3 rope_parameters reproduce" in capsys.readouterr().err
        return
    assert main(["export", gguf_path, "--to", "hf", out]) == 0
    assert np.abs(transformers_logits(out) - ref).max() <= 1e-4


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hf_dir_to_hf_keeps_the_class_and_logits(name, tmp_path):
    src = hf_dir(tmp_path / "src", name)
    out = str(tmp_path / "hf")
    assert main(["export", src, "--to", "hf", out]) == 0
    cls = FAMILIES[name][1]
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == [cls]
    assert np.abs(transformers_logits(out) - transformers_logits(src)).max() <= 1e-4


def test_gguf_to_gguf_q8_0_copies_the_tokenizer(tmp_path):
    from models import tiny_gguf
    src = tiny_gguf(tmp_path / "src.gguf")
    out = str(tmp_path / "q8.gguf")
    assert main(["export", src, "--to", "gguf", out, "--type", "q8_0"]) == 0
    a, b = ffnlab.load(src, progress=False), ffnlab.load(out, progress=False)
    text = "hello there"
    assert a.tokenizer.encode(text) == b.tokenizer.encode(text)
    ids = a.tokenizer.encode(text)
    # q8_0: 8-bit blocks, |w - q(w)| <= scale/2 = max|w|/254 per block; logits of ~3 move by ~1e-2
    assert np.abs(a.forward(ids) - b.forward(ids)).max() < 0.1


def test_hf_dir_without_a_tokenizer_is_one_line(tmp_path, capsys):
    src = hf_dir(tmp_path / "src", "qwen3")
    (tmp_path / "src" / "tokenizer.json").unlink()
    capsys.readouterr()                                         # transformers' save progress bars
    assert main(["export", src, "--to", "gguf", str(tmp_path / "m.gguf")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no tokenizer" in err[0] and src in err[0]


def test_checkpoint_to_gguf_to_hf_to_gguf(tmp_path):
    """A chain through every kind of source: the HF directory's tokenizer.json (the Split + ByteLevel
    pre-tokenizer ffnlab builds from the GGUF's gpt-2 regex) goes back into GGUF as pre = gpt-2, and
    llama.cpp tokenizes the last file as ffnlab does."""
    from export_helpers import LLAMA, PROMPT, config, make_checkpoint
    make_checkpoint(tmp_path / "ckpt", config(LLAMA))
    a, b, c = str(tmp_path / "a.gguf"), str(tmp_path / "b-hf"), str(tmp_path / "c.gguf")
    assert main(["export", str(tmp_path / "ckpt"), "--to", "gguf", a]) == 0
    assert main(["export", a, "--to", "hf", b]) == 0
    assert main(["export", b, "--to", "gguf", c]) == 0
    first, last = ffnlab.load(str(tmp_path / "ckpt"), progress=False), ffnlab.load(c, progress=False)
    ids = first.tokenizer.encode(PROMPT)
    assert last.tokenizer.encode(PROMPT) == ids
    assert np.abs(last.forward(ids) - first.forward(ids)).max() <= 1e-5
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(model_path=c, vocab_only=True, verbose=False)
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=True) == last.tokenizer.encode(PROMPT, add_bos=False)


@pytest.mark.parametrize("name", ["mistral", "qwen3", "phi3"])
def test_verify_against_hf_maps_every_family(name, tmp_path, capsys):
    """verify --against hf on the HF directory: node for node within verify's tolerance, 30 tokens
    (past Mistral's window of 8). Phi-3's fused nodes are captured under llama.cpp's names: the
    views of wqkv, one ffn_up [T, 2*d_ff], and q scaled after RoPE under the name Qcur."""
    src = hf_dir(tmp_path / "src", name)
    prompt = "the quick brown fox jumps over"
    assert main(["verify", "-m", src, "--against", "hf", "-p", prompt]) == 0
    assert capsys.readouterr().out.strip().endswith("PASS")
    if name == "phi3":
        from ffnlab.tracing.hf import capture
        ids = ffnlab.load(src, progress=False).tokenizer.encode(prompt)
        nodes = capture(src, ids, permuted=False)
        assert nodes[("ffn_up-0", "MUL_MAT")].shape == (len(ids), 2 * 96)
        assert nodes[("Qcur-1", "VIEW")].shape == (len(ids), 4, 16) and ("Qcur-1", "SCALE") in nodes


def test_llama3_gguf_to_hf_fits_rope_parameters(tmp_path):
    """A Llama 3 GGUF holds only the divisors (rope_freqs.weight). With Llama 3's own head_dim 128 and
    base 500000 the interpolated band has several frequencies, and the fit finds config.json's
    numbers again (factor 8, low 1, high 4, original context 8192): transformers then runs the HF
    export with ffnlab's logits."""
    rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                original_max_position_embeddings=8192)
    cfg = transformers.LlamaConfig(**{**COMMON, "hidden_size": 256, "num_attention_heads": 2,
                                      "num_key_value_heads": 1}, head_dim=128, rope_parameters=rope)
    model = randomize(transformers.LlamaForCausalLM(cfg), seed=3)
    model.save_pretrained(tmp_path / "src", safe_serialization=True)
    byte_tokenizer().tk.save(str(tmp_path / "src" / "tokenizer.json"))
    gguf_path, out = str(tmp_path / "m.gguf"), str(tmp_path / "hf")
    assert main(["export", str(tmp_path / "src"), "--to", "gguf", gguf_path]) == 0
    assert main(["export", gguf_path, "--to", "hf", out]) == 0
    written = json.loads((tmp_path / "hf" / "config.json").read_text())["rope_parameters"]
    assert written == {**rope, "rope_theta": 500000.0}
    ids = list(range(1, 120, 7))
    ref = ffnlab.load(gguf_path, progress=False).forward(ids)
    assert np.abs(transformers_logits(out, ids) - ref).max() <= 1e-4


def test_qwen3_window_from_a_layer_on_round_trips_through_hf(tmp_path, capsys):
    """max_window_layers=1: HF export writes it back; GGUF refuses it (llama.cpp's qwen3 has no window)."""
    cfg = transformers.Qwen3Config(**COMMON, head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1)
    model = randomize(transformers.Qwen3ForCausalLM(cfg), seed=5)
    model.save_pretrained(tmp_path / "src", safe_serialization=True)
    byte_tokenizer().tk.save(str(tmp_path / "src" / "tokenizer.json"))
    out = str(tmp_path / "hf")
    assert main(["export", str(tmp_path / "src"), "--to", "hf", out]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["max_window_layers"] == 1
    assert np.abs(transformers_logits(out) - transformers_logits(str(tmp_path / "src"))).max() <= 1e-4
    capsys.readouterr()
    assert main(["export", str(tmp_path / "src"), "--to", "gguf", str(tmp_path / "m.gguf")]) == 1
    assert "sliding_window_start=1" in capsys.readouterr().err
