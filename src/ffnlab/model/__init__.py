"""The model: a config, a dict of GGUF-named arrays, and (for real models) a tokenizer."""
import numpy as np

from .arith import arith_named
from .attention import KVCache
from .decode import decode_step, make_plan, params_key
from .hooks import Hooks
from .packing import pack
from .params import count_params, init_params, param_shapes
from .transformer import backward, forward


class Model:
    def __init__(self, config, params, tokenizer=None, source=None, pack_weights=False, arith="f32"):
        self.config = config          # ModelConfig
        self.params = params          # {GGUF tensor name: np.ndarray or quant.QuantTensor [out, in]}
        # inference models pack q/k/v and gate/up rows into one buffer each (views, no copy kept)
        self.packs = pack(params, config) if pack_weights else None
        self.tokenizer = tokenizer    # Tokenizer or None (random-weight models)
        self.source = source          # the file or directory it came from, for messages
        self.hooks = Hooks()          # what ffnlab.trace / ffnlab.hooks attach to the named nodes
        self._plan = None             # the weights per layer for decode_step, built on first use
        # "f32" | "ggml": how the graph computes (model/arith.py); the QuantTensors in params
        # were made with the same setting at load (they pick the product kernels)
        self.arith = arith_named(arith)
        self.lora = None              # {"path", "scale", "r", "alpha", "tensors"} once apply_lora ran

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

    def forward(self, ids, kv=None):
        """ids: [T] int -> logits [T, vocab] for every position (float32 for float32 weights)."""
        logits, _ = forward(self.params, self.config, np.asarray(ids)[None, :], kv=kv, hooks=self.hooks,
                            packs=self.packs, arith=self.arith)
        return logits[0]

    def forward_last(self, ids, kv):
        """ids: [T] appended after the cache -> logits [vocab] of the last position."""
        if len(ids) == 1 and not self.hooks and kv.k[0].shape[0] == 1:
            # the fast one-token path; with hooks attached the general one runs them, so a hooked
            # sequence gives the same tokens with the KV cache as recomputed in full
            return decode_step(self.params, self.config, self.decode_plan(), int(ids[0]), kv, self.arith)
        logits, _ = forward(self.params, self.config, np.asarray(ids)[None, :], kv=kv, hooks=self.hooks,
                            last_only=True, packs=self.packs, arith=self.arith)
        return logits[0, -1]

    def decode_plan(self):
        """decode_step's per-layer weights, rebuilt whenever a params entry has been replaced."""
        if self._plan is None or self._plan.key != params_key(self.params):
            self._plan = make_plan(self.params, self.config, self.packs)
        return self._plan

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
