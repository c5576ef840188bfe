"""LoRA adapters: a frozen weight W [out, in] plus a trainable low-rank update, as PEFT computes it.

    y = x W^T + scale * (drop(x) A^T) B^T        A [r, in], B [out, r], scale = alpha / r

B starts at zero, so the adapted model starts equal to the base; A starts Kaiming-uniform,
U(-1/sqrt(in), 1/sqrt(in)), as PEFT's nn.Linear init. Dropout (PEFT's lora_dropout) acts on the
adapter's input only: the base product always sees x.

An adapted weight is a LoraWeight and every other weight of a model being fine-tuned a Frozen:
both are ops/linear.py ComposedWeights, so the model code runs them where it runs arrays and
QuantTensors (DESIGN.md seam 1). Their backward gives dx, plus (dA, dB) for an adapter; no
gradient buffer for W is ever made. A GGUF weight stays in its quantized blocks: the forward
uses its kernels, and dx = dy W is a product over dequantized row tiles (QuantTensor.rmatmul).

Adapters live in one flat dict under llama.cpp's GGUF-LoRA names, blk.L.attn_q.weight.lora_a /
.lora_b (formats/peft.py and formats/gguf_lora.py write them under PEFT's or llama.cpp's names),
with q/k rows in the model's own order (a GGUF llama's permuted rows, an HF directory's rotate_half).
"""
import numpy as np

from ..analysis.lora import parse_targets
from ..errors import UsageError
from ..ops.linear import ComposedWeight, linear_forward
from ..quant import QuantTensor

# ffnlab target -> the GGUF tensor it adapts (per layer)
TENSOR = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "qkv": "attn_qkv",
          "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}


def base_dx(dy2, w):
    """dy2: [N, out] -> dy W: [N, in] for a float or quantized frozen weight"""
    return w.rmatmul(dy2) if isinstance(w, QuantTensor) else dy2 @ w


class Frozen(ComposedWeight):
    """A weight that learns nothing: its product, and the input gradient through it."""

    def __init__(self, base):
        self.base = base              # [out, in] float array or QuantTensor, never written

    shape = property(lambda self: tuple(self.base.shape))
    dtype = property(lambda self: self.base.dtype)
    ndim = 2

    def __getitem__(self, ids):
        return self.base[ids]         # embedding rows (a tied table is also the LM head)

    def forward(self, x2, hook=None):
        return linear_forward(x2, self.base)                            # [N, in] -> [N, out]

    def backward(self, dy2, x2):
        return base_dx(dy2, self.base), None


class LoraWeight(Frozen):
    """base + scale * B A. a [r, in] and b [out, r] are the arrays of the adapter dict (updated
    in place by the optimizer). training: dropout is on (fine-tuning), off for evaluation."""

    def __init__(self, base, a, b, scale, dropout=0.0, rng=None):
        super().__init__(base)
        self.a, self.b, self.scale = a, b, float(scale)
        self.dropout, self.rng = float(dropout), rng
        self.training = False
        self.mask = None              # the last forward's dropout mask / (1 - p), for its backward
        self.name = "W"               # its tensor name (attach sets it), for the trace

    def __repr__(self):
        return f"LoraWeight({self.base!r}, r={self.a.shape[0]}, scale={self.scale:g})"

    def _dropped(self, x2, new):
        """drop(x): a fresh mask in a training forward; the backward reuses it (a weight is used
        once per forward, so the last mask is the one its backward needs)"""
        if not (self.training and self.dropout > 0):
            return x2
        if new:
            keep = self.rng.random(x2.shape) >= self.dropout
            self.mask = keep.astype(x2.dtype) / np.asarray(1.0 - self.dropout, x2.dtype)
        return x2 * self.mask

    def forward(self, x2, hook=None):
        hook = hook or (lambda suffix, v, op, srcs: v)
        y = linear_forward(x2, self.base)                               # [N, in] -> [N, out]
        # llama.cpp's build_lora_mm: mul_mat(b, mul_mat(a, x)), scale, add to the base product
        xa = hook("lora_a", linear_forward(self._dropped(x2, True), self.a), "MUL_MAT",
                  (self.name + ".lora_a",))                                                    # [N, r]
        ab = hook("lora_b", linear_forward(xa, self.b), "MUL_MAT", (self.name + ".lora_b", "{node}_lora_a"))   # [N, out]
        ab = hook("lora_scaled", ab * np.asarray(self.scale, ab.dtype), "SCALE", ("{node}_lora_b",))
        return y + ab

    def backward(self, dy2, x2):
        """dy2: [N, out] -> dx [N, in], (dA [r, in], dB [out, r])"""
        xd = self._dropped(x2, False)                                   # [N, in]
        xa = xd @ self.a.T                                              # [N, r] (recomputed: N*r floats)
        gs = (dy2 @ self.b) * np.asarray(self.scale, dy2.dtype)         # [N, r] dL/d(xa)
        db = (dy2.T @ xa) * np.asarray(self.scale, dy2.dtype)           # [out, N] @ [N, r]
        da = gs.T @ xd                                                  # [r, N] @ [N, in]
        dxa = gs @ self.a                                               # [N, in] through the adapter
        if self.mask is not None and self.training and self.dropout > 0:
            dxa *= self.mask
        return base_dx(dy2, self.base) + dxa, (da, db)


# --- which weights, and the adapter dict ---------------------------------------------------
def target_tensors(cfg, text, source="the model", flag="--target"):
    """'q,v' | 'attn' | 'mlp' | 'all' | HF names -> the GGUF tensor names adapted in each layer,
    or UsageError naming a target the model lacks."""
    if cfg.moe and any(t in ("gate", "up", "down") for t in parse_targets(text, flag)):
        raise UsageError(f"{flag} {text}: {source} has a mixture of experts; LoRA on its experts is not "
                         f"supported (adapt q, k, v, o)")
    out = []
    for t in parse_targets(text, flag):
        if cfg.fused_qkv and t in ("q", "k", "v"):
            t = "qkv"                 # GPT-2's c_attn: PEFT adapts the one fused matrix
        if t == "gate" and not cfg.gated:
            raise UsageError(f"{flag} gate: {source} has no gate projection (its MLP is {cfg.ffn}, not gated)")
        if t == "qkv" and not cfg.fused_qkv:
            raise UsageError(f"{flag} qkv: {source} has separate q, k, v projections (use q,k,v)")
        if TENSOR[t] not in out:
            out.append(TENSOR[t])
    return out


def adapter_names(cfg, tensors):
    """-> [(blk.L.tensor.weight, lora_a name, lora_b name)] for every layer"""
    return [(w, w + ".lora_a", w + ".lora_b") for il in range(cfg.n_layer) for w in
            (f"blk.{il}.{t}.weight" for t in tensors)]


def init_adapters(params, cfg, tensors, rank, seed=0) -> dict:
    """-> {lora name: float32 array}: A Kaiming-uniform, B zero (PEFT's init)"""
    if not (isinstance(rank, int) and rank > 0):
        raise UsageError(f"--lora-r must be a positive integer, got {rank}")
    rng = np.random.default_rng([seed, 2])
    adapters = {}
    for w, an, bn in adapter_names(cfg, tensors):
        out, n = params[w].shape
        bound = 1.0 / np.sqrt(n)
        adapters[an] = rng.uniform(-bound, bound, (rank, n)).astype(np.float32)   # [r, in]
        adapters[bn] = np.zeros((out, rank), np.float32)                          # [out, r]
    return adapters


def attach(params, adapters, scale, dropout=0.0, rng=None, freeze=False) -> dict:
    """-> a params dict whose adapted weights are LoraWeights over the same adapter arrays.
    scale: alpha / r, or {weight name: scale}. rng: the dropout masks' Generator (fine-tuning
    passes its checkpointed one, so a resumed run draws the same masks). freeze: every other
    2-D weight becomes a Frozen (no gradient for it), the embedding table too."""
    out = dict(params)
    for an in (n for n in adapters if n.endswith(".lora_a")):
        w = an[:-len(".lora_a")]
        s = scale[w] if isinstance(scale, dict) else scale
        out[w] = LoraWeight(params[w], adapters[an], adapters[an[:-1] + "b"], s, dropout, rng)
        out[w].name = w
    if freeze:
        for n, v in out.items():
            if not isinstance(v, ComposedWeight) and getattr(v, "ndim", 0) == 2:
                out[n] = Frozen(v)
    return out


def set_training(params, on: bool):
    """Dropout on (a training forward) or off (evaluation, inference)."""
    for v in params.values():
        if isinstance(v, LoraWeight):
            v.training = on


def adapter_grads(grads, adapters) -> dict:
    """backward()'s {weight name: (dA, dB)} -> {lora name: gradient}, the adapter dict's keys"""
    out = {}
    for an in (n for n in adapters if n.endswith(".lora_a")):
        w = an[:-len(".lora_a")]
        out[an], out[an[:-1] + "b"] = grads[w]
    return out


def merged(base, a, b, scale):
    """W + scale * B A as float32 [out, in] (a quantized base is dequantized)."""
    w = base.dequantize() if isinstance(base, QuantTensor) else np.array(base, np.float32)
    w += np.float32(scale) * (b @ a)                                    # [out, r] @ [r, in]
    return w


def read_lora(path, cfg, params):
    """A PEFT adapter directory or a llama.cpp LoRA GGUF -> adapters, {weight: alpha / r},
    {"r", "alpha", "tensors"}; a file that does not fit the model is one ModelFileError line."""
    if str(path).endswith(".gguf"):
        from ..formats.gguf_lora import read_gguf_lora
        adapters, scale, r, alpha = read_gguf_lora(path, cfg, params)
    else:
        from ..formats.peft import read_adapter
        adapters, scale, conf = read_adapter(path, cfg, params)
        r, alpha = conf["r"], conf["lora_alpha"]
    return adapters, scale, {"r": r, "alpha": alpha, "tensors": len(adapters) // 2}


def adapters_of(params):
    """An adapted params dict -> adapters {lora name: array}, {weight name: scale} (what attach made)"""
    adapters, scale = {}, {}
    for w, v in params.items():
        if isinstance(v, LoraWeight):
            adapters[w + ".lora_a"], adapters[w + ".lora_b"], scale[w] = v.a, v.b, v.scale
    return adapters, scale
