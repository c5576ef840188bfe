"""Gemma 2, GPT-NeoX/Pythia and OLMo 2 in GGUF: ffnlab's export runs in llama.cpp, reads back, and
traces with llama.cpp's node names (formats/gguf_families.py, formats/gguf_meta.py).

Each family: a tiny random transformers model (vocab 256 so ffnlab's byte tokenizer fits it,
nonzero norm weights and biases, 12 tokens, longer than Gemma 2's window of 4) saved as an HF
directory, loaded by ffnlab, exported to GGUF and run by llama.cpp (llama-cpp-python) with its
default f16 KV cache:
  - llama.cpp's logits within 2e-2 of transformers' (the bound asked of every family: K and V rounded to fp16,
    2^-11 relative, move scores and outputs by ~1e-3 of logits of size ~5; measured 1.2e-3 to 7.4e-3);
  - ffnlab reading the GGUF gives its own logits within 1e-5 (the same float32 weights and the same
    code: only the packed-weight layout can change a summation order);
  - ffnlab's traced node names, ops and shapes are llama.cpp's, in order (as test_trace_llamacpp).
The GELU of gptneox differs by design: ffnlab computes Pythia's exact GELU (GELU_ERF), llama.cpp's
graph its tanh approximation (GELU): same node, another op.
"""
import numpy as np
import pytest

import ffnlab
from ffnlab.errors import UsageError
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.formats.hf_tokenizer import tokenizer_json
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
from ffnlab.tracing.llamacpp import capture, ffnlab_only, is_auto_name, is_kv_node  # noqa: E402
from hf_family_models import randomize  # noqa: E402
from llamacpp_nodes import sequence  # noqa: E402

pytestmark = pytest.mark.slow

LLAMA_CPP_TOL = 2e-2
READBACK_TOL = 1e-5
IDS = [3, 17, 250, 9, 42, 0, 101, 7, 99, 64, 5, 12]
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64,
              bos_token_id=0, eos_token_id=0, pad_token_id=0)
FAMILIES = {
    # llama.cpp reads no query_pre_attn_scalar (1/sqrt(head_dim)): here it equals head_dim
    "gemma2": ("Gemma2Config", dict(intermediate_size=96, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                    sliding_window=4, attn_logit_softcapping=3.0, final_logit_softcapping=6.0)),
    "gptneox": ("GPTNeoXConfig", dict(intermediate_size=128)),          # parallel residual, rotary_pct 0.25
    "olmo2": ("Olmo2Config", dict(intermediate_size=96, num_key_value_heads=2)),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """family -> (ffnlab Model from the HF dir, its GGUF export's path, transformers' logits)"""
    out = {}
    tok = byte_tokenizer()
    for fam, (cls, kw) in FAMILIES.items():
        model = randomize(transformers.AutoModelForCausalLM.from_config(getattr(transformers, cls)(**COMMON, **kw),
                                                                        attn_implementation="eager"))
        d = tmp_path_factory.mktemp(fam)
        model.save_pretrained(d, safe_serialization=True)
        tokenizer_json(tok).save(str(d / "tokenizer.json"))          # for verify's text prompt
        with torch.no_grad():
            ref = model(torch.tensor([IDS])).logits[0].numpy()
        m = ffnlab.load(str(d), progress=False)
        out[fam] = (m, export_gguf(m.config, m.params, tok, tokenizer_meta(tok, "byte"), str(d / "m.gguf")), ref)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_runs_in_llama_cpp_with_transformers_logits(family, exported):
    m, path, ref = exported[family]
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    assert llm.metadata["general.architecture"] == family
    llm.eval(IDS)
    theirs = np.array(llm.scores[:len(IDS)])
    assert np.abs(ref).max() > 3
    err = np.abs(theirs - ref).max()
    assert err <= LLAMA_CPP_TOL, f"{family}: max |llama.cpp - transformers| = {err:.2e}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_reads_back_as_the_same_model(family, exported):
    m, path, _ = exported[family]
    back = ffnlab.load(path, progress=False)
    for f in ("arch", "pre_norm", "post_attn_norm", "post_ffn_norm", "parallel_residual", "rope_dim", "qk_norm_full",
              "attn_softcap", "final_logit_softcap", "sliding_window", "sliding_window_pattern", "ffn", "norm"):
        assert getattr(back.config, f) == getattr(m.config, f), f
    err = np.abs(back.forward(IDS) - m.forward(IDS)).max()
    assert err <= READBACK_TOL, f"{family}: reloaded export differs by {err:.2e}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_named_nodes_match_llama_cpp_in_order(family, exported):
    _, path, _ = exported[family]
    model = ffnlab.load(path, progress=False)
    with ffnlab.trace(model, keep=False) as t:
        model.forward(np.array(IDS))
    theirs = capture(path, IDS, keep=lambda name: False)
    T = len(IDS)
    mine = sequence([n for n in t.nodes if not ffnlab_only(n.name, family)], T)
    ref = sequence([n for n in theirs if not is_auto_name(n.name) and not is_kv_node(n)], T)
    if family == "gptneox":                    # exact GELU here, llama.cpp's tanh GELU there (module docstring)
        mine = [(n, "GELU" if op == "GELU_ERF" else op, ne) for n, op, ne in mine]
    assert len(mine) > 20 * model.config.n_layer
    assert mine == ref


@pytest.mark.parametrize("family,change,needle", [
    ("gemma2", dict(attn_scale=0.125), "query_pre_attn_scalar"),
    ("gemma2", dict(attn_softcap=0.0), "always caps"),
    ("gptneox", dict(ffn="gelu_tanh"), "ffn='gelu_tanh'"),
    ("olmo2", dict(attn_bias=True), "attn_bias=True"),
])
def test_what_llama_cpp_computes_differently_is_refused(family, change, needle, exported, tmp_path):
    import dataclasses
    m, _, _ = exported[family]
    cfg = dataclasses.replace(m.config, **change)
    params = m.params
    if change.get("attn_bias"):
        params = {**params, **{f"blk.{il}.attn_{x}.bias": np.zeros(cfg.kv_dim if x != "q" else cfg.q_dim, np.float32)
                               for il in range(cfg.n_layer) for x in "qkv"}}
    tok = byte_tokenizer()
    with pytest.raises(UsageError, match=f"cannot export to GGUF {family}:.*{needle}"):
        export_gguf(cfg, params, tok, tokenizer_meta(tok, "byte"), str(tmp_path / "x.gguf"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_verify_against_llama_cpp_passes_node_by_node(family, exported, capsys):
    """`ffnlab verify --against llama.cpp --f32`: every shared node within 1e-2 of its largest value
    (Gemma 2's softcap nodes carry the padded KV columns as kq does)."""
    from ffnlab.cli.main import main
    _, path, _ = exported[family]
    assert main(["verify", "-m", path, "--against", "llama.cpp", "--f32", "-p", "Hello there, how are you"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "nodes compared" in out


@pytest.mark.parametrize("source", ["gemma2", "gptneox", "olmo2", "gemma2.gguf"])
def test_verify_against_transformers_passes_node_by_node(source, exported, capsys):
    """`ffnlab verify --against hf` (1e-4 of each node's largest value): on the HF directories, and
    on the Gemma 2 GGUF, which transformers reads itself (soft-caps, window and scale set as
    llama.cpp reads them; transformers reads no gptneox or olmo2 GGUF)."""
    from ffnlab.cli.main import main
    family = source.removesuffix(".gguf")
    m, path, _ = exported[family]
    model = path if source.endswith(".gguf") else m.source
    assert main(["verify", "-m", model, "--against", "hf", "-p", "Hello there, how are you"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and int(out.split(" nodes compared")[0].split()[-1]) > 15 * m.config.n_layer


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_cli_from_the_hf_dir_and_back_from_the_gguf(family, exported, tmp_path):
    """`ffnlab export HF_DIR --to gguf`, then `ffnlab export THAT.gguf --to hf`: the same model all the
    way (ffnlab's logits within 1e-5 at each step, transformers' on the final directory within 1e-4)."""
    from ffnlab.cli.main import main
    m, _, ref = exported[family]
    gguf_path, hf_dir = str(tmp_path / "cli.gguf"), str(tmp_path / "cli_hf")
    assert main(["export", m.source, "--to", "gguf", gguf_path]) == 0
    assert main(["export", gguf_path, "--to", "hf", hf_dir]) == 0
    ours = m.forward(IDS)
    for path in (gguf_path, hf_dir):
        assert np.abs(ffnlab.load(path, progress=False).forward(IDS) - ours).max() <= READBACK_TOL, path
    back = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager").eval()
    with torch.no_grad():
        assert np.abs(back(torch.tensor([IDS])).logits[0].numpy() - ref).max() <= 1e-4


def test_inspect_names_each_familys_block(exported, capsys):
    from ffnlab.cli.main import main
    want = {"gptneox": ["rotary dims                  4 of 16 per head (partial RoPE)",
                        "residual                     parallel: x + attn(attn_norm(x)) + ffn(ffn_norm(x))"],
            "gemma2": ["soft-caps (c*tanh(x/c))      attention 3, logits 6", "sliding window 4"],
            "olmo2": ["rmsnorm, no pre-norms, q/k norm, post-attention norm, post-FFN norm"]}
    for family, lines in want.items():
        assert main(["inspect", exported[family][1]]) == 0
        out = capsys.readouterr().out
        assert all(line in out for line in lines), (family, out[:800])
