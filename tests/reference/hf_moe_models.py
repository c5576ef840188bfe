"""The tiny mixture-of-experts transformers families (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE) and the
weight re-draw that makes the router decisive, shared by test_hf_moe.py and test_moe_llamacpp.py."""
import torch


VOCAB = 300
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
FAMILIES = {
    "mixtral": ("MixtralConfig", dict(intermediate_size=48, num_local_experts=6, num_experts_per_tok=2)),
    "qwen2_moe": ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=40, num_experts=6,
                                         num_experts_per_tok=2, shared_expert_intermediate_size=56,
                                         norm_topk_prob=False)),
    "qwen2_moe_norm": ("Qwen2MoeConfig", dict(intermediate_size=96, moe_intermediate_size=40, num_experts=5,
                                              num_experts_per_tok=3, shared_expert_intermediate_size=32,
                                              norm_topk_prob=True)),
    "qwen3_moe": ("Qwen3MoeConfig", dict(intermediate_size=96, moe_intermediate_size=40, num_experts=8,
                                         num_experts_per_tok=2, norm_topk_prob=True, attention_bias=True,
                                         head_dim=24)),
    "olmoe": ("OlmoeConfig", dict(intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False,
                                  attention_bias=True)),
}


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))          # biases
            else:
                scale = 1.0 if name.endswith("gate.weight") and "expert" not in name else 0.25
                p.copy_(scale * torch.randn(p.shape, generator=g))        # routers decisive
    return model.eval()
