"""LoRA adapters against PEFT + torch autograd on the same tiny random HF Llama.

PEFT wraps each targeted nn.Linear as  y = W x + (alpha/r) B A dropout(x); ffnlab's LoraWeight
(training/lora.py) computes the same through ops/linear.py. The reference runs in float64, ffnlab
in float32: with reductions of at most a few hundred terms per product and 2 layers, float32
rounding (eps 6e-8) stays near 1e-6 of each tensor's scale, so 1e-4 (the bound asked of it) has two
orders of margin and still catches any wrong term (a missing scale, a transposed factor, a
gradient through the wrong input), which moves the result by O(1).
"""
import copy
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

import ffnlab  # noqa: E402
from ffnlab.errors import ModelFileError, UsageError  # noqa: E402
from ffnlab.formats.export_gguf import neox_to_normal_rows  # noqa: E402
from ffnlab.formats.peft import adapter_files, peft_tensors, read_adapter  # noqa: E402
from ffnlab.model.transformer import backward, forward  # noqa: E402
from ffnlab.ops.loss import cross_entropy_backward, cross_entropy_forward  # noqa: E402
from ffnlab.training.lora import adapter_grads, attach, init_adapters, target_tensors  # noqa: E402
from torch_reference import assert_close  # noqa: E402

pytestmark = pytest.mark.slow

VOCAB, R, ALPHA = 96, 4, 8
HF_NAMES = {"q": ["q_proj"], "v": ["v_proj"], "q,v": ["q_proj", "v_proj"], "attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
            "mlp": ["gate_proj", "up_proj", "down_proj"],
            "all": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():                 # weights of unit-ish scale: every term matters
            p.normal_(0.0, 0.15)
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(1.0)
    d = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(d, safe_serialization=True)
    return d


def random_adapters(m, targets, seed=1):
    """A from PEFT's init, B random (B = 0 would make dA zero and the test blind to it)"""
    tensors = target_tensors(m.config, targets)
    ad = init_adapters(m.params, m.config, tensors, R, seed)
    rng = np.random.default_rng(seed)
    for n in ad:
        if n.endswith(".lora_b"):
            ad[n] = rng.normal(0, 0.2, ad[n].shape).astype(np.float32)
    return tensors, ad


def peft_model(hf_dir, cfg, tensors, adapters, targets):
    base = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float64)
    pm = peft.get_peft_model(base, peft.LoraConfig(r=R, lora_alpha=ALPHA, target_modules=HF_NAMES[targets],
                                                   lora_dropout=0.0))
    state = {k.replace(".weight", ".default.weight"): torch.tensor(v, dtype=torch.float64)
             for k, v in peft_tensors(cfg, adapters).items()}
    missing = pm.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys, missing.unexpected_keys
    return pm


def ffnlab_step(m, adapters, ids, targets_ids):
    p = attach(m.params, adapters, ALPHA / R, freeze=True)
    logits, cache = forward(p, m.config, ids[None], train=True)
    loss, probs = cross_entropy_forward(logits.reshape(-1, VOCAB), targets_ids)
    g = backward(cross_entropy_backward(probs, targets_ids).reshape(logits.shape), p, m.config, cache)
    return loss, logits[0], adapter_grads(g, adapters), g


def torch_step(pm, ids, targets_ids):
    logits = pm(torch.tensor(ids[None])).logits[0]
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(targets_ids))
    loss.backward()
    return loss, logits, {n: p.grad for n, p in pm.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("targets", ["q", "v", "q,v", "attn", "mlp", "all"])
def test_one_step_adapter_gradients_match_peft(hf_dir, targets):
    m = ffnlab.load(str(hf_dir), progress=False)
    tensors, adapters = random_adapters(m, targets)
    rng = np.random.default_rng(5)
    ids, tgt = rng.integers(0, VOCAB, 12), rng.integers(0, VOCAB, 12)
    before = {n: np.array(v) for n, v in m.params.items()}
    loss, logits, grads, all_grads = ffnlab_step(m, adapters, ids, tgt)
    pm = peft_model(hf_dir, m.config, tensors, adapters, targets)
    t_loss, t_logits, t_grads = torch_step(pm, ids, tgt)
    assert_close(logits, t_logits, 1e-4, "adapted logits")
    assert abs(float(loss) - t_loss.item()) <= 1e-5 * abs(t_loss.item())
    ours = peft_tensors(m.config, grads)
    want = {k.replace(".default.weight", ".weight"): v for k, v in t_grads.items()}
    assert sorted(ours) == sorted(want)                        # PEFT's trainable set, name for name
    for k in want:
        assert_close(ours[k], want[k], 1e-4, k)
    # nothing but adapters learns: no gradient buffer for a frozen matrix or the embedding table
    assert not any(isinstance(v, np.ndarray) and v.ndim == 2 for v in all_grads.values())
    for n, v in m.params.items():                             # the base is untouched, bit for bit
        assert np.array_equal(v, before[n]), n


def test_gguf_row_order_gives_the_same_model(hf_dir):
    """A GGUF llama stores q/k rows permuted (convert_hf_to_gguf.py); its adapters' B rows are
    in that order too, and formats/peft.py writes them back in HF's: PEFT's logits stay ffnlab's."""
    m = ffnlab.load(str(hf_dir), progress=False)
    tensors, adapters = random_adapters(m, "all")
    pm = peft_model(hf_dir, m.config, tensors, adapters, "all")
    g = copy.deepcopy(m.config)
    g.rope_pairing = "normal"
    params = dict(m.params)
    ad = dict(adapters)
    for il in range(g.n_layer):
        for which, heads in (("q", g.n_head), ("k", g.n_kv_head)):
            w = f"blk.{il}.attn_{which}.weight"
            params[w] = neox_to_normal_rows(params[w], heads)
            ad[w + ".lora_b"] = neox_to_normal_rows(adapters[w + ".lora_b"], heads)
    ids = np.arange(10) * 7 % VOCAB
    logits, _ = forward(attach(params, ad, ALPHA / R), g, ids[None])
    with torch.no_grad():
        want = pm(torch.tensor(ids[None])).logits[0]
    assert_close(logits[0], want, 1e-4, "logits (GGUF row order)")
    # and the PEFT tensors written from the GGUF-ordered adapters are the HF-ordered ones
    for k, v in peft_tensors(g, ad).items():
        np.testing.assert_array_equal(v, peft_tensors(m.config, adapters)[k])


def test_peft_from_pretrained_reads_our_directory(hf_dir, tmp_path):
    m = ffnlab.load(str(hf_dir), progress=False)
    tensors, adapters = random_adapters(m, "all")
    for name, data in adapter_files(m.config, adapters, tensors, R, ALPHA, 0.0, str(hf_dir), {}).items():
        (tmp_path / name).write_bytes(data)
    base = transformers.LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float64)
    pm = peft.PeftModel.from_pretrained(base, str(tmp_path))
    ids = np.arange(9) * 5 % VOCAB
    with torch.no_grad():
        want = pm(torch.tensor(ids[None])).logits[0]
    ad2, scale, _ = read_adapter(str(tmp_path), m.config, m.params)
    logits, _ = forward(attach(m.params, ad2, scale), m.config, ids[None])
    assert_close(logits[0], want, 1e-4, "logits of the adapter directory")


def test_trainable_count_matches_peft_smollm2_r4_all():
    """SmolLM2-135M's shapes, r=4 on all seven projections: PEFT counts 1,221,120."""
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    with torch.device("meta"):
        pm = peft.get_peft_model(transformers.LlamaForCausalLM(cfg), peft.LoraConfig(r=4, target_modules=HF_NAMES["all"]))
    want = pm.get_nb_trainable_parameters()[0]
    assert want == 1_221_120
    from ffnlab.config import ModelConfig
    ours = ModelConfig(arch="llama", n_layer=30, d_model=576, n_head=9, n_kv_head=3, d_ff=1536, vocab_size=49152,
                       ffn="swiglu", norm="rmsnorm", positions="rope", tie_embeddings=True)
    shapes = ffnlab.model.params.param_shapes(ours)
    fake = {n: np.empty(s, np.float32) if len(s) == 2 else None for n, s in shapes.items()}
    ad = init_adapters(fake, ours, target_tensors(ours, "all"), 4)
    assert sum(a.size for a in ad.values()) == want


@pytest.mark.parametrize("targets, needle", [("gate", "no gate projection"), ("qq", "unknown target 'qq'")])
def test_a_target_the_model_lacks_is_one_line(targets, needle):
    from ffnlab.config import ModelConfig
    cfg = ModelConfig(arch="gpt2", n_layer=1, d_model=8, n_head=2, d_ff=16, vocab_size=10, ffn="gelu",
                      norm="layernorm", positions="learned", fused_qkv=True)
    with pytest.raises(UsageError, match=needle):
        target_tensors(cfg, targets)


def test_zero_rank_is_refused(hf_dir):
    m = ffnlab.load(str(hf_dir), progress=False)
    with pytest.raises(UsageError, match="--lora-r must be a positive integer, got 0"):
        init_adapters(m.params, m.config, ["attn_q"], 0)


def test_an_adapter_for_another_model_names_the_tensor(hf_dir, tmp_path):
    m = ffnlab.load(str(hf_dir), progress=False)
    tensors, adapters = random_adapters(m, "q")
    adapters["blk.0.attn_q.weight.lora_a"] = adapters["blk.0.attn_q.weight.lora_a"][:, :32]   # d_model 32, not 64
    for name, data in adapter_files(m.config, adapters, tensors, R, ALPHA, 0.0, "x", {}).items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(ModelFileError, match=r"adapter of blk\.0\.attn_q\.weight has A \[4, 32\]"):
        read_adapter(str(tmp_path), m.config, m.params)
    conf = json.loads((tmp_path / "adapter_config.json").read_text())
    conf["use_dora"] = True
    (tmp_path / "adapter_config.json").write_text(json.dumps(conf))
    with pytest.raises(ModelFileError, match="'use_dora' is True"):
        read_adapter(str(tmp_path), m.config, m.params)


def test_dropout_acts_on_the_adapter_input_as_peft(hf_dir):
    """lora_dropout: PEFT drops the adapter's input only. ffnlab's masks, handed to PEFT's
    dropout modules, give PEFT's gradients: same placement, same 1/(1-p) rescale."""
    m = ffnlab.load(str(hf_dir), progress=False)
    tensors, adapters = random_adapters(m, "q,v")
    p = attach(m.params, adapters, ALPHA / R, dropout=0.3, rng=np.random.default_rng(4), freeze=True)
    from ffnlab.training.lora import set_training
    set_training(p, True)
    rng = np.random.default_rng(6)
    ids, tgt = rng.integers(0, VOCAB, 12), rng.integers(0, VOCAB, 12)
    logits, cache = forward(p, m.config, ids[None], train=True)
    loss, probs = cross_entropy_forward(logits.reshape(-1, VOCAB), tgt)
    grads = adapter_grads(backward(cross_entropy_backward(probs, tgt).reshape(logits.shape), p, m.config, cache),
                          adapters)
    pm = peft_model(hf_dir, m.config, tensors, adapters, "q,v")

    class Mask(torch.nn.Module):
        def __init__(self, mask):
            super().__init__()
            self.mask = torch.tensor(mask, dtype=torch.float64)

        def forward(self, x):
            return x * self.mask.reshape(x.shape)

    for il in range(m.config.n_layer):
        for which, mod in (("q", "q_proj"), ("v", "v_proj")):
            lw = p[f"blk.{il}.attn_{which}.weight"]
            assert 0.5 < (lw.mask > 0).mean() < 0.9                   # about 70% kept
            getattr(pm.base_model.model.model.layers[il].self_attn, mod).lora_dropout["default"] = Mask(lw.mask)
    _, t_logits, t_grads = torch_step(pm, ids, tgt)
    assert_close(logits[0], t_logits, 1e-4, "logits with dropout")
    ours = peft_tensors(m.config, grads)
    for k, v in t_grads.items():
        assert_close(ours[k.replace(".default.weight", ".weight")], v, 1e-4, k)


def test_quantized_base_gives_dx_through_dequantized_tiles():
    """A GGUF weight stays quantized while its adapter trains: dx = dy W over dequantized row
    tiles equals the product with the whole dequantized matrix (float64 reference; float32
    sums of 96 terms: ~1e-6)."""
    from gguf import GGMLQuantizationType, quants
    from ffnlab.quant import QuantTensor
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4100, 64)).astype(np.float32)            # more rows than one tile holds
    qt = QuantTensor(quants.quantize(w, GGMLQuantizationType.Q4_1), GGMLQuantizationType.Q4_1, w.shape)
    dy = rng.normal(size=(7, 4100)).astype(np.float32)
    assert_close(qt.rmatmul(dy), dy.astype(np.float64) @ qt.dequantize().astype(np.float64), 1e-5, "dy W")
