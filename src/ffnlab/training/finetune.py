"""LoRA fine-tuning of a loaded model: the training loop of trainer.py over adapters only.

    adapters = init (A Kaiming-uniform, B = 0)       # the adapted model starts as the base
    for step in 1..steps:
        x, y = random windows of the train split         # [batch, seq_len]
        loss, grads = forward + backward through Frozen / LoraWeight   (training/lora.py)
        clip, AdamW on the adapters' A and B only
        every eval_every steps: loss on fixed train and val windows
        every ckpt_every steps: commit the adapter directory

The output directory is a PEFT adapter directory (formats/peft.py) plus the resume state, with
the commit order of training/checkpoint.py: state-NNNNNN.safetensors (adapters + AdamW
moments), then adapter_model.safetensors, then trainer.json (the commit). A crash at any
instant resumes from the last commit and reproduces the uninterrupted run's losses.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import UsageError
from ..formats import peft
from ..model import Model
from ..ops.loss import cross_entropy_backward, cross_entropy_forward
from . import checkpoint as ckpt
from .data import eval_batches, sample_batch
from .lora import adapter_grads, attach, init_adapters, set_training, target_tensors
from .optim import AdamW, clip_grad_norm
from .trainer import DivergedError, Progress, TrainSettings, extend_run, mean_loss

FINETUNE_FILE = "finetune.json"     # settings, base model and data, written once at the start


@dataclass
class FinetuneSettings(TrainSettings):
    """TrainSettings with LoRA's fields; defaults as PEFT and HF's Trainer use them."""
    steps: int = 200
    batch: int = 4
    seq_len: int = 128
    lr: float = 1e-3
    warmup: int = 10
    weight_decay: float = 0.0    # HF Trainer's default: LoRA factors are not decayed
    beta2: float = 0.999         # torch.optim.AdamW's default
    eval_every: int = 50
    ckpt_every: int = 50
    r: int = 8                   # adapter rank
    alpha: float = 16.0          # scale = alpha / r
    dropout: float = 0.0         # PEFT's lora_dropout, on the adapter input
    targets: str = "q,v"         # PEFT's (and llama-factory's) default for Llama: q_proj, v_proj
    train_tokens: int = 0        # train on the first N tokens of the train split only; 0: all of it
    eval_train: bool = True      # evaluate on fixed train windows too (False: val only, half the cost)

    def validate(self):
        super().validate()
        if not (isinstance(self.r, int) and self.r > 0):
            raise UsageError(f"--lora-r must be a positive integer, got {self.r}")
        if not (self.alpha > 0 and math.isfinite(self.alpha)):
            raise UsageError(f"--lora-alpha must be a positive number, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"--lora-dropout must be in [0, 1), got {self.dropout}")
        if self.train_tokens < 0:
            raise UsageError(f"--train-tokens must be >= 0, got {self.train_tokens}")


def loss_and_grads(model, x, y, adapters):
    """model: the base model with the adapters attached (training_view), x, y: [B, T] ->
    loss, {lora name: gradient} (None when the loss is not finite)"""
    B, T = x.shape
    logits, cache = model.forward(x, train=True)                          # [B, T, V]
    loss, probs = cross_entropy_forward(logits.reshape(B * T, -1), y.reshape(-1))
    if not np.isfinite(loss):
        return loss, None
    dlogits = cross_entropy_backward(probs, y.reshape(-1)).reshape(logits.shape)
    return loss, adapter_grads(model.backward(dlogits, cache), adapters)


def _files(model, adapters, tensors, s, base_model):
    return peft.adapter_files(model.config, adapters, tensors, s.r, s.alpha, s.dropout, base_model,
                              model.config.to_dict())


def finetune(model, settings: FinetuneSettings, data, out, resume=False, data_info=None, base_model="",
             progress=True) -> dict:
    """Fine-tune LoRA adapters on `model` (its params never change) into adapter directory `out`."""
    s = settings
    s.validate()
    cfg = model.config
    if s.seq_len > cfg.n_ctx:
        raise UsageError(f"--seq-len {s.seq_len} exceeds the model context n_ctx={cfg.n_ctx}")
    tensors = target_tensors(cfg, s.targets, model.source or "the model")
    ckpt.check_writable(out)
    adapters = init_adapters(model.params, cfg, tensors, s.r, s.seed)
    opt = AdamW(adapters, s.weight_decay, (s.beta1, s.beta2))
    rng = np.random.default_rng([s.seed, 1])
    history = {"train": [], "grad_norm": [], "eval": []}
    seconds, start = 0.0, 0
    record = ckpt.read_trainer(out)
    if record is not None and not resume:
        raise UsageError(f"--out {out} already holds a fine-tuning run at step {record['step']}; "
                         f"add --resume to continue it or choose another --out")
    # as JSON holds it (tuples become lists), so a resume compares like with like
    meta = json.loads(json.dumps({"settings": asdict(s), "base_model": base_model, "config": cfg.to_dict(),
                                  "data": data_info or {}}))
    if record is not None:
        from ..formats.jsonfile import read_json_object
        saved_meta = read_json_object(os.path.join(out, FINETUNE_FILE), "fine-tuning record")
        saved = saved_meta.get("settings", {})
        for kind, a, b in (("model config", saved_meta.get("config"), meta["config"]),
                           ("data", saved_meta.get("data", {}).get("sha256"), (data_info or {}).get("sha256"))):
            if a != b:
                raise UsageError(f"--resume: the {kind} differs from the run in {out}; resume with the same "
                                 f"model and data or choose another --out")
        if s.steps != saved.get("steps"):            # --steps M: extend the run, keeping its schedule
            extend_run(s, saved, saved_meta, out, record["step"], FINETUNE_FILE)
        for k, v in asdict(s).items():
            if k in saved and saved[k] != v:
                raise UsageError(f"--resume: setting {k} is {v!r} but the run in {out} has {saved[k]!r}; "
                                 f"resume with the same settings or choose another --out")
        ckpt.load_state(out, record, adapters, opt, rng)
        history, seconds, start = record["history"], record["train_seconds"], record["step"]
    else:
        ckpt.atomic_write_json(os.path.join(out, FINETUNE_FILE), meta)

    train_ids = data.train[:s.train_tokens] if s.train_tokens else data.train
    if len(train_ids) < s.seq_len + 1:
        raise UsageError(f"--train-tokens {s.train_tokens} is less than one window of --seq-len {s.seq_len} + 1")
    p = attach(model.params, adapters, s.alpha / s.r, s.dropout, rng, freeze=True)
    # the model being trained: the frozen base with the adapters, in float32 arithmetic (the
    # reference ops: they have backward passes)
    adapted = Model(cfg, p)
    val_windows = eval_batches(data.val, s.batch, s.seq_len, s.eval_batches)
    train_windows = eval_batches(train_ids, s.batch, s.seq_len, s.eval_batches)
    tokens_per_step = s.batch * s.seq_len
    bar = Progress(s.steps, enabled=progress)
    if start:
        bar.line(f"resuming {out} at step {start}/{s.steps}")

    def evaluate():
        set_training(p, False)
        tl = mean_loss(adapted, train_windows) if s.eval_train else float("nan")
        vl = mean_loss(adapted, val_windows)
        set_training(p, True)
        return tl, vl

    def commit(step):
        done = step == s.steps
        final = history["eval"][-1] if history["eval"] and history["eval"][-1][0] == step else None
        rec = {"history": history, "train_seconds": seconds, "done": done,
               "tokens_per_s": step * tokens_per_step / seconds if seconds else 0.0,
               "trainable_params": int(sum(a.size for a in adapters.values())),
               "final": {"train_loss": final[1], "val_loss": final[2]} if (done and final) else None}
        state_name = f"state-{step:06d}.safetensors"
        ckpt.atomic_write_safetensors(os.path.join(out, state_name), {**adapters, **opt.state_arrays()},
                                      {"step": str(step)})
        for name, blob in _files(model, adapters, tensors, s, base_model).items():
            ckpt.atomic_write(os.path.join(out, name), blob)
        ckpt.atomic_write_json(os.path.join(out, ckpt.TRAINER_FILE),
                               {"step": step, "state_file": state_name, "rng": rng.bit_generator.state,
                                "optimizer": opt.state_scalars(), **rec})
        ckpt.remove_old_states(out, state_name)
        return {"step": step, **rec}

    if not start:
        history["eval"].append([0, *evaluate()])          # the base model's losses: where the curves start
    rec = None
    set_training(p, True)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for i in range(start, s.steps):
            step = i + 1
            t0 = time.perf_counter()
            lr = s.lr_at(i)
            x, y = sample_batch(train_ids, s.batch, s.seq_len, rng)
            loss, grads = loss_and_grads(adapted, x, y, adapters)
            if grads is None:
                raise DivergedError(f"step {step}: the loss ({float(loss)}) is not finite. Lower --lr", step)
            norm = clip_grad_norm(grads, s.grad_clip)
            if not math.isfinite(norm):
                raise DivergedError(f"step {step}: the gradient norm ({norm}) is not finite. Lower --lr", step)
            opt.step(adapters, grads, lr)
            seconds += time.perf_counter() - t0
            history["train"].append(float(loss))
            history["grad_norm"].append(norm)
            bar.step(step, float(loss), lr, step * tokens_per_step / seconds)
            if step % s.eval_every == 0 or step == s.steps:
                tl, vl = evaluate()
                history["eval"].append([step, tl, vl])
                bar.line(f"step {step}/{s.steps}: loss {float(loss):.4f}  train loss {tl:.4f}  val loss {vl:.4f}  "
                         f"lr {lr:.2e}  {step * tokens_per_step / seconds:.0f} tok/s")
            if step == s.steps or (s.ckpt_every and step % s.ckpt_every == 0):
                rec = commit(step)
    set_training(p, False)
    if rec is None:                        # resumed a finished run: nothing to do
        rec = {k: v for k, v in record.items()}
    return rec
