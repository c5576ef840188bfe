"""Activation patching against TransformerLens 4.x on the same HF model (a small random Llama with
grouped-query attention, written by transformers, read by both).

TransformerLens patches with run_with_hooks on blocks.L.hook_resid_post / hook_mlp_out /
hook_attn_out, one (layer, position) per run, exactly as its patching tutorials do; ffnlab's
patch() runs the same patches on l_out / ffn_out / attn_out, a layer's positions in one batch.
Both normalize by (clean - corrupt), so the effects compare directly: torch and NumPy differ by
float32 rounding of logits of size ~1 (d_model * eps ~ 1e-5), over a clean-corrupt span of ~1.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tl_bridge = pytest.importorskip("transformer_lens.model_bridge")

import ffnlab  # noqa: E402
from ffnlab.interventions.patching import patch  # noqa: E402
from hf_dense_models import tiny_llama_dir  # noqa: E402

pytestmark = pytest.mark.slow

CLEAN = [5, 40, 77, 120, 9, 33, 200, 17]
CORRUPT = [5, 41, 80, 120, 9, 33, 200, 17]
NODES = {"l_out": "hook_resid_post", "ffn_out": "hook_mlp_out", "attn_out": "hook_attn_out"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_llama_dir(tmp_path_factory.mktemp("tl-llama"))


def transformer_lens_patching(model_dir, target, foil):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    bridge = tl_bridge.TransformerBridge.boot_transformers(
        str(model_dir), hf_model=AutoModelForCausalLM.from_pretrained(str(model_dir), attn_implementation="eager"),
        tokenizer=AutoTokenizer.from_pretrained(str(model_dir)))
    clean, corrupt = torch.tensor([CLEAN]), torch.tensor([CORRUPT])
    with torch.no_grad():
        clean_logits, cache = bridge.run_with_cache(clean)
        corrupt_logits = bridge(corrupt)

        def metric(logits):
            return float(logits[0, -1, target] - logits[0, -1, foil])
        m_clean, m_corrupt = metric(clean_logits), metric(corrupt_logits)
        out = {}
        for ours, hook_name in NODES.items():
            grid = []
            for layer in range(bridge.cfg.n_layers):
                name = f"blocks.{layer}.{hook_name}"
                row = []
                for pos in range(len(CLEAN)):
                    def put(act, hook, pos=pos, name=name):
                        act[:, pos] = cache[name][:, pos]
                        return act
                    row.append((metric(bridge.run_with_hooks(corrupt, fwd_hooks=[(name, put)])) - m_corrupt)
                               / (m_clean - m_corrupt))
                grid.append(row)
            out[ours] = grid
    return out, m_clean, m_corrupt


@pytest.mark.slow
def test_activation_patching_equals_transformer_lens(model_dir):
    m = ffnlab.load(str(model_dir), progress=False)
    logits = m.forward(np.array(CLEAN))[-1]
    target, foil = int(np.argmax(logits)), int(np.argsort(logits)[-2])
    theirs, t_clean, t_corrupt = transformer_lens_patching(model_dir, target, foil)
    for node in NODES:
        r = patch(m, np.array(CLEAN), np.array(CORRUPT), target, foil, node)
        assert abs(r["clean"] - t_clean) < 1e-4 and abs(r["corrupt"] - t_corrupt) < 1e-4
        assert abs(r["clean"] - r["corrupt"]) > 0.5              # a span worth normalizing by
        err = np.abs(np.array(r["effect"]) - np.array(theirs[node])).max()
        assert err <= 1e-4, f"{node}: max |ffnlab - TransformerLens| effect = {err:.2e}"
        assert np.abs(np.array(theirs[node])).max() > 0.1        # the patches did something
