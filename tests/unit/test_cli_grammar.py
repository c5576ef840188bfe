"""One grammar for every subcommand (cli/common.py, cli/main.py): --help works, an unknown flag is
one line that names the subcommand and the closest flag, each pair of flags that do not go together
is refused in one line naming both, -m takes the model everywhere, names and commands get "did you
mean", -t is capped at the cores available.

The commands, their flags and their rules are read from the parsers (build_parser()), so a command,
flag or rule added later is walked too. Nothing here loads a model except the -t and -m checks,
which run a 2-layer GGUF.
"""
import argparse
import json
import tomllib
from pathlib import Path

import pytest

from ffnlab.cli.main import build_parser, main, subparser

ROOT = Path(__file__).resolve().parents[2]


def commands():
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def run_main(capsys, *argv):
    """-> (exit code, stdout, the non-empty stderr lines)"""
    try:
        rc = main(list(argv))
    except SystemExit as e:                                  # argparse's own exits
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, [line for line in err.splitlines() if line.strip()]


def one_error(capsys, cmd, *argv):
    """`ffnlab CMD ARGV` fails with one line `ffnlab CMD: error: ...` -> that line"""
    rc, _, err = run_main(capsys, cmd, *argv)
    assert rc != 0 and len(err) == 1, err
    assert err[0].startswith(f"ffnlab {cmd}: error: ") and "Traceback" not in err[0], err
    return err[0]


def _value(action, want=None):
    """A value argparse accepts for action: the rule's own, a choice, a number, or a word."""
    if action.nargs == 0:
        return []
    if want is not None:
        return [want]
    if action.choices:
        return [str(next(iter(action.choices)))]
    try:
        (action.type or str)("1")
        return ["1"]
    except Exception:
        return ["x"]


def typed(p, side):
    """A rule's side ('-f', '--by=weight', 'MODEL') as the command line types it."""
    name, _, want = side.partition("=")
    action = next(a for a in p._actions if name in a.option_strings
                  or (not a.option_strings and name in (a.metavar, a.dest)))
    if not action.option_strings:
        return _value(action, want or None)
    return [name, *_value(action, want or None)]


def required_args(p, model=True):
    """Values for the command's required flags and positionals (the rules are checked before they are
    used); model: -m for a command that has no default model."""
    argv = []
    for a in p._actions:
        if a.required and a.option_strings:
            argv += [a.option_strings[0], *_value(a)]
    if model and p.get_default("_model_required"):
        argv += ["-m", "model.gguf"]
    argv += [v for a in p._actions if a.required and not a.option_strings for v in _value(a)]
    return argv


def rules():
    return [(cmd, rule) for cmd, p in commands().items() for rule in p.get_default("_rules") or []]


def rule_id(cmd, rule):
    kind, a, b, _ = rule
    return f"{cmd} {a} {'+' if kind == 'together' else 'needs'} {b}"


@pytest.mark.parametrize("cmd", commands())
def test_help_exits_0_and_names_the_command(cmd, capsys):
    rc, out, err = run_main(capsys, cmd, "--help")
    assert rc == 0 and out.startswith(f"usage: ffnlab {cmd} ") and not err


def test_help_marks_required_flags_as_required(capsys):
    """--help is printed by the parser as built, not by main's probe (which relaxes `required`)."""
    rc, out, _ = run_main(capsys, "neurons", "--help")
    assert rc == 0 and " --layer LAYER --data DATA" in " ".join(out.split())


@pytest.mark.parametrize("cmd", commands())
def test_unknown_flag_is_one_line_naming_the_command(cmd, capsys):
    line = one_error(capsys, cmd, "--zzzz", "3")
    assert line == f"ffnlab {cmd}: error: unrecognized argument --zzzz (see ffnlab {cmd} --help)"


@pytest.mark.parametrize("cmd", commands())
def test_a_misspelt_flag_gets_the_closest_one(cmd, capsys):
    """Each long flag with one letter too many, before any required flag: the suggestion, not 'required'."""
    for flag in sorted({s for a in commands()[cmd]._actions for s in a.option_strings if s.startswith("--")}):
        line = one_error(capsys, cmd, flag + "x")
        assert line == f"ffnlab {cmd}: error: unrecognized argument {flag}x (did you mean {flag}?)"


def test_temperature_suggests_temp(capsys):
    line = one_error(capsys, "run", "-p", "hi", "--temperature", "0")
    assert line == "ffnlab run: error: unrecognized argument --temperature (did you mean --temp?)"


def test_the_walk_finds_the_conflicts_that_were_resolved_silently():
    found = {(cmd, a, b) for cmd, (_, a, b, _) in rules()}
    for expected in [("run", "-p", "-f"), ("prune", "--by=weight", "--calib"), ("neurons", "--neuron", "--units"),
                     ("run", "-i", "--json"), ("compare", "--list", "MODEL"), ("run", "--lora-scale", "--lora")]:
        assert expected in found


@pytest.mark.parametrize("cmd,rule", rules(), ids=[rule_id(*r) for r in rules()])
def test_each_conflicting_pair_is_refused_in_one_line(cmd, rule, capsys):
    """Both sides of a `together` rule, or a `needs` rule's flag alone, on top of the required flags."""
    kind, a, b, _ = rule
    p = commands()[cmd]
    sides = typed(p, a) + (typed(p, b) if kind == "together" else [])
    line = one_error(capsys, cmd, *required_args(p), *sides)
    a, b = a.replace("=", " "), b.replace("=", " ")           # '--by=weight' is typed '--by weight'
    expected = f"{a} and {b} do not go together" if kind == "together" else f"{a} needs {b}"
    assert line.startswith(f"ffnlab {cmd}: error: {expected}"), line


@pytest.mark.parametrize("cmd,argv,needle", [            # pairs the commands refuse in run(), before loading
    ("verify", ["--against", "hf", "--f32"], "--f32 applies to --against llama.cpp only"),
    ("verify", ["--against", "llama.cpp", "--f32", "--arith", "ggml"], "use one or the other"),
    ("run", ["--system", "be brief"], "--system needs --chat or -i"),
    ("run", ["--chat-template", "chatml"], "--chat-template needs --chat or -i"),
])
def test_conflicts_checked_in_run_are_one_line_too(cmd, argv, needle, capsys):
    import mlp_models
    assert needle in one_error(capsys, cmd, "-m", mlp_models.tiny_gguf("f32"), "-p", "hi", *argv)


def test_a_value_equal_to_the_default_still_counts_as_given(capsys):
    """--units 10 is --units' default, but typed with --neuron it is still a contradiction."""
    line = one_error(capsys, "neurons", "--layer", "0", "--data", "x", "--neuron", "5", "--units", "10")
    assert "--neuron and --units do not go together" in line


def test_every_command_that_reads_a_model_takes_m():
    no_model = {"ablate", "experiment", "models", "train"}   # they make or list models; train --tokenizer MODEL
    for cmd, p in commands().items():
        flags = {s for a in p._actions for s in a.option_strings}
        assert cmd in no_model or {"-m", "--model"} <= flags, f"ffnlab {cmd} has no -m"


@pytest.mark.parametrize("argv", [["inspect", "-m", "gpt2", "--json"], ["inspect", "gpt2", "--json"],
                                  ["inspect", "--preset", "gpt2", "--json"]])
def test_inspect_takes_the_model_as_m_positional_or_preset(argv, capsys):
    rc, out, _ = run_main(capsys, *argv)
    assert rc == 0 and json.loads(out)["model"]["d_model"] == 768


@pytest.mark.parametrize("argv", [["analyze", "-m", "gpt2", "--json"], ["analyze", "--preset", "gpt2", "--json"]])
def test_analyze_takes_m_and_preset(argv, capsys):
    rc, out, _ = run_main(capsys, *argv)
    assert rc == 0 and json.loads(out)["model"]["d_ff"] == 3072


def test_shapes_takes_m(capsys):
    rc, out, _ = run_main(capsys, "shapes", "-m", "gpt2", "--json")
    assert rc == 0 and json.loads(out)["config"]["d_ff"] == 3072


def test_compare_takes_repeated_m_and_positionals(capsys):
    rc, out, _ = run_main(capsys, "compare", "-m", "gpt2", "llama3-8b", "--json")
    assert rc == 0 and [r["d_ff"] for r in json.loads(out)] == [3072, 14336]


def test_the_model_given_twice_is_one_line(capsys):
    line = one_error(capsys, "inspect", "gpt2", "-m", "llama3-8b")
    assert "the model is given twice" in line


def test_export_takes_m_before_the_output(tmp_path, capsys):
    from export_helpers import LLAMA, config, make_checkpoint
    make_checkpoint(tmp_path / "ckpt", config(LLAMA, n_ctx=16))
    for argv in (["-m", str(tmp_path / "ckpt"), "--to", "gguf", str(tmp_path / "a.gguf")],
                 [str(tmp_path / "ckpt"), "--to", "gguf", str(tmp_path / "b.gguf")]):
        rc, _, err = run_main(capsys, "export", *argv)
        assert rc == 0, err
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()


def test_export_without_a_model_says_what_is_missing(capsys):
    assert "give the model and the output" in one_error(capsys, "export", "out.gguf", "--to", "gguf")


def test_unknown_command_suggests_the_closest(capsys):
    rc, _, err = run_main(capsys, "rn", "-p", "hi")
    assert rc == 2 and err == ["ffnlab: error: no command 'rn' (did you mean run?)"]


def test_misspelt_model_name_suggests_the_installed_one(capsys):
    line = one_error(capsys, "run", "-m", "smollm3", "-p", "hi")
    assert line == "ffnlab run: error: smollm3: no such file or directory (did you mean smollm2?)"


def test_missing_model_path_is_one_line_for_every_command_that_reads_one(capsys):
    for cmd, p in commands().items():
        if "-m" not in {s for a in p._actions for s in a.option_strings}:
            continue
        line = one_error(capsys, cmd, *required_args(p, model=False), "-m", "/no/such/model.gguf")
        assert line == f"ffnlab {cmd}: error: /no/such/model.gguf: no such file or directory"


def test_version_is_the_package_version(capsys):
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    rc, out, _ = run_main(capsys, "--version")
    assert rc == 0 and out == f"ffnlab {version}\n"


def test_threads_beyond_the_cores_are_capped_with_one_warning(capsys):
    import mlp_models
    from ffnlab.threads import available_cores
    n = available_cores()
    rc, out, err = run_main(capsys, "run", "-m", mlp_models.tiny_gguf("f32"), "-p", "hi", "-n", "1", "--temp", "0",
                            "--json", "-t", str(n + 97))
    assert rc == 0 and json.loads(out)["threads"]["threads"] == n
    assert err[0] == (f"ffnlab run: warning: -t {n + 97} is more than the {n} cores this process may use; "
                      f"using {n}")


def test_a_rule_naming_no_argument_fails_when_the_parser_is_built():
    from ffnlab.cli.common import refuse_together
    p = subparser(build_parser(only=""), "models")
    with pytest.raises(ValueError, match="--no-such"):
        refuse_together(p, "--no-such", "--json")
