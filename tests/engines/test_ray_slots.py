"""Workers of a given thread count on one node: with -t N a node of C CPUs runs C // N workers of N
threads each, so a grid of small runs keeps every core busy (a 2-CPU node runs two units at once at
-t 1), and the figures equal the in-process ones.

The node is a one-node ray.cluster_utils.Cluster of 2 logical CPUs on 127.0.0.1 (as in
test_ray_cluster.py); the units sleep, so two of them overlap whatever the machine's cores.
"""
import os
import subprocess
import sys
import time

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"     # read when Ray is imported: every address is 127.0.0.1
ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install ffnlab[ray]")

from mlp_models import TEXT, sweep_table, write_text   # noqa: E402

pytestmark = pytest.mark.slow
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")
UNITS, SLEEP_S = 6, 1.0


@pytest.fixture(scope="module")
def node():
    from ray.cluster_utils import Cluster
    os.environ["PYTHONPATH"] = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])   # the workers' ffnlab
    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 2, "include_dashboard": False})
    try:
        yield c
    finally:
        c.shutdown()


def timed(_model, params, payload):
    """a unit that sleeps: -> where it ran, when, and on how many threads"""
    from ffnlab.threads import threads
    t0 = time.time()
    time.sleep(params["sleep"])
    return {"unit": payload, "pid": os.getpid(), "start": t0, "end": time.time(), "threads": threads()}


def run_timed(address, threads):
    from ray import cloudpickle
    from ffnlab.runtime.executor import Task, Unit, execute
    from ffnlab.runtime.ray_backend import RayBackend
    cloudpickle.register_pickle_by_value(sys.modules[__name__])      # the workers cannot import this test module
    units = [Unit(f"u-{i:02d}", i) for i in range(UNITS)]
    o = execute(Task(None, timed, {"sleep": SLEEP_S}), units, lambda acc, r: acc + [r], [],
                backend=RayBackend.connect(address, threads=threads), progress=False)
    return o.merged


def most_at_once(rs):
    """the largest number of units running at one moment (just after some unit started)"""
    return max(sum(1 for r in rs if r["start"] <= t < r["end"]) for t in (s["start"] + 1e-3 for s in rs))


@pytest.mark.parametrize("threads,workers", [(1, 2), (2, 1), (None, 1)], ids=["t1", "t2", "default"])
def test_a_node_runs_its_cpus_over_t_workers_of_t_threads(node, threads, workers):
    from ffnlab.threads import available_cores
    rs = run_timed(node.address, threads)
    assert [r["unit"] for r in rs] == list(range(UNITS))              # merged in unit order
    assert len({r["pid"] for r in rs}) == workers
    assert most_at_once(rs) == workers
    assert {r["threads"] for r in rs} == {min(threads or 2, available_cores())}


def test_an_ablate_grid_on_two_one_thread_workers_of_one_node_gives_the_in_process_table(node, tmp_path):
    corpus = write_text(tmp_path, TEXT * 8)
    grid = [sys.executable, "-m", "ffnlab.cli.main", "ablate", "--data", corpus, "--ffn", "gelu,swiglu",
            "--mult", "1,2", "--seeds", "1", "--steps", "4", "--batch", "2", "--seq-len", "16", "--eval-every", "2",
            "--eval-batches", "1", "--d-model", "16", "--n-layer", "1", "--n-head", "2", "--warmup", "1",
            "--ckpt-every", "4", "-t", "1"]
    here = subprocess.run(grid + ["--out", str(tmp_path / "here")], capture_output=True, text=True, timeout=600)
    there = subprocess.run(grid + ["--out", str(tmp_path / "there"), "--ray", node.address], capture_output=True,
                           text=True, timeout=600)
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert sweep_table(tmp_path / "here") == sweep_table(tmp_path / "there")
