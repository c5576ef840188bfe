"""The flags of the commands whose work runs as units (runtime/executor.py), and their reading.

    --ray [ADDRESS]   run the units on a Ray cluster: what ray.init takes (auto, HOST:PORT,
                      ray://HOST:10001), `local` for a new local instance on 127.0.0.1; the flag
                      alone follows Ray's own rule (RAY_ADDRESS, else the cluster `ray start` made)
    --out DIR         keep each unit's result in DIR as it finishes; the same command with the same
                      DIR resumes, computing only the units DIR lacks
    --shard N         items (chunks, windows) per unit
Nothing here imports Ray: runtime/ray_backend.py does, when --ray is given.
"""
import json
import sys

from .common import needs, positive, refuse_together


def add_scale_arguments(p, items, default_help):
    """--ray, --workers, --out, --shard for a command whose units are runs of `items`."""
    add_ray_arguments(p)
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write each unit's result into DIR as it finishes; rerunning the same command with the same "
                        "DIR computes only the units it lacks")
    p.add_argument("--shard", type=positive("--shard"), default=None, metavar="N",
                   help=f"{items} per work unit ({default_help})")


def add_ray_arguments(p):
    """--ray [ADDRESS] and --workers N."""
    p.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="run the work units on a Ray cluster (pip install ffnlab[ray]): auto, HOST:PORT, "
                        "ray://HOST:10001, or local (a new instance on 127.0.0.1); the flag alone uses RAY_ADDRESS "
                        "or the cluster `ray start` made (docs/scale-out.md)")
    p.add_argument("--workers", type=positive("--workers"), default=None, metavar="N",
                   help="with --ray: at most N workers, each holding the model (default: one per node with all its "
                        "CPUs as threads; with -t T, CPUs // T per node of T threads each)")
    needs(p, "--workers", "--ray", "the in-process default is one worker")


def add_prompts_arguments(p, lines, kept, single, own):
    """--prompts FILE.jsonl (lines: its help), --results DIR (kept: what it keeps of each line), --ray, --workers:
    the dataset form of a command whose single form (`single`, e.g. "prompt") takes the flags `own`."""
    p.add_argument("--prompts", metavar="FILE.jsonl", default=None, help=lines)
    p.add_argument("--results", metavar="DIR", default=None,
                   help=f"with --prompts: keep each {kept} in DIR as it finishes; the same command resumes it")
    add_ray_arguments(p)
    for flag in own:
        refuse_together(p, flag, "--prompts", "each line of --prompts gives its own")
    needs(p, "--results", "--prompts", f"a single {single} is one unit")


def largest(g):
    """-> (row, column) of g's largest value (a list of rows), NaN passed over"""
    return max(((i, j) for i in range(len(g)) for j in range(len(g[0])) if g[i][j] == g[i][j]),
               key=lambda ij: g[ij[0]][ij[1]])


def backend(args, model=None):
    """--ray -> a RayBackend; otherwise the in-process default (reusing the driver's model)."""
    if args.ray is None:
        from ..runtime.executor import InProcess
        b = InProcess()
        b.model = model
        return b
    from ..runtime.ray_backend import RayBackend
    threads = getattr(args, "threads", None)                  # -t N: each worker N threads, CPUs // N per node
    return RayBackend.connect(args.ray or None, args.workers, threads if threads and threads > 0 else None)


def output_dir(args, command, key, units):
    if args.out is None:
        return None
    from ..runtime.executor import OutputDir
    return OutputDir(args.out, command, json.loads(json.dumps(key)), [u.id for u in units])


def finish(outcome, n_units, stream=None):
    """One line per failed unit and the exit code; --json's summary dict."""
    from ..runtime.executor import report_failures
    return report_failures(outcome, n_units, stream or sys.stderr), outcome.summary(n_units)


def run_prompts(args, command, unit_fn, params, png, average, key):
    """--prompts FILE.jsonl as work units (interventions/datasets.py), kept in --results DIR if given
    -> (exit code, or None where the command goes on to draw png, --out's figure; the per-line results in
    line order; average(results)). --json prints {"prompts", key: the average, "executor"} instead."""
    if not args.json:
        from ..pictures import check_png
        check_png(png, "--out")                        # before the work, not after it
    from ..interventions.datasets import prompt_units, read_prompt_lines
    from ..runtime.executor import ModelSpec, OutputDir, Task, execute, file_digest
    from .common import load_model
    units = prompt_units(read_prompt_lines(args.prompts))
    spec = ModelSpec.from_args(args)
    params = {"path": args.prompts, **params}
    out = None
    if args.results is not None:
        out = OutputDir(args.results, command, {"model": spec.path, "arith": spec.arith,
                                                "prompts": file_digest(args.prompts), **params}, [u.id for u in units],
                        "--results")
    where = backend(args, load_model(args, quiet=True) if args.ray is None else None)
    outcome = execute(Task(spec, unit_fn, params), units, lambda acc, r: acc + [r], [], out=out, backend=where,
                      label=command)
    code, summary = finish(outcome, len(units))
    if code:
        return code, None, None
    avg = average(outcome.merged)
    if args.json:
        print(json.dumps({"prompts": outcome.merged, key: avg, "executor": summary}))
        return 0, None, None
    return None, outcome.merged, avg
