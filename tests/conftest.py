"""Test setup: make tests/reference/ importable (the torch and ggml references, tolerances, shared model builders and
checks), keep numpy output short, and give the run its own caches (formats/tokenizer_cache.py, formats/pack_cache.py),
not the user's.

The tiers: unit/ (the default `pytest`), model/, engines/ and fuzz/; engines/ and fuzz/ are marked slow."""
import atexit
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "reference"))
np.set_printoptions(precision=6, suppress=True, linewidth=120, edgeitems=3)
if "FFNLAB_CACHE_DIR" not in os.environ:
    # removed when the run ends: the packed weights of the real models alone are ~380 MB
    os.environ["FFNLAB_CACHE_DIR"] = tempfile.mkdtemp(prefix="ffnlab-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FFNLAB_CACHE_DIR"], ignore_errors=True)
