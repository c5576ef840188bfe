"""The Ray backend on a real two-node cluster on 127.0.0.1 (a head and a second node, 1 CPU each):
the same figures as the in-process single pass for 1 and 2 workers, a killed node's units retried
elsewhere, a killed driver resumed from --out, a raising unit reported alone.

The nodes are separate raylets started by ray.cluster_utils.Cluster -- Ray's own way to run several
nodes on one machine. `ray start --node-ip-address=127.0.0.1` rewrites 127.0.0.1 to the machine's
network address and binds there, and refuses a second node when told to stay local
(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0); the Cluster, with that variable set, keeps every server of
both nodes on 127.0.0.1 (test_cluster_listens_on_loopback_only checks). The fixture stops the
cluster when the tests end, pass or fail.
"""
import json
import os
import signal
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"     # read when Ray is imported: every address is 127.0.0.1
ray = pytest.importorskip("ray", reason="Ray is an optional extra: pip install ffnlab[ray]")

from mlp_models import TEXT, smollm2, sweep_table, tiny_gguf, write_text   # noqa: E402

pytestmark = pytest.mark.slow
SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "src")


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster
    os.environ["PYTHONPATH"] = os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])   # the workers' ffnlab
    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        c.second = c.add_node(num_cpus=1)
        c.wait_for_nodes()
        yield c
    finally:
        c.shutdown()


def one_thread(fn):
    """fn() on one thread, as a worker of these 1-CPU nodes runs: a float32 model's products are OpenBLAS's,
    whose bits can depend on the threads a product is split over (its Haswell kernels, on AMD Zen)"""
    from ffnlab.threads import set_threads, threads
    n = threads()
    set_threads(1)
    try:
        return fn()
    finally:
        set_threads(n)


def ffnlab(*args, timeout=600):
    """The CLI in a subprocess (the driver), -> CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "ffnlab.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout)


def perplexity_args(model, data, *more):
    return ["perplexity", "-m", model, "--data", data, "--json", *more]


def figures(stdout):
    r = json.loads(stdout)
    return r["nll"], r["ppl_stderr"], r["tokens_scored"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("corpus"), TEXT * 8)


def test_cluster_listens_on_loopback_only(cluster):
    if shutil.which("ss") is None:
        pytest.skip("ss (Debian's iproute2, which scripts/install.sh --test installs) is not on PATH")
    r = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, check=True)
    ours = [line.split()[3] for line in r.stdout.splitlines()[1:] if any(
        k in line for k in ("gcs_server", "raylet", "ray::"))]
    assert ours and all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for a in ours), ours


@pytest.mark.parametrize("workers", [["--workers", "1"], []], ids=["1-worker", "2-workers"])
def test_perplexity_on_the_cluster_equals_the_single_pass(cluster, corpus, workers):
    from ffnlab.evaluation.perplexity import perplexity, text_chunks
    import ffnlab as lab
    m = lab.load(tiny_gguf("bos"))
    want = one_thread(lambda: perplexity(m, text_chunks(m, TEXT * 8, 32), 2))
    r = ffnlab(*perplexity_args(tiny_gguf("bos"), corpus, "--ctx", "32", "--batch", "2", "--ray", cluster.address, *workers))
    assert r.returncode == 0, r.stderr
    assert figures(r.stdout) == (want.nll, want.ppl_stderr, want.tokens_scored)


def test_neurons_on_the_cluster_equal_the_in_process_scan(cluster, corpus):
    args = ["neurons", "-m", tiny_gguf("bos"), "--layer", "1", "--data", corpus, "--ctx", "24", "--batch", "2",
            "--shard", "4", "--top", "4", "--json", "-t", "1"]
    here, there = ffnlab(*args), ffnlab(*args, "--ray", cluster.address)
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    a, b = json.loads(here.stdout), json.loads(there.stdout)
    assert a["units"] == b["units"] and a["n_tokens"] == b["n_tokens"]


def _wait_for_units(out, n, proc, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        d = os.path.join(out, "units")
        if os.path.isdir(d) and len([u for u in os.listdir(d) if not u.startswith(".")]) >= n:
            return
        if proc.poll() is not None:
            pytest.fail(f"the job ended before {n} units landed: {proc.stderr.read()}")
        time.sleep(0.2)
    pytest.fail(f"no {n} units in {out} after {timeout} s")


@pytest.fixture(scope="module")
def real_job(corpus):
    """SmolLM2 over the corpus, one chunk per unit: long enough to kill something in the middle."""
    model = smollm2().source
    r = ffnlab(*perplexity_args(model, corpus, "--ctx", "64", "--batch", "1", "--chunks", "16"))
    assert r.returncode == 0, r.stderr
    return model, figures(r.stdout)


def test_killed_driver_resumes_from_out_with_the_same_figure(cluster, corpus, real_job, tmp_path):
    model, want = real_job
    out = str(tmp_path / "out")
    args = perplexity_args(model, corpus, "--ctx", "64", "--batch", "1", "--chunks", "16", "--ray", cluster.address,
                           "--out", out)
    p = subprocess.Popen([sys.executable, "-m", "ffnlab.cli.main", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _wait_for_units(out, 3, p)
    p.send_signal(signal.SIGKILL)
    p.wait()
    landed = len([u for u in os.listdir(os.path.join(out, "units")) if not u.startswith(".")])
    assert landed < 16
    r = ffnlab(*args)
    assert r.returncode == 0, r.stderr
    assert figures(r.stdout) == want
    assert json.loads(r.stdout)["executor"]["resumed"] >= landed


def test_killed_node_units_finish_elsewhere_with_the_same_figure(cluster, corpus, real_job, tmp_path):
    model, want = real_job
    out = str(tmp_path / "out")
    p = subprocess.Popen([sys.executable, "-m", "ffnlab.cli.main",
                          *perplexity_args(model, corpus, "--ctx", "64", "--batch", "1", "--chunks", "16",
                                           "--ray", cluster.address, "--out", out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_units(out, 2, p)
    cluster.remove_node(cluster.second, allow_graceful=False)      # the second node's processes, killed
    try:
        stdout, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
        assert figures(stdout) == want
        assert json.loads(stdout)["executor"]["retried"] >= 1
    finally:
        cluster.second = cluster.add_node(num_cpus=1)               # the next test has two nodes again
        cluster.wait_for_nodes()


def test_a_raising_unit_is_reported_alone_and_the_rest_complete(cluster):
    from ffnlab.evaluation.shards import perplexity_merge, perplexity_shard, perplexity_units
    from ffnlab.runtime.executor import ModelSpec, Task, execute, report_failures
    from ffnlab.runtime.ray_backend import RayBackend
    from ffnlab.evaluation.perplexity import RunningNLL
    import io
    chunks = np.arange(8 * 16).reshape(8, 16) % 200
    units = perplexity_units(chunks, 2)
    bad = units[2].payload.copy()
    bad[0, 3] = 10 ** 6                                               # a corrupt shard: a token id past the vocab
    units[2] = type(units[2])(units[2].id, bad, units[2].tokens)
    outcome = execute(Task(ModelSpec(tiny_gguf("f32")), perplexity_shard, {"batch": 2}), units, perplexity_merge,
                      (RunningNLL(), 0), backend=RayBackend.connect(cluster.address))
    assert [u for u, _ in outcome.failures] == [units[2].id] and outcome.done == len(units) - 1
    err = io.StringIO()
    assert report_failures(outcome, len(units), err) == 1
    lines = err.getvalue().splitlines()
    assert lines[0].startswith(f"unit {units[2].id} failed: ") and "\n" not in lines[0]


def test_an_address_nothing_listens_on_is_one_line_within_30_s(tmp_path):
    data = write_text(tmp_path, TEXT)
    t0 = time.time()
    r = ffnlab(*perplexity_args(tiny_gguf("bos"), data, "--ctx", "32", "--ray", "127.0.0.1:1"), timeout=60)
    assert time.time() - t0 < 30
    assert r.returncode == 1
    err = r.stderr.strip().splitlines()
    assert len(err) == 2 and "--ray 127.0.0.1:1: nothing answers at 127.0.0.1:1" in err[-1]   # after the chunk line


def test_ray_local_listens_on_loopback_only(tmp_path):
    if shutil.which("ss") is None:
        pytest.skip("ss (Debian's iproute2, which scripts/install.sh --test installs) is not on PATH")
    data = write_text(tmp_path, TEXT * 4)
    p = subprocess.Popen([sys.executable, "-m", "ffnlab.cli.main",
                          *perplexity_args(tiny_gguf("bos"), data, "--ctx", "32", "--batch", "1", "--ray", "local")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = set()
    while p.poll() is None:                                          # every listening socket of the instance, while it runs
        out = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True).stdout
        seen |= {line.split()[3] for line in out.splitlines()[1:] if any(k in line for k in ("gcs_server", "raylet", "ray::"))}
        time.sleep(0.5)
    assert p.returncode == 0, p.stderr.read()
    assert seen and all(a.startswith(("127.0.0.1:", "[::ffff:127.0.0.1]:")) for a in seen), seen


def test_ablate_grid_on_the_cluster_gives_the_same_sweep_table(cluster, corpus, tmp_path):
    grid = ["ablate", "--data", corpus, "--ffn", "gelu,swiglu", "--mult", "1,2", "--seeds", "1", "--steps", "4",
            "--batch", "2", "--seq-len", "16", "--eval-every", "2", "--eval-batches", "1", "--d-model", "16",
            "--n-layer", "1", "--n-head", "2", "--warmup", "1", "--ckpt-every", "4"]
    here = ffnlab(*grid, "--out", str(tmp_path / "here"))
    there = ffnlab(*grid, "--out", str(tmp_path / "there"), "--ray", cluster.address)
    assert here.returncode == 0 and there.returncode == 0, there.stderr
    assert sweep_table(tmp_path / "here") == sweep_table(tmp_path / "there")


def test_a_node_with_another_ffnlab_version_is_refused_in_one_line_naming_it(cluster, corpus, tmp_path):
    import shutil
    other = tmp_path / "other"
    shutil.copytree(os.path.join(SRC, "ffnlab"), other / "ffnlab", ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "ffnlab" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', '__version__ = "0.0.0+other-', 1))
    node = cluster.add_node(num_cpus=1, env_vars={"PYTHONPATH": str(other)})   # its workers import that copy
    try:
        cluster.wait_for_nodes()
        r = ffnlab(*perplexity_args(tiny_gguf("bos"), corpus, "--ctx", "32", "--ray", cluster.address))
        assert r.returncode == 1
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("ffnlab perplexity: error: node "), r.stderr
        assert "ffnlab 0.0.0+other-" in last and "is installed there, the driver runs" in last
        assert f"node 127.0.0.1 ({node.node_id[:8]})" in last
    finally:
        cluster.remove_node(node)


def test_a_node_without_ffnlab_is_refused_in_one_line_naming_it(cluster, corpus, tmp_path):
    # the node's workers find, first on their path, a package that cannot be imported: as where ffnlab is missing
    missing = tmp_path / "missing" / "ffnlab"
    missing.mkdir(parents=True)
    (missing / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'ffnlab\'", name="ffnlab")\n')
    node = cluster.add_node(num_cpus=1, env_vars={"PYTHONPATH": str(missing.parent)})
    try:
        cluster.wait_for_nodes()
        r = ffnlab(*perplexity_args(tiny_gguf("bos"), corpus, "--ctx", "32", "--ray", cluster.address))
        assert r.returncode == 1
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith(f"ffnlab perplexity: error: node 127.0.0.1 ({node.node_id[:8]}): cannot start an "
                               f"ffnlab worker"), r.stderr
        version = __import__("ffnlab").__version__
        assert last.endswith(f"(ModuleNotFoundError: No module named 'ffnlab'); install ffnlab {version} there"), last
        assert len(r.stderr.strip().splitlines()) == 2, r.stderr      # the command's header line, then this one
    finally:
        cluster.remove_node(node)


def test_ray_flag_alone_follows_ray_address(cluster, corpus):
    from ffnlab.evaluation.perplexity import perplexity, text_chunks
    import ffnlab as lab
    m = lab.load(tiny_gguf("bos"))
    want = one_thread(lambda: perplexity(m, text_chunks(m, TEXT * 8, 32), 2))
    r = subprocess.run([sys.executable, "-m", "ffnlab.cli.main",
                        *perplexity_args(tiny_gguf("bos"), corpus, "--ctx", "32", "--batch", "2", "--ray")],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "RAY_ADDRESS": cluster.address})
    assert r.returncode == 0, r.stderr
    assert figures(r.stdout) == (want.nll, want.ppl_stderr, want.tokens_scored)


def test_prompt_datasets_on_the_cluster_equal_the_in_process_run(cluster, tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps(p) for p in [
        {"clean": "First Citizen: Before we", "corrupt": "First Soldier: Before we", "target": " ", "foil": "e"},
        {"clean": "All: Speak, speak.", "corrupt": "All: Speak, shout.", "target": "\n", "foil": " "}]) + "\n")
    facts = tmp_path / "facts.jsonl"
    facts.write_text("\n".join(json.dumps(p) for p in [
        {"prompt": "First Citizen: Before we", "subject": "Citizen"},
        {"prompt": "All: Speak, speak.", "subject": "Speak"}]) + "\n")
    for args in (["patch", "-m", tiny_gguf("f32"), "--prompts", str(pairs), "--json", "-t", "1"],
                 ["causal-trace", "-m", tiny_gguf("f32"), "--prompts", str(facts), "--samples", "2", "--window", "1",
                  "--json", "-t", "1"]):
        here, there = ffnlab(*args), ffnlab(*args, "--ray", cluster.address)
        assert here.returncode == 0 and there.returncode == 0, there.stderr
        mine, theirs = json.loads(here.stdout), json.loads(there.stdout)
        mine.pop("executor"), theirs.pop("executor")
        assert mine == theirs


def _run_files(out, run):
    """A run's trainer record, or its stopped.json: the numbers the table is made of."""
    d = os.path.join(out, "runs", run)
    name = "trainer.json" if os.path.isfile(os.path.join(d, "trainer.json")) else "stopped.json"
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return name, json.load(f)


def test_early_stop_stops_the_weak_config_and_the_finished_runs_equal_the_in_process_grid(cluster, tmp_path):
    # d_ff = 1 (mult 1/16 of d_model 16) is the grid's weak config: at the one rung, step 8, its val loss is the
    # highest of the three (checked below from the in-process runs). ASHA compares a run with those that reached
    # the rung before it, and the first to reach a rung always goes on; the trials start in the grid's order, two at
    # a time on the two 1-CPU nodes, so the weak run, third, starts only when one of the first two has passed the
    # rung: it meets at least one recorded loss, all lower than its own, and is stopped whatever the interleaving.
    data = os.path.join(os.path.dirname(SRC), "docs", "data", "calib.txt")
    grid = ["ablate", "--data", data, "--ffn", "gelu", "--mult", "4,2,0.0625", "--seeds", "1", "--steps", "16",
            "--batch", "2", "--seq-len", "16", "--eval-every", "4", "--eval-batches", "2", "--d-model", "16",
            "--n-layer", "1", "--n-head", "2", "--warmup", "1", "--ckpt-every", "16", "-t", "1"]
    runs, weak = ["gelu-x4-s0", "gelu-x2-s0", "gelu-x0.0625-s0"], "gelu-x0.0625-s0"
    here, there = str(tmp_path / "here"), str(tmp_path / "there")
    r = ffnlab(*grid, "--out", here)
    assert r.returncode == 0, r.stderr
    at_rung = {run: dict((e[0], e[2]) for e in _run_files(here, run)[1]["history"]["eval"])[8] for run in runs}
    assert max(at_rung, key=at_rung.get) == weak, at_rung                  # the premise

    r = ffnlab(*grid, "--out", there, "--ray", cluster.address, "--early-stop", "--grace-period", "8",
               "--reduction-factor", "2")
    assert r.returncode == 0, r.stderr
    assert f"stopped {weak} at step 8" in r.stdout and "| stopped |" in r.stdout
    name, stopped = _run_files(there, weak)
    assert name == "stopped.json" and stopped["step"] == 8 and stopped["scheduler"]["rungs"] == [8]
    history = _run_files(here, weak)[1]["history"]                         # its reports: the in-process run's prefix
    assert stopped["eval"] == history["eval"][:2] and stopped["train"] == history["train"][:8]
    finished = [run for run in runs if _run_files(there, run)[0] == "trainer.json"]
    assert finished and finished[0] in ("gelu-x4-s0", "gelu-x2-s0")       # the first at the rung always goes on
    for run in finished:                                                    # bit for bit: losses, curves, the finals
        mine, theirs = _run_files(here, run)[1], _run_files(there, run)[1]
        assert theirs["history"] == mine["history"] and theirs["final"] == mine["final"]
    rows = {row["variant"]: row for row in sweep_table(there)}
    assert rows["gelu-x0.0625"]["stopped"] == 1 and rows["gelu-x0.0625"]["per_seed"][0]["stopped_at"] == 8
    table_here = {row["variant"]: row for row in sweep_table(here)}
    for run in finished:
        v = run[:-3]
        assert rows[v]["val_loss_mean"] == table_here[v]["val_loss_mean"]

    again = ffnlab(*grid, "--out", there, "--ray", cluster.address, "--early-stop", "--grace-period", "8",
                   "--reduction-factor", "2")
    assert again.returncode == 0 and "3 already finished, 0 to train" in again.stdout, again.stderr
    other = ffnlab(*grid, "--out", there)                                    # stopped runs are not finished ones
    assert other.returncode == 1 and "--early-stop is off, was on" in other.stderr.strip().splitlines()[-1]


def _wait_until_every_cpu_is_taken(address, timeout=300):
    """Returns once the cluster has no free CPU (every trial placed), polling from a driver of its own."""
    code = ("import sys, time, ray\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR')\n"
            "end = time.time() + float(sys.argv[2])\n"
            "while ray.available_resources().get('CPU', 0) > 0 and time.time() < end:\n"
            "    time.sleep(0.2)\n"
            "print(ray.available_resources().get('CPU', 0))\n")
    r = subprocess.run([sys.executable, "-c", code, address, str(timeout)], capture_output=True, text=True,
                       timeout=timeout + 60)
    assert r.returncode == 0 and float(r.stdout.split()[-1]) == 0, r.stderr


def test_a_node_killed_during_tune_trials_restarts_its_trial_and_the_runs_equal_an_uninterrupted_one(cluster, tmp_path):
    # two runs of ~10 s each on an idle machine, one per 1-CPU node; no rung (--grace-period = --steps), so no
    # run is stopped whatever order the restarted run comes back in. The reference is the same grid under Tune
    # without a kill: on AMD EPYC (Zen 5, OpenBLAS's Haswell kernels) a Tune trial's evaluation losses at these
    # shapes differ from the in-process run's in the seventh digit, where Ray's tasks give its bits
    data = os.path.join(os.path.dirname(SRC), "docs", "data", "calib.txt")
    grid = ["ablate", "--data", data, "--ffn", "gelu", "--mult", "4,3", "--seeds", "1", "--steps", "3000",
            "--batch", "4", "--seq-len", "32", "--eval-every", "1000", "--eval-batches", "2", "--d-model", "32",
            "--n-layer", "2", "--n-head", "2", "--warmup", "1", "--ckpt-every", "3000", "-t", "1",
            "--ray", cluster.address, "--early-stop", "--grace-period", "3000"]
    runs = ["gelu-x4-s0", "gelu-x3-s0"]
    here, there = str(tmp_path / "here"), str(tmp_path / "there")
    r = ffnlab(*grid, "--out", here)
    assert r.returncode == 0, r.stderr
    assert "started again" not in r.stdout
    p = subprocess.Popen([sys.executable, "-m", "ffnlab.cli.main", *grid, "--out", there], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_every_cpu_is_taken(cluster.address)                  # both trials placed, one on each node
        time.sleep(1)
        cluster.remove_node(cluster.second, allow_graceful=False)        # the second node's trial, killed mid-run
        stdout, stderr = p.communicate(timeout=900)
        assert p.returncode == 0, stderr
        assert "1 started again after a lost worker" in stdout, stdout
        assert sum("starts again from its first step" in line for line in stdout.splitlines()) == 1, stdout
        for run in runs:                                                 # bit for bit: losses, curves, the finals
            name, theirs = _run_files(there, run)
            assert name == "trainer.json"
            mine = _run_files(here, run)[1]
            assert theirs["history"] == mine["history"] and theirs["final"] == mine["final"]
        assert sweep_table(there) == sweep_table(here)
    finally:
        if p.poll() is None:
            p.kill()
        cluster.second = cluster.add_node(num_cpus=1)                   # the next test has two nodes again
        cluster.wait_for_nodes()
