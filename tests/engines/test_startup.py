"""Start-up: `ffnlab --help`, `ffnlab CMD --help` and errors in arguments or paths answer before any
model code is imported. NumPy, numba and SciPy take over a second to import (python -X importtime);
the command line reads its arguments and checks -m's path first (cli/main.py), and `import ffnlab`
imports its public names on first use (ffnlab/__init__.py).

Each check runs in a fresh interpreter and asserts which modules are NOT imported, rather than a
time: what was imported does not depend on the machine's load.
"""
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

HEAVY = ("numpy", "numba", "scipy", "torch", "gguf", "ffnlab.model", "ffnlab.formats.load")


def imported_after(code):
    """The HEAVY modules loaded once `code` has run in a fresh interpreter."""
    probe = (f"import io, sys, contextlib\n"
             f"with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
             f"    try:\n" + "".join(f"        {line}\n" for line in code.splitlines()) +
             f"    except SystemExit:\n        pass\n"
             f"print(__import__('json').dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def cli(*argv):
    return f"from ffnlab.cli.main import main\nmain({list(argv)!r})"


def test_import_ffnlab_loads_no_model_code():
    assert imported_after("import ffnlab\nffnlab.__version__") == []


def test_top_level_help_loads_no_model_code():
    assert imported_after(cli("--help")) == []


def test_every_command_help_loads_no_model_code():
    from ffnlab.cli.main import _commands
    code = "from ffnlab.cli.main import main\n" + "".join(
        f"try:\n    main([{c!r}, '--help'])\nexcept SystemExit:\n    pass\n" for c in _commands())
    assert imported_after(code) == []


@pytest.mark.parametrize("argv", [
    ["run", "-m", "/no/such/model.gguf", "-p", "hi"],
    ["run", "-m", "smollm3", "-p", "hi"],
    ["run", "-p", "hi", "--temperature", "0"],
    ["run", "-p", "hi", "-f", "prompt.txt"],
    ["perplexity", "-m", "/no/such/model.gguf", "--data", "x.txt"],
    ["inspect", "-m", "/no/such/model.gguf"],
    ["rn"],
], ids=lambda argv: " ".join(argv))
def test_argument_and_path_errors_load_no_model_code(argv):
    assert imported_after(cli(*argv)) == []


def test_the_lazy_names_are_the_modules_own():
    import ffnlab
    from ffnlab.config import ConfigError, ModelConfig
    from ffnlab.formats.load import load
    from ffnlab.interventions import hooks
    from ffnlab.model import Model
    from ffnlab.tracing import trace
    assert (ffnlab.load, ffnlab.Model, ffnlab.trace, ffnlab.hooks, ffnlab.ModelConfig, ffnlab.ConfigError) == \
        (load, Model, trace, hooks, ModelConfig, ConfigError)
    assert {"load", "Model", "trace", "hooks", "ModelConfig", "ConfigError"} <= set(dir(ffnlab))


def test_an_unknown_name_is_an_attribute_error():
    import ffnlab
    with pytest.raises(AttributeError, match="no_such_name"):
        ffnlab.no_such_name


def test_prune_type_choices_are_what_the_rewriter_writes():
    """cli/prune.py keeps its own copy of the tuple so that `ffnlab prune --help` imports no NumPy."""
    from ffnlab.cli.prune import TYPES as cli_types
    from ffnlab.pruning.gguf_rewrite import TYPES
    assert cli_types == TYPES
