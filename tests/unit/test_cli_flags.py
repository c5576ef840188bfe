"""Every numeric flag of every subcommand, given 0, -1 and a non-number, either works or fails with
one line naming the flag -- never a traceback, never a ZeroDivisionError.

The flags are found by introspecting the argparse parsers (build_parser()), so a flag added
later is walked too. Each command runs for real on a tiny model (a 2-layer GGUF / checkpoint) with
small sizes, in this process; BASE_ARGS holds the small arguments each command needs.
"""
import argparse
import itertools

import pytest

from ffnlab.cli.main import build_parser, main

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\nAll:\nSpeak, speak.\n" * 12
NOT_NUMBERS = ("0", "-1", "abc")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import mlp_models
    from export_helpers import LLAMA, config, make_checkpoint

    d = tmp_path_factory.mktemp("flags")
    text = mlp_models.write_text(d, TEXT)
    ckpt = d / "ckpt"
    make_checkpoint(ckpt, config(LLAMA, n_ctx=64))
    moe = d / "moe"                                   # a mixture of experts, for `ffnlab experts`
    make_checkpoint(moe, config(LLAMA, n_ctx=64, ffn="moe", n_expert=3, n_expert_used=2, expert_norm=True))
    return {"gguf": mlp_models.tiny_gguf("f32"), "text": text, "ckpt": str(ckpt), "moe": str(moe), "dir": d}


_counter = itertools.count()


def base_args(cmd, f):
    """Small, valid arguments for each command; a fresh output path per call."""
    out = str(f["dir"] / f"out{next(_counter)}")
    m, t = f["gguf"], f["text"]
    small_train = ["--steps", "2", "--batch", "2", "--seq-len", "16", "--n-layer", "1", "--d-model", "16",
                   "--n-head", "2", "--eval-every", "1", "--eval-batches", "1"]
    return {
        "run": ["-m", m, "-p", "hi", "-n", "2", "--temp", "0"],
        "trace": ["-m", m, "-p", "hi", "--filter", "result_output"],
        "verify": ["-m", m, "-p", "hi", "--against", "hf"],
        "perplexity": ["-m", m, "--data", t, "--ctx", "32", "--chunks", "2"],
        "neurons": ["-m", m, "--data", t, "--layer", "0", "--ctx", "32", "--max-windows", "2", "--units", "2"],
        "experts": ["-m", f["moe"], "--data", t, "--ctx", "32", "--max-windows", "2"],
        "prune": ["-m", m, "--keep", "0.5", "--by", "weight", "--out", out + ".gguf", "--ctx", "32"],
        "train": ["--data", t, "--out", out, "--quiet", *small_train],
        "ablate": ["--data", t, "--out", out, "--ffn", "gelu", "--mult", "1", "--seeds", "1", *small_train],
        "export": [f["ckpt"], "--to", "gguf", out + ".gguf"],
        "finetune": ["-m", m, "--data", t, "--out", out, "--quiet", "--steps", "2", "--batch", "2", "--seq-len", "16",
                     "--lora-r", "2", "--eval-every", "1", "--eval-batches", "1"],
        "experiment": ["activation", "--quick", "--data", t, "--out", out, "--json"],
        "features": ["train", "-m", m, "--data", t, "--out", out, "--layer", "0", "--width", "32", "--k", "4",
                     "--tokens", "256", "--batch", "32", "--buffer-mb", "1", "--ctx", "32", "--min-context", "8"],
        "inspect": [m], "analyze": [m], "compare": [m], "models": [],
        "patch": ["-m", m, "--clean", "ab", "--corrupt", "cd", "--target", "#5", "--foil", "#6", "--json"],
        "causal-trace": ["-m", m, "-p", "hello", "--subject", "he", "--samples", "2", "--window", "1", "--json"],
        "lens": ["-m", m, "-p", "hi", "--json"],
        "attribute": ["-m", m, "-p", "hi", "--target", "#5", "--json"],
        "shapes": ["--preset", "gpt2"],
        "patch": ["-m", m, "--clean", "ab", "--corrupt", "cd", "--target", "#1", "--foil", "#2",
                  "--out", out + ".png"],
        "causal-trace": ["-m", m, "-p", "hello", "--subject", "he", "--samples", "2", "--out", out + ".png"],
        "lens": ["-m", m, "-p", "hi"],
        "attribute": ["-m", m, "-p", "hi", "--target", "#1"],
    }.get(cmd)


def subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


def is_numeric(action):
    """A flag whose value must parse as a number (int, float, a range-checked number, a number list)."""
    if not action.option_strings or action.nargs == 0 or action.type is None or action.choices:
        return False
    def parses(s):
        try:
            action.type(s)
            return True
        except Exception:
            return False
    return parses("1") and not parses("abc")


def numeric_flags():
    cases = []
    for cmd, p in subparsers().items():
        for a in p._actions:
            if is_numeric(a):
                cases += [(cmd, a.option_strings[-1], v) for v in NOT_NUMBERS]
    return cases


def test_every_command_has_small_base_arguments(files):
    missing = [cmd for cmd in subparsers() if base_args(cmd, files) is None]
    assert not missing, f"add small arguments for {missing} to BASE_ARGS in {__file__}"


def test_the_walk_finds_the_flags_that_broke_before():
    found = {(c, f) for c, f, _ in numeric_flags()}
    for c, f in [("perplexity", "--batch"), ("perplexity", "--chunks"), ("neurons", "--top"), ("prune", "--ctx"),
                 ("run", "--n-predict"), ("train", "--steps"), ("ablate", "--mult"), ("analyze", "--seq-len")]:
        assert (c, f) in found


def with_flag(argv, flag, value, aliases):
    """argv with FLAG set to VALUE (replacing the value base_args gives it, under any alias)."""
    argv = list(argv)
    for i, a in enumerate(argv):
        if a in aliases:
            del argv[i:i + 2]
            break
    return argv + [f"{flag}={value}"]              # '=' so '-1' is not read as a flag


@pytest.mark.parametrize("cmd,flag,value", numeric_flags())
def test_numeric_flag_works_or_fails_in_one_line(cmd, flag, value, files, capsys):
    p = subparsers()[cmd]
    action = next(a for a in p._actions if flag in a.option_strings)
    base = base_args(cmd, files)
    if base is None:
        pytest.skip(f"no base arguments for {cmd}")
    argv = [cmd, *with_flag(base, flag, value, action.option_strings)]
    try:
        rc = main(argv)
    except SystemExit as e:                         # argparse: exit 2 after one line
        rc = e.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    if rc == 0:
        assert value != "abc", f"{' '.join(argv)} accepted a non-number"
        return
    if rc == 1 and cmd == "verify" and "FAIL" in out and not err.strip():
        return                                       # a verdict (--rtol 0 is a legal, strict tolerance)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(f"ffnlab {cmd}: error: "), err
    # the message names the flag (any of its spellings) so the user knows what to change
    assert any(s in lines[-1] for s in action.option_strings), lines[-1]
