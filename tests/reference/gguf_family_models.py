"""The tiny Mistral, Llama 3.x, Qwen3 and Phi-3 transformers families, the ids they are run on and
their weight re-draw, shared by test_gguf_mistral_llama3_qwen3_phi3.py and test_export_any_model.py."""
import numpy as np
import torch


IDS = [int(i) for i in np.random.default_rng(0).integers(1, 256, 22)]
COMMON = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)
LLAMA3 = dict(rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=32)
FAMILIES = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "llama3": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=LLAMA3)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict()),           # q/k/v biases, no o bias
    "phi3_partial": ("Phi3Config", "Phi3ForCausalLM",                 # rotates 8 of 16 dims per head
                     dict(pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.5})),
}


def randomize(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            else:
                p.copy_((0.15 if p.ndim == 2 else 0.1) * torch.randn(p.shape, generator=g))
    return model.eval()
