"""Where SAELens runs: this interpreter when sae_lens imports here, else $FFNLAB_SAELENS_PYTHON, else the venv
scripts/install.sh --test makes at $FFNLAB_SAELENS_VENV (default ~/.cache/ffnlab/venv-saelens). SAELens pins
transformer-lens < 4, so it lives in a venv of its own; the drivers it runs import ffnlab from src/."""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "src")


def saelens_python():
    """-> the interpreter's path, or a pytest skip saying why there is none"""
    if importlib.util.find_spec("sae_lens") is not None:
        return sys.executable
    venv = os.environ.get("FFNLAB_SAELENS_VENV", os.path.expanduser("~/.cache/ffnlab/venv-saelens"))
    py = os.environ.get("FFNLAB_SAELENS_PYTHON", os.path.join(venv, "bin", "python"))
    if shutil.which(py) is None and not os.path.exists(py):
        pytest.skip(f"sae_lens is not importable here and {py} does not exist (scripts/install.sh --test makes it)")
    ok = subprocess.run([py, "-c", "import sae_lens"], capture_output=True)
    if ok.returncode:
        pytest.skip(f"{py} cannot import sae_lens: {ok.stderr.decode().strip().splitlines()[-1:]}")
    return py


def run_driver(driver, *args, timeout=900):
    """Runs tests/reference/DRIVER under SAELens's interpreter -> the JSON object it prints last"""
    import json
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.abspath(SRC), HERE]),
               OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    p = subprocess.run([saelens_python(), os.path.join(HERE, driver), *map(str, args)], capture_output=True,
                       env=env, timeout=timeout)
    assert p.returncode == 0, p.stderr.decode()[-3000:]
    return json.loads(p.stdout.decode().strip().splitlines()[-1])
