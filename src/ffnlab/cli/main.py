"""`ffnlab` entry point.

Every module in ffnlab/cli/ that defines COMMAND is a subcommand: it provides HELP,
add_arguments(parser) and run(args) -> exit code. One grammar for all of them (cli/common.py):
-m MODEL, -t N, flags that contradict each other refused in one line; an unknown command, flag or
model name gets the closest ones ("did you mean").

Start-up answers at once, as llama.cpp's does: `ffnlab --help` imports the command modules for
their COMMAND and HELP (the standard library only), `ffnlab CMD ...` builds CMD's arguments alone,
and -m's path is checked before run() imports the model code (NumPy, numba, SciPy: over a second).
Errors the user can fix (FfnlabError) print one line and exit 1; argparse's own exit 2; --debug
shows the traceback instead.
"""
import argparse
import difflib
import functools
import importlib
import pkgutil
import sys

from .. import __version__
from .. import cli as cli_pkg
from ..errors import FfnlabError
from . import common


@functools.cache
def _commands():
    """{command name: module}, sorted by name."""
    mods = {}
    for info in pkgutil.iter_modules(cli_pkg.__path__):
        if info.name == "main" or info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{cli_pkg.__name__}.{info.name}")
        if hasattr(mod, "COMMAND"):
            mods[mod.COMMAND] = mod
    return dict(sorted(mods.items()))


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # argparse's own errors: one line plus a pointer to --help, exit 2
        self.fail(f"{message} (see {self.prog} --help)")

    def fail(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only=None):
    """The `ffnlab` parser, one subparser per command. only=NAME: only that command's arguments are
    added (what main needs; the other commands' add_arguments may import more); only="": none."""
    parser = _Parser(prog="ffnlab", description="A glass-box transformer lab in NumPy, centred on the MLP (FFN).")
    parser.add_argument("--version", action="version", version=f"ffnlab {__version__}")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, mod in _commands().items():
        p = sub.add_parser(name, help=mod.HELP.replace("%", "%%"), description=mod.HELP)   # help is %-formatted
        if only is None or only == name:
            p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                           help="show full tracebacks on errors")
            mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def subparser(parser, name):
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _did_you_mean(word, choices) -> str:
    """' (did you mean X?)' for the closest of choices, or ''. The longest choice the word starts
    with comes first (--temperature -> --temp), then difflib's closest."""
    prefixes = sorted((c for c in choices if len(c) > 2 and word.startswith(c)), key=len, reverse=True)
    close = prefixes[:1] or difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def _unrecognized(p, extras) -> str:
    """The first argument p did not take -> one line, with the closest flag of the command."""
    flag = next((a for a in extras if a.startswith("-")), None)
    if flag is None:
        return f"unexpected argument {extras[0]!r} (see {p.prog} --help)"
    name = flag.split("=", 1)[0]
    hint = _did_you_mean(name, [s for a in p._actions for s in a.option_strings])
    return f"unrecognized argument {name}" + (hint or f" (see {p.prog} --help)")


def _parse(p, argv):
    """argv -> (Namespace, the dests the command line named). Intermixed: positionals may sit
    between flags (`ffnlab export CKPT --to gguf OUT`). An unknown flag exits 2 with one line naming
    the command, before argparse would complain of a missing required flag (a typo of it, often)."""
    if any(a == "-h" or len(a) > 2 and "--help".startswith(a) for a in argv):
        p.parse_intermixed_args(argv)                # --help: printed by the parser as built, and exit
    named, extras = _probe(p, argv)
    if extras:
        p.fail(_unrecognized(p, extras))
    return p.parse_intermixed_args(argv), named


def _probe(p, argv):
    """argv parsed with every default suppressed, nothing required and no positional's choices
    checked -> (the dests it sets, the arguments p does not know). Only what was typed lands in the
    namespace: check_grammar tells `--units 10` typed from --units left at its default 10. (A
    positional's choices wait for the real parse, so that `features --zzzz 3` names --zzzz.)"""
    saved = [(a, a.default, a.required, a.choices) for a in p._actions]
    try:
        for a, _, _, _ in saved:
            a.default, a.required = argparse.SUPPRESS, False
            if not a.option_strings:
                a.choices = None
        named, extras = p.parse_known_intermixed_args(argv)
    finally:
        for a, default, required, choices in saved:
            a.default, a.required, a.choices = default, required, choices
    return set(vars(named)), extras


def _apply_threads(args):
    """-t N for BLAS and numba (threads.py). More threads than this process may run on are capped,
    with one warning line: llama.cpp accepts any -t, so scripts written for a larger machine should
    still run, but ffnlab's thread pools spin while they wait and lose most of their speed when
    oversubscribed (bench/RESULTS.md, "Threads under a competing load")."""
    from ..threads import available_cores, set_threads
    n, cores = args.threads, available_cores()
    if n is not None and n > cores:
        print(f"ffnlab {args.command}: warning: -t {n} is more than the {cores} cores this process may use; "
              f"using {cores}", file=sys.stderr)
        n = cores
    set_threads(n)


def _split(argv):
    """argv -> (ffnlab's own flags, the command or None, the command's arguments). ffnlab's own
    flags take no value, so the first word that is not a flag is the command."""
    i = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if i is None:
        return argv, None, []
    return argv[:i], argv[i], argv[i + 1:]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    top, command, rest = _split(argv)
    if command is not None and command not in _commands():
        parser = build_parser(only="")
        parser.fail(f"no command {command!r}" + (_did_you_mean(command, list(_commands())) or " (see ffnlab --help)"))
    parser = build_parser(only=command or "")
    top_args, extras = parser.parse_known_args(top)              # --help, --version, --debug
    if extras:
        parser.fail(_unrecognized(parser, extras))
    if command is None:
        parser.print_help()
        return 2
    p = subparser(parser, command)
    debug = top_args.debug or "--debug" in rest
    try:
        args, named = _parse(p, rest)
        args.command, args.debug = command, debug
        common.check_grammar(p, args, named)
        common.check_model(args)
    except FfnlabError as e:                       # a flag's own type check (common.positive, ...), a rule, -m
        if debug:
            raise
        print(f"ffnlab {command}: error: {e}", file=sys.stderr)
        return 1
    try:
        from ..progress import quiet
        quiet(getattr(args, "json", False))        # machine-readable output: no progress lines
        if "threads" in args:                      # -t/--threads: one setting for BLAS and numba
            _apply_threads(args)
        return args._run(args) or 0
    except FfnlabError as e:
        if args.debug:
            raise
        print(f"ffnlab {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"ffnlab {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
