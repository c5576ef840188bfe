"""Granite and SmolLM3, the two families added as one module each (families/granite.py, smollm3.py),
held to transformers and llama.cpp as the other families are.

Granite: four multipliers (embedding, residual, attention, logits), drawn far from 1 so that a
dropped or misplaced one moves the logits by O(1). SmolLM3: no RoPE on every fourth layer; 8
layers, so layers 3 and 7 are NoPE (transformers' no_rope_layers = int((il + 1) % 4 != 0)).

  - ffnlab's float32 logits on an HF directory within 1e-4 of transformers' (14 tokens), the full
    forward and the KV-cache decode (the bound and its reason: tests/engines/test_hf_families.py);
  - ffnlab's backward in float64 equals torch autograd through transformers' float64 model, every
    weight's gradient within 1e-5 of its largest entry: transformers computes RoPE's cos/sin from a
    float32 inv_freq (relative error ~6e-8 per angle, measured 1e-6 after 8 layers), every other step
    of both sides is float64;
  - the HF export loads in transformers with the same logits (1e-4), and reads back as the same config;
  - the GGUF export runs in llama.cpp (llama-cpp-python, its default f16 KV cache) within 2e-2 of
    transformers' logits (the bound of tests/engines/test_gguf_families.py), reads back in ffnlab
    within 1e-5, and ffnlab's traced node names, ops and shapes are llama.cpp's eval callback's, in order;
  - what neither llama.cpp's graph nor ffnlab computes is refused, naming the field.
"""
import dataclasses
import re

import numpy as np
import pytest

import ffnlab
from ffnlab.config import ConfigError
from ffnlab.errors import UsageError
from ffnlab.formats.export_gguf import export_gguf
from ffnlab.formats.export_hf import export_hf
from ffnlab.formats.hf import gguf_name
from ffnlab.formats.hf_config import config_from_hf
from ffnlab.formats.hf_tokenizer import tokenizer_json
from ffnlab.training.data import byte_tokenizer, tokenizer_meta

torch = pytest.importorskip("torch", reason="torch, the reference (scripts/install.sh --test installs it)")
transformers = pytest.importorskip("transformers", reason="transformers, the reference (scripts/install.sh --test installs it)")
llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
from ffnlab.tracing.llamacpp import capture, ffnlab_only, is_auto_name, is_kv_node  # noqa: E402
from hf_family_models import randomize  # noqa: E402
from llamacpp_nodes import sequence  # noqa: E402

pytestmark = pytest.mark.slow

TOL = 1e-4
LLAMA_CPP_TOL = 2e-2
READBACK_TOL = 1e-5
GRAD_TOL = 1e-5
IDS = [3, 17, 250, 9, 42, 0, 101, 7, 99, 64, 5, 12, 77, 180]
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
              pad_token_id=1)      # not in IDS: torch gives the padding row of nn.Embedding no gradient
FAMILIES = {
    "granite": ("GraniteConfig", dict(num_hidden_layers=3, embedding_multiplier=3.0, residual_multiplier=0.4,
                                      attention_multiplier=0.09, logits_scaling=2.5)),
    "smollm3": ("SmolLM3Config", dict(num_hidden_layers=8)),
}


def hf_model(family, dtype=torch.float32):
    cls, kw = FAMILIES[family]
    cfg = getattr(transformers, cls)(**COMMON, **kw)
    return randomize(transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")).to(dtype)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """family -> (HF directory, transformers' logits [T, vocab], ffnlab's model, its GGUF export)"""
    out = {}
    tok = byte_tokenizer()
    for family in FAMILIES:
        model = hf_model(family)
        d = tmp_path_factory.mktemp(family)
        model.save_pretrained(d, safe_serialization=True)
        tokenizer_json(tok).save(str(d / "tokenizer.json"))          # for verify's text prompt
        with torch.no_grad():
            ref = model(torch.tensor([IDS])).logits[0].numpy()
        m = ffnlab.load(str(d), progress=False)
        gguf = export_gguf(m.config, m.params, tok, tokenizer_meta(tok, "byte"), str(d / "m.gguf"))
        out[family] = (str(d), ref, m, gguf)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_dir_logits_match_transformers(family, saved):
    _, ref, m, _ = saved[family]
    assert np.abs(ref).max() > 1.0
    err = np.abs(m.forward(IDS) - ref).max()
    assert err <= TOL, f"{family}: max |ffnlab - transformers| = {err:.2e}"
    kv = m.new_cache()                                   # the KV-cache decode path gives the same logits
    steps = np.stack([m.forward_last([t], kv) for t in IDS])
    assert np.abs(steps - ref).max() <= TOL


def test_the_flags_each_family_sets(saved):
    g = saved["granite"][2].config
    assert (g.embedding_multiplier, g.residual_multiplier, g.attn_scale, g.logits_scaling) == (3.0, 0.4, 0.09, 2.5)
    assert g.scale == 0.09 and g.no_rope_layer_step == 0
    s = saved["smollm3"][2].config
    assert s.no_rope_layer_step == 4 and (s.embedding_multiplier, s.residual_multiplier, s.logits_scaling) == (0, 0, 0)
    assert [il for il in range(s.n_layer) if not s.uses_rope(il)] == [3, 7]


def test_inspect_shows_the_flags(saved, capsys):
    from ffnlab.cli.main import main
    assert main(["inspect", saved["granite"][3]]) == 0
    rows = dict((line[:28].strip(), line[28:].strip())
                for line in capsys.readouterr().out.splitlines() if len(line) > 28)
    assert rows["scalings"] == "embeddings x 3, q.k x 0.09, residual adds x 0.4, logits / 2.5"
    assert main(["inspect", saved["smollm3"][3]]) == 0
    out = capsys.readouterr().out
    assert "layers without RoPE          every 4th (il + 1 divisible by 4: NoPE)" in out and "scalings" not in out


def test_causal_trace_noise_is_scaled_as_the_node_it_is_added_to(saved):
    """Granite's noise goes on embd, after the multiplier: its std is the table's times the multiplier"""
    from ffnlab.interventions.causal_trace import embedding_std
    m = saved["granite"][2]
    assert embedding_std(m) == pytest.approx(3.0 * np.asarray(m.params["token_embd.weight"], np.float64).std(),
                                             rel=1e-12)
    with ffnlab.trace(m, filter="^embd") as t:
        m.forward(np.array(IDS))
    assert np.asarray(t["embd"], np.float64).std() > 2.0 * np.asarray(t["embd_rows"], np.float64).std()


def test_a_nope_layer_runs_without_rope(saved):
    """The traced NoPE layers have no ROPE node; every other layer rotates q and k."""
    m = saved["smollm3"][2]
    with ffnlab.trace(m, keep=False) as t:
        m.forward(np.array(IDS))
    roped = {int(n.name.rsplit("-", 1)[1]) for n in t.nodes if n.op == "ROPE"}
    assert roped == {0, 1, 2, 4, 5, 6}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_backward_matches_torch_autograd(family, saved):
    """d(sum(logits * R))/dW for every weight, ffnlab's backward in float64 against torch autograd
    through transformers' own float64 model."""
    path = saved[family][0]
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                              dtype=torch.float64).eval()
    R = np.random.default_rng(1).standard_normal((len(IDS), COMMON["vocab_size"]))
    logits = model(torch.tensor([IDS])).logits[0]
    (logits * torch.from_numpy(R)).sum().backward()
    m = ffnlab.load(path, dtype=np.float64, progress=False)
    ours_logits, cache = m.forward(IDS, train=True)
    assert np.abs(ours_logits - logits.detach().numpy()).max() <= GRAD_TOL * np.abs(ours_logits).max()
    grads = m.backward(R, cache)
    seen = 0
    for name, p in model.named_parameters():
        g = gguf_name(name, m.config.arch)
        if g is None or g not in grads:
            continue
        want = p.grad.numpy()
        err = np.abs(grads[g] - want).max()
        assert err <= GRAD_TOL * max(np.abs(want).max(), 1.0), f"{family}: {name} ({g}) off by {err:.2e}"
        seen += 1
    assert seen == len(grads)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_hf_loads_in_transformers_with_the_same_logits(family, saved, tmp_path):
    _, ref, m, _ = saved[family]
    export_hf(m.config, m.params, byte_tokenizer(), str(tmp_path / "out"))
    back = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager").eval()
    assert type(back).__name__ == {"granite": "GraniteForCausalLM", "smollm3": "SmolLM3ForCausalLM"}[family]
    with torch.no_grad():
        theirs = back(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(theirs - ref).max() <= TOL
    assert ffnlab.load(str(tmp_path / "out"), progress=False).config == m.config


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_runs_in_llama_cpp_with_transformers_logits(family, saved):
    _, ref, _, path = saved[family]
    llm = llama_cpp.Llama(model_path=path, n_ctx=64, logits_all=True, n_threads=1, verbose=False)
    assert llm.metadata["general.architecture"] == family
    llm.eval(IDS)
    theirs = np.array(llm.scores[:len(IDS)])
    err = np.abs(theirs - ref).max()
    assert err <= LLAMA_CPP_TOL, f"{family}: max |llama.cpp - transformers| = {err:.2e}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_reads_back_as_the_same_model(family, saved):
    _, _, m, path = saved[family]
    back = ffnlab.load(path, progress=False)
    for f in dataclasses.fields(m.config):        # GGUF keeps floats as float32
        want, got = getattr(m.config, f.name), getattr(back.config, f.name)
        if f.name not in ("rope_pairing", "name"):   # a GGUF llama-shaped file rotates adjacent pairs
            assert got == pytest.approx(want, rel=1e-7) if isinstance(want, float) else got == want, f.name
    err = np.abs(back.forward(IDS) - m.forward(IDS)).max()
    assert err <= READBACK_TOL, f"{family}: reloaded export differs by {err:.2e}"


@pytest.mark.parametrize("family", list(FAMILIES))
def test_named_nodes_match_llama_cpp_in_order(family, saved):
    path = saved[family][3]
    model = ffnlab.load(path, progress=False)
    with ffnlab.trace(model, keep=False) as t:
        model.forward(np.array(IDS))
    theirs = capture(path, IDS, keep=lambda name: False)
    T = len(IDS)
    mine = sequence([n for n in t.nodes if not ffnlab_only(n.name, family)], T)
    ref = sequence([n for n in theirs if not is_auto_name(n.name) and not is_kv_node(n)], T)
    assert len(mine) > 20 * model.config.n_layer
    assert mine == ref


@pytest.mark.parametrize("family,change,needle", [
    ("smollm3", dict(no_rope_layer_step=3), "no_rope_layer_step=3 (needs 4)"),
    ("granite", dict(qk_norm=True), "qk_norm=True"),
])
def test_what_llama_cpp_computes_differently_is_refused(family, change, needle, saved, tmp_path):
    m = saved[family][2]
    cfg = dataclasses.replace(m.config, **change)
    params = m.params
    if change.get("qk_norm"):
        params = {**params, **{f"blk.{il}.attn_{x}_norm.weight": np.ones(cfg.head_dim, np.float32)
                               for il in range(cfg.n_layer) for x in "qk"}}
    tok = byte_tokenizer()
    with pytest.raises(UsageError, match=f"cannot export to GGUF {family}:.*{re.escape(needle)}"):
        export_gguf(cfg, params, tok, tokenizer_meta(tok, "byte"), str(tmp_path / "x.gguf"))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_targets_refuse_the_new_flags(family, saved, tmp_path):
    """A Llama GGUF would drop Granite's multipliers or SmolLM3's NoPE layers: refused, naming them."""
    m = saved[family][2]
    cfg = dataclasses.replace(m.config, arch="llama")
    tok = byte_tokenizer()
    needle = "embedding_multiplier" if family == "granite" else "no_rope_layer_step"
    with pytest.raises(UsageError, match=f"cannot export to GGUF llama:.*{needle}"):
        export_gguf(cfg, m.params, tok, tokenizer_meta(tok, "byte"), str(tmp_path / "x.gguf"))


def hf_dict(family, **over):
    cls, kw = FAMILIES[family]
    d = getattr(transformers, cls)(**COMMON, **kw).to_dict()
    d.update(over)
    return d


@pytest.mark.parametrize("over,msg", [
    ({"no_rope_layers": [1, 0, 1, 1, 1, 1, 1, 0]}, r"'no_rope_layers' = .*every Nth layer"),
    ({"no_rope_layers": [1, 1, 1]}, r"'no_rope_layers' = .*8 flags"),
    ({"use_sliding_window": True, "sliding_window": 4}, r"'use_sliding_window' = True"),
])
def test_smollm3_fields_ffnlab_does_not_compute_are_refused(over, msg):
    with pytest.raises(ConfigError, match=msg):
        config_from_hf(hf_dict("smollm3", **over), "x/config.json")


def test_smollm3_interval_without_a_list():
    """A config.json without no_rope_layers: transformers builds them from no_rope_layer_interval."""
    d = hf_dict("smollm3", no_rope_layer_interval=2)
    del d["no_rope_layers"]
    assert config_from_hf(d, "x/config.json").no_rope_layer_step == 2


@pytest.mark.parametrize("family", list(FAMILIES))
def test_verify_against_transformers_passes_node_by_node(family, saved, capsys):
    """`ffnlab verify --against hf` on the HF directory (1e-4 of each node's largest value): the
    tracer hooks the modules families/<arch>.py names (hf_hooks), Granite's scaled logits as a SCALE."""
    from ffnlab.cli.main import main
    path, _, m, _ = saved[family]
    assert main(["verify", "-m", path, "--against", "hf", "-p", "Hello there, how are you"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and int(out.split(" nodes compared")[0].split()[-1]) > 15 * m.config.n_layer


@pytest.mark.parametrize("family", list(FAMILIES))
def test_verify_against_llama_cpp_passes_node_by_node(family, saved, capsys):
    from ffnlab.cli.main import main
    assert main(["verify", "-m", saved[family][3], "--against", "llama.cpp", "--f32", "-p",
                 "Hello there, how are you"]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "nodes compared" in out


# shaped as the 3B SmolLM3 and the 2B Granite 3 models (widths, depths, heads, vocabularies); the
# sizing tools count a config.json through the same reader
SIZED = {
    "smollm3": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                    num_key_value_heads=4, vocab_size=128256, tie_word_embeddings=True),
    "granite": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=40, num_attention_heads=32,
                    num_key_value_heads=8, vocab_size=49155, tie_word_embeddings=True, embedding_multiplier=12.0,
                    residual_multiplier=0.22, attention_multiplier=0.015625, logits_scaling=8.0),
}


@pytest.mark.parametrize("family", list(SIZED))
def test_parameter_count_equals_transformers_model(family):
    """ffnlab's exact parameter count of a full-size config.json = transformers' model built from it
    on the meta device (as tests/engines/test_presets.py holds every preset)."""
    from ffnlab.analysis.params import param_counts
    cls = getattr(transformers, FAMILIES[family][0])
    d = cls(**SIZED[family]).to_dict()
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cls(**SIZED[family]))
    assert param_counts(config_from_hf(d, "x/config.json"))["total"] == sum(t.numel() for t in model.parameters())
