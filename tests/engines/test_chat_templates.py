"""Chat templates under llama.cpp's names, the chatml fallback, and run's llama.cpp-style flags:
--chat-template, --system needing a chat, -i (a chat loop with history, read from piped stdin),
-n -1 and -c/--ctx-size with the one-line notice when the context fills.

References: llama.cpp's own llama_chat_apply_template() for every built-in name (llama-cpp-python),
the outputs llama.cpp documents for its templates (wiki "Templates supported by
llama_chat_apply_template"), and ffnlab's Python API (greedy, so deterministic) for the CLI.
"""
import ctypes
import io
import json

import pytest

from ffnlab.cli.main import main
from ffnlab.generation.chat import encode_chat, render_chat
from ffnlab.generation.chat_templates import BUILTIN, FALLBACK

pytestmark = pytest.mark.slow

CONVERSATION = [{"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": "Hi there"},
                {"role": "user", "content": "Who are you"}]


class _Tok:                                              # what render_chat reads from a tokenizer
    chat_template, bos_id, eos_id = None, None, None

    def token_text(self, i):
        return ""


def render(name, messages, add=True):
    return render_chat(_Tok(), messages, add_generation_prompt=add, template=BUILTIN[name])


def llama_cpp_render(name, messages, add):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
    arr = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(role=m["role"].encode(), content=m["content"].encode()) for m in messages])
    buf = ctypes.create_string_buffer(1 << 16)
    n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add, buf, len(buf))
    assert 0 < n < len(buf), f"llama.cpp does not know the template {name!r}"
    return buf.raw[:n].decode()


@pytest.mark.parametrize("name", sorted(BUILTIN))
@pytest.mark.parametrize("add", [True, False])
def test_builtin_template_writes_what_llama_cpp_writes(name, add):
    assert render(name, CONVERSATION, add) == llama_cpp_render(name, CONVERSATION, add)


def test_templates_match_llama_cpps_documented_outputs():
    """Without llama.cpp at hand: the outputs its documentation shows for these names."""
    hello = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "response"},
             {"role": "user", "content": "again"}, {"role": "assistant", "content": "response"}]
    assert render("chatml", hello, False) == ("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nresponse"
                                              "<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n"
                                              "response<|im_end|>\n")
    assert render("gemma", hello, False) == ("<start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n"
                                             "response<end_of_turn>\n<start_of_turn>user\nagain<end_of_turn>\n"
                                             "<start_of_turn>model\nresponse<end_of_turn>\n")
    assert render("llama2", hello, False) == "[INST] hello [/INST]response</s>[INST] again [/INST]response</s>"


def test_gemma_merges_the_system_message_into_the_first_user_turn():
    assert render("gemma", CONVERSATION[:2]) == ("<start_of_turn>user\nYou are a helpful assistant\n\nHello"
                                                 "<end_of_turn>\n<start_of_turn>model\n")


# --- run --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    """A 2-layer GGUF without a chat template, and the same model through the Python API."""
    import ffnlab
    import mlp_models
    path = mlp_models.tiny_gguf("f32")
    return path, ffnlab.load(path)


def run_json(capsys, *argv):
    rc = main(["run", *argv, "--temp", "0", "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), err


def test_chat_without_a_model_template_falls_back_to_chatml_with_a_notice(tiny, capsys):
    path, model = tiny
    doc, err = run_json(capsys, "-m", path, "-p", "Hello", "--chat", "-n", "3")
    assert "the model has no chat template; using chatml, llama.cpp's fallback" in err
    msgs = [{"role": "user", "content": "Hello"}]
    assert doc["prompt_ids"] == encode_chat(model.tokenizer, render_chat(model.tokenizer, msgs,
                                                                         template=BUILTIN[FALLBACK]))


def test_chat_template_by_name_and_by_file(tiny, capsys, tmp_path):
    path, model = tiny
    msgs = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hello"}]
    doc, err = run_json(capsys, "-m", path, "-p", "Hello", "--chat", "--system", "Be brief",
                        "--chat-template", "gemma", "-n", "2")
    assert "no chat template" not in err
    assert doc["prompt_ids"] == encode_chat(model.tokenizer, render_chat(model.tokenizer, msgs,
                                                                         template=BUILTIN["gemma"]))
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}>>")
    doc, _ = run_json(capsys, "-m", path, "-p", "Hello", "--chat", "--chat-template", str(f), "-n", "2")
    assert doc["prompt_ids"] == model.tokenizer.encode("[user] Hello\n>>", add_bos=False)


@pytest.mark.parametrize("argv,needle", [
    (["--system", "x"], "--system needs --chat or -i"),
    (["--chat-template", "chatml"], "--chat-template needs --chat or -i"),
    (["--chat", "--chat-template", "no-such"], "neither a built-in template (chatml, "),
    (["-n", "-2"], "-n must be >= 0, or -1 for no limit"),
    (["-c", "4096"], "exceeds"),
])
def test_chat_and_context_flags_fail_in_one_line(tiny, capsys, argv, needle):
    assert main(["run", "-m", tiny[0], "-p", "Hello", *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_n_minus_one_runs_until_the_context_is_full_and_says_so(tiny, capsys):
    path, model = tiny
    doc, err = run_json(capsys, "-m", path, "-p", "Hello", "-n", "-1", "-c", "24")
    assert doc["stop_reason"] == "context" and len(doc["prompt_ids"]) + len(doc["ids"]) == 24
    assert doc["ids"] == model.generate("Hello", n_predict=24 - len(doc["prompt_ids"]), temp=0).ids
    notice = [x for x in err.splitlines() if "context is full" in x]
    assert notice == ["ffnlab run: the context is full (24 tokens: 5 prompt + 19 generated), generation stopped "
                      "(no -n limit); -c/--ctx-size or a shorter prompt"]


def test_interactive_chat_keeps_the_history(capsys, monkeypatch, tmp_path):
    """Two turns piped on stdin: each reply is the greedy continuation of the whole conversation
    rendered with the template (the second turn sees the first turn and its reply)."""
    import ffnlab
    from models import tiny_gguf
    path = tiny_gguf(tmp_path / "chat.gguf", n_ctx=512)          # room for two byte-level turns
    model = ffnlab.load(path)
    monkeypatch.setattr("sys.stdin", io.StringIO("Hello\nAgain\n"))
    assert main(["run", "-m", path, "-i", "--temp", "0", "-n", "4", "--system", "Be brief"]) == 0
    out = capsys.readouterr().out
    tok = model.tokenizer
    msgs, want = [{"role": "system", "content": "Be brief"}], ""
    for turn in ("Hello", "Again"):
        msgs.append({"role": "user", "content": turn})
        ids = encode_chat(tok, render_chat(tok, msgs, template=BUILTIN[FALLBACK]))
        reply = model.generate(ids, n_predict=4, temp=0).text
        msgs.append({"role": "assistant", "content": reply})
        want += f"> {turn}\n{reply}\n"
    assert out == want
