"""Re-draws a transformers model's weights with a large spread (tests/engines/test_hf_dirs.py's
docstring says why)."""
import torch


def randomize(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name:
                p.copy_(0.5 + torch.rand(p.shape, generator=g) if name.endswith("weight") else
                        0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_((0.25 if p.ndim == 2 else 0.1) * torch.randn(p.shape, generator=g))
    return model.eval()
