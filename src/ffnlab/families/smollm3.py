"""SmolLM3: Llama's block in which every fourth layer attends without RoPE (NoPE).

transformers: no_rope_layers[il] is 1 where layer il rotates q and k, built by default as
int((il + 1) % no_rope_layer_interval != 0) (interval 4: layers 3, 7, 11, ... skip RoPE).
llama.cpp's smollm3 graph: use_rope = (il + 1) % n_no_rope_layer_step != 0, the step fixed at 4 (no
GGUF key). ffnlab's flag: ModelConfig.no_rope_layer_step, the block reads cfg.uses_rope(il); a
no_rope_layers list that is not periodic that way is refused."""
from .hf_common import COMMON_USED, HF_BASE, PARTIAL_ROTARY, SWIGLU
from .llama import LLAMA_SHAPED
from .record import Family, Graph, HFFields, Refuse

LLAMA_CPP_STEP = 4                  # llama.cpp hard-codes n_no_rope_layer_step for smollm3


def no_rope_step(flags, n_layer):
    """[1 = rotates, 0 = NoPE] per layer -> the step N with flags[il] == ((il + 1) % N != 0), 0 when every
    layer rotates, None when no step gives them."""
    if all(flags):
        return 0
    for n in range(1, n_layer + 1):
        if all(bool(f) == ((il + 1) % n != 0) for il, f in enumerate(flags)):
            return n
    return None


def _hf_config(d, req, n_layer, fail) -> dict:
    flags = d.get("no_rope_layers")
    if flags is None:
        step = req("no_rope_layer_interval", int, 4, lo=1)
        flags = [int((il + 1) % step != 0) for il in range(n_layer)]
    if not isinstance(flags, list) or len(flags) != n_layer or any(f not in (0, 1) for f in flags):
        fail(f"field 'no_rope_layers' = {flags!r:.80}: must be {n_layer} flags 0 or 1 (one per layer)")
    step = no_rope_step(flags, n_layer)
    if step is None:
        fail(f"field 'no_rope_layers' = {flags!r:.80}: ffnlab runs NoPE on every Nth layer ((il + 1) % N == 0)")
    return {"no_rope_layer_step": step}


def _hf_export(cfg) -> dict:
    return {"no_rope_layers": [int(cfg.uses_rope(il)) for il in range(cfg.n_layer)],
            "no_rope_layer_interval": cfg.no_rope_layer_step or cfg.n_layer + 1, "use_sliding_window": False,
            "attention_bias": cfg.attn_bias, "mlp_bias": cfg.ffn_bias}


FAMILY = Family(
    arch="smollm3", hf_types=("smollm3",), gguf_pairing="normal", gguf_qk_permuted=True,
    gguf_flags=dict(no_rope_layer_step=LLAMA_CPP_STEP),
    gguf_target=(dict(SWIGLU, attn_bias=False, fused_qkv=False, no_rope_layer_step=LLAMA_CPP_STEP), ()),
    hf_config_extra=_hf_config, hf_tensors=LLAMA_SHAPED,
    hf_fields={"smollm3": HFFields("SmolLM3Config", COMMON_USED + (
        "attention_bias", "mlp_bias", "no_rope_layers", "no_rope_layer_interval"),
        {"sliding_window": "the window of use_sliding_window, which is refused",
         "layer_types": "sliding_attention applies only with use_sliding_window, which is refused"},
        {"partial_rotary_factor": PARTIAL_ROTARY,
         "use_sliding_window": Refuse(lambda v: not v, True, "sliding windows on SmolLM3's NoPE layers are not "
                                                              "implemented")})},
    hf_llama_shaped=True,
    hf_export={"smollm3": ("SmolLM3ForCausalLM", dict(HF_BASE, fused_qkv=False, ffn="swiglu"), ("no_rope_layer_step",))},
    hf_export_extra=_hf_export,
    graph=Graph(attn_out_named=True))
