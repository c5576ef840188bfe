"""TrainSettings: every setting of a training run, as saved in a checkpoint's ffnlab.json and
checked again by --resume."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

from ..errors import UsageError
from .optim import lr_at


@dataclass
class TrainSettings:
    steps: int = 1000           # optimizer updates
    batch: int = 16             # sequences per step
    seq_len: int = 128          # tokens per sequence (context seen in training)
    lr: float = 1e-3            # peak learning rate
    warmup: int = 100           # linear warmup steps, then cosine decay
    min_lr_frac: float = 0.1    # the cosine ends at min_lr_frac * lr
    weight_decay: float = 0.1   # AdamW decoupled decay on matrices (see optim.decays)
    decay_embeddings: bool = False
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0      # max global gradient norm; 0 disables clipping
    seed: int = 0               # init and batch order
    eval_every: int = 100       # evaluate train/val loss every N steps (and at the end)
    eval_batches: int = 4       # fixed windows per evaluation: eval_batches * batch sequences
    ckpt_every: int = 100       # commit a checkpoint every N steps (and at the end); 0: only at the end
    val_frac: float = 0.1       # held-out tail of the data
    aux_loss: float = 0.01      # mixture of experts: weight of the load-balancing loss (Switch: 0.01)
    mlp_dropout: float = 0.0    # Dropout(p) on the MLP's hidden activation in training steps (mlp_dropout.py)
    schedule_steps: int = 0     # the steps warmup + cosine span; 0: steps. A run extended with
                                # --resume --steps M keeps its first schedule, so the added steps
                                # run at its final rate, min_lr_frac * lr (no jump back up)

    def validate(self):
        for f in ("steps", "batch", "seq_len", "eval_every", "eval_batches"):
            if getattr(self, f) <= 0:
                raise UsageError(f"--{f.replace('_', '-')} must be a positive integer, got {getattr(self, f)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if self.warmup < 0 or self.ckpt_every < 0:
            raise UsageError("--warmup and --ckpt-every must be >= 0")
        if not (self.aux_loss >= 0 and math.isfinite(self.aux_loss)):
            raise UsageError(f"--aux-loss must be a number >= 0, got {self.aux_loss}")
        if not 0.0 <= self.mlp_dropout < 1.0:
            raise UsageError(f"mlp_dropout must be in [0, 1), got {self.mlp_dropout}")

    def lr_at(self, s) -> float:
        """The learning rate of 0-based step s: warmup + cosine over the schedule's steps, then
        (an extended run) the schedule's last rate."""
        span = self.schedule_steps or self.steps
        return lr_at(min(s, span - 1), self.lr, span, self.warmup, self.min_lr_frac)

    def warmup_warning(self) -> str | None:
        """A warmup at least as long as the run never reaches --lr (and never decays): say so."""
        span = self.schedule_steps or self.steps
        if self.warmup < span:
            return None
        top = self.lr_at(span - 1)
        return (f"warning: --warmup {self.warmup} >= --steps {span}: the learning rate only ramps up, to "
                f"{top:.2e} ({top / self.lr:.0%} of --lr {self.lr:g}) at the last step, and never decays; "
                f"use --warmup below --steps (e.g. {max(0, span // 10)})")

    @classmethod
    def from_dict(cls, d):
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})
