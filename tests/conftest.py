"""Test setup: make tests/ importable (torch_reference, shared checks), keep numpy output short,
and give the run its own tokenizer cache (formats/tokenizer_cache.py), not the user's."""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
np.set_printoptions(precision=6, suppress=True, linewidth=120, edgeitems=3)
os.environ.setdefault("FFNLAB_CACHE_DIR", tempfile.mkdtemp(prefix="ffnlab-test-cache-"))
