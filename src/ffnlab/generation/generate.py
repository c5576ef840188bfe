"""Generation with a KV cache: prefill the prompt in one forward, then one token per step."""
import os
import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from ..tracing.api import check_logits
from .sampling import SamplingParams, sample


@dataclass
class Timings:
    prompt_tokens: int = 0
    prompt_ms: float = 0.0
    eval_tokens: int = 0
    eval_ms: float = 0.0

    @property
    def prompt_tps(self):
        return 1000.0 * self.prompt_tokens / self.prompt_ms if self.prompt_ms else 0.0

    @property
    def eval_tps(self):
        return 1000.0 * self.eval_tokens / self.eval_ms if self.eval_ms else 0.0


@dataclass
class Generation:
    prompt_ids: list
    ids: list = field(default_factory=list)     # generated ids (without the prompt)
    text: str = ""
    stop_reason: str = ""                       # "eos" | "length" | "context" (n_ctx reached before n_predict)
    timings: Timings = field(default_factory=Timings)


def check_prompt_fits(model, prompt_ids, n_ctx=None):
    """A prompt needs at least one free position after it for the first generated token."""
    n_ctx = n_ctx or model.config.n_ctx
    if len(prompt_ids) >= n_ctx:
        where = f"{model.source}: " if getattr(model, "source", None) else ""
        raise UsageError(f"{where}the prompt has {len(prompt_ids)} tokens, the model's context length is {n_ctx} "
                         f"(expected at most {n_ctx - 1} prompt tokens)")


def check_cache_fits(model, n_positions):
    """The KV cache is allocated up front; a context of 2^30 positions (a file may claim one) with
    -n -1 would ask for tens of GiB: refused in one line if it exceeds the machine's memory."""
    cfg = model.config
    need = 2 * cfg.n_layer * cfg.n_kv_head * cfg.head_dim * n_positions * 4          # K and V, float32
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        where = f"{model.source}: " if getattr(model, "source", None) else ""
        raise UsageError(f"{where}a KV cache for {n_positions} positions needs {need / 2**30:.1f} GiB, more than this "
                         f"machine's {have / 2**30:.1f} GiB (the model's context is {cfg.n_ctx}); give -n or -c")


def generate(model, prompt_ids, n_predict=64, params: SamplingParams | None = None, on_token=None, n_ctx=None,
             ignore_eos=False):
    """Generate up to n_predict tokens after prompt_ids; on_token(id, text_piece) streams them.
    n_ctx: the context to stay within (llama.cpp's -c; default and at most the model's).
    ignore_eos: never sample an end-of-generation token (llama.cpp's --ignore-eos gives them a
    -inf logit bias), so exactly n_predict tokens come out: what benchmarks need."""
    params = params or SamplingParams()
    cfg = model.config
    prompt_ids = list(prompt_ids)
    if not prompt_ids:
        raise UsageError("the prompt is empty (no tokens to start from)")
    n_ctx = min(n_ctx or cfg.n_ctx, cfg.n_ctx)
    check_prompt_fits(model, prompt_ids, n_ctx)
    room = n_ctx - len(prompt_ids)
    capped, n_predict = n_predict > room, min(n_predict, room)
    rng = np.random.default_rng(None if params.seed < 0 else params.seed)
    check_cache_fits(model, len(prompt_ids) + n_predict)
    kv = model.new_cache(n_ctx=len(prompt_ids) + n_predict)
    out = Generation(prompt_ids=prompt_ids)
    tok = model.tokenizer
    t0 = time.perf_counter()
    # overflow inside a forward is reported by check_logits (one line naming the first NaN/Inf
    # node), not as NumPy's RuntimeWarning and a source line on stderr
    with np.errstate(over="ignore", invalid="ignore"):
        logits = model.forward_last(prompt_ids, kv)                    # prefill: [vocab] for the last position
    check_logits(model, logits, prompt_ids)                            # NaN/Inf: name the first bad node
    out.timings.prompt_tokens, out.timings.prompt_ms = len(prompt_ids), 1000 * (time.perf_counter() - t0)
    history = list(prompt_ids)
    t1 = time.perf_counter()
    text_so_far = ""
    eot = sorted(tok.eot_ids) if ignore_eos and tok is not None else []
    for step in range(n_predict):
        if eot:
            logits[eot] = -np.inf
        nxt = sample(logits, params, rng, history)
        if tok is not None and nxt in tok.eot_ids:
            out.stop_reason = "eos"
            break
        out.ids.append(nxt)
        history.append(nxt)
        if on_token is not None:
            # decode the whole continuation so multi-token characters come out whole
            text = tok.decode(out.ids) if tok is not None else ""
            on_token(nxt, text[len(text_so_far):] if text.startswith(text_so_far) else text)
            text_so_far = text
        if step + 1 < n_predict:
            with np.errstate(over="ignore", invalid="ignore"):
                logits = model.forward_last([nxt], kv)                 # one token against the cache
            check_logits(model, logits, history)
    else:
        out.stop_reason = "context" if capped else "length"
    t2 = time.perf_counter()
    # the eval count, like llama.cpp's, is the number of single-token forward passes
    out.timings.eval_tokens = len(out.ids) if out.stop_reason == "eos" else max(len(out.ids) - 1, 0)
    out.timings.eval_ms = 1000 * (t2 - t1)
    out.text = tok.decode(out.ids) if tok is not None else ""
    return out
