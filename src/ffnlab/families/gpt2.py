"""GPT-2: LayerNorm with bias, learned positions, one fused c_attn, a dense GELU-tanh MLP, all biases.

HF's Conv1D layers store [in, out] (formats/hf.py transposes them). llama.cpp's gpt2 graph reads one
fused attn_qkv and names the product before each bias (attn_out_w is ffnlab's own name)."""
from .record import Family, HFTensors

FAMILY = Family(
    arch="gpt2", hf_types=("gpt2",), activation="gelu_tanh", dense_ffn=True, layernorm=True, gguf_pairing="normal",
    hf_tensors=HFTensors(
        top={"wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
             "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias"},
        block={"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
               "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
        layers=r"h", prefix="transformer.", conv1d=True),
    hf_hooks="gpt2")
