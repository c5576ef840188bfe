"""The training loss of a dictionary and its gradient, written out term by term.

    mse    = mean_b sum_d (out - y)^2                                    (SAELens's mse_loss: sum over d, mean over b)
    l1     = c * mean_b sum_i a_i ||W_dec_i||                            relu: the decoder norm folded into the L1
                                                                          (Anthropic, April 2024 update), so the
                                                                          decoder's scale cannot buy sparsity
    l0     = c * mean_b sum_i H(pre_i - theta_i)                         jumprelu (Rajamanoharan et al. 2024, eq. 9)
    aux    = alpha * min(n_dead / k_aux, 1) * mean_b sum_d (e_hat - e)^2  topk, batchtopk: AuxK (Gao et al. 2024, A.2)
             e = y - out (no gradient), e_hat = z @ W_dec, z = the k_aux largest pre-activations among the dead
             latents (their pre-activations as they are, as SAELens's calculate_topk_aux_acts takes them),
             k_aux = min(d_out // 2, n_dead)

loss_and_grads returns the terms and {param: gradient}, the gradient of their sum.
"""
import numpy as np

from . import dictionary as D
from . import kernels
from .sparsity import Sparse, from_mask, jumprelu_backward, step_backward, topk_mask


def mse(out, y):
    """-> loss, dout"""
    diff = out - y                                                            # [B, d_out]
    B = out.shape[0]
    return float(np.einsum("bd,bd->", diff, diff, dtype=np.float64)) / B, (2.0 / B) * diff


def auxk_latents(pre, dead, k_aux) -> Sparse:
    """The k_aux largest pre-activations of each token among the dead latents (values as they are)."""
    masked = np.where(dead[None, :], pre, -np.inf)                            # [B, d_sae]
    return from_mask(pre, topk_mask(masked, k_aux) & dead[None, :], pre)


def merged(a: Sparse, b: Sparse) -> Sparse:
    """the entries of a, then b's, as one Sparse (rows no longer sorted within a row: by_latent's stable sort keeps
    a fixed order, which is all the sums need to be reproducible)"""
    rows = np.concatenate([a.rows, b.rows])
    order = np.argsort(rows, kind="stable")
    ptr = np.zeros(a.shape[0] + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=a.shape[0]), out=ptr[1:])
    cat = (lambda u, v: np.concatenate([u, v])[order])
    return Sparse(ptr, cat(a.idx, b.idx), cat(a.val, b.val), cat(a.pre, b.pre), a.shape), order


def loss_and_grads(p, cfg, x, y, dead=None, coef=0.0, aux_coef=1.0):
    """x [B, d_in], y [B, d_out] (= x for an SAE), dead [d_sae] bool (latents that have not fired lately),
    coef: the L1 (relu) or L0 (jumprelu) coefficient; aux_coef: AuxK's alpha
    -> ({term: float}, {param: grad}, out [B, d_out], Sparse activations)"""
    out, (x, sae_in, pre, acts) = D.forward(p, cfg, x, train=True)
    B = x.shape[0]
    losses = {}
    losses["mse"], dout = mse(out, y)
    dval, dW_dec = D.decoder_backward(p, cfg, acts, dout)
    grads = {"W_dec": dW_dec, "b_dec": dout.sum(0)}
    if cfg.kind == "skip-transcoder":
        grads["W_skip"] = dout.T @ x                                          # [d_out, B] @ [B, d_in]
    extra = []                                                                # (Sparse, dpre) of other terms
    if cfg.act == "relu" and coef:
        norms = np.linalg.norm(p["W_dec"], axis=1)                            # [d_sae]
        losses["l1"] = coef * float(np.dot(np.bincount(acts.idx, weights=acts.val, minlength=cfg.d_sae), norms)) / B
        dval = dval + (coef / B) * norms[acts.idx].astype(dval.dtype)                  # d/da of c/B a n
        dnorm = (coef / B) * np.bincount(acts.idx, weights=acts.val, minlength=cfg.d_sae)   # d/dn
        grads["W_dec"] += (dnorm / norms)[:, None].astype(dval.dtype) * p["W_dec"]
    if cfg.act == "jumprelu":
        dpre, dtheta = jumprelu_backward(dval, acts, p["threshold"], cfg.bandwidth, cfg.ste_to_input)
        if coef:
            losses["l0"] = coef * float((acts.val > 0).sum()) / B
            dpre0, dtheta0 = step_backward(np.full(acts.val.size, coef / B, dval.dtype), acts, p["threshold"],
                                           cfg.bandwidth, cfg.ste_to_input)
            dpre, dtheta = dpre + dpre0, dtheta + dtheta0
        grads["threshold"] = dtheta
    else:
        dpre = dval                                                           # every support entry has pre > 0
    if cfg.act in ("topk", "batchtopk") and dead is not None and dead.any() and aux_coef:
        n_dead = int(dead.sum())
        k_aux = cfg.d_out // 2
        scale = min(n_dead / k_aux, 1.0)
        z = auxk_latents(pre, dead, min(k_aux, n_dead))
        recons = np.zeros_like(out)
        kernels.sparse_decode(z.ptr, z.idx, z.val, p["W_dec"], recons)      # z @ W_dec, no bias
        e = y - out                                                           # the residual, a constant here
        a, drec = mse(recons, e)
        losses["aux"] = aux_coef * scale * a
        drec *= drec.dtype.type(aux_coef * scale)
        dz, dW_aux = D.decoder_backward(p, cfg, z, drec)
        grads["W_dec"] += dW_aux
        extra.append((z, dz))
    support = acts
    for z, dz in extra:                                                       # one encoder backward for all terms
        support, order = merged(support, z)
        dpre = np.concatenate([dpre, dz])[order]
    dW_enc, db_enc, db_dec_in = D.encoder_backward(p, cfg, support, sae_in, dpre)
    grads["W_enc"], grads["b_enc"] = dW_enc, db_enc
    if db_dec_in is not None:
        grads["b_dec"] = grads["b_dec"] + db_dec_in
    grads = {n: np.asarray(g, p[n].dtype) for n, g in grads.items()}
    return losses, grads, out, acts
