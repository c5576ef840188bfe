"""Scale-out figures for docs/scale-out.md: the executor in-process against Ray with 1 and 2
workers (nodes of 1 CPU each on 127.0.0.1, ray.cluster_utils), for perplexity and neurons over
SmolLM2 and a 6-run ablate grid; RSS per worker; and the per-unit costs a larger cluster's
throughput follows from (compute per unit, the driver's dispatch and merge per unit).

    python bench/bench_scale.py --tokens 100000      # the overhead floor's 100k-token corpus
    python bench/bench_scale.py --tokens 8192        # what a shared 2-core machine finishes in minutes

Every configuration runs once, 1 thread per worker; the load average is printed with the figures
(on a shared machine, 2 workers cannot get 2 idle cores: rerun the scaling on a quiet one). Under
each job come its per-unit costs -- a unit's compute inside the worker (wall and CPU time), the
first result's arrival less that compute (the start: actors, version check, model shipped and
loaded), units per worker, the driver's CPU per unit -- which tell the code's overhead from the
load's: a worker whose wall time per unit exceeds its CPU time was waiting for a core.
"""
import argparse
import json
import os
import sys
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"        # every Ray server on 127.0.0.1 (tests/engines/test_ray_cluster.py)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
os.environ["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src"), os.environ.get("PYTHONPATH", "")])

import numpy as np                                            # noqa: E402


def corpus(n_tokens, tok):
    """docs/data/calib.txt repeated until it holds n_tokens tokens -> ids [n_tokens]."""
    with open(os.path.join(ROOT, "docs", "data", "calib.txt"), encoding="utf-8") as f:
        base = np.array(tok.encode(f.read(), add_bos=False), dtype=np.int64)
    return np.resize(base, n_tokens)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def timed_unit(fn):
    """fn -> the same unit function, its result carrying the unit's compute time (wall and this
    process's CPU) and the worker's pid: the per-unit costs beside the job's time."""
    def run(model, params, payload):
        import os
        import time
        t0, c0 = time.perf_counter(), os.times()
        result = fn(model, params, payload)
        c1 = os.times()
        return {**result, "bench_wall": time.perf_counter() - t0, "bench_cpu": c1.user + c1.system - c0.user - c0.system,
                "bench_pid": os.getpid()}
    return run


def run_job(spec, fn, params, units, merge, init, backend):
    """-> (Outcome, costs): costs = the first result's time, per-unit compute medians, units per worker,
    the driver's CPU seconds per unit, the load average before and after."""
    from ffnlab.runtime.executor import Task, execute
    landed, t0, c0, load0 = [], time.perf_counter(), time.process_time(), os.getloadavg()[0]
    o = execute(Task(spec, timed_unit(fn), params), units, merge, init, backend=backend, progress=False,
                on_unit=lambda u, r: landed.append((time.perf_counter() - t0, float(r["bench_wall"]),
                                                    float(r["bench_cpu"]), int(r["bench_pid"]))))
    pids = [p for _, _, _, p in landed]
    first = landed[0]
    costs = {"first_result_s": first[0], "startup_s": first[0] - first[1],
             "unit_wall_s": float(np.median([w for _, w, _, _ in landed])),
             "unit_cpu_s": float(np.median([c for _, _, c, _ in landed])),
             "units_per_worker": sorted(pids.count(p) for p in set(pids)),
             "driver_cpu_s_per_unit": (time.process_time() - c0) / len(units),
             "load": [round(load0, 2), round(os.getloadavg()[0], 2)]}
    return o, costs


def run_corpus_jobs(model, spec, ids, backend_for, ctx, batch, jobs=("perplexity", "neurons")):
    """-> ({name: (seconds, tokens, merged figure, costs)}, worker infos) for perplexity and neurons on one
    backend. Every configuration loads the model inside its time: a Ray worker after its start, the
    in-process backend before its first unit."""
    from ffnlab.evaluation import DEFAULT_MIN_CONTEXT
    from ffnlab.evaluation.activations import context_windows
    from ffnlab.evaluation.perplexity import RunningNLL, make_chunks
    from ffnlab.evaluation.shards import (NeuronAccumulator, neuron_merge, neuron_shard, neuron_units, perplexity_merge,
                                       perplexity_shard, perplexity_units)

    chunks = make_chunks(ids, ctx)
    out, infos = {}, []
    if "perplexity" in jobs:
        b = backend_for()
        o, costs = run_job(spec, perplexity_shard, {"batch": batch}, perplexity_units(chunks, 4 * batch),
                           perplexity_merge, (RunningNLL(), 0), b)
        out["perplexity"] = (o.seconds, o.tokens, o.merged[0].sum, costs)
        infos += getattr(b, "worker_info", lambda: [])()
    if "neurons" not in jobs:
        return out, infos
    cw = context_windows(ids, ctx, DEFAULT_MIN_CONTEXT)
    d_ff = model.config.d_ff
    params = {"layer": 10, "k": 5, "bins": 64, "batch": batch}
    b = backend_for()
    o, costs = run_job(spec, neuron_shard, params, neuron_units(cw, 4 * batch), neuron_merge,
                       NeuronAccumulator(d_ff, 5, 64), b)
    out["neurons"] = (o.seconds, o.tokens, float(o.merged.stats.sum_abs.sum()), costs)
    infos += getattr(b, "worker_info", lambda: [])()
    return out, infos


def ablate_grid(data, out, ray_address=None):
    """A 6-run grid (gelu, swiglu, geglu x 1 width x 2 seeds) -> seconds."""
    import subprocess
    args = [sys.executable, "-m", "ffnlab.cli.main", "ablate", "--data", data, "--out", out, "--ffn", "gelu,swiglu,geglu",
            "--mult", "2", "--seeds", "2", "--steps", "30", "--batch", "8", "--seq-len", "64", "--eval-every", "30",
            "--eval-batches", "2", "--warmup", "3", "--ckpt-every", "30", "-t", "1"]
    if ray_address:
        args += ["--ray", ray_address, "--workers", "1"]
    t0 = time.perf_counter()
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(r.stderr)
    return time.perf_counter() - t0


def driver_costs(address, n_units=200):
    """The driver's cost per unit with no compute: a no-op unit's round trip through the actors, and a
    merge of one SmolLM2-sized neuron shard."""
    from ffnlab.runtime.executor import Task, Unit, execute
    from ffnlab.runtime.ray_backend import RayBackend
    units = [Unit(f"u-{i:05d}", i) for i in range(n_units)]
    o = execute(Task(None, noop), units, lambda acc, r: acc + 1, 0, backend=RayBackend.connect(address), progress=False)
    return o.seconds / n_units


def noop(_model, _params, payload):
    return {"i": payload}


def merge_cost(d_ff=1536, k=5, bins=64, n_batch=4, repeats=20):
    """Seconds to merge one neuron shard ([d_ff] sums, top-k, histogram) into the accumulator."""
    from ffnlab.evaluation.shards import NeuronAccumulator, neuron_merge
    r = np.random.default_rng(0)
    shard = {"top_score": r.random((d_ff, k)), "top_value": r.random((d_ff, k)).astype(np.float32),
             "top_pos": r.integers(0, 10 ** 6, (d_ff, k)), "top_ctx": r.random((d_ff, k, 17)).astype(np.float32),
             "n": np.full(n_batch, 512), "sum_abs": r.random((n_batch, d_ff)), "sum": r.random((n_batch, d_ff)),
             "sum2": r.random((n_batch, d_ff)), "min": -r.random(d_ff), "max": r.random(d_ff),
             "hist_R": np.full(d_ff, 4.0), "hist_counts": r.integers(0, 100, (d_ff, bins)).astype(np.uint16),
             "windows": 16}
    acc = NeuronAccumulator(d_ff, k, bins)
    t0 = time.perf_counter()
    for _ in range(repeats):
        acc = neuron_merge(acc, shard)
    return (time.perf_counter() - t0) / repeats


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=100_000, help="corpus size in tokens (default 100000)")
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--skip-ablate", action="store_true")
    ap.add_argument("--jobs", default="perplexity,neurons", help="corpus jobs to run (default perplexity,neurons)")
    ap.add_argument("--json", metavar="OUT.json", help="also write the figures here")
    a = ap.parse_args()

    from machine import cpu_model
    from ffnlab.formats.load import default_model_path
    from ffnlab.runtime.executor import InProcess, ModelSpec
    from ffnlab.runtime.ray_backend import RayBackend
    from ffnlab.threads import set_threads
    from ray.cluster_utils import Cluster

    set_threads(1)
    spec = ModelSpec(default_model_path())
    model = spec.load()
    ids = corpus(a.tokens, model.tokenizer)
    load0 = os.getloadavg()[0]
    fig = {"cpu": cpu_model(), "tokens": a.tokens, "load_before": round(load0, 2)}

    def in_process():
        return InProcess()                                    # loads the model before its first unit, in the time

    jobs = a.jobs.split(",")
    fig["in_process"], _ = run_corpus_jobs(model, spec, ids, in_process, a.ctx, a.batch, jobs)
    c = Cluster(initialize_head=True, connect=False, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        fig["ray_1"], infos1 = run_corpus_jobs(model, spec, ids, lambda: RayBackend.connect(c.address, 1), a.ctx, a.batch,
                                                  jobs)
        c.add_node(num_cpus=1)
        c.wait_for_nodes()
        fig["ray_2"], infos2 = run_corpus_jobs(model, spec, ids, lambda: RayBackend.connect(c.address), a.ctx, a.batch, jobs)
        fig["rss_mib_per_worker"] = sorted({round(i["rss_mib"]) for i in infos1 + infos2})
        fig["dispatch_s_per_unit"] = driver_costs(c.address)
        if not a.skip_ablate:
            import tempfile
            with tempfile.TemporaryDirectory() as tmp:
                data = os.path.join(ROOT, "docs", "data", "calib.txt")
                fig["ablate_in_process_s"] = ablate_grid(data, os.path.join(tmp, "a"))
                fig["ablate_ray_1_s"] = ablate_grid(data, os.path.join(tmp, "b"), c.address)
    finally:
        c.shutdown()
    fig["merge_s_per_neuron_shard"] = merge_cost()
    fig["load_after"] = round(os.getloadavg()[0], 2)

    print(f"{fig['cpu']}; {a.tokens} tokens of docs/data/calib.txt, ctx {a.ctx}, batch {a.batch}, 1 thread per worker; "
          f"load average {fig['load_before']} before, {fig['load_after']} after")
    for job in jobs:
        s0, n0, v0, _ = fig["in_process"][job]
        s1, n1, v1, _ = fig["ray_1"][job]
        s2, n2, v2, _ = fig["ray_2"][job]
        print(f"{job:10s} in-process {n0 / s0:7.1f} tok/s | ray 1 worker {n1 / s1:7.1f} tok/s ({s1 / s0:.3f}x the time) | "
              f"ray 2 workers {n2 / s2:7.1f} tok/s ({(n2 / s2) / (n1 / s1):.2f}x 1 worker) | merged figures equal: "
              f"{v0 == v1 == v2}")
        for name in ("in_process", "ray_1", "ray_2"):
            s, _, _, c = fig[name][job]
            print(f"    {name:10s} {s:7.1f} s: first result at {c['first_result_s']:.1f} s (start {c['startup_s']:.1f} s), "
                  f"per unit {c['unit_wall_s']:.2f} s ({c['unit_cpu_s']:.2f} s CPU), units per worker "
                  f"{c['units_per_worker']}, driver {c['driver_cpu_s_per_unit'] * 1e3:.0f} ms CPU per unit, "
                  f"load {c['load'][0]} -> {c['load'][1]}")
    if "ablate_in_process_s" in fig:
        print(f"ablate 6 runs: in-process {fig['ablate_in_process_s']:.1f} s, ray 1 worker {fig['ablate_ray_1_s']:.1f} s "
              f"({fig['ablate_ray_1_s'] / fig['ablate_in_process_s']:.3f}x)")
    print(f"peak RSS per worker: {fig['rss_mib_per_worker']} MiB; driver: {fig['dispatch_s_per_unit'] * 1e3:.2f} ms "
          f"dispatch per unit, {fig['merge_s_per_neuron_shard'] * 1e3:.2f} ms merge per neuron shard")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(fig, f, indent=1)


if __name__ == "__main__":
    main()
