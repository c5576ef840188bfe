"""--dump DIR: every traced node's array as a .npy file, plus index.json describing them.

index.json: {"model", "prompt", "ids", "nodes": [{"index", "name", "op", "shape", "ne",
"dtype", "inputs": [{"name", "shape"}], "file"}]}. Files are NNNN-<name>.npy in trace order
(a name can repeat: Qcur-0 is a MUL_MAT, a RESHAPE and a ROPE).
"""
import json
import os
import re

import numpy as np

from ..errors import UsageError
from .tracer import ggml_shape


class Dumper:
    def __init__(self, directory, model=None, prompt=None, ids=None):
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--dump {directory}: cannot create the directory ({e.strerror})") from None
        self.dir = directory
        self.head = {"model": model, "prompt": prompt, "ids": [int(i) for i in ids] if ids is not None else None}
        self.entries = []

    def add(self, node):
        i = len(self.entries)
        file = f"{i:04d}-{re.sub(r'[^A-Za-z0-9_.-]', '_', node.name)}.npy"
        np.save(os.path.join(self.dir, file), node.array)
        self.entries.append({"index": i, "name": node.name, "op": node.op, "shape": list(node.shape),
                             "ne": list(ggml_shape(node.shape)), "dtype": node.dtype,
                             "inputs": [{"name": s, "shape": list(sh) if sh is not None else None}
                                        for s, sh in node.srcs],
                             "file": file})

    def close(self):
        path = os.path.join(self.dir, "index.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**self.head, "nodes": self.entries}, f, indent=1)
        return path


def load_dump(directory):
    """-> (index dict, [arrays]) in trace order."""
    with open(os.path.join(directory, "index.json"), encoding="utf-8") as f:
        index = json.load(f)
    return index, [np.load(os.path.join(directory, e["file"])) for e in index["nodes"]]
