"""Re-draws a Gemma 2 / GPT-NeoX / OLMo 2 transformers model's weights with a wide spread
(tests/engines/test_hf_families.py's docstring says why)."""
import torch


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))          # biases
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5 * (2.0 if "embed" in name else 1.0))
    return model.eval()
