"""Load-time warm-up (model/warmup.py) and the release of LLVM's code pages (quant/pages.py).

compile_decode runs one layer of each kind, not the whole model: these tests hold it to loading
every kernel a real decoding step calls (no numba compilation or cache load may happen inside
the first timed step, in either arithmetic), and check that LLVM's code, dropped after load,
comes back when a kernel compiles later."""
import os
import subprocess
import sys

import numpy as np
import pytest
from numba.core import dispatcher
from quant_models import quant_model

import ffnlab
from ffnlab.formats.installed import resolve_model


def _compiles_during(f, monkeypatch):
    """-> the names of the numba kernels compiled or loaded from their cache while f() runs"""
    seen, original = [], dispatcher.Dispatcher._compile_for_args

    def record(self, *args, **kws):
        seen.append(self.py_func.__name__)
        return original(self, *args, **kws)
    monkeypatch.setattr(dispatcher.Dispatcher, "_compile_for_args", record)
    f()
    monkeypatch.setattr(dispatcher.Dispatcher, "_compile_for_args", original)
    return seen


@pytest.mark.parametrize("model,arith", [("smollm2", "f32"), ("gemma3", "f32"), ("smollm2", "ggml"),
                                         ("q6k", "f32"), ("q6k", "ggml")])
def test_the_first_decoding_step_loads_no_kernel(tmp_path, monkeypatch, model, arith):
    """Gemma 3 mixes sliding and global layers and Q4_K / Q6_K matrices; q6k is a random model
    whose every matrix is Q6_K. The step runs after a prompt, as in generation."""
    path = quant_model(tmp_path, "Q6_K") if model == "q6k" else resolve_model(model)
    m = ffnlab.load(path, progress=False, arith=arith)
    kv = m.new_cache(n_ctx=16)
    tok = int(np.argmax(m.forward_last([1, 2, 3], kv)))              # the prompt: its own kernels
    assert _compiles_during(lambda: m.forward_last([tok], kv), monkeypatch) == []
    assert _compiles_during(lambda: m.forward_last([tok], kv), monkeypatch) == []


RELEASE_SCRIPT = """
import sys, numpy as np, ffnlab
from numba import njit
def llvm_code_kb():
    kb, on = 0, False
    for line in open("/proc/self/smaps"):
        f = line.split()
        if "-" in f[0] and not f[0].endswith(":"):
            on = len(f) > 5 and f[1] == "r-xp" and f[5].endswith("libllvmlite.so")
        elif on and f[0] == "Rss:":
            kb += int(f[1])
    return kb
m = ffnlab.load(sys.argv[1], progress=False)
after_load = llvm_code_kb()
ids = m.generate(list(range(2, 12)), n_predict=4, temp=0).ids
after_generate = llvm_code_kb()
@njit
def fresh(x):
    return x * 3 + 1
assert fresh(np.arange(4)).tolist() == [1, 4, 7, 10]   # LLVM runs again, from pages faulted back
print(after_load, after_generate, llvm_code_kb(), ids)
"""


def test_llvm_code_is_released_after_load_and_comes_back(tmp_path):
    """A fresh process: LLVM's code pages (~50 MB resident once the kernels load) are dropped at
    the end of the load, stay out through generation (no kernel loads then), and a kernel
    compiled afterwards still works; the generated ids are those of a process that keeps them."""
    path = quant_model(tmp_path, "Q4_1")
    out = subprocess.run([sys.executable, "-c", RELEASE_SCRIPT, path], capture_output=True, text=True,
                         env=os.environ, check=True).stdout.split(maxsplit=3)
    after_load, after_generate, after_compile = (int(x) for x in out[:3])
    assert after_load < 4096 and after_generate < 4096, (after_load, after_generate)   # KB
    assert after_compile > after_load                                   # faulted back in to compile
    m = ffnlab.load(path, progress=False)
    assert out[3].strip() == str(m.generate(list(range(2, 12)), n_predict=4, temp=0).ids)


def test_split_keeps_each_group_whole_and_balances_the_cost():
    from ffnlab.model.warmup import Step, _split
    steps = [Step("a", None, "one-token", 5.0), Step("b", None, "one-token", 5.0), Step("c", None, "prompt", 9.0),
             Step("d", None, "attention", 6.0), Step("e", None, "rows", 3.0)]
    shares = _split(steps, 2)
    assert sorted(i for s in shares for i in s) == [0, 1, 2, 3, 4]            # every step, once
    assert any({0, 1} <= set(s) for s in shares)                              # a group is never split
    cost = sorted(sum(steps[i].cost for i in s) for s in shares)
    assert cost == [13.0, 15.0]                                               # {a, b, e} | {c, d}: the best split
    assert _split(steps, 9) == [[0, 1], [2], [3], [4]]                        # no empty share


def test_the_time_left_comes_from_the_pace_so_far():
    from ffnlab.model.warmup import Pace, _note
    assert _note(3, 11, 10.0, 40.0, 5.0) == "3/11, ~15 s left"               # 10 of 40 in 5 s: 30 more in 15 s
    pace = Pace(2.0)
    assert pace.seconds_per_cost == 2.0                                      # nothing done: the guess
    pace.add(4.0, 2.0)
    pace.add(6.0, 13.0)
    assert pace.seconds_per_cost == 1.5                                      # 15 s for 10 units of cost


@pytest.fixture
def stamp(tmp_path, monkeypatch):
    from ffnlab.model import warmup
    path = tmp_path / "stamp"
    monkeypatch.setattr(warmup, "stamp_path", lambda model, arith, steps: str(path))
    return path


def test_a_first_load_compiles_in_workers_and_stamps_and_the_next_reads_the_cache(tmp_path, monkeypatch, stamp):
    """No stamp: workers (one per core and one more: 3 for 2 cores) run the steps; then the stamp is
    written, and the next load runs the steps in this process only."""
    from ffnlab.model import warmup
    from quant_models import quant_model
    calls = []
    monkeypatch.setattr(warmup, "available_cores", lambda: 2)
    monkeypatch.setattr(warmup, "_compile_in_workers", lambda path, arith, steps, n, bar: calls.append((path, n)))
    path = quant_model(tmp_path, "Q4_1")
    ffnlab.load(path, progress=False)
    assert calls == [(path, 3)] and stamp.exists()
    ffnlab.load(path, progress=False)
    assert len(calls) == 1


def test_one_core_compiles_in_this_process(tmp_path, monkeypatch, stamp):
    from ffnlab.model import warmup
    from quant_models import quant_model
    monkeypatch.setattr(warmup, "available_cores", lambda: 1)
    monkeypatch.setattr(warmup, "_compile_in_workers", lambda *a: pytest.fail("a worker on one core"))
    ffnlab.load(quant_model(tmp_path, "Q4_1"), progress=False)
    assert stamp.exists()


def test_the_workers_run_every_step_and_report_each(tmp_path):
    """The real worker processes (python -m ffnlab.runtime.warmup --worker), on this machine's cache:
    every step of the model is reported done once, whichever worker ran it."""
    from ffnlab.formats.gguf import load_gguf
    from ffnlab.model.warmup import _compile_in_workers, warm_up_steps
    from quant_models import quant_model
    path = quant_model(tmp_path, "Q4_1")
    steps = warm_up_steps(load_gguf(path, warm=False))

    class Bar:
        notes = []

        def update(self, n, note=""):
            self.notes.append((n, note))
    _compile_in_workers(path, "f32", steps, 2, Bar())
    assert sum(n for n, _ in Bar.notes) == pytest.approx(sum(s.cost for s in steps))   # every step's cost, once
    assert Bar.notes[-1][1].startswith(f"{len(steps)}/{len(steps)}, ~0 s left")
