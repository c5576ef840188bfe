"""ModelConfig: one dataclass that describes GPT-2, Llama-family, Qwen2, Gemma 3 and MoE blocks.

Formats (GGUF, HF, presets) produce a ModelConfig; the model, the tracer, the sizing tools and
the trainer only ever read one. Field names follow the seeds' vocabulary (d_model, d_ff, ...);
the GGUF metadata key each field comes from is given in formats/gguf_config.py.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from .errors import FfnlabError
from .families import runnable_archs
from .kinds import FFN_KINDS  # the one table of FFN kinds: name -> activation, gated, node names

NORM_KINDS = ("layernorm", "rmsnorm")
POSITION_KINDS = ("learned", "rope")
ROPE_PAIRINGS = ("normal", "neox")
RUNNABLE_ARCHS = runnable_archs()      # families/: others (bert, custom) are sizing only
# Bounds no real model reaches; they stop a corrupt file from building billions of per-layer shapes
# before its tensors are checked (a block count of 2^32-1 must fail, not hang).
MAX_DIM = 1 << 31
MAX_LAYERS = 1 << 16
_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               tuple: "a list of numbers"}


class ConfigError(FfnlabError, ValueError):
    """A config that cannot describe a model (bad field, inconsistent shapes)."""


@dataclass
class ModelConfig:
    arch: str = "llama"              # GGUF architecture name, the key of its families/ record
                                     # (decides tensor/node names, never the math)
    n_layer: int = 2                 # number of transformer blocks
    d_model: int = 64                # residual stream width (hidden_size, n_embd)
    n_head: int = 4                  # query heads
    n_kv_head: int = 0               # key/value heads; 0 means n_head (multi-head); < n_head is grouped-query attention
    head_dim: int = 0                # width of one head; 0 means d_model // n_head (Gemma 3 sets it explicitly)
    d_ff: int = 256                  # MLP hidden width (intermediate_size, n_ff)
    ffn: str = "swiglu"              # gelu (exact erf) | gelu_tanh | relu | swiglu (SiLU-gated) | geglu (GELU-tanh-gated)
                                     # | moe (a mixture of SwiGLU experts, d_ff wide each; model/ffn.py)
    n_expert: int = 0                # moe: experts per layer (num_local_experts, num_experts); 0 for other kinds
    n_expert_used: int = 0           # moe: experts each token is routed to, the k of top-k (num_experts_per_tok)
    expert_norm: bool = False        # moe: divide the k chosen router probabilities by their sum (norm_topk_prob)
    d_ff_shexp: int = 0              # moe: width of a shared, sigmoid-gated SwiGLU expert every token uses
                                     # (Qwen2-MoE's shared_expert_intermediate_size); 0 means none
    ffn_bias: bool = False           # biases on up/gate/down (GPT-2: yes, Llama: no)
    attn_bias: bool = False          # biases on q/k/v projections (GPT-2, Qwen2)
    attn_out_bias: bool = False      # bias on the attention output projection (GPT-2)
    fused_qkv: bool = False          # one [q_dim + 2*kv_dim, d_model] attn_qkv matrix (GPT-2, Phi-3), split by head counts
    norm: str = "rmsnorm"            # layernorm (mean/var, weight + bias) | rmsnorm (scale only)
    norm_eps: float = 1e-5           # epsilon inside the norm's square root
    pre_norm: bool = True            # norm each sub-layer's input (attn_norm, ffn_norm); False: OLMo 2, whose
                                     # sub-layers read the residual stream as it is and only post norms exist
    post_attn_norm: bool = False     # Gemma 2/3, OLMo 2: norm the attention output before adding it to the residual
    post_ffn_norm: bool = False      # Gemma 2/3, OLMo 2: norm the FFN output before adding it to the residual
    parallel_residual: bool = False  # GPT-NeoX/Pythia: out = x + attn(attn_norm(x)) + ffn(ffn_norm(x)), both
                                     # sub-layers read the block input (use_parallel_residual)
    qk_norm: bool = False            # Gemma 3, Qwen3: RMS-norm each query/key head before RoPE
    qk_norm_full: bool = False       # OLMoE: the q/k norms span the whole projection (q_dim, kv_dim), not one head
    positions: str = "rope"          # learned (GPT-2 position table) | rope (rotary, applied to q and k)
    rope_pairing: str = "normal"     # normal: rotate adjacent pairs (x0,x1) as llama.cpp's LLAMA rope
                                     # neox: rotate (x_i, x_{i+d/2}) as HF rotate_half / llama.cpp NEOX
    rope_theta: float = 10000.0      # RoPE base frequency
    rope_dim: int = 0                # partial rotary (GPT-NeoX rotary_pct): only the first rope_dim dims of each
                                     # head rotate, the rest pass through; 0 means head_dim (llama.cpp: n_rot)
    rope_theta_local: float = 0.0    # Gemma 3: RoPE base for sliding-window layers; 0 means rope_theta
    rope_scale: float = 1.0          # linear RoPE scaling factor: positions are divided by it (global layers)
    rope_freq_factors: tuple = ()    # Llama 3.x: frequency i is divided by factor i, [n_rot/2] (llama.cpp's
                                     # rope_freqs.weight); () means none. llama3_freq_factors below makes them
    rope_llama3: tuple = ()          # Llama 3.x config.json's (factor, low_freq_factor, high_freq_factor,
                                     # original_max_position_embeddings), kept to write it back; () if unknown
    sliding_window: int = 0          # keys more than this many positions back are masked on sliding layers; 0: none
    sliding_window_pattern: int = 0  # which layers slide (llama.cpp's n_pattern): N > 0: every Nth layer is global,
                                     # the others slide (Gemma 2: 2, Gemma 3: 6); 0: every layer slides (Mistral)
    sliding_window_start: int = 0    # Qwen2/3 (max_window_layers): layers below this one never slide
    attn_scale: float = 0.0          # multiplier of q.k; 0 means 1/sqrt(head_dim)
    attn_softcap: float = 0.0        # Gemma 2: scores = c*tanh(scale*q.k / c) before the mask; 0 means none
    embed_scale: bool = False        # Gemma: multiply token embeddings by sqrt(d_model)
    final_logit_softcap: float = 0.0 # Gemma 2 style tanh softcap on logits; 0 means none
    embedding_multiplier: float = 0.0  # Granite: token embeddings times this (llama.cpp: embedding_scale); 0: none
    residual_multiplier: float = 0.0   # Granite: each sub-layer's output times this before its residual add
                                       # (llama.cpp: residual_scale); 0: none
    logits_scaling: float = 0.0        # Granite: logits divided by this (llama.cpp multiplies by 1/logit_scale); 0: none
    no_rope_layer_step: int = 0        # SmolLM3: layers il with (il + 1) % N == 0 attend without RoPE (NoPE;
                                       # llama.cpp's n_no_rope_layer_step); 0: every layer rotates
    vocab_size: int = 256            # rows of the token embedding table
    n_ctx: int = 256                 # context length the model was trained for (learned positions: table rows)
    tie_embeddings: bool = True      # LM head reuses the token embedding matrix (no separate output.weight)
    name: str = ""                   # human-readable model name, for reports only

    def __post_init__(self):
        self._check_types()
        if self.n_kv_head == 0:
            self.n_kv_head = self.n_head
        if self.head_dim == 0:
            if self.n_head <= 0 or self.d_model % self.n_head:
                raise ConfigError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}; set head_dim")
            self.head_dim = self.d_model // self.n_head
        if self.rope_llama3 and not self.rope_freq_factors and len(self.rope_llama3) == 4:
            self.rope_freq_factors = llama3_freq_factors(self.rope_dim or self.head_dim, self.rope_theta,
                                                         *self.rope_llama3)
        self.validate()

    def _check_types(self) -> None:
        """Every field has the type its default has (a bool is not an int here, an int is a float), so
        that a string, a list or a null from a file fails here, naming the field, and not as a
        TypeError deep in the model."""
        for f in fields(self):
            v, want = getattr(self, f.name), type(f.default)
            ok = isinstance(v, want) and not (want is int and isinstance(v, bool))
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                ok = True
                setattr(self, f.name, float(v))
            if want is tuple and isinstance(v, (list, tuple)):      # a JSON list comes back as a list
                ok = all(type(x) in (int, float) for x in v)
                if ok:
                    setattr(self, f.name, tuple(float(x) for x in v))
            if not ok:
                raise ConfigError(f"{f.name} must be {_TYPE_NAMES[want]}, got {v!r:.60}")

    def validate(self) -> None:
        def need(cond, msg):
            if not cond:
                raise ConfigError(msg)
        self._check_types()
        for f in ("n_layer", "d_model", "n_head", "n_kv_head", "head_dim", "d_ff", "vocab_size", "n_ctx"):
            v = getattr(self, f)
            need(0 < v <= MAX_DIM, f"{f} must be a positive integer of at most {MAX_DIM}, got {v!r}")
        need(self.n_layer <= MAX_LAYERS, f"n_layer must be at most {MAX_LAYERS}, got {self.n_layer}")
        need(self.ffn in FFN_KINDS, f"ffn must be one of {', '.join(FFN_KINDS)}, got {self.ffn!r}")
        if FFN_KINDS[self.ffn].moe:
            need(0 < self.n_expert <= MAX_DIM, f"n_expert must be a positive integer for ffn moe, got {self.n_expert}")
            need(0 < self.n_expert_used <= self.n_expert,
                 f"n_expert_used (top-k) must be between 1 and n_expert = {self.n_expert}, got {self.n_expert_used}")
            need(0 <= self.d_ff_shexp <= MAX_DIM, f"d_ff_shexp must be an integer in [0, {MAX_DIM}], got {self.d_ff_shexp}")
            need(not self.ffn_bias, "ffn moe has no FFN biases (ffn_bias must be false)")
        else:
            need(self.n_expert == self.n_expert_used == self.d_ff_shexp == 0,
                 f"n_expert, n_expert_used and d_ff_shexp are for ffn moe only (ffn is {self.ffn})")
        need(self.norm in NORM_KINDS, f"norm must be one of {', '.join(NORM_KINDS)}, got {self.norm!r}")
        need(self.positions in POSITION_KINDS, f"positions must be one of {', '.join(POSITION_KINDS)}, got {self.positions!r}")
        need(self.rope_pairing in ROPE_PAIRINGS, f"rope_pairing must be one of {', '.join(ROPE_PAIRINGS)}, got {self.rope_pairing!r}")
        need(self.n_head % self.n_kv_head == 0, f"n_head={self.n_head} is not a multiple of n_kv_head={self.n_kv_head}")
        need(self.positions != "rope" or self.head_dim % 2 == 0, f"RoPE needs an even head_dim, got {self.head_dim}")
        need(0 <= self.rope_dim <= self.head_dim and self.rope_dim % 2 == 0,
             f"rope_dim must be an even integer in [0, head_dim={self.head_dim}], got {self.rope_dim}")
        need(self.pre_norm or (self.post_attn_norm and self.post_ffn_norm),
             "pre_norm false needs post_attn_norm and post_ffn_norm (a block with no norm at all diverges)")
        need(not self.parallel_residual or not (self.post_attn_norm or self.post_ffn_norm or not self.pre_norm),
             "parallel_residual is a pre-norm block without post norms (GPT-NeoX)")
        need(self.qk_norm or not self.qk_norm_full, "qk_norm_full needs qk_norm")
        need(not (self.parallel_residual and self.residual_multiplier),
             "residual_multiplier scales sequential residual adds (Granite), not a parallel residual")
        # floats that change the math: a NaN, an infinity or a non-positive base gives NaN logits
        need(math.isfinite(self.norm_eps) and self.norm_eps > 0, f"norm_eps must be finite and > 0, got {self.norm_eps}")
        need(math.isfinite(self.rope_theta) and self.rope_theta > 0, f"rope_theta must be finite and > 0, got {self.rope_theta}")
        for f in ("rope_theta_local", "attn_scale", "attn_softcap", "final_logit_softcap", "embedding_multiplier",
                  "residual_multiplier", "logits_scaling"):
            v = getattr(self, f)
            need(math.isfinite(v) and v >= 0, f"{f} must be finite and >= 0 (0: unused), got {v}")
        need(math.isfinite(self.rope_scale) and self.rope_scale > 0, f"rope_scale must be finite and > 0, got {self.rope_scale}")
        for f in ("sliding_window", "sliding_window_pattern", "sliding_window_start", "no_rope_layer_step"):
            v = getattr(self, f)
            need(0 <= v <= MAX_DIM, f"{f} must be an integer in [0, {MAX_DIM}], got {v}")
        ff = self.rope_freq_factors
        need(not ff or len(ff) == self.n_rot // 2,
             f"rope_freq_factors must hold n_rot/2 = {self.n_rot // 2} numbers, got {len(ff)}")
        need(all(math.isfinite(x) and x > 0 for x in ff), "rope_freq_factors must be finite and > 0")
        need(len(self.rope_llama3) in (0, 4), "rope_llama3 must be (factor, low_freq_factor, high_freq_factor, "
                                              f"original_max_position_embeddings), got {len(self.rope_llama3)} numbers")

    # --- derived quantities -------------------------------------------------------------
    @property
    def gated(self) -> bool:
        """True for SwiGLU/GeGLU: the FFN has a gate matrix (ffn_gate.weight) next to up.
        False for moe: its gates are the experts' (ffn_gate_exps.weight)."""
        return FFN_KINDS[self.ffn].gated and not self.moe

    @property
    def moe(self) -> bool:
        """True for a mixture of experts."""
        return FFN_KINDS[self.ffn].moe

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_head * self.head_dim

    @property
    def n_rot(self) -> int:
        """Dimensions of each head that RoPE rotates (llama.cpp's n_rot)."""
        return self.rope_dim or self.head_dim

    @property
    def scale(self) -> float:
        """The factor q.k is multiplied by before the softmax."""
        return self.attn_scale if self.attn_scale else 1.0 / math.sqrt(self.head_dim)

    def is_sliding(self, layer: int) -> bool:
        """Whether `layer` attends to the last sliding_window positions only. As llama.cpp's
        set_swa_pattern: pattern 0 slides every layer (Mistral), N slides all but every Nth
        (il % N < N - 1: Gemma 2 alternates with N = 2, Gemma 3 has N = 6); layers below
        sliding_window_start (Qwen's max_window_layers) never slide."""
        if not self.sliding_window or layer < self.sliding_window_start:
            return False
        n = self.sliding_window_pattern
        return n == 0 or layer % n < n - 1

    def uses_rope(self, layer: int) -> bool:
        """Whether `layer` rotates q and k: RoPE models do, except SmolLM3's NoPE layers, every
        no_rope_layer_step-th (llama.cpp: use_rope = (il + 1) % n_no_rope_layer_step != 0)."""
        step = self.no_rope_layer_step
        return self.positions == "rope" and not (step and (layer + 1) % step == 0)

    def layer_rope_theta(self, layer: int) -> float:
        if self.is_sliding(layer) and self.rope_theta_local:
            return self.rope_theta_local
        return self.rope_theta

    def layer_rope_scale(self, layer: int) -> float:
        """Gemma 3's sliding layers have their own RoPE (rope_theta_local), unscaled; in every other
        family (Gemma 2, Mistral) one scaled RoPE serves every layer, sliding or not."""
        return 1.0 if self.is_sliding(layer) and self.rope_theta_local else self.rope_scale

    def layer_rope(self, layer: int) -> tuple:
        """(theta, linear scale, frequency factors) of `layer`'s RoPE: ops/rope.py rope_angles' arguments.
        Gemma 3's sliding layers run unscaled RoPE; Llama 3's factors apply to every layer (it has no
        sliding layers)."""
        return (self.layer_rope_theta(layer), self.layer_rope_scale(layer), self.rope_freq_factors)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(unknown)}")
        return cls(**d)


def llama3_freq_factors(head_dim, theta, factor, low_freq_factor, high_freq_factor, original_ctx):
    """Llama 3.1's RoPE scaling as per-frequency divisors -> tuple [head_dim/2].

    Frequencies whose wavelength is shorter than original_ctx/high_freq_factor are kept (divisor 1),
    those longer than original_ctx/low_freq_factor are divided by `factor`, and those between are
    interpolated: new = (1 - s) * f / factor + s * f with s = (original_ctx / wavelength - low) / (high - low),
    i.e. divisor 1 / ((1 - s) / factor + s). transformers' _compute_llama3_parameters computes the
    new frequencies; llama.cpp's converter stores these divisors as rope_freqs.weight."""
    import numpy as np                    # here: `ffnlab --help` reads config.py without loading NumPy

    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # [hd/2]
    wavelen = 2 * np.pi / inv_freq
    s = (original_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    div = 1.0 / ((1 - s) / factor + s)                                                # the smooth middle band
    div = np.where(wavelen < original_ctx / high_freq_factor, 1.0, div)               # high frequencies: kept
    div = np.where(wavelen > original_ctx / low_freq_factor, factor, div)             # low frequencies: / factor
    return tuple(float(x) for x in div)
