"""`ffnlab` entry point.

Every module in ffnlab/cli/ that defines COMMAND is a subcommand: it provides HELP,
add_arguments(parser) and run(args) -> exit code. Modules import their heavy dependencies
inside run(), so `ffnlab --help` stays fast. Errors the user can fix (FfnlabError) print one
line and exit 1; --debug shows the traceback instead.
"""
import argparse
import importlib
import pkgutil
import sys

from .. import cli as cli_pkg
from ..errors import FfnlabError


def _commands():
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
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
    parser = _Parser(prog="ffnlab", description="A glass-box transformer lab in NumPy, centred on the MLP (FFN).")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, mod in _commands().items():
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show full tracebacks on errors")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def _command_name(argv):
    """The subcommand named in argv (for error lines raised before argparse has finished)."""
    commands = _commands()
    return next((a for a in argv if a in commands), "")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except FfnlabError as e:                       # a flag's own type check (common.positive, ...)
        if "--debug" in argv:
            raise
        print(f"ffnlab {_command_name(argv)}: error: {e}", file=sys.stderr)
        return 1
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        from ..progress import quiet
        quiet(getattr(args, "json", False))        # machine-readable output: no progress lines
        if "threads" in args:                      # -t/--threads: one setting for BLAS and numba
            from ..threads import set_threads
            set_threads(args.threads)
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
