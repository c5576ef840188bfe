"""`ffnlab export --to gguf`: llama.cpp (llama-cpp-python) loads the file and gives ffnlab's
logits, tokenizes like ffnlab, and ffnlab loads the file back.

Tolerances, f32: 1e-3 absolute. llama.cpp's CPU GELU looks its output up in a table of fp16
values indexed by the fp16-rounded input (GGML_GELU_FP16 in ggml-cpu/vec.h), so for the gpt2
architecture the ffnlab side is computed with the same table, and the bound grows by twice the
logit change float32 rounding of the table's inputs causes (table_step_sensitivity); the KV cache is kept in f32
(type_k/type_v = 0) because its default f16 rounding is not part of the model.
q8_0: llama.cpp also rounds activations to 8 bits in each matmul, so its logits are compared
with ffnlab running the dequantized q8_0 weights, within 5% of the largest logit (measured 0.9-2.4%).
"""
import numpy as np
import pytest

import ffnlab
from export_helpers import GPT2, LLAMA, PROMPT, config, make_checkpoint
from ffnlab.cli.main import main
from ffnlab.model.arith import F32
from ffnlab.model.transformer import forward
from ffnlab.ops import activations as A
from ffnlab.quant import floats
from ffnlab.training.data import tokenizer_meta, train_bpe_tokenizer

pytestmark = pytest.mark.slow

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")

F32_TOL = 1e-3
Q8_REL = 5e-2
GGML_F32 = 0

CASES = {
    "llama-normal": config(LLAMA),
    "llama-neox": config(LLAMA, rope_pairing="neox"),             # needs convert_hf_to_gguf's Q/K row permutation
    "llama-tied": config(LLAMA, tie_embeddings=True),
    "gpt2": config(GPT2),
    "gpt2-unfused-qkv": config(GPT2, fused_qkv=False),
}


def llama_cpp_logits(path, ids):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, n_threads=1, verbose=False,
                          type_k=GGML_F32, type_v=GGML_F32)
    llm.eval(list(map(int, ids)))
    return np.array(llm.scores[:len(ids)]), llm


def ggml_gelu_table(x):
    """ggml's fp16 GELU: fp16(gelu(fp16(x))) inside (-10, 10), 0 below, identity above."""
    y = A.gelu_tanh_forward(x.astype(np.float16).astype(np.float32)).astype(np.float16).astype(np.float32)
    return np.where(x <= -10, 0, np.where(x >= 10, x, y)).astype(np.float32)


def table_step_sensitivity(params, cfg, ids, ours, monkeypatch, seeds=4):
    """How far the logits move when the fp16 GELU table's inputs move by float32 rounding.

    llama.cpp and ffnlab compute the GELU's input in float32 with different summation orders, so
    they differ by up to about K * eps relative (K the longest reduction). The table is a step
    function: an input that lands on the other side of an fp16 rounding boundary moves the output
    by a whole fp16 step, which no float32 error bound covers. This perturbs the inputs by +-K*eps
    relative (random signs, a few seeds) in ffnlab itself and returns the largest logit change:
    the same steps llama.cpp's rounding can take, measured on this model and this machine."""
    rel = max(cfg.d_model, cfg.d_ff) * np.finfo(np.float32).eps
    worst = 0.0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)

        def shifted(x):
            return ggml_gelu_table((x * (1 + rel * rng.choice([-1.0, 1.0], size=x.shape))).astype(np.float32))
        use_gelu(monkeypatch, shifted)
        worst = max(worst, float(np.abs(forward(params, cfg, ids[None])[0][0] - ours).max()))
    use_gelu(monkeypatch, ggml_gelu_table)
    return worst


def use_gelu(monkeypatch, fn):
    """Make the forward's GELU-tanh fn: the activation table and the f32 arithmetic's copy of it
    (model/arith.py), whichever the block reads."""
    monkeypatch.setitem(A.ACTIVATIONS, "gelu_tanh", A.ACTIVATIONS["gelu_tanh"]._replace(forward=fn))
    monkeypatch.setitem(F32.act, "gelu_tanh", fn)


def export(ckpt, out, qtype="f32"):
    assert main(["export", str(ckpt), "--to", "gguf", str(out), "--type", qtype]) == 0


@pytest.mark.parametrize("case", list(CASES))
def test_gguf_f32_gives_the_same_logits_in_llama_cpp(case, tmp_path, monkeypatch):
    cfg = CASES[case]
    params, tok = make_checkpoint(tmp_path / "ckpt", cfg)
    export(tmp_path / "ckpt", tmp_path / "m.gguf")
    ids = np.array(tok.encode(PROMPT))
    theirs, llm = llama_cpp_logits(tmp_path / "m.gguf", ids)
    assert llm.n_vocab() == cfg.vocab_size and llm.n_ctx() >= 64
    assert llm.metadata["general.architecture"] == cfg.arch
    exact = forward(params, cfg, ids[None])[0][0]
    if cfg.ffn == "gelu_tanh":
        use_gelu(monkeypatch, ggml_gelu_table)
    ours = forward(params, cfg, ids[None])[0][0]
    assert np.abs(ours).max() > 3
    err = np.abs(theirs - ours).max()
    # gpt2: plus twice the steps float32 rounding can make the fp16 GELU table take (5-6e-4 measured)
    steps = table_step_sensitivity(params, cfg, ids, ours, monkeypatch) if cfg.ffn == "gelu_tanh" else 0.0
    assert err <= F32_TOL + 2 * steps, (f"{case}: max |llama.cpp - ffnlab| = {err:.2e}, bound {F32_TOL:.0e} + 2 x "
                                        f"{steps:.2e} (without the GELU table: {np.abs(theirs - exact).max():.2e})")
    assert llm.tokenize(PROMPT.encode(), add_bos=False, special=False) == tok.encode(PROMPT)
    back = ffnlab.load(str(tmp_path / "m.gguf"))             # ffnlab reads its own export (GGUF order, normal pairing)
    assert back.config.arch == cfg.arch and back.config.d_ff == cfg.d_ff
    monkeypatch.undo()
    # Against the exact-GELU forward, not `ours`: the fp16 GELU table is a step function, so a 1e-6
    # change in its input (a fused q/k/v product rounds differently from three) moves its output by a
    # whole fp16 step (2^-11 relative), 6e-4 in these logits. Both sides are float32 forwards of the
    # same weights that differ only in summation order; each logit carries at most about
    # (longest reduction) * eps/2 of its terms' size, the terms being of the order of the largest logit.
    back_err = np.abs(back.forward(ids) - exact).max()
    bound = 2 * max(cfg.d_model, cfg.d_ff) * np.finfo(np.float32).eps / 2 * np.abs(exact).max()
    assert back_err <= bound, f"{case}: reloaded export differs by {back_err:.2e} (bound {bound:.2e})"
    assert back.tokenizer.encode(PROMPT) == tok.encode(PROMPT)


@pytest.mark.parametrize("case", ["llama-normal", "gpt2"])
def test_gguf_q8_0_runs_in_llama_cpp(case, tmp_path):
    import gguf
    cfg = CASES[case]
    params, tok = make_checkpoint(tmp_path / "ckpt", cfg)
    export(tmp_path / "ckpt", tmp_path / "q8.gguf", "q8_0")
    r = gguf.GGUFReader(str(tmp_path / "q8.gguf"))
    types = {t.name: t.tensor_type.name for t in r.tensors}
    assert types["blk.0.ffn_up.weight"] == "Q8_0" and types["token_embd.weight"] == "Q8_0"
    assert types["output_norm.weight"] == "F32"
    assert int(r.fields["general.file_type"].contents()) == int(gguf.LlamaFileType.MOSTLY_Q8_0)
    q8 = ffnlab.load(str(tmp_path / "q8.gguf"))
    for name, w in params.items():
        if types[name] == "Q8_0":
            # q8_0: w ~ d * q, q an int8 in [-127, 127], d = max|block| / 127 stored as fp16, so each weight
            # is within half a step plus 127 times the fp16 rounding of d (relative 2^-11)
            blocks = w.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            assert np.all(np.abs(floats(q8.params[name]).reshape(-1, 32) - blocks) <= (0.5 + 127 * 2**-11) * step + 1e-7), name
    ids = np.array(tok.encode(PROMPT))
    theirs, _ = llama_cpp_logits(tmp_path / "q8.gguf", ids)
    ours = q8.forward(ids)
    err = np.abs(theirs - ours).max() / np.abs(ours).max()
    assert err <= Q8_REL, f"{case} q8_0: max |llama.cpp - ffnlab| = {err:.1%} of the largest logit"


def test_gguf_bpe_tokenizer_tokenizes_the_same_in_llama_cpp(tmp_path):
    text = "".join(f"Now is the winter of our discontent {i}, made glorious summer.\n" for i in range(100))
    tok = train_bpe_tokenizer(text, 320)
    cfg = config(LLAMA, vocab_size=320)
    make_checkpoint(tmp_path / "ckpt", cfg, tok, tokenizer_meta(tok, "bpe"))
    export(tmp_path / "ckpt", tmp_path / "m.gguf")
    _, llm = llama_cpp_logits(tmp_path / "m.gguf", [0])
    for s in (text[:300], PROMPT, "  two  spaces\n\nand 12345 numbers's"):
        assert llm.tokenize(s.encode(), add_bos=False, special=False) == tok.encode(s), s
    assert llm.token_eos() == tok.eos_id
    assert ffnlab.load(str(tmp_path / "m.gguf")).tokenizer.encode(text[:300]) == tok.encode(text[:300])


@pytest.mark.parametrize("cfg,needle", [
    (config(GPT2, ffn="relu"), "a relu MLP cannot be represented in GGUF -- use --to hf"),
    (config(LLAMA, ffn="geglu"), "a geglu MLP cannot be represented in GGUF -- use --to hf"),
    (config(GPT2, ffn="gelu"), "ffn='gelu' (needs 'gelu_tanh')"),
    (config(LLAMA, attn_bias=True), "attn_bias=True (needs False)"),
])
def test_gguf_export_refuses_what_llama_cpp_cannot_represent(cfg, needle, tmp_path, capsys):
    make_checkpoint(tmp_path / "ckpt", cfg)
    assert main(["export", str(tmp_path / "ckpt"), "--to", "gguf", str(tmp_path / "m.gguf")]) == 1
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.slow
def test_train_with_a_real_models_tokenizer_and_export_it(tmp_path):
    """--tokenizer PATH: SmolLM2's tokenizer (49152 tokens); the GGUF export carries that model's own
    tokenizer.* metadata, so llama.cpp tokenizes like the source model."""
    from ffnlab.formats.load import default_model_path
    from ffnlab.errors import ModelFileError
    try:
        src = default_model_path()
    except ModelFileError as e:
        pytest.skip(str(e))
    data = tmp_path / "text.txt"
    data.write_text("".join(f"{i}: It was the best of times, it was the worst of times.\n" for i in range(80)))
    out = tmp_path / "ckpt"
    assert main(["train", "--data", str(data), "--out", str(out), "--tokenizer", src, "--n-layer", "1", "--d-model",
                 "32", "--n-head", "2", "--seq-len", "16", "--batch", "2", "--steps", "2", "--warmup", "0",
                 "--quiet"]) == 0
    export(out, tmp_path / "m.gguf")
    _, llm = llama_cpp_logits(tmp_path / "m.gguf", [1])
    ref = llama_cpp.Llama(model_path=src, vocab_only=True, verbose=False)
    for s in (PROMPT, "<|im_start|>user\nhi<|im_end|>", "  code:\tx = 42"):
        assert llm.tokenize(s.encode(), add_bos=False, special=True) == ref.tokenize(s.encode(), add_bos=False, special=True)
    assert ffnlab.load(str(out)).tokenizer.encode("It was the best") == ref.tokenize(b"It was the best", add_bos=False)
