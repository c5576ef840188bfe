"""-t/--threads: one setting reaches BLAS (threadpoolctl's view of the loaded OpenBLAS) and numba,
every command that computes has the flag, and the number used is printed with the timings."""
import argparse
import json
import os
import subprocess
import sys

import pytest
from threadpoolctl import threadpool_info

from ffnlab import threads as T
from ffnlab.cli.main import build_parser, main

# commands that only read metadata or print tables: nothing to parallelise
NO_COMPUTE = {"inspect", "analyze", "compare", "shapes", "models", "export"}


@pytest.fixture(autouse=True)
def restore_threads():
    before = {i["internal_api"]: i["num_threads"] for i in threadpool_info()}
    env = {k: os.environ.get(k) for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "MKL_NUM_THREADS")}
    yield
    T.set_threads(max(before.values(), default=1))
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def blas_threads():
    return {i["internal_api"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def test_set_threads_reaches_the_loaded_blas():
    import numpy  # noqa: F401  (OpenBLAS is loaded with NumPy)
    assert T.set_threads(1) == 1 and set(blas_threads().values()) == {1}
    assert T.report()["threads"] == 1 and T.report()["libraries"]["openblas"] == 1
    assert T.set_threads(2) == 2 and set(blas_threads().values()) == {2}


@pytest.mark.parametrize("numba_first", [False, True])
def test_numba_uses_the_same_number_whether_imported_before_or_after(numba_first):
    """Before: numba.set_num_threads; after: NUMBA_NUM_THREADS, which numba reads at import."""
    pytest.importorskip("numba")
    code = (("import numba; " if numba_first else "") + "import ffnlab.threads as T; T.set_threads(1); "
            "import numba; print(numba.get_num_threads())")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.split() == ["1"]


@pytest.mark.parametrize("busy,expected", [(0.0, 2), (0.4, 2), (0.6, 1), (1.0, 1), (7.5, 1), (None, 2)])
def test_default_leaves_the_cores_other_processes_use_now(monkeypatch, busy, expected):
    """None: no /proc (not Linux): every core, as llama.cpp's default."""
    monkeypatch.setattr(T, "available_cores", lambda: 2)
    monkeypatch.setattr(T, "busy_cores", lambda: busy)
    assert T.default_threads() == expected
    assert T.set_threads(0) == expected and T.set_threads(-1) == expected


def fake_proc(tmp_path, running, own_states):
    """A /proc/stat with procs_running = running and a /proc/self/task of threads in own_states"""
    stat = tmp_path / "stat"
    stat.write_text(f"cpu  1 2 3 4\nctxt 99\nprocs_running {running}\nprocs_blocked 0\n")
    for i, state in enumerate(own_states):
        (tmp_path / "task" / str(i)).mkdir(parents=True)
        (tmp_path / "task" / str(i) / "stat").write_text(f"{i} (py thon) {state} 1 2 3\n")
    return str(stat), str(tmp_path / "task")


@pytest.mark.parametrize("running,own,expected", [(1, "R", 0.0), (3, "R", 2.0), (3, "RRS", 1.0), (1, "S", 0.0)])
def test_busy_cores_counts_runnable_threads_other_than_ours(tmp_path, running, own, expected):
    """procs_running counts this process's runnable threads too (the reader at least: a process
    whose threads all read S is counted as one)."""
    stat, task = fake_proc(tmp_path, running, own)
    assert T.busy_cores(samples=3, interval=0, stat=stat, own=task) == expected


def test_busy_cores_without_proc_is_none(tmp_path):
    assert T.busy_cores(samples=1, stat=str(tmp_path / "none"), own=str(tmp_path)) is None


def test_a_competing_process_counts_as_a_busy_core():
    """A lower bound only: the machine may be running other work too."""
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        import time
        time.sleep(0.3)                                       # let it get its core
        assert T.busy_cores() >= 0.8
    finally:
        burner.kill()
        burner.wait()


def test_threads_before_any_setting_measures_the_default_once(monkeypatch):
    """threads() is asked on every product: a 20 ms measurement each time would cost more than they do."""
    calls = []
    monkeypatch.setattr(T, "default_threads", lambda: calls.append(1) or 2)
    monkeypatch.setattr(T, "_threads", None)
    monkeypatch.setattr(T, "_default", None)
    assert [T.threads() for _ in range(3)] == [2, 2, 2] and len(calls) == 1


def test_every_command_that_computes_has_t():
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for cmd, p in sub.choices.items():
        flags = {s for a in p._actions for s in a.option_strings}
        if cmd in NO_COMPUTE:
            continue
        assert {"-t", "--threads"} <= flags, f"ffnlab {cmd} has no -t/--threads"


def test_run_prints_the_threads_in_json_and_perf_lines(capsys):
    import mlp_models
    gguf = mlp_models.tiny_gguf("f32")
    assert main(["run", "-m", gguf, "-p", "hi", "-n", "2", "--temp", "0", "-t", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["threads"]["threads"] == 1 and set(doc["threads"]["libraries"].values()) == {1}
    line = next(x for x in err.splitlines() if "threads =" in x)
    assert line.startswith("ffnlab_perf:          threads = 1 (") and "openblas 1" in line


def test_parallel_for_runs_every_item_once_and_restores_blas():
    import threading
    T.set_threads(2)
    seen, names = [], set()

    def item(i):
        seen.append(i)
        names.add(threading.current_thread().name)
        assert set(blas_threads().values()) == {1}       # one BLAS thread per caller while it runs
    T.parallel_for(item, 37)
    assert sorted(seen) == list(range(37))
    assert set(blas_threads().values()) == {2}           # the setting comes back afterwards
    T.parallel_for(item, 0)                              # nothing to do: no call
    assert len(seen) == 37


def test_parallel_for_raises_a_workers_error_in_the_caller():
    T.set_threads(2)

    def item(i):
        if i == 5:
            raise ValueError("item 5")
    with pytest.raises(ValueError, match="item 5"):
        T.parallel_for(item, 8)
    T.parallel_for(lambda i: None, 8)                    # the pool still works after an error


def test_parallel_for_nested_in_an_item_runs_inline():
    """an item that calls parallel_for itself (the pool's one worker is busy with it) does not wait
    for itself: run in a thread of its own, so that a deadlock fails here instead of hanging"""
    import threading
    T.set_threads(2)
    seen = []
    t = threading.Thread(target=T.parallel_for, args=(lambda i: T.parallel_for(lambda j: seen.append((i, j)), 3), 4),
                         daemon=True)
    t.start()
    t.join(timeout=60)
    assert not t.is_alive(), "nested parallel_for did not return"
    assert sorted(seen) == [(i, j) for i in range(4) for j in range(3)]
