"""ffnlab run: generate text from a model, with llama.cpp's sampling flags and perf lines."""
import json
import sys

from .run_interactive import chat_loop, chat_template, context_notice

COMMAND = "run"
HELP = "generate text from a model (GGUF, HF directory or ffnlab checkpoint)"


def add_arguments(p):
    from .common import (add_intervention_arguments, add_lora_arguments, add_model_argument, add_prompt_arguments,
                         needs, nonneg, refuse_together)
    add_model_argument(p)
    add_lora_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("-n", "--n-predict", type=int, default=64,
                   help="tokens to generate at most; -1 = until EOS or the context is full (default 64)")
    p.add_argument("-c", "--ctx-size", type=nonneg("-c/--ctx-size"), default=0, metavar="N",
                   help="context size in tokens, prompt included; 0 = the model's (default 0)")
    p.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    p.add_argument("--top-k", type=int, default=40, help="top-k sampling, 0 = off (default 40)")
    p.add_argument("--top-p", type=float, default=0.95, help="top-p (nucleus) sampling, 1.0 = off (default 0.95)")
    p.add_argument("--min-p", type=float, default=0.05, help="min-p sampling, 0 = off (default 0.05)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="penalize repeated tokens, 1.0 = off (default 1.0)")
    p.add_argument("--repeat-last-n", type=int, default=64, help="tokens the repeat penalty looks back (default 64)")
    p.add_argument("--seed", type=int, default=-1, help="RNG seed, -1 = random (default -1)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template as a user turn")
    p.add_argument("--system", default=None, help="with --chat or -i: a system message")
    p.add_argument("--chat-template", metavar="NAME|FILE", default=None,
                   help="with --chat or -i: a built-in template (chatml, llama2, llama2-sys, llama3, gemma, zephyr, "
                        "phi3, mistral-v7, vicuna) or a file holding a jinja template, instead of the model's own "
                        "(a model without one gets chatml, as in llama.cpp)")
    p.add_argument("-i", "--interactive", action="store_true",
                   help="chat in a loop: read a user turn per line from stdin, answer it with the whole "
                        "conversation as context; -p is the first turn; end with EOF (Ctrl-D)")
    p.add_argument("--json", action="store_true", help="print one JSON object (text, ids, timings) instead of streaming")
    add_intervention_arguments(p)                       # --ablate / --scale / --steer (interventions/flags.py)
    p.add_argument("--features", action="append", default=[], metavar="DIR",
                   help="a transcoder or SAE directory (ffnlab features train) whose latents --feature-steer "
                        "adds; one per layer (repeatable)")
    p.add_argument("--feature-steer", action="append", default=[], metavar="L:LATENT:SCALE",
                   help="add SCALE x the decoder row of LATENT of the --features dictionary of block L to what it "
                        "writes (a transcoder: ffn_out-L) at every position, e.g. 5:123:8 (repeatable)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="never stop at an end-of-generation token: exactly -n tokens (llama.cpp's flag, for benchmarks)")
    refuse_together(p, "-i", "--json", "an interactive chat streams its turns")
    needs(p, "--feature-steer", "--features", "the latents are those of a dictionary directory")
    needs(p, "--features", "--feature-steer", "the dictionary is read to steer with its latents")


def _check(args):
    from ..errors import UsageError
    if args.n_predict < -1:
        raise UsageError(f"-n must be >= 0, or -1 for no limit, got {args.n_predict}")
    chat = args.chat or args.interactive
    if args.system is not None and not chat:
        raise UsageError("--system needs --chat or -i (without a chat template there is no system turn)")
    if args.chat_template is not None and not chat:
        raise UsageError("--chat-template needs --chat or -i")
    if not 0.0 < args.top_p <= 1.0:
        raise UsageError(f"--top-p must be in (0, 1], got {args.top_p}")
    if not 0.0 <= args.min_p <= 1.0:
        raise UsageError(f"--min-p must be in [0, 1], got {args.min_p}")
    if args.repeat_penalty <= 0:
        raise UsageError(f"--repeat-penalty must be > 0, got {args.repeat_penalty}")


def run(args):
    from ..errors import UsageError
    from ..generation import SamplingParams, generate
    from ..generation.chat import encode_chat, render_chat
    from ..generation.generate import check_prompt_fits
    from ..threads import report as thread_report
    from .common import load_model, read_prompt

    _check(args)
    prompt = None if args.interactive and args.prompt is None and not args.file else read_prompt(args)
    import time
    t0 = time.perf_counter()
    model = load_model(args)
    if not model.load_seconds:         # a checkpoint's loader keeps no time of its own
        model.load_seconds = time.perf_counter() - t0
    if model.tokenizer is None:
        raise UsageError(f"{model.source}: the model has no tokenizer, so it cannot read a text prompt")
    n_ctx = context_size(args, model)
    from ..interventions.flags import intervention_editor
    editor, interventions = intervention_editor(model, args.ablate, args.scale, args.steer)
    if editor is not None:
        model.hooks.attach(editor)                      # for the whole command: hooked generation
    if args.feature_steer:
        from ..features.steer import feature_steer_editor
        steer, done = feature_steer_editor(model, args.features, args.feature_steer)
        model.hooks.attach(steer)                       # after --ablate/--scale/--steer on the same node
        interventions += done
    params = SamplingParams(temp=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                            repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n, seed=args.seed)
    if args.interactive:
        return chat_loop(model, args, prompt, params, n_ctx, _perf)
    if args.chat:
        template = chat_template(args, model)
        msgs = ([{"role": "system", "content": args.system}] if args.system else []) + [{"role": "user", "content": prompt}]
        ids = encode_chat(model.tokenizer, render_chat(model.tokenizer, msgs, template=template))
    else:
        ids = model.tokenizer.encode(prompt)
    check_prompt_fits(model, ids, n_ctx)                # before the prompt is echoed
    if not args.json:
        if not args.chat:
            sys.stdout.write(prompt)
        sys.stdout.flush()
    n_predict = n_ctx if args.n_predict < 0 else args.n_predict        # -1: the context ends it
    out = generate(model, ids, n_predict, params, None if args.json else _stream, n_ctx=n_ctx,
                   ignore_eos=args.ignore_eos)
    t = out.timings
    load_ms = 1000 * model.load_seconds
    if args.json:
        print(json.dumps({"model": model.source, "threads": thread_report(), "prompt": prompt, "prompt_ids": out.prompt_ids, "ids": out.ids,
                          "text": out.text, "stop_reason": out.stop_reason, "interventions": interventions,
                          "timings": {"load_ms": load_ms, "kernels_ms": 1000 * model.compile_seconds,
                                      "packed_from_cache": model.pack_cached,
                                      "prompt_tokens": t.prompt_tokens, "prompt_ms": t.prompt_ms,
                                      "prompt_tokens_per_s": t.prompt_tps, "eval_tokens": t.eval_tokens,
                                      "eval_ms": t.eval_ms, "eval_tokens_per_s": t.eval_tps}}, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        sys.stdout.flush()
    context_notice(out, n_ctx, args.n_predict)
    _perf(load_ms, t, 1000 * model.compile_seconds)
    return 0


def context_size(args, model) -> int:
    """-c N (0: the model's) -> the context generation stays within."""
    from ..errors import UsageError
    n_ctx = model.config.n_ctx
    if args.ctx_size > n_ctx:
        raise UsageError(f"-c/--ctx-size {args.ctx_size} exceeds {model.source}'s context length {n_ctx} "
                         f"(ffnlab does not extend a model's context)")
    return args.ctx_size or n_ctx


def _stream(_id, piece):
    sys.stdout.write(piece)
    sys.stdout.flush()


def _perf(load_ms, t, compile_ms=0.0):
    """The timing summary, in the shape of llama.cpp's llama_perf_context_print lines."""
    def per(ms, n):
        return (ms / n if n else 0.0), (1000.0 * n / ms if ms else 0.0)
    pms, ptps = per(t.prompt_ms, t.prompt_tokens)
    ems, etps = per(t.eval_ms, t.eval_tokens)
    from ..threads import describe
    err = sys.stderr
    print(f"ffnlab_perf:          threads = {describe()}", file=err)
    kernels = f" (of which {compile_ms:.2f} ms compiling or loading the quant kernels)" if compile_ms else ""
    print(f"ffnlab_perf:        load time = {load_ms:10.2f} ms{kernels}", file=err)
    print(f"ffnlab_perf: prompt eval time = {t.prompt_ms:10.2f} ms / {t.prompt_tokens:5d} tokens "
          f"({pms:8.2f} ms per token, {ptps:8.2f} tokens per second)", file=err)
    print(f"ffnlab_perf:        eval time = {t.eval_ms:10.2f} ms / {t.eval_tokens:5d} runs   "
          f"({ems:8.2f} ms per token, {etps:8.2f} tokens per second)", file=err)
    print(f"ffnlab_perf:       total time = {load_ms + t.prompt_ms + t.eval_ms:10.2f} ms / "
          f"{t.prompt_tokens + t.eval_tokens:5d} tokens", file=err)
