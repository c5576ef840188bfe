"""Chat prompts from the model's own template (tokenizer.chat_template, jinja2).

A template comes from the model file, so it is untrusted code. jinja2's sandbox stops it from
reaching Python internals but not from using resources, so the environment here also bounds them:
  - time: rendering stops after RENDER_SECONDS (a SIGALRM timer; only in the main thread);
  - output: at most MAX_OUTPUT_CHARS characters are produced, counted as they stream;
  - single huge values: `"x" * 10**10`, `2 ** 10**10` and a filter or method called with an
    integer argument above MAX_INT_ARG (`center(10**10)`) are refused before they allocate;
  - memory: whatever else grows (a string doubled 40 times, "%0999999999d" % 1) meets an address-space
    limit of RENDER_MEMORY bytes above what the process holds, set for the render only (POSIX).
Every failure -- syntax, an undefined call, a runtime error, a bound -- is one UsageError line.
"""
import contextlib
import functools
import signal
import threading

from ..errors import UsageError

RENDER_SECONDS = 5.0
MAX_OUTPUT_CHARS = 1 << 20          # a prompt must fit the context anyway; real templates write a few kB
MAX_INT_ARG = 1 << 20
RENDER_MEMORY = 512 << 20


class TemplateLimit(Exception):
    """A chat template went past a resource bound."""


def _environment():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context, operator, left, right):
            seqs = (str, list, tuple)
            if operator == "*" and (isinstance(left, seqs) or isinstance(right, seqs)):
                seq, n = (left, right) if isinstance(left, seqs) else (right, left)
                size = len(seq) if isinstance(seq, str) else sum(len(x) if isinstance(x, str) else 1 for x in seq)
                if isinstance(n, int) and size * n > MAX_OUTPUT_CHARS:
                    raise TemplateLimit(f"repeats a value of size {size} {n} times")
            if operator == "**" and isinstance(right, int) and abs(right) > 1024 and left not in (0, 1, -1):
                raise TemplateLimit(f"raises to the power {right}")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805 (jinja2's signature)
            _check_args(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    env = Bounded(trim_blocks=True, lstrip_blocks=True)
    env.filters = {name: _bounded_filter(f) for name, f in env.filters.items()}
    return env


def _check_args(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_INT_ARG:
            raise TemplateLimit(f"calls a function with the argument {a}")


def _bounded_filter(f):
    @functools.wraps(f)                      # keeps jinja2's pass_context / pass_environment marks
    def bounded(*args, **kwargs):
        _check_args(args[1:], kwargs)
        return f(*args, **kwargs)
    return bounded


@contextlib.contextmanager
def _memory_limit(extra):
    """Cap this process's address space at its current size + extra bytes (soft limit, restored)."""
    try:
        import resource
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * resource.getpagesize()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = current + extra
        if hard != resource.RLIM_INFINITY:
            cap = min(cap, hard)
        if soft != resource.RLIM_INFINITY:
            cap = min(cap, soft)
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ImportError, OSError, ValueError):   # not Linux: the other bounds still hold
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@contextlib.contextmanager
def _time_limit(seconds):
    """Raise TemplateLimit in this thread after `seconds` (main thread only: signals go there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise TemplateLimit(f"ran longer than {seconds:g} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def render_chat(tokenizer, messages, add_generation_prompt=True, template=None) -> str:
    """messages: [{"role": "system"|"user"|"assistant", "content": str}] -> prompt text.
    template: jinja text to use instead of the model's (generation/chat_templates.py)."""
    template = template or tokenizer.chat_template
    if not template:
        raise UsageError("--chat: this model has no chat template (tokenizer.chat_template is missing)")

    where = getattr(tokenizer, "template_source", "") or "chat template"

    def raise_exception(msg):
        raise UsageError(f"{where}: {msg}")

    tok_text = lambda i: tokenizer.token_text(i) if i is not None else ""   # noqa: E731
    pieces, size = [], 0
    try:
        with _time_limit(RENDER_SECONDS), _memory_limit(RENDER_MEMORY):
            env = _environment()
            env.globals["raise_exception"] = raise_exception
            tpl = env.from_string(template)
            for piece in tpl.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                      bos_token=tok_text(tokenizer.bos_id), eos_token=tok_text(tokenizer.eos_id)):
                size += len(piece)
                if size > MAX_OUTPUT_CHARS:
                    raise TemplateLimit(f"writes more than {MAX_OUTPUT_CHARS} characters")
                pieces.append(piece)
    except UsageError:
        raise
    except TemplateLimit as e:
        raise UsageError(f"{where}: template refused: it {e}") from None
    except RecursionError:
        raise UsageError(f"{where}: template failed to render: it recurses too deeply") from None
    except MemoryError:
        raise UsageError(f"{where}: template refused: it needs more than {RENDER_MEMORY >> 20} MB") from None
    except Exception as e:                    # TemplateSyntaxError, UndefinedError, TypeError, ...
        line = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        msg = " ".join(str(e).split())[:200]
        raise UsageError(f"{where}: template failed to render{line}: {type(e).__name__}: {msg}") from None
    return "".join(pieces)


def encode_chat(tokenizer, prompt_text) -> list:
    """Encode a rendered chat prompt; BOS is added only if the template did not write it."""
    ids = tokenizer.encode(prompt_text, add_bos=False)
    if tokenizer.add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
        ids = [tokenizer.bos_id] + ids
    return ids
