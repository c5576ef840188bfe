"""Built-in chat templates under llama.cpp's names, for `--chat-template NAME` and for models
whose file carries none.

Each is a jinja2 template (rendered by generation/chat.py's sandbox, like a model's own) that
writes what llama.cpp's llm_chat_apply_template() writes for that name (src/llama-chat.cpp);
tests/engines/test_chat_templates.py holds every one to llama.cpp's own output. Roles are "system",
"user", "assistant"; none writes BOS (the tokenizer adds it, as llama.cpp's does).

    chatml      <|im_start|>role\\ncontent<|im_end|>\\n            (Qwen, SmolLM2; llama.cpp's fallback)
    llama2      [INST] system\\nuser [/INST]assistant</s>[INST] ...
    llama2-sys  [INST] <<SYS>>\\nsystem\\n<</SYS>>\\n\\nuser [/INST]assistant</s>
    llama3      <|start_header_id|>role<|end_header_id|>\\n\\ncontent<|eot_id|>
    gemma       <start_of_turn>user\\ncontent<end_of_turn>\\n  (assistant is "model"; the system
                message is merged into the first user turn: Gemma has no system role)
    zephyr      <|role|>\\ncontent<|endoftext|>\\n
    phi3        <|role|>\\ncontent<|end|>\\n
    mistral-v7  [SYSTEM_PROMPT] system[/SYSTEM_PROMPT][INST] user[/INST] assistant</s>
    vicuna      system\\n\\nUSER: user\\nASSISTANT: assistant</s>\\n

resolve_template(name_or_file, tokenizer, arch) picks what --chat uses: a built-in name, a file
holding a jinja template, the model's own template, or -- when the model has none -- the format its
architecture was trained on (ARCH_TEMPLATES: a Gemma reads no chatml and would print <|im_end|> as
text), else chatml, llama.cpp's fallback; either with a notice saying so.
"""
import os

from ..errors import UsageError

FALLBACK = "chatml"
# architectures whose every chat model speaks one format (llama and others vary by release: fallback)
ARCH_TEMPLATES = {"gemma2": "gemma", "gemma3": "gemma", "phi3": "phi3",
                  "qwen2": "chatml", "qwen3": "chatml", "qwen2moe": "chatml", "qwen3moe": "chatml"}


def _llama2(system):
    return ("[INST] {% set ns = namespace(inside=true) %}{% for m in messages %}"
            "{% if not ns.inside %}[INST] {% set ns.inside = true %}{% endif %}"
            "{% if m.role == 'system' %}" + system +
            "{% elif m.role == 'user' %}{{ m.content }} [/INST]"
            "{% else %}{{ m.content }}</s>{% set ns.inside = false %}{% endif %}{% endfor %}")

BUILTIN = {
    "chatml": (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    # the turn stays open after a user message ([/INST]) and closes after the answer (</s>);
    # "llama2" has no system role (the text goes first, plain), "llama2-sys" wraps it in <<SYS>>
    "llama2": _llama2("{{ m.content }}\n"),
    "llama2-sys": _llama2("<<SYS>>\n{{ m.content }}\n<</SYS>>\n\n"),
    "llama3": (
        "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
        "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"),
    "gemma": (
        "{% set ns = namespace(system='') %}{% for m in messages %}"
        "{% if m.role == 'system' %}{% set ns.system = ns.system + (m.content | trim) %}"
        "{% else %}{% set role = 'model' if m.role == 'assistant' else m.role %}"
        "<start_of_turn>{{ role }}\n"
        "{% if ns.system and role != 'model' %}{{ ns.system }}\n\n{% set ns.system = '' %}{% endif %}"
        "{{ m.content | trim }}<end_of_turn>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"),
    "zephyr": (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|endoftext|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"),
    "phi3": (
        "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"),
    "mistral-v7": (
        "{% for m in messages %}{% if m.role == 'system' %}[SYSTEM_PROMPT] {{ m.content }}[/SYSTEM_PROMPT]"
        "{% elif m.role == 'user' %}[INST] {{ m.content }}[/INST]"
        "{% else %} {{ m.content }}</s>{% endif %}{% endfor %}"),
    "vicuna": (
        "{% for m in messages %}{% if m.role == 'system' %}{{ m.content }}\n\n"
        "{% elif m.role == 'user' %}USER: {{ m.content }}\n"
        "{% else %}ASSISTANT: {{ m.content }}</s>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}ASSISTANT:{% endif %}"),
}


def resolve_template(choice, tokenizer, arch=None):
    """-> (jinja template text, label, notice or None).
    choice: None (the model's own, else the fallback), a BUILTIN name, or a file holding a template."""
    if choice is None:
        if tokenizer.chat_template:
            return tokenizer.chat_template, "the model's own", None
        if arch in ARCH_TEMPLATES:
            name = ARCH_TEMPLATES[arch]
            return (BUILTIN[name], name, f"the model has no chat template; using {name}, the format of its "
                                         f"architecture ({arch}); --chat-template NAME|FILE chooses another")
        return (BUILTIN[FALLBACK], FALLBACK,
                f"the model has no chat template; using {FALLBACK}, llama.cpp's fallback; "
                f"--chat-template NAME|FILE chooses another")
    if choice in BUILTIN:
        return BUILTIN[choice], choice, None
    if os.path.isfile(choice):
        try:
            with open(choice, encoding="utf-8") as f:
                return f.read(1 << 20), choice, None
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"--chat-template {choice}: cannot read it as UTF-8 text ({e})") from None
    raise UsageError(f"--chat-template {choice!r}: neither a built-in template ({', '.join(BUILTIN)}) "
                     f"nor a file")
