"""Flags and helpers shared by the subcommands that run a model."""
from ..errors import UsageError


def add_model_argument(p):
    p.add_argument("-m", "--model", default=None,
                   help="a .gguf file, an HF directory, an ffnlab checkpoint, or an installed model: smollm2, "
                        "gemma3 (`ffnlab models`; default: smollm2, SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--arith", choices=("f32", "ggml"), default="f32",
                   help="arithmetic: f32 (float32, exact weights: the HF reference; default) or ggml (llama.cpp's "
                        "CPU numerics: 8-bit activation blocks and integer dots, f16 K/V, ggml's exp/SiLU/GELU; "
                        "docs/glass-box.md)")
    add_threads_argument(p)


def add_threads_argument(p, default_help="the cores other processes leave idle, at least 1"):
    """-t/--threads N, as llama.cpp's: main() applies it (ffnlab/threads.py) before the command runs."""
    p.add_argument("-t", "--threads", type=int, default=None, metavar="N",
                   help=f"threads for BLAS and compiled kernels; <= 0 = the default ({default_help})")


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


# --- argparse types that check a number's range and name the flag (UsageError: one line) --------
def _number(name, s, kind):
    try:
        return kind(s)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise UsageError(f"{name} must be {what}, got {s!r}") from None


def positive(name):
    """> 0 (a count or a size)."""
    def parse(s):
        v = _number(name, s, int)
        if v <= 0:
            raise UsageError(f"{name} must be > 0, got {v}")
        return v
    return parse


def nonneg(name, kind=int):
    """>= 0"""
    def parse(s):
        v = _number(name, s, kind)
        if not v >= 0:
            raise UsageError(f"{name} must be >= 0, got {v}")
        return v
    return parse


def count_or_all(name):
    """> 0, or -1 for all (llama.cpp's convention for --chunks)."""
    def parse(s):
        v = _number(name, s, int)
        if v <= 0 and v != -1:
            raise UsageError(f"{name} must be > 0, or -1 for all, got {v}")
        return v
    return parse


def positive_float(name):
    def parse(s):
        v = _number(name, s, float)
        if not (v > 0 and v < float("inf")):
            raise UsageError(f"{name} must be a positive number, got {s}")
        return v
    return parse
