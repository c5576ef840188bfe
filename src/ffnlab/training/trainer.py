"""The training loop: batches -> forward -> cross-entropy -> backward -> clip -> AdamW.

    for step in 1..steps:
        x, y = random windows of the train split          # [batch, seq_len] each
        logits = forward(params, x)                        # [batch, seq_len, vocab]
        loss = cross_entropy(logits, y)
        grads = backward(dloss/dlogits)
        clip the global gradient norm; AdamW update with lr(step)
        every eval_every steps: loss on fixed train and val windows
        every ckpt_every steps: commit a checkpoint (training/checkpoint.py)

Everything random comes from one seeded NumPy Generator whose state is checkpointed, and
numpy's kernels are deterministic for fixed shapes and threads, so an interrupted run resumed
from its last checkpoint reproduces the uninterrupted run's losses bit for bit.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict

import numpy as np

from ..errors import FfnlabError, UsageError
from ..model.params import init_params
from ..model import Model
from ..progress import Progress as Bar
from ..threads import blas_single, one_pool
from ..ops.loss import cross_entropy_backward, cross_entropy_forward
from . import mlp_dropout
from .moe_loss import load_balancing_loss
from . import checkpoint as ckpt
from .data import TokenData, eval_batches, sample_batch
from .heap import keep_freed_memory
from .optim import AdamW, clip_grad_norm
from .settings import TrainSettings


class DivergedError(FfnlabError):
    """The loss or the gradients became NaN/Inf at `step`."""

    def __init__(self, message, step):
        super().__init__(message)
        self.step = step


# --- the step -----------------------------------------------------------------------------
def loss_and_grads(model, x, y, aux_loss=0.0):
    """x, y: [B, T] -> loss (float32 scalar, the language-model loss), {name: grad}
    aux_loss: weight of a mixture of experts' load-balancing loss (training/moe_loss.py), whose
    gradient joins the language-model loss's."""
    keep_freed_memory()     # the step's arrays stay in the heap for the next step (training/heap.py)
    with blas_single(), one_pool():     # BLAS on one thread: the step's products and row kernels split
        return _loss_and_grads(model, x, y, aux_loss)           # over one pool of threads (ops/matmul.py says why)


def _loss_and_grads(model, x, y, aux_loss):
    B, T = x.shape
    cfg = model.config
    logits, cache = model.forward(x, train=True)                       # [B, T, V]
    loss, probs = cross_entropy_forward(logits.reshape(B * T, -1), y.reshape(-1))
    if not np.isfinite(loss):
        return loss, None
    if cfg.moe and aux_loss:
        load_balancing_loss(cache, cfg, aux_loss)                      # puts its gradient in the cache
    dlogits = cross_entropy_backward(probs, y.reshape(-1)).reshape(logits.shape)
    return loss, model.backward(dlogits, cache)


def mean_loss(model, batches) -> float:
    losses = []
    for x, y in batches:
        logits = model.forward(x)                                      # [B, T, V]
        losses.append(cross_entropy_forward(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))[0])
    return float(np.mean(losses))


class _Found(Exception):
    def __init__(self, node):
        self.node = node


def first_nonfinite_node(model, x):
    """Re-run the forward with a tracer and stop at the first node holding NaN/Inf.
    -> 'name (OP)' or None when every node is finite."""
    from ..tracing.tracer import Tracer
    params = model.params

    def check(node):
        if not np.all(np.isfinite(node.array)):
            raise _Found(node)

    bad = [n for n, p in params.items() if not np.all(np.isfinite(p))]
    try:
        model.forward(x, hooks=Tracer(params=params, on_node=check))
    except _Found as f:
        where = f"{f.node.name} ({f.node.op})"
        return where + (f"; non-finite weights: {', '.join(bad[:3])}" if bad else "")
    return None


def diverged(step, what, model, x):
    node = first_nonfinite_node(model, x)
    where = (f"first non-finite node: {node}" if node
             else "every forward node is finite (the loss or backward overflowed)")
    return DivergedError(f"step {step}: {what} is not finite; {where}. Lower --lr or raise --warmup", step)


# --- progress -----------------------------------------------------------------------------
class Progress:
    """The training line (ffnlab/progress.py's bar, on a terminal: step, loss, lr, tokens/s) and
    a line per eval, printed above it on a terminal and plainly otherwise; nothing when disabled."""

    def __init__(self, total, enabled=True, stream=None):
        self.enabled = enabled
        self.bar = Bar(total, "training", enabled=None if enabled else False, stream=stream)

    def step(self, step, loss, lr, tok_s):
        self.bar.update(step - self.bar.n, f"loss {loss:.4f}  lr {lr:.2e}  {tok_s / 1e3:.1f}k tok/s")

    def line(self, text):
        if self.enabled:
            self.bar.write(text)


# --- the loop -----------------------------------------------------------------------------
def _check_same(kind, saved: dict, now: dict, out):
    for k, v in now.items():
        # a tuple field (Llama 3's rope_freq_factors) comes back from the JSON record as a list
        if k in saved and saved[k] != (list(v) if isinstance(v, tuple) else v):
            raise UsageError(f"--resume: {kind} {k} is {v!r} but the checkpoint in {out} has {saved[k]!r}; "
                             f"resume with the same settings or choose another --out")


def extend_run(settings, saved, meta, out, step, meta_file=ckpt.META_FILE):
    """--resume --steps M beyond the checkpoint's steps: keep the schedule it was trained with
    (the added steps run at its final rate) and record the new total in meta_file (saved is the
    settings dict inside meta)."""
    old = saved.get("steps")
    if not isinstance(old, int) or settings.steps < old:
        raise UsageError(f"--resume: --steps {settings.steps} is below the {old} steps of the run in {out} "
                         f"(at step {step}); a run can be extended, not shortened")
    settings.schedule_steps = saved.get("schedule_steps") or old
    saved.update(steps=settings.steps, schedule_steps=settings.schedule_steps)
    ckpt.atomic_write_json(os.path.join(out, meta_file), meta)


def train(cfg, settings: TrainSettings, data: TokenData, tok, tok_meta, out, resume=False,
          data_info=None, progress=True, init_hook=None, on_eval=None) -> dict:
    """Train (or resume) into checkpoint directory `out`; returns the final trainer record.

    data_info: {"path", "sha256", ...} recorded in ffnlab.json and checked on resume.
    init_hook(params): called once on freshly initialised weights (tests inject faults here).
    on_eval(step, train_loss, val_loss, history): after each evaluation (an early-stopping scheduler
    hears of the run there, training/tune_grid.py); it observes, the run is the same without it.
    """
    settings.validate()
    if settings.seq_len > cfg.n_ctx:
        raise UsageError(f"--seq-len {settings.seq_len} exceeds the model context n_ctx={cfg.n_ctx}")
    ckpt.check_writable(out)
    params = init_params(cfg, seed=settings.seed)
    if init_hook is not None:
        init_hook(params)
    # the optimizer updates params in place; with MLP dropout the model sees the same arrays
    # through mlp_dropout.DroppedInput weights
    view = mlp_dropout.attach(params, cfg, settings.mlp_dropout, settings.seed) if settings.mlp_dropout else params
    model = Model(cfg, view)
    opt = AdamW(params, settings.weight_decay, (settings.beta1, settings.beta2), decay_embeddings=settings.decay_embeddings)
    rng = np.random.default_rng([settings.seed, 1])                    # batch order (init used seed alone)
    history = {"train": [], "grad_norm": [], "eval": []}                # train[i]: loss of step i+1
    seconds, start = 0.0, 0
    record = ckpt.read_trainer(out)
    if record is not None and not resume:
        raise UsageError(f"--out {out} already holds a checkpoint at step {record['step']}; "
                         f"add --resume to continue it or choose another --out")
    if record is not None:
        meta = ckpt.read_resume_meta(out)
        _check_same("model", meta["config"], cfg.to_dict(), out)
        saved = meta["train"]["settings"]
        if settings.steps != saved.get("steps"):
            extend_run(settings, saved, meta, out, record["step"])
        _check_same("setting", saved, asdict(settings), out)
        _check_same("data", meta["train"].get("data", {}), {"sha256": (data_info or {}).get("sha256")}, out)
        ckpt.load_state(out, record, params, opt, rng)
        history, seconds, start = record["history"], record["train_seconds"], record["step"]
    else:
        ckpt.write_model_files(out, cfg, tok, tok_meta,
                               {"train": {"settings": asdict(settings), "data": data_info or {}}})

    val_windows = eval_batches(data.val, settings.batch, settings.seq_len, settings.eval_batches)
    train_windows = eval_batches(data.train, settings.batch, settings.seq_len, settings.eval_batches)
    tokens_per_step = settings.batch * settings.seq_len
    bar = Progress(settings.steps, enabled=progress)
    if start:
        extended = settings.schedule_steps and settings.schedule_steps < settings.steps
        bar.line(f"resuming {out} at step {start}/{settings.steps}" + (
            f" (extended: the schedule of its first {settings.schedule_steps} steps is kept; steps after it "
            f"run at its final rate {settings.lr_at(settings.schedule_steps - 1):.2e})" if extended else ""))

    def commit(step):
        done = step == settings.steps
        final = history["eval"][-1] if history["eval"] and history["eval"][-1][0] == step else None
        rec = {"history": history, "train_seconds": seconds, "done": done,
               "tokens_per_s": step * tokens_per_step / seconds if seconds else 0.0,
               "final": {"train_loss": final[1], "val_loss": final[2]} if (done and final) else None}
        ckpt.save_state(out, step, params, opt, rng, rec)
        return {"step": step, **rec}

    rec = None
    # overflow surfaces as a non-finite loss or gradient norm, reported below with the step and
    # the node; numpy's RuntimeWarnings on the way there would only add noise
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for s in range(start, settings.steps):
            step = s + 1
            t0 = time.perf_counter()
            lr = settings.lr_at(s)
            x, y = sample_batch(data.train, settings.batch, settings.seq_len, rng)
            mlp_dropout.set_step(view, step)
            loss, grads = loss_and_grads(model, x, y, settings.aux_loss)
            mlp_dropout.set_step(view, step, training=False)
            if grads is None:
                raise diverged(step, f"the loss ({float(loss)})", model, x)
            norm = clip_grad_norm(grads, settings.grad_clip)
            if not math.isfinite(norm):
                raise diverged(step, f"the gradient norm ({norm})", model, x)
            opt.step(params, grads, lr)
            seconds += time.perf_counter() - t0
            history["train"].append(float(loss))
            history["grad_norm"].append(norm)
            bar.step(step, float(loss), lr, step * tokens_per_step / seconds)
            if step % settings.eval_every == 0 or step == settings.steps:
                tl, vl = mean_loss(model, train_windows), mean_loss(model, val_windows)
                history["eval"].append([step, tl, vl])
                if on_eval is not None:
                    on_eval(step, tl, vl, history)
                bar.line(f"step {step}/{settings.steps}: train loss {tl:.4f}  val loss {vl:.4f}  "
                         f"lr {lr:.2e}  {step * tokens_per_step / seconds / 1e3:.1f}k tok/s")
            if step == settings.steps or (settings.ckpt_every and step % settings.ckpt_every == 0):
                rec = commit(step)
    if rec is None:                        # resumed a finished run: nothing to do
        rec = {"step": start, **{k: v for k, v in record.items() if k not in ("step",)}}
    return rec
