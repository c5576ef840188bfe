"""One execution layer for every long job: deterministic work units, atomic per-unit results,
a merge in unit order, resume, and a choice of where the units run.

    units   = [Unit("shard-00000", payload, tokens), ...]      # made by the command, in a fixed order
    task    = Task(model, fn, params)                          # what one worker does with one unit
    outcome = execute(task, units, merge, out="OUT", backend=InProcess())

A unit's result is a dict of NumPy arrays and JSON values. It is written to OUT/units/ID/ as
result.json + NAME.npy into a temporary folder that is renamed into place when complete, so a
killed run leaves either a whole result or none. Rerunning the same command with the same OUT
loads the finished units and computes only the others. OUT/job.json records the command and
its arguments; an OUT written by another command or other arguments is refused, never mixed.

The merge is a fold in the units' order (sorted by id), applied to the longest finished prefix as
results arrive: whatever order the units finish in, the merged value is the one a single
sequential pass computes, and the driver holds only the results that wait for an earlier unit.

Backends: InProcess (the default: the model loaded once, units one after another, no Ray import)
and runtime/ray_backend.py's RayBackend (`--ray ADDRESS`). Results on disk are JSON and .npy read
with allow_pickle=False: nothing is unpickled from a file.
"""
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError

JOB_FILE = "job.json"


@dataclass(frozen=True)
class Unit:
    id: str             # sortable, stable across runs: "shard-00003", "run-kinds=swiglu-w=64-s=1"
    payload: object     # what the task's fn receives (arrays, dicts, strings)
    tokens: int = 0     # tokens this unit evaluates (progress rate); 0 = count units only


@dataclass(frozen=True)
class ModelSpec:
    """How a worker loads the model: load_model's arguments, resolved to paths on the driver."""
    path: str
    lora: str = None
    lora_scale: float = 1.0
    arith: str = "f32"

    @classmethod
    def from_args(cls, args):
        from ..formats.installed import resolve_model
        return cls(resolve_model(args.model), getattr(args, "lora", None), getattr(args, "lora_scale", 1.0),
                   getattr(args, "arith", "f32"))

    def load(self, path=None, lora=None):
        """-> Model; path / lora: local copies of the files (a Ray worker's, shipped from the driver)."""
        from ..formats.load import load
        return load(path or self.path, progress=False, lora=lora or self.lora, lora_scale=self.lora_scale,
                    arith=self.arith)


@dataclass(frozen=True)
class Task:
    """fn(model, params, payload) -> result dict, for each unit. fn is a module-level function so
    that a worker imports it by name (the worker needs ffnlab installed, nothing else)."""
    model: ModelSpec    # None: the units need no model (a training run loads or builds its own)
    fn: object
    params: dict = field(default_factory=dict)


@dataclass
class Outcome:
    merged: object              # the merge's final value (None when a unit failed)
    done: int                   # units with a result, this run or an earlier one
    resumed: int                # of those, found in OUT and not recomputed
    failures: list              # [(unit id, one-line reason)], in unit order
    retried: int                # units sent again after their worker was lost
    seconds: float
    tokens: int                 # tokens evaluated this run (resumed units not counted)

    def summary(self, total):
        return {"units": total, "done": self.done, "resumed": self.resumed, "failed": len(self.failures),
                "retried": self.retried, "seconds": round(self.seconds, 3),
                "tokens_per_s": round(self.tokens / self.seconds, 1) if self.seconds > 0 else None,
                "failures": [{"unit": u, "error": m} for u, m in self.failures]}


# --- results on disk -------------------------------------------------------------------------
def write_result(folder, unit_id, result):
    """result: {name: ndarray | JSON value} -> folder/unit_id/ (result.json + name.npy), atomically:
    written into a temporary sibling, then renamed."""
    final = os.path.join(folder, unit_id)
    tmp = os.path.join(folder, f".{unit_id}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    plain = {}
    for name, v in result.items():
        if isinstance(v, np.ndarray):
            np.save(os.path.join(tmp, f"{name}.npy"), v, allow_pickle=False)
        else:
            plain[name] = v
    with open(os.path.join(tmp, "result.json"), "w", encoding="utf-8") as f:
        json.dump(plain, f)          # floats as repr: they read back bit for bit
    try:
        os.rename(tmp, final)
    except OSError:                  # another worker finished the same unit first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def read_result(folder, unit_id):
    d = os.path.join(folder, unit_id)
    with open(os.path.join(d, "result.json"), encoding="utf-8") as f:
        result = json.load(f)
    for name in sorted(os.listdir(d)):
        if name.endswith(".npy"):
            result[name[:-4]] = np.load(os.path.join(d, name), allow_pickle=False)
    return result


class OutputDir:
    """OUT/job.json (the command and its arguments) and OUT/units/ID/ (one finished unit each)."""

    def __init__(self, path, command, key, unit_ids, flag="--out"):
        """flag: the option that named path, for the messages"""
        self.path, self.units = path, os.path.join(path, "units")
        want = {"command": command, "arguments": key, "units": list(unit_ids)}
        job = os.path.join(path, JOB_FILE)
        if os.path.exists(job):
            try:
                with open(job, encoding="utf-8") as f:
                    have = json.load(f)
            except (OSError, ValueError) as e:
                raise UsageError(f"{job}: not an ffnlab job file ({e}); give another {flag}") from None
            if have.get("command") != command:
                raise UsageError(f"{path}: written by `ffnlab {have.get('command')}`, not `ffnlab {command}`; "
                                 f"give another {flag}")
            have.pop("ffnlab", None)                   # the version that wrote it: informative only
            if have != want:
                diff = [k for k in sorted(set(key) | set(have.get("arguments") or {}))
                        if key.get(k) != (have.get("arguments") or {}).get(k)] or ["units"]
                raise UsageError(f"{path}: written by `ffnlab {command}` with other arguments ({', '.join(diff)}); "
                                 f"give another {flag} or remove it")
        elif os.path.exists(path) and os.listdir(path):
            raise UsageError(f"{path}: exists and holds no {JOB_FILE}; give an empty or new {flag}")
        else:
            os.makedirs(path, exist_ok=True)
            with open(job + ".tmp", "w", encoding="utf-8") as f:
                json.dump({"ffnlab": _version(), **want}, f, indent=1)
            os.replace(job + ".tmp", job)
            want = None
        os.makedirs(self.units, exist_ok=True)

    def finished(self, unit_id):
        return os.path.isfile(os.path.join(self.units, unit_id, "result.json"))

    def read(self, unit_id):
        return read_result(self.units, unit_id)

    def write(self, unit_id, result):
        write_result(self.units, unit_id, result)


def _version():
    from .. import __version__
    return __version__


# --- progress on the driver --------------------------------------------------------------------
class UnitProgress:
    """One updating line: units done / total, tokens/s, ETA, retried, failed (tqdm, on a terminal;
    silent otherwise, where the command's own output is what a log wants)."""

    def __init__(self, total, label, enabled=None):
        self.bar = None
        if enabled if enabled is not None else sys.stderr.isatty():
            from tqdm import tqdm
            self.bar = tqdm(total=total, desc=label, unit="unit", leave=True, file=sys.stderr, dynamic_ncols=True)
        self.t0, self.tokens = time.perf_counter(), 0

    def update(self, tokens, retried, failed, n=1):
        self.tokens += tokens
        if self.bar is not None:
            dt = time.perf_counter() - self.t0
            self.bar.set_postfix_str(f"{self.tokens / dt if dt > 0 else 0:.0f} tok/s retried {retried} failed {failed}",
                                     refresh=False)
            self.bar.update(n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


# --- where the units run -----------------------------------------------------------------------
class InProcess:
    """The default: this process loads the model once and runs the units in order. No Ray."""
    name = "in-process"

    def __init__(self):
        self.model = None

    def run(self, task, units, on_result, on_failure, on_retry):
        """on_result(unit, result) / on_failure(unit, reason) for each unit, in order (on_retry():
        a unit sent again; a process that runs them all never loses one)."""
        for u in units:
            try:
                if task.model is not None and self.model is None:
                    self.model = task.model.load()
                result = task.fn(self.model, task.params, u.payload)
            except Exception as e:                     # one unit's failure does not stop the others
                on_failure(u, one_line(e))
                continue
            on_result(u, result)

    def close(self):
        pass


def one_line(e):
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if isinstance(e, UsageError) or type(e).__module__.startswith("ffnlab") else f"{type(e).__name__}: {msg}"


def execute(task, units, merge, init=None, out=None, backend=None, label="", on_merged=None, progress=None,
            on_unit=None):
    """Runs `task` over `units` -> Outcome. merge(acc, result) -> acc is folded over the results in
    unit order starting from init; on_merged(n merged, acc) after each step (a running figure);
    on_unit(unit, result) as each unit lands, in completion order (files a unit produced).
    out: an OutputDir (resume and atomic results) or None (results kept in memory only)."""
    ids = [u.id for u in units]
    if ids != sorted(ids) or len(set(ids)) != len(ids):
        raise ValueError("unit ids must be unique and given in sorted order")
    backend = backend or InProcess()
    waiting, failures = {}, {}
    state = {"acc": init, "next": 0}
    bar = UnitProgress(len(units), label, progress)
    t0 = time.perf_counter()

    def advance():
        while state["next"] < len(units) and units[state["next"]].id in waiting:
            result = waiting.pop(units[state["next"]].id)
            state["acc"] = merge(state["acc"], result)
            state["next"] += 1
            if on_merged is not None:
                on_merged(state["next"], state["acc"])

    todo, resumed = [], 0
    for u in units:
        if out is not None and out.finished(u.id):
            waiting[u.id] = out.read(u.id)
            resumed += 1
        else:
            todo.append(u)
    advance()
    if resumed:
        bar.update(0, 0, 0, n=resumed)
    counters = {"tokens": 0, "retried": 0}

    def on_result(u, result):
        if out is not None:
            out.write(u.id, result)
            result = out.read(u.id)                    # merge what a resumed run would read: one path
        if on_unit is not None:
            on_unit(u, result)
        waiting[u.id] = result
        counters["tokens"] += u.tokens
        bar.update(u.tokens, counters["retried"], len(failures))
        advance()

    def on_failure(u, reason):
        failures[u.id] = reason
        bar.update(0, counters["retried"], len(failures))

    def on_retry():
        counters["retried"] += 1

    try:
        backend.run(task, todo, on_result, on_failure, on_retry)
    finally:
        bar.close()
        backend.close()
    dt = time.perf_counter() - t0
    done = len(units) - len(failures)
    return Outcome(merged=state["acc"] if not failures else None, done=done, resumed=resumed,
                   failures=sorted(failures.items()), retried=counters["retried"], seconds=dt,
                   tokens=counters["tokens"])


def report_failures(outcome, total, stream=None):
    """One line per failed unit, and one that says how many: -> the exit code (0 or 1)."""
    stream = stream or sys.stderr
    for uid, reason in outcome.failures:
        print(f"unit {uid} failed: {reason}", file=stream)
    if outcome.failures:
        print(f"{len(outcome.failures)} of {total} units failed, the others are done; rerun the same command "
              f"with the same --out to compute only the failed ones", file=stream)
        return 1
    return 0


def shard_ranges(n, size):
    """[0, n) -> [(start, stop)] of `size` items each (the last may be shorter)."""
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def file_digest(path):
    """sha256 of a file: a job's identity includes its data, not only the data's name."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
