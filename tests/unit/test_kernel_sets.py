"""The block code takes a kernel set (model/arith.py) and calls its functions; it never asks which
set it has. The forward picks the set once: the arithmetic's fused set when nothing observes the
nodes, its reference set otherwise (a tracer sees every node)."""
import pathlib
import re

import numpy as np
from block_checks import CONFIGS, random_params

import ffnlab
from ffnlab.model import Model, arith

MODEL = pathlib.Path(ffnlab.__file__).parent / "model"
BLOCK_CODE = ("block.py", "attention.py", "ffn.py", "decode.py", "transformer.py")
# what asking looks like: a set compared by identity or by name, or the hook tested for identity
ASKS = re.compile(r"\barith\s+is\b|\barith\.name\b|\bis\s+(F32|GGML)\b|\bhook\s+is\s+(not\s+)?identity\b")


def test_the_block_never_asks_which_kernel_set_it_has():
    found = [f"{f}:{i}: {line.strip()}" for f in BLOCK_CODE
             for i, line in enumerate((MODEL / f).read_text().splitlines(), 1) if ASKS.search(line.split("#")[0])]
    assert not found, "\n".join(found)


def test_fused_sets_hold_the_fused_kernels_and_reference_sets_none():
    for name, ref in arith.ARITH.items():
        assert (ref.qk_rows, ref.attend_one, ref.attend_rows) == (None, None, None)
        assert arith.fused(ref).name == name
    f32 = arith.fused(arith.F32)
    assert None not in (f32.qk_rows, f32.attend_one, f32.attend_rows)
    assert arith.fused(arith.GGML) is arith.GGML          # ggml's products and ops have no fused variants yet


def test_a_traced_forward_takes_the_reference_set(monkeypatch):
    """with a tracer attached the fused kernels must not run (they skip the nodes it records)"""
    cfg = CONFIGS["gemma3"]                                 # head_dim 16: attend_rows takes its prompts
    model = Model(cfg, random_params(cfg))
    calls = []
    fused = arith.FUSED["f32"]
    monkeypatch.setitem(arith.FUSED, "f32", fused._replace(
        attend_rows=lambda *a: calls.append("rows") or fused.attend_rows(*a),
        attend_one=lambda *a: calls.append("one") or fused.attend_one(*a)))
    ids = np.arange(6)
    kv = model.new_cache()
    with ffnlab.trace(model) as t:
        model.forward(ids, kv=kv)
    assert calls == [] and any(n.name.startswith("kq_soft_max") for n in t.nodes)
    kv = model.new_cache()
    model.forward(ids, kv=kv)
    model.forward(ids[:1], kv=kv)
    assert calls == ["rows"] * cfg.n_layer + ["one"] * cfg.n_layer
