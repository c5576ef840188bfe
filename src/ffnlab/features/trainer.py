"""Training a dictionary on a model's activations, crash-safe and deterministic.

One step (the recipe of SAELens's SAETrainer and the TopK/JumpReLU papers):
    x, y = buffer.next_batch(B)                      shuffled rows of the sites (harvest.py)
    x, y = c_in x, c_out y                           normalize "scale": constants that bring each site's mean
                                                     row norm to sqrt(width) (SAELens's expected_average_only_in,
                                                     on both sites); "none": c = 1
    terms, grads = loss_and_grads(...)               MSE + L1 | L0 | AuxK (losses.py)
    clip the global gradient norm to 1               (SAELens clips at 1.0)
    AdamW(lr_t) on every trainable parameter         training/optim.py: torch.optim.AdamW's arithmetic;
                                                     lr_t: linear warm-up, then cosine decay to a fraction
    topk/batchtopk/jumprelu: W_dec rows to unit norm (relu keeps them free: the L1 carries their norm)
    batchtopk: threshold <- (1 - 0.01) threshold + 0.01 * (smallest kept activation)   (SAELens's update)
    tokens since each latent last fired += B; 0 where it fired; dead = that count >= dead_window
    history: loss, mse, aux | l1 | l0_loss, ...     each term over c_out^2 (so mse is in the model's units), loss
                                                     their sum: the objective minimised, over that constant

b_dec starts at the mean of the targets in the first full buffer (b_dec_init "mean": the MSE-optimal
constant; earlier SAELens's "mean" init, not its geometric median, which minimises the L2 distance rather
than its square), or at zero ("zero": SAELens 6's start; docs/features.md measures what each costs). c_in
and c_out come from the same buffer. Why "scale" is the default: a site's norm sets how far the encoder must
grow before a latent's activation can match the target, and the latents that win the first top-k places
grow first and keep them. SmolLM2's ffn_norm rows have norm ~3.3 against ffn_out's ~30; trained on them as
they are, 82% of a transcoder's latents never fired (docs/features.md has the figures).

The saved dictionary takes the model's own activations: c_in and c_out are folded into its weights
(params(): W_enc c_in, W_dec / c_out, b_dec / c_out, W_skip c_in / c_out; the pre-activations, and so
the thresholds, are the same numbers), so it is an ordinary SAELens file. The state keeps the weights
the optimizer moves.

DIR holds cfg.json + sae_weights.safetensors (SAELens's format, saelens_io.py), rewritten at each
checkpoint, and the resume state: state-NNNNNN.safetensors (parameters, AdamW moments, the latents'
counters, the buffer) committed by trainer.json (training/checkpoint.py's write order). Nothing in DIR
depends on the clock or the thread count: a fixed seed gives the same DIR bit for bit, and a run resumed
from any commit writes what the uninterrupted run writes.
"""
import dataclasses
import os

import numpy as np

from ..training.checkpoint import atomic_write_json, atomic_write_safetensors, remove_old_states
from ..training.optim import AdamW, clip_grad_norm, lr_at
from . import saelens_io
from .dictionary import DictConfig, init_params, trainable
from .losses import loss_and_grads

TRAINER_FILE = "trainer.json"


@dataclasses.dataclass
class FeatureSettings:
    tokens: int = 200_000            # training rows (tokens) in all
    batch: int = 1024                # rows per step
    lr: float = 3e-4                 # peak learning rate (SAELens's default)
    warmup: int = -1                 # warm-up steps; -1: 5% of the steps
    min_lr_frac: float = 0.1         # the cosine decay ends at this fraction of lr
    coef: float = 0.0                # relu: the L1 coefficient; jumprelu: the L0 coefficient
    aux_coef: float = 1 / 32         # AuxK's alpha (Gao et al. 2024)
    dead_window: int = 100_000       # a latent is dead after this many tokens without firing
    grad_clip: float = 1.0
    seed: int = 0
    buffer_mb: float = 64.0          # the activation buffer's memory
    ckpt_every: int = 50             # steps between checkpoints (0: only at the end)
    decoder_init_norm: float = -1.0  # -1: 1 (unit rows) for topk/batchtopk/jumprelu, 0.1 for relu (Anthropic)
    threshold_init: float = 0.001    # jumprelu's initial threshold
    normalize: str = "scale"         # scale: each site to mean row norm sqrt(width) while training; none
    project_decoder_grad: bool = False  # unit-norm rows: drop each W_dec row's gradient along the row first
    b_dec_init: str = "mean"         # mean: the targets' mean in the first buffer; zero

    @property
    def steps(self):
        return max(1, self.tokens // self.batch)

    def warmup_steps(self):
        return self.steps // 20 if self.warmup < 0 else self.warmup


def unit_norm_rows(cfg):
    return cfg.act != "relu"


def project_out_radial(g, W):
    """g, W [d_sae, d_out], W's rows unit: g minus its component along each row (the part renorm_decoder undoes)"""
    g -= np.einsum("ij,ij->i", g, W)[:, None] * W


def renorm_decoder(p):
    p["W_dec"] /= np.linalg.norm(p["W_dec"], axis=1, keepdims=True)


NORMALIZE = ("scale", "none")
B_DEC_INIT = ("mean", "zero")


def scale_to_sqrt_width(rows):
    """-> the constant c that makes the mean row norm of c * rows sqrt(width) (1 for rows that are all zero)"""
    total = sum(float(np.linalg.norm(rows[i:i + 65536].astype(np.float64), axis=1).sum())
                for i in range(0, len(rows), 65536))                     # in slices: a large buffer is not copied
    mean_norm = total / max(len(rows), 1)
    return float(np.float32(np.sqrt(rows.shape[1]) / mean_norm)) if mean_norm > 0 else 1.0


def folded(p, cfg, c_in, c_out):
    """The weights trained on (c_in x, c_out y) -> the same dictionary on (x, y): out(x) = out'(c_in x) / c_out.
    An SAE centres its input on b_dec, so it has one constant (c_in = c_out) and the same algebra holds."""
    if c_in == 1.0 and c_out == 1.0:
        return {n: a.copy() for n, a in p.items()}
    q = {n: a.astype(np.float64) for n, a in p.items()}
    q["W_enc"] *= c_in                                         # pre = (c_in x) @ W' + b = x @ (c_in W') + b
    q["W_dec"] /= c_out
    q["b_dec"] /= c_out
    if "W_skip" in q:
        q["W_skip"] *= c_in / c_out
    return {n: a.astype(p[n].dtype) for n, a in q.items()}


class Trainer:
    def __init__(self, cfg: DictConfig, settings: FeatureSettings, harvest, meta):
        if settings.normalize not in NORMALIZE:
            raise ValueError(f"normalize {settings.normalize!r}: expected one of {', '.join(NORMALIZE)}")
        if settings.b_dec_init not in B_DEC_INIT:
            raise ValueError(f"b_dec_init {settings.b_dec_init!r}: expected one of {', '.join(B_DEC_INIT)}")
        self.cfg, self.s, self.harvest, self.meta = cfg, settings, harvest, meta
        rng = np.random.default_rng(settings.seed)
        norm = settings.decoder_init_norm if settings.decoder_init_norm > 0 else (0.1 if cfg.act == "relu" else 1.0)
        self.p = init_params(cfg, rng, norm, 0.0 if cfg.act == "batchtopk" else settings.threshold_init)
        self.opt = AdamW({n: self.p[n] for n in trainable(cfg)}, weight_decay=0.0, betas=(0.9, 0.999))
        self.since_fired = np.zeros(cfg.d_sae, np.int64)
        self.fired_ever = np.zeros(cfg.d_sae, np.int64)    # tokens each latent fired on (density)
        self.step = 0
        self.history = []
        self.c_in = self.c_out = 1.0         # the sites' constants (normalize), set from the first buffer

    def init_b_dec(self):
        """c_in, c_out and (b_dec_init "mean") b_dec from the first full buffer"""
        self.harvest.fill()
        b = self.harvest.buffer
        if self.s.normalize == "scale":
            self.c_in = scale_to_sqrt_width(b.x[:b.n])
            self.c_out = self.c_in if self.cfg.kind == "sae" else scale_to_sqrt_width(b.y[:b.n])
        if self.s.b_dec_init == "mean":
            self.p["b_dec"][:] = (b.y[:b.n].astype(np.float64) * self.c_out).mean(0)

    def params(self):
        """-> the dictionary as it is used: on the model's own activations (the constants folded in)"""
        return folded(self.p, self.cfg, self.c_in, self.c_out)

    def dead(self):
        return self.since_fired >= self.s.dead_window

    def train_step(self):
        cfg, s = self.cfg, self.s
        x, y = self.harvest.next_batch(s.batch)
        if self.c_in != 1.0 or self.c_out != 1.0:
            x, y = x * np.float32(self.c_in), y * np.float32(self.c_out)
        terms, grads, out, acts = loss_and_grads(self.p, cfg, x, y, self.dead(), s.coef, s.aux_coef)
        grads = {n: grads[n] for n in trainable(cfg)}
        if s.project_decoder_grad and unit_norm_rows(cfg):
            project_out_radial(grads["W_dec"], self.p["W_dec"])
        clip_grad_norm(grads, s.grad_clip)
        self.opt.step({n: self.p[n] for n in trainable(cfg)}, grads,
                      lr_at(self.step, s.lr, s.steps, s.warmup_steps(), s.min_lr_frac))
        if unit_norm_rows(cfg):
            renorm_decoder(self.p)
        fires = np.bincount(acts.idx[acts.val > 0], minlength=cfg.d_sae)
        if cfg.act == "batchtopk" and (acts.val > 0).any():
            th = self.p["threshold"]
            th[:] = np.float32(0.99) * th + np.float32(0.01) * acts.val[acts.val > 0].min()
        self.since_fired += len(x)
        self.since_fired[fires > 0] = 0
        self.fired_ever += fires
        self.step += 1
        var = float(((y - y.mean(0)) ** 2).sum()) / len(y)
        # each term over c_out^2: mse and aux in the model's units, and loss, their sum, the objective minimised over
        # the same constant; jumprelu's L0 term is "l0_loss", "l0" being the latents fired
        units = {("l0_loss" if k == "l0" else k): v / self.c_out ** 2 for k, v in terms.items()}
        rec = {"step": self.step, "loss": round(sum(units.values()), 6), **{k: round(v, 6) for k, v in units.items()},
               "l0": round(float(acts.l0().mean()), 3), "fvu": round(terms["mse"] / var, 6) if var > 0 else None,
               "dead": round(float(self.dead().mean()), 6)}
        self.history.append(rec)
        return rec

    # --- checkpoints ---------------------------------------------------------------------------
    def save(self, out):
        arrays, scalars = self.harvest.state()
        state = {**{f"param.{n}": a for n, a in self.p.items()}, **self.opt.state_arrays(),
                 "since_fired": self.since_fired, "fired_ever": self.fired_ever, **arrays}
        name = f"state-{self.step:06d}.safetensors"
        atomic_write_safetensors(os.path.join(out, name), state)
        saelens_io.save(out, self.params(), self.cfg, self.meta_now())
        atomic_write_json(os.path.join(out, TRAINER_FILE),
                          {"step": self.step, "state_file": name, "optimizer": self.opt.state_scalars(),
                           "scales": {"in": self.c_in, "out": self.c_out},
                           "harvest": scalars, "settings": dataclasses.asdict(self.s), "config": dataclasses.asdict(self.cfg),
                           "history": self.history})
        remove_old_states(out, name)

    def meta_now(self):
        m = dict(self.meta)
        tokens = self.step * self.s.batch
        m["ffnlab"] = {**m["ffnlab"], "steps": self.step, "tokens": tokens,
                       "dead_fraction": float(self.dead().mean()), "normalize": self.s.normalize,
                       "b_dec_init": self.s.b_dec_init,
                       "scale_in": self.c_in, "scale_out": self.c_out}
        return saelens_io.cfg_dict(self.cfg, m["hook_name"], m["hook_name_out"], m["model_name"], m["ffnlab"])

    def load(self, out, record):
        from safetensors.numpy import load_file
        st = load_file(os.path.join(out, record["state_file"]))
        for n in self.p:
            self.p[n][...] = st[f"param.{n}"]
        self.opt.load_state({k: v for k, v in st.items() if k.startswith("adam.")}, record["optimizer"])
        self.since_fired[:], self.fired_ever[:] = st["since_fired"], st["fired_ever"]
        self.harvest.load(st, record["harvest"])
        self.step, self.history = int(record["step"]), list(record["history"])
        scales = record.get("scales", {"in": 1.0, "out": 1.0})
        self.c_in, self.c_out = float(scales["in"]), float(scales["out"])

    def run(self, out, on_step=None):
        """Trains to settings.steps from wherever self.step is, checkpointing into out (created)."""
        os.makedirs(out, exist_ok=True)
        if self.step == 0:
            self.init_b_dec()
        while self.step < self.s.steps:
            rec = self.train_step()
            if on_step is not None:
                on_step(rec)
            if self.s.ckpt_every and self.step % self.s.ckpt_every == 0 and self.step < self.s.steps:
                self.save(out)
        self.save(out)
