"""Fingerprint every forward ffnlab computes, to prove a refactor changed no number.

    python scripts/trace_hashes.py > before.txt       # on the old commit
    python scripts/trace_hashes.py > after.txt        # on the new one
    diff before.txt after.txt                         # empty: traces and logits bit-identical

One line per node of a traced forward (name, op, shape, sources, sha1 of the array's bytes) and
one per logits array, for: every family's tiny random model (the configs of
tests/reference/block_checks.py and a mixture of experts with a shared expert), in float32 and ggml
arithmetic, the full forward, a KV-cache decode of 4 tokens (the one-token fast path), and the
real models (SmolLM2, Gemma 3) when installed, Granite's multipliers, SmolLM3's NoPE layers, OLMoE's whole-projection q/k norms on the tiny llama, and LoRA adapters on two tiny models; then the results of the lab's own computations
(lens, patching, causal tracing, attribution, neuron and expert scans, perplexity) in both
arithmetics. --quick leaves out the real models.
"""
import argparse
import hashlib
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "reference"))


def sha(a):
    a = np.ascontiguousarray(a)
    return hashlib.sha1(a.view(np.uint8).reshape(-1).tobytes() + str(a.dtype).encode()).hexdigest()[:16]


def emit(*parts):
    print(" ".join(str(p) for p in parts), flush=True)


def fingerprint_forward(label, model, ids):
    import ffnlab
    with ffnlab.trace(model) as t:
        logits = model.forward(ids)
    for n in t.nodes:
        emit(label, "node", n.name, n.op, n.shape, n.dtype, [s for s, _ in n.srcs],
             sha(n.array) if n.array is not None else "-")
    emit(label, "logits", logits.shape, sha(logits))
    kv = model.new_cache()
    step = model.forward_last(np.asarray(ids[:len(ids) - 4]), kv)
    emit(label, "prefill", sha(step))
    for i in ids[len(ids) - 4:]:
        step = model.forward_last(np.asarray([i]), kv)
        emit(label, "decode", int(i), sha(step))


def tiny_models():
    from ffnlab.model import Model
    from block_checks import CONFIGS, random_params
    from moe_models import moe_config
    from moe_models import random_params as moe_params
    for arch, cfg in CONFIGS.items():
        yield arch, cfg, random_params(cfg)
    cfg = moe_config(shared=True)
    yield "moe_shexp", cfg, moe_params(cfg)
    from ffnlab.config import ModelConfig
    llama = CONFIGS["llama"].to_dict()
    for arch, over in (("granite", dict(embedding_multiplier=3.0, residual_multiplier=0.4, logits_scaling=2.5,
                                        attn_scale=0.3)),
                       ("smollm3", dict(no_rope_layer_step=2)),
                       ("olmoe", dict(qk_norm=True, qk_norm_full=True))):
        cfg = ModelConfig.from_dict({**llama, "arch": arch, **over})
        yield arch, cfg, random_params(cfg)
    for arch in ("llama", "gpt2"):                  # LoRA on every weight: the adapter's nodes, the ADDs
        yield f"{arch}_lora", CONFIGS[arch], lora_params(CONFIGS[arch], random_params(CONFIGS[arch]))
    del Model


def lora_params(cfg, params):
    """params with a rank-2 adapter on every projection, B drawn (not PEFT's zero) so it counts"""
    from ffnlab.training.lora import attach, init_adapters, target_tensors
    adapters = init_adapters(params, cfg, target_tensors(cfg, "all" if cfg.gated else "q,o,up,down"), 2, seed=3)
    rng = np.random.default_rng(5)
    for n in adapters:
        if n.endswith(".lora_b"):
            adapters[n] = rng.normal(0, 0.1, adapters[n].shape).astype(np.float32)
    return attach(params, adapters, 2.0)


def lab_results(label, model, text, foil_text):
    """The interventions and scans on one real model, as their commands compute them."""
    from ffnlab.evaluation.activations import stream_activations, token_windows
    from ffnlab.evaluation.perplexity import perplexity
    from ffnlab.interventions.attribution import attribute
    from ffnlab.interventions.causal_trace import causal_trace
    from ffnlab.interventions.lens import logit_lens
    from ffnlab.interventions.patching import patch
    tok = model.tokenizer
    ids = np.array(tok.encode(text))
    corrupt = np.array(tok.encode(foil_text))
    lens = logit_lens(model, ids)
    emit(label, "lens", sha(np.asarray(lens["top_logits"], np.float32)), sha(np.asarray(lens["last_lens"])))
    target, foil = int(np.argmax(lens["logits"][-1])), int(np.argsort(lens["logits"][-1])[-2])
    if len(corrupt) == len(ids):
        r = patch(model, ids, corrupt, target, foil, node="ffn_out")
        emit(label, "patch", sha(np.asarray(r["effect"])), repr(r["clean"]), repr(r["corrupt"]))
    r = causal_trace(model, ids, 1, 2, samples=2, window=3)
    emit(label, "causal_trace", repr(r["clean_p"]), repr(r["corrupt_p"]), sha(np.asarray(r["hidden"])),
         sha(np.asarray(r["mlp"])))
    r = attribute(model, ids, target, top=5)
    emit(label, "attribute", repr(r["logit"]), sha(np.asarray([[u[1] for u in L["units"]] for L in r["layers"]])))
    windows, _ = token_windows(np.array(tok.encode(text * 6, add_bos=False)), 16)
    seen = []
    stream_activations(model, windows, [0, model.config.n_layer // 2], 4,
                       lambda il, a, first: seen.append((il, first, sha(a))))
    emit(label, "activations", seen)
    chunks = np.array(tok.encode(text * 12, add_bos=False)[:64]).reshape(2, 32)
    r = perplexity(model, chunks, batch=2)
    emit(label, "perplexity", repr(r.ppl), repr(r.nll))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny models only (no real models)")
    args = ap.parse_args()
    from ffnlab.model import Model
    from ffnlab.threads import set_threads
    set_threads(1)                       # one thread: the products' summation order cannot vary
    rng = np.random.default_rng(0)
    for arch, cfg, params in tiny_models():
        ids = rng.integers(0, cfg.vocab_size, size=min(12, cfg.n_ctx))
        for arith in ("f32", "ggml"):
            fingerprint_forward(f"{arch}/{arith}", Model(cfg, params, arith=arith), ids)
    if args.quick:
        return
    import ffnlab
    from ffnlab.formats.installed import resolve_model
    for name in ("smollm2", "gemma3"):
        for arith in ("f32", "ggml"):
            model = ffnlab.load(resolve_model(name), progress=False, arith=arith)
            label = f"{name}/{arith}"
            fingerprint_forward(label, model, np.array(model.tokenizer.encode("The Eiffel Tower is in the city of")))
            lab_results(label, model, "The Eiffel Tower is in the city of", "The Colosseum is in the city of")


if __name__ == "__main__":
    main()
