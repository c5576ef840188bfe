"""Chat prompts from the model's own template (tokenizer.chat_template, jinja2)."""
from ..errors import UsageError


def render_chat(tokenizer, messages, add_generation_prompt=True) -> str:
    """messages: [{"role": "system"|"user"|"assistant", "content": str}] -> prompt text"""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    if not tokenizer.chat_template:
        raise UsageError("--chat: this model has no chat template (tokenizer.chat_template is missing)")

    def raise_exception(msg):
        raise UsageError(f"chat template: {msg}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(tokenizer.chat_template)
    tok_text = lambda i: tokenizer.token_text(i) if i is not None else ""   # noqa: E731
    try:
        return tpl.render(messages=messages, add_generation_prompt=add_generation_prompt,
                          bos_token=tok_text(tokenizer.bos_id), eos_token=tok_text(tokenizer.eos_id))
    except jinja2.TemplateError as e:
        raise UsageError(f"chat template failed to render: {e}") from None


def encode_chat(tokenizer, prompt_text) -> list:
    """Encode a rendered chat prompt; BOS is added only if the template did not write it."""
    ids = tokenizer.encode(prompt_text, add_bos=False)
    if tokenizer.add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
        ids = [tokenizer.bos_id] + ids
    return ids
