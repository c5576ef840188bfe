"""`ffnlab run -i`: a chat loop in the manner of llama-cli's conversation mode.

Each line read from stdin is a user turn; the reply is generated from the whole conversation
(system message, every earlier turn and reply) rendered with the chat template, so the model
sees its history. The conversation is re-encoded each turn rather than kept in a KV cache: with
ffnlab's small models the prefill costs little, and the ids are then exactly what the template
gives for the full history. The loop ends at EOF, or when the conversation fills the context.
"""
import sys

PROMPT_MARK = "> "


def chat_template(args, model):
    """--chat-template, the model's own, or llama.cpp's fallback (chatml) with a notice on stderr."""
    from ..generation.chat_templates import resolve_template
    template, _label, notice = resolve_template(args.chat_template, model.tokenizer, model.config.arch)
    if notice:
        print(f"ffnlab run: {notice}", file=sys.stderr)
    return template


def context_notice(out, n_ctx, n_predict):
    """One line on stderr when the context, not -n or EOS, ended the generation."""
    if out.stop_reason == "context":
        asked = "no -n limit" if n_predict < 0 else f"-n {n_predict}"
        print(f"ffnlab run: the context is full ({n_ctx} tokens: {len(out.prompt_ids)} prompt + {len(out.ids)} "
              f"generated), generation stopped ({asked}); -c/--ctx-size or a shorter prompt", file=sys.stderr)


def _read_turns(first):
    if first is not None:
        yield first
    while True:
        if sys.stdin.isatty():
            sys.stdout.write(PROMPT_MARK)
            sys.stdout.flush()
        line = sys.stdin.readline()
        if not line:                                   # EOF
            return
        line = line.rstrip("\n")
        if line.strip():
            yield line


def chat_loop(model, args, first, params, n_ctx, perf) -> int:
    """-> exit code. first: -p's text (the first user turn) or None."""
    from ..generation import generate
    from ..generation.chat import encode_chat, render_chat
    from ..generation.generate import Timings

    template = chat_template(args, model)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    total = Timings()
    for turn in _read_turns(first):
        messages.append({"role": "user", "content": turn})
        ids = encode_chat(model.tokenizer, render_chat(model.tokenizer, messages, template=template))
        if len(ids) >= n_ctx:
            print(f"ffnlab run: the context is full ({n_ctx} tokens): the conversation so far takes {len(ids)}; "
                  f"ending the chat (-c/--ctx-size or a shorter conversation)", file=sys.stderr)
            break
        if not sys.stdin.isatty():
            sys.stdout.write(f"{PROMPT_MARK}{turn}\n")    # a piped turn is echoed so the transcript reads
        n_predict = n_ctx if args.n_predict < 0 else args.n_predict
        out = generate(model, ids, n_predict, params, _stream, n_ctx=n_ctx,
                       ignore_eos=getattr(args, "ignore_eos", False))
        sys.stdout.write("\n")
        sys.stdout.flush()
        messages.append({"role": "assistant", "content": out.text})
        for k in ("prompt_tokens", "prompt_ms", "eval_tokens", "eval_ms"):
            setattr(total, k, getattr(total, k) + getattr(out.timings, k))
        context_notice(out, n_ctx, args.n_predict)
        if out.stop_reason == "context":
            break
    perf(1000 * model.load_seconds, total)
    return 0


def _stream(_id, piece):
    sys.stdout.write(piece)
    sys.stdout.flush()
