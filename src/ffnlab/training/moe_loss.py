"""The load-balancing auxiliary loss of a mixture of experts (Switch Transformer eq. 4-6; Mixtral).

Per MoE layer, over its N tokens:
    f_e = (tokens routed to expert e among their top-k) / N      (sums to k; no gradient: a count)
    P_e = mean over tokens of the router probability p_{n,e}      (differentiable)
    aux_layer = E * sum_e f_e * P_e
The model loss adds coef * mean over layers of aux_layer. With perfectly balanced routing
f_e = k/E and P_e = 1/E, so aux_layer = k: its minimum value. For one layer this is
transformers' load_balancing_loss_func exactly (tests/model/test_moe_train.py).

Its gradient reaches only P: d aux / d p_{n,e} = coef / L * E * f_e / N, handed to the MoE
backward through the layer's cache (MoECache.daux), which chains it through the softmax into the
router weights and the layer input.
"""
import numpy as np


def load_balancing_loss(cache, cfg, coef):
    """cache: a training forward's ForwardCache -> (coef * mean_l aux_l, [aux_l per layer]); with
    coef > 0 each layer's MoECache gets daux [N, E] for the backward."""
    E, L = cfg.n_expert, cfg.n_layer
    per_layer = []
    for il, block in enumerate(cache.blocks):
        c = block.ffn
        N = c.probs.shape[0]
        f = np.bincount(c.topk.reshape(-1), minlength=E) / N          # [E] fraction of tokens per expert
        P = c.probs.mean(axis=0)                                      # [E] mean router probability
        per_layer.append(float(E * (f * P).sum()))
        if coef:
            daux = np.broadcast_to((coef / L * E / N * f).astype(c.probs.dtype), c.probs.shape)
            cache.blocks[il] = block._replace(ffn=c._replace(daux=daux))
    return coef * float(np.mean(per_layer)), per_layer
