"""Test setup: make tests/ importable (torch_reference, shared checks) and keep numpy output short."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
np.set_printoptions(precision=6, suppress=True, linewidth=120, edgeitems=3)
