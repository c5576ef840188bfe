"""LoRA adapters in llama.cpp's format: `ffnlab export ADAPTER --to gguf-lora` on SmolLM2-135M (Q4_1),
loaded by llama.cpp (llama-cpp-python's lora_path); --merge into a GGUF; --lora on the commands.

llama.cpp runs the Q4_1 products with 8-bit activations and the adapter's F32 products, ffnlab
dequantizes exactly: the base model itself agrees on ~90% of next-token argmaxes (verify's
bound for this model is 85%), so the adapted one is held to the same 85%, and llama.cpp's
adapted logits must be nearer ffnlab's adapted logits than its own base logits are.
"""
import json

import numpy as np
import pytest

import ffnlab
from ffnlab.cli.main import main
from ffnlab.formats.installed import model_path
from ffnlab.formats.peft import adapter_files
from ffnlab.training.lora import init_adapters, target_tensors

pytestmark = pytest.mark.slow

llama_cpp = pytest.importorskip("llama_cpp")

TEXT = ("First Citizen: Before we proceed any further, hear me speak. All: Speak, speak. First Citizen: You are "
        "all resolved rather to die than to famish?")
R, ALPHA = 8, 16


@pytest.fixture(scope="module")
def smol():
    return model_path("smollm2")


def random_adapter(smol, d, targets):
    """A random adapter, large enough to move the logits by O(1), as a PEFT directory d."""
    m = ffnlab.load(smol, progress=False)
    tensors = target_tensors(m.config, targets)
    ad = init_adapters(m.params, m.config, tensors, R, seed=7)
    rng = np.random.default_rng(8)
    for n in ad:
        if n.endswith(".lora_b"):
            ad[n] = rng.normal(0, 0.04, ad[n].shape).astype(np.float32)
    for name, data in adapter_files(m.config, ad, tensors, R, ALPHA, 0.0, smol, m.config.to_dict()).items():
        (d / name).write_bytes(data)
    return d


@pytest.fixture(scope="module")
def adapter(smol, tmp_path_factory):
    return random_adapter(smol, tmp_path_factory.mktemp("adapter"), "all")


def llama_logits(path, ids, lora=None):
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, n_threads=1, verbose=False,
                          lora_path=None if lora is None else str(lora))
    llm.eval(list(map(int, ids)))
    return np.array(llm.scores[:len(ids)])


def test_llama_cpp_runs_the_exported_adapter_as_ffnlab_does(smol, adapter, tmp_path):
    out = tmp_path / "lora.gguf"
    assert main(["export", str(adapter), "--to", "gguf-lora", str(out)]) == 0   # the base from ffnlab_adapter.json
    from gguf import GGUFReader
    r = GGUFReader(str(out))
    assert r.fields["general.type"].contents() == "adapter" and r.fields["adapter.type"].contents() == "lora"
    assert r.fields["adapter.lora.alpha"].contents() == ALPHA and r.fields["general.architecture"].contents() == "llama"
    t = {x.name: x for x in r.tensors}
    assert len(t) == 30 * 7 * 2
    assert list(t["blk.0.ffn_down.weight.lora_a"].shape) == [1536, R]     # ggml ne: [in, r]
    assert list(t["blk.0.ffn_down.weight.lora_b"].shape) == [R, 576]      # [r, out]

    base = ffnlab.load(smol, progress=False)
    ids = base.tokenizer.encode(TEXT)
    ours_base = base.forward(np.asarray(ids))
    adapted = ffnlab.load(smol, progress=False, lora=str(adapter))
    ours = adapted.forward(np.asarray(ids))
    assert np.abs(ours - ours_base).max() > 1.0                              # the adapter matters
    ref_base, ref = llama_logits(smol, ids), llama_logits(smol, ids, out)
    agree = float(np.mean(ours.argmax(-1) == ref.argmax(-1)))
    assert agree >= 0.85, f"argmax agreement {agree:.0%}"
    # llama.cpp's logits moved with the adapter to ffnlab's adapted logits: they differ by what the
    # two engines' base models differ by (8-bit activations), much less than the adapter moved them
    noise, moved, off = (float(np.abs(a - b).mean()) for a, b in ((ref_base, ours_base), (ref_base, ours), (ref, ours)))
    assert off <= 1.5 * noise and moved >= 3 * off, f"base difference {noise:.3f}, adapter {moved:.3f}, adapted {off:.3f}"

    # ffnlab reads llama.cpp's file back: the same adapted model as from the PEFT directory
    back = ffnlab.load(smol, progress=False, lora=str(out)).forward(np.asarray(ids))
    np.testing.assert_array_equal(back, ours)


def test_merge_into_a_gguf_equals_the_adapted_model(smol, tmp_path):
    """W + alpha/r B A merged as F32 (other tensors copied as their Q4_1/Q8_0 blocks): the same model
    up to float32 rounding of one sum per weight (~1e-7 of each product; 1e-4 of the logits' scale).
    The adapter is on q and ffn_up only, to keep the F32 copy small."""
    adapter = random_adapter(smol, tmp_path, "q,up")
    out = tmp_path / "merged.gguf"
    assert main(["export", str(adapter), "--merge", "--to", "gguf", str(out)]) == 0
    ids = np.asarray(ffnlab.load(smol, progress=False).tokenizer.encode(TEXT))
    want = ffnlab.load(smol, progress=False, lora=str(adapter)).forward(ids)
    merged = ffnlab.load(str(out), progress=False)
    assert merged.lora is None and merged.params["blk.3.ffn_up.weight"].dtype == np.float32
    got = merged.forward(ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()


def test_lora_scale_zero_is_the_base_model(smol, adapter):
    ids = np.asarray(ffnlab.load(smol, progress=False).tokenizer.encode("To be, or not to be"))
    base = ffnlab.load(smol, progress=False).forward(ids)
    np.testing.assert_array_equal(ffnlab.load(smol, progress=False, lora=str(adapter), lora_scale=0.0).forward(ids), base)


def test_an_adapter_for_another_model_is_one_line(smol, adapter, tmp_path, capsys):
    """A PEFT directory whose lora_A has the wrong width, and a llama.cpp adapter of another arch."""
    from safetensors.numpy import load_file, save_file
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("adapter_config.json", "ffnlab_adapter.json"):
        (bad / f).write_bytes((adapter / f).read_bytes())
    t = load_file(str(adapter / "adapter_model.safetensors"))
    key = "base_model.model.model.layers.2.mlp.up_proj.lora_A.weight"
    t[key] = t[key][:, :100].copy()
    save_file(t, str(bad / "adapter_model.safetensors"))
    assert main(["run", "-m", smol, "--lora", str(bad), "-p", "hi", "-n", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "adapter of blk.2.ffn_up.weight has A [8, 100]" in err, err
    conf = json.loads((adapter / "adapter_config.json").read_text())
    conf["r"] = 0
    (bad / "adapter_config.json").write_text(json.dumps(conf))
    assert main(["perplexity", "-m", smol, "--lora", str(bad), "--data", str(bad / "adapter_config.json")]) == 1
    err = capsys.readouterr().err.strip()
    assert "field 'r' = 0 is outside [1, None]" in err and err.count("\n") == 0, err


def test_trace_and_verify_show_the_adapter_where_llama_cpp_does(smol, tmp_path, capsys):
    """`trace --lora`: the adapter's three nodes before the adapted node, which is an ADD (llama.cpp's
    build_lora_mm); `verify --lora` runs llama.cpp with the same adapter and passes, comparing Vcur's ADD."""
    adapter = random_adapter(smol, tmp_path, "v")
    assert main(["trace", "-m", smol, "--lora", str(adapter), "-p", "Speak", "--filter", "Vcur.*-0", "-t", "1"]) == 0
    # 'common_debug_cb_eval:   Vcur-0 = (f32)        ADD(...)' -> 'Vcur-0 ADD'
    lines = [ln.split("=")[0].split(":")[-1].strip() + " " + ln.split(")", 1)[1].split("(")[0].strip()
             for ln in capsys.readouterr().out.splitlines() if "Vcur" in ln.split("=")[0]]
    assert lines[:4] == ["Vcur_lora_a-0 MUL_MAT", "Vcur_lora_b-0 MUL_MAT", "Vcur_lora_scaled-0 SCALE", "Vcur-0 ADD"], lines
    rc = main(["verify", "-m", smol, "--against", "llama.cpp", "--lora", str(adapter), "-p", "To be, or not", "-t", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS" in out, out[-2000:]
    assert any(ln.startswith("Vcur-0 ") and " ADD " in ln for ln in out.splitlines())
