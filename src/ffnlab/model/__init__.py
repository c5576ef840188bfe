"""The model: a config, a dict of GGUF-named arrays, and (for real models) a tokenizer."""
import dataclasses

import numpy as np

from .arith import arith_named
from .attention import KVCache
from .block import norm_forward
from .decode import decode_step
from .hooks import Hooks, as_hooks
from .packing import pack
from .params import count_params, init_params, lm_head_name, param_shapes
from .transformer import backward, forward, lm_head
from .weights import model_weights, params_key


class Model:
    def __init__(self, config, params, tokenizer=None, source=None, pack_weights=False, arith="f32"):
        self.config = config          # ModelConfig
        self.params = params          # {GGUF tensor name: np.ndarray or quant.QuantTensor [out, in]}
        # inference models pack q/k/v and gate/up rows into one buffer each (views, no copy kept);
        # the records the forward reads (model/weights.py), again whenever a params entry is replaced
        self._weights = model_weights(params, config, pack(params, config) if pack_weights else None)
        self.tokenizer = tokenizer    # Tokenizer or None (random-weight models)
        self.source = source          # the file or directory it came from, for messages
        self.hooks = Hooks()          # what ffnlab.trace / ffnlab.hooks attach to the named nodes
        # "f32" | "ggml": how the graph computes (model/arith.py); the QuantTensors in params
        # were made with the same setting at load (they pick the product kernels)
        self.arith = arith_named(arith)
        self.lora = None              # {"path", "scale", "r", "alpha", "tensors"} once apply_lora ran
        # what loading it cost, for `ffnlab run`'s perf lines (the loaders set them; 0 for a model made here)
        self.load_seconds = 0.0       # reading, packing and warming up, end to end
        self.compile_seconds = 0.0    # of which compiling or loading the quant kernels
        self.pack_cached = False      # the packed layouts came from the pack cache (formats/pack_cache.py)

    @classmethod
    def random(cls, config, seed=0, dtype=np.float32):
        return cls(config, init_params(config, seed, dtype))

    def apply_lora(self, path, scale=1.0):
        """Adapt the model with a LoRA adapter: a PEFT directory (`ffnlab finetune` writes one) or
        llama.cpp's LoRA GGUF. Each adapted weight becomes W + scale * alpha/r * B A, computed as
        the base product plus the adapter's (training/lora.py), so the trace shows both."""
        import math

        from ..errors import UsageError
        from ..training.lora import attach, read_lora
        if not math.isfinite(scale):
            raise UsageError(f"--lora-scale must be a finite number, got {scale}")
        adapters, s, info = read_lora(path, self.config, self.params)
        self.params = attach(self.params, adapters, {w: v * scale for w, v in s.items()})
        self.lora = {"path": path, "scale": scale, **info}

    def forward(self, ids, kv=None, hooks=None, train=False, last_only=False, n_layer=None):
        """ids: [T] or [B, T] int -> logits [T, vocab] or [B, T, vocab] (float32 for float32 weights)

        The one way in: every command and lab function runs the model through here (or
        forward_last / generate), so the weights' packed layout and the arithmetic chosen at load
        (arith "f32" | "ggml") always come along.
        kv: KVCache; the tokens go after its cached positions and are appended to it.
        hooks: what observes or edits the named nodes for this call (an Editor, a Tracer, a list
               of them, or a Hooks), instead of those attached by ffnlab.trace / ffnlab.hooks;
               None: the attached ones.
        train: keep the activations for backward() -> (logits, ForwardCache).
        last_only: the logits of the last position only -> [1, vocab] or [B, 1, vocab].
        n_layer: run the first n_layer blocks only (a scan that reads nodes of the early layers);
                 the logits then read block n_layer - 1's output through the final norm and head."""
        ids = np.asarray(ids)
        cfg = self.config if n_layer is None else dataclasses.replace(self.config, n_layer=n_layer)
        logits, cache = forward(self.params, cfg, ids[None] if ids.ndim == 1 else ids, kv=kv,
                                hooks=self.hooks if hooks is None else as_hooks(hooks), train=train,
                                last_only=last_only, weights=self.weights(), arith=self.arith)
        if ids.ndim == 1:
            logits = logits[0]
        return (logits, cache) if train else logits

    def backward(self, dlogits, cache):
        """dlogits: [B, T, vocab] (or [T, vocab]), cache: forward(..., train=True)'s ->
        {tensor name: gradient}, the keys of self.params"""
        dlogits = np.asarray(dlogits)
        return backward(dlogits[None] if dlogits.ndim == 2 else dlogits, self.params, self.config, cache)

    def forward_last(self, ids, kv):
        """ids: [T] appended after the cache -> logits [vocab] of the last position."""
        if len(ids) == 1 and not self.hooks and kv.k[0].shape[0] == 1:
            # the fast one-token path; with hooks attached the general one runs them, so a hooked
            # sequence gives the same tokens with the KV cache as recomputed in full
            return decode_step(self.weights(), self.config, int(ids[0]), kv, self.arith)
        return self.forward(ids, kv=kv, last_only=True)[-1]

    def final_logits(self, x):
        """x: [..., d_model] residual states -> logits [..., vocab] through the model's final norm
        and LM head, in the model's arithmetic (the logit lens reads a layer's output this way)."""
        y, _ = norm_forward(x, self.weights().output_norm, self.config, "result_norm", arith=self.arith)
        return self.head_logits(y)

    def head_logits(self, y):
        """y: [..., d_model] final-norm outputs -> logits [..., vocab] (soft-capped), as the forward makes them."""
        return lm_head(y, self.weights().head, self.config)[0]

    def weights(self):
        """The params read into records (model/weights.py), read again whenever an entry has been
        replaced (LoRA, pruning, an ablation): a stack of load serves only while params holds its views."""
        w = self._weights
        if w.config is not self.config or w.key != params_key(self.params):
            self._weights = w = model_weights(self.params, self.config, w.stacks)
        return w

    def generate(self, prompt, n_predict=64, params=None, on_token=None, ignore_eos=False, **sampling):
        """prompt: text or a list of ids -> Generation (ids, text, stop_reason, timings).
        sampling: SamplingParams fields (temp, top_k, top_p, min_p, repeat_penalty, seed);
        ignore_eos: never stop at an end-of-generation token (exactly n_predict tokens)."""
        from ..generation import SamplingParams, generate
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return generate(self, ids, n_predict, params or SamplingParams(**sampling), on_token, ignore_eos=ignore_eos)

    def new_cache(self, n_ctx=None, batch=1):
        dtype = np.float16 if self.arith.kv_dtype == np.float16 else self.params["token_embd.weight"].dtype
        return KVCache(self.config, batch=batch, n_ctx=n_ctx, dtype=dtype)

    @property
    def n_params(self):
        return count_params(self.params)
