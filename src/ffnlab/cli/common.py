"""The grammar every subcommand shares, and the helpers of the commands that run a model.

    -m MODEL            the model, on every command that reads one (a positional MODEL stays as an
                        alias where a command had one: `ffnlab inspect gemma3` = `ffnlab inspect -m gemma3`)
    -t N                threads (main applies it before the command runs)
    refuse_together()   two flags that contradict each other are refused in one line
    needs()             a flag that means nothing without another is refused in one line

main.py checks the last two after parsing (check_grammar), from the flags the command line named,
and -m's path (check_model) before the command imports any model code. Nothing here imports
NumPy or the model at the top: `ffnlab CMD --help` reads this file.
"""
import argparse

from ..errors import UsageError

MODEL_HELP = ("a .gguf file, an HF directory, an ffnlab checkpoint, or an installed model: smollm2, gemma3 "
              "(`ffnlab models`; default: smollm2, SmolLM2-135M-Instruct Q4_1)")


class _OneModel(argparse.Action):
    """-m MODEL and the positional MODEL fill one slot (args.model); naming the model twice is an error."""
    def __call__(self, parser, namespace, value, option_string=None):
        if value is None:                              # the positional, absent
            return
        if getattr(namespace, self.dest, None) is not None:
            raise argparse.ArgumentError(self, "the model is given twice: give MODEL or -m MODEL, not both")
        setattr(namespace, self.dest, value)


class _Models(argparse.Action):
    """-m MODEL (repeatable) and positional MODELs add to one list: the -m ones first (main parses
    flags before positionals), each group in the order typed."""
    def __call__(self, parser, namespace, values, option_string=None):
        values = values if isinstance(values, list) else [values]
        setattr(namespace, self.dest, (getattr(namespace, self.dest, None) or []) + values)


def add_model_argument(p):
    """-m MODEL, --arith and -t: the flags of every command that runs a model."""
    p.add_argument("-m", "--model", default=None, help=MODEL_HELP)
    p.add_argument("--arith", choices=("f32", "ggml"), default="f32",
                   help="arithmetic: f32 (float32, exact weights: the HF reference; default) or ggml (llama.cpp's "
                        "CPU numerics: 8-bit activation blocks and integer dots, f16 K/V, ggml's exp/SiLU/GELU; "
                        "docs/glass-box.md)")
    add_threads_argument(p)
    p.set_defaults(_model_kind="model")


def add_model_flag(p, help, presets=False, required=None):
    """-m MODEL for a command that reads a model's file but runs no forward (inspect, analyze, shapes,
    export), with the positional MODEL these commands took before as an alias. presets: the value
    may also name a preset (`ffnlab compare --list`), so a name that is no file is not refused early.
    required: the command has no default model; check_grammar refuses a command line without one
    with this line."""
    p.add_argument("-m", "--model", action=_OneModel, default=None, metavar="MODEL", help=help)
    p.add_argument("model", action=_OneModel, nargs="?", default=None, metavar="MODEL", help="the same as -m MODEL")
    p.set_defaults(_model_kind="preset" if presets else "model", _model_required=required)


def add_models_flag(p, help):
    """compare: -m MODEL, repeatable, and any number of positional MODELs -> args.models."""
    # -m's default is None, not []: argparse's intermixed parse warns about a positional's dest that holds []
    p.add_argument("-m", "--model", dest="models", action=_Models, default=None, metavar="MODEL", help=help)
    p.add_argument("models", action=_Models, nargs="*", default=[], metavar="MODEL", help="the same as -m MODEL")
    p.set_defaults(_model_kind="preset")


def add_threads_argument(p, default_help="the cores other processes leave idle, at least 1"):
    """-t/--threads N, as llama.cpp's: main() applies it (ffnlab/threads.py) before the command runs;
    more threads than this process may use are capped, with a warning."""
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help=f"threads for BLAS and compiled kernels; <= 0 = the default ({default_help}); more than "
                        f"the cores available are capped to them")


def add_intervention_arguments(p):
    """--ablate / --scale / --steer of `ffnlab run` (interventions/flags.py reads them into hooks)."""
    p.add_argument("--ablate", action="append", default=[], metavar="NODE:UNITS",
                   help="zero these units of a node during generation, e.g. ffn_swiglu-5:123,456 (repeatable)")
    p.add_argument("--scale", action="append", default=[], metavar="NODE:UNIT:FACTOR",
                   help="multiply one unit of a node by FACTOR, e.g. ffn_swiglu-5:123:4 (repeatable)")
    p.add_argument("--steer", action="append", default=[], metavar="NODE:FILE.npy",
                   help="add the vector in FILE.npy to every row of a node, e.g. l_out-10:v.npy (repeatable)")


# --- flags that do not go together ------------------------------------------------------------
# A rule names each side as the user types it: a flag ('-f', '--calib') is true when the command
# line names it (a value equal to the default counts: `--units 10 --neuron 5` is still refused);
# FLAG=VALUE is true when the flag's value, given or default, is VALUE (or a list holding it), so
# `--by=weight` also covers a command whose default is weight.
def refuse_together(p, a, b, why=""):
    """a and b on one command line: `a and b do not go together[: why]` (exit 1)."""
    _add_rule(p, ("together", a, b, why))


def needs(p, flag, other, why=""):
    """flag without other: `flag needs other[: why]` (exit 1)."""
    _add_rule(p, ("needs", flag, other, why))


def _add_rule(p, rule):
    for side in rule[1:3]:
        _action(p, side)                               # a typo in a rule fails when the parser is built
    p.set_defaults(_rules=[*(p.get_default("_rules") or []), rule])


def _action(p, side):
    """'-f' / '--by=weight' / 'MODEL' (a positional's metavar) -> its argparse action."""
    name = side.split("=", 1)[0]
    for a in p._actions:
        if name in a.option_strings or (not a.option_strings and name in (a.metavar, a.dest)):
            return a
    raise ValueError(f"{p.prog}: a rule names {side!r}, which is not one of its arguments")


def _holds(p, side, args, given) -> bool:
    a = _action(p, side)
    if "=" not in side:
        return a.dest in given
    want = side.split("=", 1)[1]
    value = getattr(args, a.dest, None)
    return want in [str(v) for v in value] if isinstance(value, list) else str(value) == want


def _shown(side) -> str:
    return side.replace("=", " ")                      # '--by=weight' -> '--by weight', as typed


def check_grammar(p, args, given):
    """The first rule of parser p that args break -> UsageError. given: the dests the command line named."""
    if p.get_default("_model_required") and args.model is None:
        raise UsageError(p.get_default("_model_required"))
    for kind, a, b, why in p.get_default("_rules") or []:
        if kind == "together" and _holds(p, a, args, given) and _holds(p, b, args, given):
            raise UsageError(f"{_shown(a)} and {_shown(b)} do not go together" + (f": {why}" if why else ""))
        if kind == "needs" and _holds(p, a, args, given) and not _holds(p, b, args, given):
            raise UsageError(f"{_shown(a)} needs {_shown(b)}" + (f": {why}" if why else ""))


def check_model(args):
    """-m's value, before the command imports any model code (formats/installed.py: check_model_arg)."""
    kind = getattr(args, "_model_kind", None)
    if kind is None:
        return
    from ..formats.installed import check_model_arg
    for m in getattr(args, "models", None) or [getattr(args, "model", None)]:
        check_model_arg(m, presets=kind == "preset")


def refuse_moe(cfg, source, command):
    """A command that reads one dense or gated MLP per layer: a mixture of experts is one line."""
    if cfg.moe:
        from ..errors import UsageError
        raise UsageError(f"{source} has a mixture of experts ({cfg.n_expert} experts per layer): `ffnlab {command}` "
                         f"reads one dense or gated MLP; `ffnlab experts` studies the routing")


def add_lora_arguments(p):
    """--lora ADAPTER [--lora-scale S]: the model with a LoRA adapter applied (load_model reads them)."""
    p.add_argument("--lora", default=None, metavar="ADAPTER",
                   help="apply a LoRA adapter: a PEFT directory (`ffnlab finetune --out`) or a llama.cpp LoRA GGUF")
    p.add_argument("--lora-scale", type=float, default=1.0, metavar="S",
                   help="scale of the adapter's update, times alpha/r (llama.cpp's --lora-scaled; default 1)")
    needs(p, "--lora-scale", "--lora", "it scales the adapter's update")


def add_flag_table(p, table):
    """A command's flags from its table {flag: (settings field, type, help)}, each defaulting to None so that
    flag_values() tells what the command line gave; a type "positive", "nonneg" or "positive_float" is that
    range check, naming the flag."""
    kinds = {"positive": positive, "nonneg": nonneg, "positive_float": positive_float}
    for flag, (_, typ, hlp) in table.items():
        p.add_argument(flag, type=kinds[typ](flag) if isinstance(typ, str) else typ, default=None, help=hlp)


def flag_values(args, table):
    """-> {settings field: its flag's value, None where not given}"""
    return {f: getattr(args, flag[2:].replace("-", "_")) for flag, (f, _, _) in table.items()}


def add_prompt_arguments(p):
    """-p TEXT / -f FILE: the prompt (read_prompt reads it)."""
    p.add_argument("-p", "--prompt", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from a UTF-8 file")
    refuse_together(p, "-p", "-f", "give the prompt as text or as a file")


def load_model(args, quiet=False):
    """-m's file, directory, short name (smollm2, gemma3) or the default model -> Model
    (with --lora's adapter applied, for the commands that have the flag)."""
    from ..formats.installed import resolve_model
    from ..formats.load import load
    return load(resolve_model(args.model), progress=None if not quiet else False,
                lora=getattr(args, "lora", None), lora_scale=getattr(args, "lora_scale", 1.0),
                arith=getattr(args, "arith", "f32"))


def read_prompt(args):
    """-p TEXT or -f FILE -> prompt text"""
    if getattr(args, "file", None):
        try:
            with open(args.file, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            raise UsageError(f"{args.file}: no such file") from None
        except UnicodeDecodeError:
            raise UsageError(f"{args.file}: not UTF-8 text") from None
    if args.prompt is None:
        raise UsageError("no prompt: give -p TEXT or -f FILE")
    return args.prompt


def model_and_prompt(args):
    """-p/-f and -m -> (prompt, Model, token ids); a model without a tokenizer or a prompt of no tokens is one line"""
    prompt = read_prompt(args)
    model = load_model(args, quiet=True)
    if model.tokenizer is None:
        raise UsageError(f"{model.source}: the model has no tokenizer, so it cannot read a text prompt")
    ids = model.tokenizer.encode(prompt)
    if not ids:
        raise UsageError("the prompt encodes to no tokens")
    return prompt, model, ids


# --- argparse types that check a number's range and name the flag (UsageError: one line) --------
def _number(name, s, kind):
    try:
        return kind(s)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise UsageError(f"{name} must be {what}, got {s!r}") from None


def _checked(name, kind, ok, rule, show_text=False):
    """an argparse type: s -> kind(s), refused in one line unless ok(value): `NAME must be RULE, got VALUE`"""
    def parse(s):
        v = _number(name, s, kind)
        if not ok(v):
            raise UsageError(f"{name} must be {rule}, got {s if show_text else v}")
        return v
    return parse


def positive(name):
    """> 0 (a count or a size)."""
    return _checked(name, int, lambda v: v > 0, "> 0")


def nonneg(name, kind=int):
    """>= 0"""
    return _checked(name, kind, lambda v: v >= 0, ">= 0")


def count_or_all(name):
    """> 0, or -1 for all (llama.cpp's convention for --chunks)."""
    return _checked(name, int, lambda v: v > 0 or v == -1, "> 0, or -1 for all")


def positive_float(name):
    return _checked(name, float, lambda v: 0 < v < float("inf"), "a positive number", show_text=True)
