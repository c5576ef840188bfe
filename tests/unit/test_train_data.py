"""Data, tokenizers, checkpoints and the errors `ffnlab train` gives for bad input."""
import numpy as np
import pytest

from ffnlab.cli.main import main
from ffnlab.config import ModelConfig
from ffnlab.errors import DataError
from ffnlab.formats.checkpoint import load_checkpoint
from ffnlab.model import Model
from ffnlab.training.data import TokenData, byte_tokenizer, encode, make_tokenizer, sample_batch, train_bpe_tokenizer
from ffnlab.training.trainer import DivergedError, TrainSettings, train

UTF8_SAMPLES = ["plain ascii", "Grüße, naïve café", "日本語のテキスト", "emoji 😀👍🏽 and ZWJ 👩‍👩‍👧",
                "\x00\x01\x7f control bytes \t\r\n", "  leading and trailing spaces  ", ""]


@pytest.mark.parametrize("text", UTF8_SAMPLES)
def test_byte_tokenizer_ids_are_the_utf8_bytes_and_round_trip(text):
    tok = byte_tokenizer()
    ids = tok.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    assert tok.vocab_size == 256


def test_fast_byte_encoding_equals_the_tokenizer():
    tok, meta = make_tokenizer("byte", "")
    text = "".join(UTF8_SAMPLES) * 3
    assert encode(tok, meta, text).tolist() == tok.encode(text)


def test_byte_tokenizer_covers_every_byte():
    tok = byte_tokenizer()
    assert [tok.tk.token_to_id(tok.token_text(i)) for i in range(256)] == list(range(256))


def test_bpe_tokenizer_trained_on_the_data_round_trips_and_compresses():
    text = "".join(f"To be, or not to be, that is the question {i}.\n" for i in range(200))
    tok = train_bpe_tokenizer(text, 300)
    assert tok.vocab_size == 300
    assert tok.tk.id_to_token(tok.eos_id) == "<|endoftext|>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) / 2
    for s in UTF8_SAMPLES:                               # unseen text still round-trips (byte fallback alphabet)
        assert tok.decode(tok.encode(s)) == s


def test_split_and_batches():
    ids = np.arange(1000)
    d = TokenData.from_ids(ids, seq_len=20, val_frac=0.1)
    assert len(d.train) == 900 and len(d.val) == 100 and d.val[0] == 900   # held-out tail, no overlap
    x, y = sample_batch(d.train, 8, 20, np.random.default_rng(0))
    assert x.shape == y.shape == (8, 20)
    assert np.array_equal(y[:, :-1], x[:, 1:])          # targets are the next tokens
    assert x.max() < 900


def test_too_little_data_for_the_sequence_length_is_a_data_error():
    with pytest.raises(DataError, match="too little for --seq-len 64"):
        TokenData.from_ids(np.arange(300), seq_len=64, path="tiny.txt")


def cli_error(capsys, argv):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    return err


def test_cli_errors_are_one_line(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    err = cli_error(capsys, ["train", "--data", str(empty), "--out", str(tmp_path / "o1")])
    assert "empty.txt: the data file is empty" in err
    small = tmp_path / "small.txt"
    small.write_text("hello world, " * 10)
    err = cli_error(capsys, ["train", "--data", str(small), "--out", str(tmp_path / "o2"), "--seq-len", "128"])
    assert "small.txt: 130 tokens is too little for --seq-len 128" in err
    err = cli_error(capsys, ["train", "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o3")])
    assert "missing.txt: cannot read the data file" in err
    binary = tmp_path / "bin.dat"
    binary.write_bytes(b"abc\xff\xfe" * 100)
    assert "not UTF-8" in cli_error(capsys, ["train", "--data", str(binary), "--out", str(tmp_path / "o4")])
    text = tmp_path / "text.txt"
    text.write_text("some text to train on. " * 400)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    err = cli_error(capsys, ["train", "--data", str(text), "--out", str(blocker / "sub")])
    assert "--out" in err and "cannot create the directory" in err
    err = cli_error(capsys, ["train", "--data", str(text), "--out", str(tmp_path / "o5"), "--seq-len", "64",
                             "--n-ctx", "32"])
    assert "--seq-len 64 exceeds the model context n_ctx=32" in err
    assert "--steps must be a positive integer" in cli_error(
        capsys, ["train", "--data", str(text), "--out", str(tmp_path / "o6"), "--steps", "0"])
    assert "ffn must be one of" in cli_error(
        capsys, ["train", "--data", str(text), "--out", str(tmp_path / "o7"), "--ffn", "tanh"])


TEXT = "".join(f"line {i}: all the world's a stage, and all the men and women merely players.\n" for i in range(60))
CFG = ModelConfig(arch="llama", n_layer=1, d_model=32, n_head=2, d_ff=64, ffn="swiglu", vocab_size=256, n_ctx=16)


def test_nonfinite_loss_names_the_step_and_the_first_nonfinite_node(tmp_path):
    def poison(params):
        params["blk.0.ffn_up.weight"][3, 5] = np.inf
    tok = byte_tokenizer()
    data = TokenData.from_ids(tok.encode(TEXT), 16)
    with pytest.raises(DivergedError) as e:
        train(CFG, TrainSettings(steps=5, batch=2, seq_len=16, warmup=0), data, tok, {"kind": "byte"},
              str(tmp_path / "run"), progress=False, init_hook=poison)
    msg = str(e.value)
    assert e.value.step == 1
    assert msg.startswith("step 1: the loss (nan) is not finite")
    assert "first non-finite node: ffn_up-0 (MUL_MAT)" in msg and "blk.0.ffn_up.weight" in msg


def test_exploding_learning_rate_stops_with_the_step(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text(TEXT)
    err = cli_error(capsys, ["train", "--data", str(data), "--out", str(tmp_path / "run"), "--n-layer", "1",
                             "--d-model", "32", "--n-head", "2", "--seq-len", "16", "--batch", "2", "--steps", "5",
                             "--warmup", "0", "--lr", "1e30", "--quiet"])
    # step 1 moves every weight by ~lr, so step 2's forward overflows
    assert "step 2: the loss (nan) is not finite; first non-finite node:" in err


def test_checkpoint_loads_back_with_its_tokenizer(tmp_path):
    tok, meta = make_tokenizer("bpe", TEXT, 280)
    cfg = ModelConfig(**{**CFG.__dict__, "vocab_size": tok.vocab_size})
    data = TokenData.from_ids(tok.encode(TEXT), 16)
    rec = train(cfg, TrainSettings(steps=3, batch=2, seq_len=16, warmup=0, eval_every=3), data, tok, meta,
                str(tmp_path / "run"), progress=False)
    cfg2, params, tok2 = load_checkpoint(str(tmp_path / "run"))
    assert cfg2 == cfg
    assert tok2.encode(TEXT) == tok.encode(TEXT) and tok2.eos_id == tok.eos_id
    # the saved weights reproduce the logged final validation loss
    from ffnlab.training.data import eval_batches
    from ffnlab.training.trainer import mean_loss
    val = mean_loss(Model(cfg2, params), eval_batches(data.val, 2, 16, 4))
    assert val == rec["final"]["val_loss"]
    assert Model(cfg2, params, tok2).forward(tok2.encode("line 1"))[-1].shape == (tok.vocab_size,)
