"""Mistral, Llama 3.x, Qwen3, Phi-3 (and Qwen2) through GGUF: HF directory -> ffnlab -> export_gguf -> llama.cpp.

For each family a tiny random transformers model (from_config, weights re-drawn, a byte tokenizer
so llama.cpp has a vocabulary) is loaded by ffnlab from its HF directory and exported to GGUF as
llama.cpp's converter writes that architecture (llama with rope_freqs.weight for Llama 3's
scaling, qwen3 with per-head q/k norms, phi3 with fused attn_qkv and a [gate; up] ffn_up, and
with partial rotary as rope.dimension_count). Then:
  - ffnlab reading the GGUF gives its own HF logits within 1e-5: the same float32 weights, only the
    q/k row order (llama's adjacent pairs vs HF's half-split) and packing differ, so the sums run in
    another order: ~1e-6 on logits of ~5;
  - llama.cpp (f32 K/V cache) gives HF's logits within 1e-4, and with its default f16 K/V cache within
    2e-2: f16 keeps 11 bits, a relative error of 2^-11 = 4.9e-4 on every key and value, which moves
    scores and mixed values by ~5e-4 relative per layer; on logits of ~5 over 2 layers that is
    ~5e-3, and 2e-2 leaves room for the tails;
  - every node name llama.cpp's eval callback prints is ffnlab's, in order, with op and shape.
The weights are drawn narrower than tests/engines/test_hf_dirs.py's (std 0.15) so the logits are ~5, not
~10, keeping the f16 cache's share of the error inside the 2e-2 bound.

llama.cpp's llama and phi3 graphs do not apply a sliding window (llama.cpp says so for phi3); the
export writes the window for ffnlab and HF, says so in one line, and the llama.cpp check of Mistral
runs 8 tokens (its window), where windowed and full attention agree.
"""
import numpy as np
import pytest

import ffnlab
from ffnlab.formats.export_gguf import export_gguf, window_warning
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
from ffnlab.tracing.llamacpp import capture, ffnlab_only, is_auto_name, is_kv_node  # noqa: E402

from gguf_family_models import COMMON, FAMILIES, IDS, randomize

pytestmark = pytest.mark.slow


GGUF_ARCH = {"mistral": "llama", "llama3": "llama", "qwen3": "qwen3", "phi3": "phi3", "qwen2": "qwen2",
             "phi3_partial": "phi3"}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    """-> (name, HF logits [22, 256], ffnlab model from the HF dir, GGUF path)"""
    name = request.param
    cfg_cls, model_cls, kw = FAMILIES[name]
    model = randomize(getattr(transformers, model_cls)(getattr(transformers, cfg_cls)(**COMMON, **kw)), seed=7)
    d = tmp_path_factory.mktemp(name)
    model.save_pretrained(d, safe_serialization=True)
    byte_tokenizer().tk.save(str(d / "tokenizer.json"))
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    m = ffnlab.load(str(d), progress=False)
    path = export_gguf(m.config, m.params, m.tokenizer, tokenizer_meta(m.tokenizer, "byte"), str(d / "m.gguf"))
    return name, ref, m, path


def llama_cpp_logits(path, ids, f16_cache):
    kv = 1 if f16_cache else 0                                  # ggml type: 0 = F32, 1 = F16
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, n_threads=1, verbose=False,
                          type_k=kv, type_v=kv)
    llm.eval(ids)
    return np.array(llm.scores[:len(ids)])


def test_hf_logits_reach_ffnlab(family):
    name, ref, m, _ = family
    assert np.abs(ref).max() > 1.0
    assert np.abs(m.forward(IDS) - ref).max() <= 1e-4


def test_ffnlab_reads_its_gguf_back(family):
    name, _, m, path = family
    back = ffnlab.load(path, progress=False)
    assert back.config.arch == GGUF_ARCH[name]
    assert back.config.sliding_window == m.config.sliding_window
    assert back.config.rope_freq_factors == pytest.approx(m.config.rope_freq_factors, rel=1e-7)
    assert np.abs(back.forward(IDS) - m.forward(IDS)).max() <= 1e-5


@pytest.mark.parametrize("f16_cache,tol", [(False, 1e-4), (True, 2e-2)], ids=["f32-kv", "f16-kv"])
def test_llama_cpp_runs_the_gguf_with_hf_logits(family, f16_cache, tol):
    name, ref, _, path = family
    n = 8 if name == "mistral" else len(IDS)                    # llama.cpp's llama graph has no window
    err = np.abs(llama_cpp_logits(path, IDS[:n], f16_cache) - ref[:n]).max()
    assert err <= tol, f"{name}: max |llama.cpp - transformers| = {err:.2e}"


def test_export_says_llama_cpp_ignores_the_window(family):
    name, _, m, _ = family
    line = window_warning(m.config, GGUF_ARCH[name])
    assert ("ignores attention.sliding_window=8" in line) == (name == "mistral")


def test_named_nodes_match_llama_cpp(family):
    name, _, _, path = family
    model = ffnlab.load(path, progress=False)
    ids = IDS[:6]
    with ffnlab.trace(model, keep=False) as t:
        model.forward(np.array(ids))
    theirs = capture(path, ids, keep=lambda n: False)

    def seq(nodes):
        out = []
        for n in nodes:
            ne = tuple(n.ne)
            if n.name.split("-")[0] in ("kq", "kq_soft_max"):
                ne = ("keys",) + ne[1:]                         # llama.cpp pads the KV cache to 256 cells
            out.append((n.name, n.op, ne))
        return out
    mine = seq([n for n in t.nodes if not ffnlab_only(n.name, model.config.arch)])
    ref = seq([n for n in theirs if not is_auto_name(n.name) and not is_kv_node(n)])
    assert len(mine) > 15 * model.config.n_layer
    assert mine == ref
