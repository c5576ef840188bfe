"""`ffnlab ablate --early-stop`: the grid's runs as Ray Tune trials under the ASHA scheduler
(asynchronous successive halving, Li et al. 2018, "A System for Massively Parallel Hyperparameter
Tuning"), which stops the runs whose validation loss is weak when they reach a rung.

    rungs           grace_period * reduction_factor^k steps, k = 0, 1, ... while below --steps
    a run           reports its val loss at each evaluation the trainer makes (--eval-every) before
                    its last step; at its first report at or past a rung it is compared with the
                    runs that reached that rung before it, and stopped there when it is worse than
                    their best 1/reduction_factor (the first run to reach a rung always goes on)
    a finished run  its folder (trainer record, checkpoint, train.log) is written to OUT/runs/<run>/
                    by a small actor on the driver's node, then the run reports `finished`
    a stopped run   the driver writes OUT/runs/<run>/stopped.json: the step, the evaluations and
                    train losses up to it, and the scheduler's settings

A trial trains with training/ablate.py run_one, the code a local run uses, so a finished run's
numbers equal the in-process grid's for the same seeds bit for bit. Which runs stop depends on the
order in which runs reach a rung; the trials start in the grid's order (docs/scale-out.md).
Tune's own state goes to a temporary folder that is removed afterwards: OUT holds only JSON and
the runs' own files, never Tune's pickles.
"""
import contextlib
import json
import logging
import math
import os
import shutil
import sys
import tempfile

from ..errors import UsageError
from .ablate import STOPPED_FILE, run_dir
from .checkpoint import atomic_write_json, read_trainer
from .grid import pack_run, run_id, write_run

try:
    import ray
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError:                                   # the optional extra (Ray with its Tune dependencies)
    ray = tune = None

DEFAULT_REDUCTION_FACTOR = 3        # keep the best third at each rung (Hyperband's eta = 3)
MAX_TRIAL_FAILURES = 2              # a trial whose worker died starts again, from its first step


def require_tune():
    if tune is None:
        raise UsageError("--early-stop needs Ray Tune, an optional extra: pip install 'ffnlab[ray]'")


def default_grace_period(steps, eval_every):
    """The first evaluation at or past a quarter of the run: a run is judged on a loss it has had
    time to lower, and there is room for a rung or two before the end."""
    quarter = max(1, math.ceil(steps / 4))
    return min(steps, math.ceil(quarter / eval_every) * eval_every)


def rungs(steps, grace_period, reduction_factor):
    """The steps at which runs are compared: grace_period * reduction_factor^k below steps."""
    out, t = [], float(grace_period)
    while t < steps:
        out.append(t)
        t *= reduction_factor
    return out


# --- on a worker ------------------------------------------------------------------------------
class RunSink:
    """On the driver's node: writes a finished run's files into OUT/runs/<run>/ (grid.py write_run)."""

    def __init__(self, out):
        self.out = out

    def write(self, result):
        write_run(self.out, result)


def tune_trial(config, specs, text, data, version, threads, sink):
    """One Tune trial: trains one run, reporting {step, val_loss, train_loss, train_losses} at each
    evaluation before the last step; when it finishes, sends its folder and reports `finished`."""
    from .. import __version__
    from ..threads import set_threads
    from .ablate import run_one
    if __version__ != version:
        raise UsageError(f"node {ray.util.get_node_ip_address()}: ffnlab {__version__} is installed there, the "
                         f"driver runs {version}; install the same version on every node")
    set_threads(threads)
    spec = specs[config["run"]]
    steps = spec["settings"]["steps"]
    work = tempfile.mkdtemp(prefix="ffnlab-run-", dir=os.getcwd())   # the trial's folder, which Ray cleans
    text_path, run = os.path.join(work, "data.txt"), os.path.join(work, "run")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text)
    os.makedirs(run)
    with open(os.path.join(run, "spec.json"), "w", encoding="utf-8") as f:
        json.dump({**spec, "data": data}, f)
    sent = [0]                                                        # train losses already reported

    def on_eval(step, train_loss, val_loss, history):
        if step < steps:                     # the last evaluation is reported with the run's files, below
            tune.report({"step": step, "val_loss": val_loss, "train_loss": train_loss,
                         "train_losses": history["train"][sent[0]:]})
            sent[0] = len(history["train"])

    run_one(os.path.join(run, "spec.json"), text_path=text_path, on_eval=on_eval)
    ray.get(sink.write.remote(pack_run(run, run_id(spec))))
    rec = read_trainer(run)
    final = (rec or {}).get("final") or {}
    shutil.rmtree(work, ignore_errors=True)
    tune.report({"step": steps, "val_loss": final.get("val_loss", float("nan")), "finished": True})


# --- on the driver ----------------------------------------------------------------------------
class _Reports(tune.Callback if tune is not None else object):
    """Tune's events on the driver: each run's evaluations as they arrive; at its end, `done` (its
    files are in OUT already) or `stopped` (stopped.json written here) or failed."""

    def __init__(self, out, specs, scheduler, log):
        self.out, self.specs, self.scheduler, self.log = out, specs, scheduler, log
        self.evals, self.train, self.failed, self.stopped, self.restarted = {}, {}, [], [], []

    def __getstate__(self):
        """Tune pickles its callbacks into its state folder (a temporary one here, never restored
        from): without the log, which holds the terminal."""
        return {k: v for k, v in self.__dict__.items() if k != "log"}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run = trial.config["run"]
        if result.get("finished"):
            return
        step, new = result["step"], result["train_losses"]
        # a trial started again after its worker died reports from its first step: keep one copy
        self.evals[run] = [e for e in self.evals.get(run, []) if e[0] < step] + \
            [[step, result["train_loss"], result["val_loss"]]]
        self.train[run] = self.train.get(run, [])[:step - len(new)] + list(new)

    def on_trial_complete(self, iteration, trials, trial, **info):
        run, last = trial.config["run"], trial.last_result or {}
        if last.get("finished"):
            self.log(f"  done {run}")
            return
        evals = self.evals.get(run, [])
        step, train_loss, val_loss = evals[-1] if evals else (0, float("nan"), float("nan"))
        atomic_write_json(os.path.join(run_dir(self.out, self.specs[run]), STOPPED_FILE),
                          {"step": step, "val_loss": val_loss, "train_loss": train_loss, "eval": evals,
                           "train": self.train.get(run, []), "scheduler": self.scheduler})
        self.stopped.append(run)
        self.log(f"  stopped {run} at step {step} (val loss {val_loss:.4f})")

    def on_trial_recover(self, iteration, trials, trial, **info):
        from ..runtime.ray_backend import _cause
        err = trial.get_error()
        reason = _cause(err) if err is not None else "its worker was lost"
        self.restarted.append(trial.config["run"])
        self.log(f"  {trial.config['run']} starts again from its first step: {reason}")

    def on_trial_error(self, iteration, trials, trial, **info):
        from ..runtime.ray_backend import _cause
        run = trial.config["run"]
        err = trial.get_error()
        reason = _cause(err) if err is not None else "the trial failed"
        self.failed.append(run)
        self.log(f"  FAILED {run}: {reason}")


def train_runs_asha(address, workers, data, threads, early_stop):
    """-> train_runs(out, todo, log) for training/ablate.py run_ablation: the unfinished runs as Tune
    trials on the cluster at `address` (ray_backend.connect's), ASHA stopping the weak ones.
    early_stop: {"scheduler": "asha", "grace_period", "reduction_factor"}."""
    require_tune()
    if address and address.startswith("ray://"):
        raise UsageError(f"--early-stop with --ray {address}: Ray Client runs Tune on the head, where --out "
                         f"is not this machine's; run ffnlab on a node of the cluster with --ray auto")
    from .. import __version__
    from ..runtime.ray_backend import connect
    from .data import read_text

    def train_runs(out, todo, log):
        if not todo:
            return []
        stdout = sys.stdout

        def say(msg):                                                 # the command's own lines stay on stdout
            with contextlib.redirect_stdout(stdout):
                log(msg)
        specs = {run_id(s): s for s in todo}
        steps = todo[0]["settings"]["steps"]
        scheduler = {"name": "ASHA", "time_attr": "step", "metric": "val_loss", "max_t": steps,
                     "grace_period": early_stop["grace_period"], "reduction_factor": early_stop["reduction_factor"],
                     "rungs": rungs(steps, early_stop["grace_period"], early_stop["reduction_factor"])}
        say(f"  ASHA: rungs at step {', '.join(f'{r:g}' for r in scheduler['rungs']) or 'none (--grace-period >= --steps)'}, "
            f"the best 1/{early_stop['reduction_factor']:g} of the runs at a rung go on")
        reports = _Reports(os.path.abspath(out), specs, scheduler, say)
        storage = tempfile.mkdtemp(prefix="ffnlab-tune-")
        # Ray and Tune print cluster events and their status with print() and logging: onto stderr,
        # so that stdout holds only the command's table
        with contextlib.redirect_stdout(sys.stderr), _quiet_tune():
            connect(address if address is not None else "local")
            try:
                here = ray.get_runtime_context().get_node_id()
                sink = ray.remote(num_cpus=0)(RunSink).options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False)).remote(os.path.abspath(out))
                trainable = tune.with_resources(
                    tune.with_parameters(tune_trial, specs=specs, text=read_text(data), data=os.path.abspath(data),
                                         version=__version__, threads=threads, sink=sink), {"cpu": threads})
                asha = ASHAScheduler(time_attr="step", metric="val_loss", mode="min", max_t=steps,
                                     grace_period=early_stop["grace_period"],
                                     reduction_factor=early_stop["reduction_factor"])
                tune.Tuner(trainable, param_space={"run": tune.grid_search(list(specs))},   # the grid's order
                           tune_config=tune.TuneConfig(scheduler=asha, max_concurrent_trials=workers),
                           run_config=tune.RunConfig(name="ablate", storage_path=storage, verbose=0,
                                                     callbacks=[reports],
                                                     failure_config=tune.FailureConfig(max_failures=MAX_TRIAL_FAILURES))
                           ).fit()
            finally:
                shutil.rmtree(storage, ignore_errors=True)
                ray.shutdown()
        say(f"  early stopping: {len(reports.stopped)} of {len(todo)} runs stopped, "
            f"{len(todo) - len(reports.stopped) - len(reports.failed)} finished"
            + (f", {len(reports.restarted)} started again after a lost worker" if reports.restarted else ""))
        return reports.failed
    return train_runs


@contextlib.contextmanager
def _quiet_tune():
    """Tune's loggers above warnings only while it runs (its status tables and hints are not ffnlab's output)."""
    names = ["ray.tune", "ray.train", "ray.air"]
    old = [logging.getLogger(n).level for n in names]
    for n in names:
        logging.getLogger(n).setLevel(logging.ERROR)
    # the status box and "View detailed results here" (a temporary folder, gone afterwards) come from
    # Tune's console reporter, which verbose=0 quiets only in its older form
    reporter = os.environ.get("RAY_AIR_NEW_OUTPUT")
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        yield
    finally:
        for n, lv in zip(names, old):
            logging.getLogger(n).setLevel(lv)
        if reporter is None:
            os.environ.pop("RAY_AIR_NEW_OUTPUT")
        else:
            os.environ["RAY_AIR_NEW_OUTPUT"] = reporter
