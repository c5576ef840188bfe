"""The dictionaries' training loss in torch, written from the papers without ffnlab code: autograd (float64)
gives the reference gradients of tests/model/test_features_grad.py.

JumpReLU and its Heaviside step as autograd Functions with the pseudo-derivatives of Rajamanoharan et al.
2024 (eqs. 11-12, rectangle kernel of width epsilon); AuxK as Gao et al. 2024 appendix A.2 and SAELens's
calculate_topk_aux_loss; the decoder-norm L1 as Anthropic's April 2024 update.
"""
import torch


def rectangle(u):
    return ((u > -0.5) & (u < 0.5)).to(u)


class JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, theta, eps, ste_to_input):
        ctx.save_for_backward(z, theta)
        ctx.eps, ctx.ste = eps, ste_to_input
        return z * (z > theta).to(z)

    @staticmethod
    def backward(ctx, g):
        z, theta = ctx.saved_tensors
        ste = (theta / ctx.eps) * rectangle((z - theta) / ctx.eps) * g       # -d/dtheta, eq. 11
        dz = (z > theta).to(z) * g + (ste if ctx.ste else 0)
        return dz, -ste.sum(0), None, None


class Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, theta, eps, ste_to_input):
        ctx.save_for_backward(z, theta)
        ctx.eps, ctx.ste = eps, ste_to_input
        return (z > theta).to(z)

    @staticmethod
    def backward(ctx, g):
        z, theta = ctx.saved_tensors
        ste = (1.0 / ctx.eps) * rectangle((z - theta) / ctx.eps) * g         # eq. 12
        return (ste if ctx.ste else None), -ste.sum(0), None, None


def topk_relu(pre, k):
    v, i = torch.topk(pre, k, dim=-1)
    return torch.zeros_like(pre).scatter(-1, i, v.relu())


def batchtopk(pre, k):
    a = pre.relu().flatten()
    v, i = torch.topk(a, int(k * pre.shape[0]))
    return torch.zeros_like(a).scatter(-1, i, v).reshape(pre.shape)


def loss(p, cfg, x, y, dead=None, coef=0.0, aux_coef=1.0):
    """p: {name: float64 tensor requiring grad}; cfg: a DictConfig (read for its fields only) -> (total, terms)"""
    sae_in = x - p["b_dec"] if cfg.kind == "sae" else x
    pre = sae_in @ p["W_enc"] + p["b_enc"]
    if cfg.act == "relu":
        a = pre.relu()
    elif cfg.act == "topk":
        a = topk_relu(pre, cfg.k)
    elif cfg.act == "batchtopk":
        a = batchtopk(pre, cfg.k)
    else:
        a = JumpReLU.apply(pre, p["threshold"], cfg.bandwidth, cfg.ste_to_input)
    out = a @ p["W_dec"] + p["b_dec"]
    if cfg.kind == "skip-transcoder":
        out = out + x @ p["W_skip"].T
    terms = {"mse": ((out - y) ** 2).sum(-1).mean()}
    if cfg.act == "relu" and coef:
        terms["l1"] = coef * (a * p["W_dec"].norm(dim=1)).sum(-1).mean()
    if cfg.act == "jumprelu" and coef:
        terms["l0"] = coef * Step.apply(pre, p["threshold"], cfg.bandwidth, cfg.ste_to_input).sum(-1).mean()
    if cfg.act in ("topk", "batchtopk") and dead is not None and bool(dead.any()) and aux_coef:
        n_dead = int(dead.sum())
        k_aux = cfg.d_out // 2
        scale = min(n_dead / k_aux, 1.0)
        masked = torch.where(dead[None], pre, torch.tensor(-torch.inf, dtype=pre.dtype))
        v, i = masked.topk(min(k_aux, n_dead), dim=-1)
        z = torch.zeros_like(pre).scatter(-1, i, v)
        e = (y - out).detach()
        terms["aux"] = aux_coef * scale * ((z @ p["W_dec"] - e) ** 2).sum(-1).mean()
    return sum(terms.values()), terms
