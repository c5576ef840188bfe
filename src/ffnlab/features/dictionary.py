"""The dictionary: a wide, sparse layer trained to stand in for a piece of the model.

    sae              out = a @ W_dec + b_dec,  a = act((x - b_dec) @ W_enc + b_enc)     reconstructs x
    transcoder       out = a @ W_dec + b_dec,  a = act(x @ W_enc + b_enc)              x = ffn_norm-L, out ~ ffn_out-L
    skip-transcoder  out = a @ W_dec + b_dec + x @ W_skip.T                            (Paulo et al. 2025)

Shapes (SAELens's, so its files load as they are):
    W_enc   [d_in, d_sae]     column i: latent i's encoder direction
    b_enc   [d_sae]
    W_dec   [d_sae, d_out]    row i: latent i's decoder direction (unit norm when trained with topk,
                              batchtopk or jumprelu; free, with its norm in the L1, with relu)
    b_dec   [d_out]
    W_skip  [d_out, d_in]     skip-transcoder only
    threshold [d_sae]         jumprelu, and batchtopk at inference (one value for all latents)

forward/backward work on a batch of rows x [B, d_in]; the latents are sparse (sparsity.Sparse) and
the decode and its gradients touch only the support (kernels.py).
"""
import dataclasses

import numpy as np

from . import kernels
from .sparsity import activate, by_latent

KINDS = ("sae", "transcoder", "skip-transcoder")
ACTS = ("topk", "batchtopk", "jumprelu", "relu")


@dataclasses.dataclass
class DictConfig:
    kind: str = "transcoder"        # sae | transcoder | skip-transcoder
    act: str = "topk"               # topk | batchtopk | jumprelu | relu
    d_in: int = 576                 # the input site's width (d_model)
    d_sae: int = 4608               # latents
    d_out: int = 576                # the target's width (d_model)
    k: int = 32                     # topk / batchtopk: latents per token (batchtopk: on average)
    bandwidth: float = 0.05         # jumprelu: the straight-through estimator's window (the paper's epsilon)
    ste_to_input: bool = False      # jumprelu: pass the threshold's pseudo-gradient to pre too (Anthropic)

    @property
    def apply_b_dec_to_input(self):
        """an SAE centres its input on b_dec (the same space); a transcoder's input is another space"""
        return self.kind == "sae"

    @property
    def has_threshold(self):
        return self.act in ("jumprelu", "batchtopk")


def param_shapes(cfg: DictConfig) -> dict:
    shapes = {"W_enc": (cfg.d_in, cfg.d_sae), "b_enc": (cfg.d_sae,), "W_dec": (cfg.d_sae, cfg.d_out),
              "b_dec": (cfg.d_out,)}
    if cfg.kind == "skip-transcoder":
        shapes["W_skip"] = (cfg.d_out, cfg.d_in)
    if cfg.has_threshold:
        shapes["threshold"] = (cfg.d_sae,)
    return shapes


def trainable(cfg: DictConfig) -> list:
    """the parameters the optimizer moves: all but batchtopk's threshold (a running mean, not a gradient's)"""
    return [n for n in param_shapes(cfg) if not (n == "threshold" and cfg.act == "batchtopk")]


def init_params(cfg: DictConfig, rng, decoder_norm=1.0, threshold=0.001) -> dict:
    """SAELens's init: W_dec kaiming-uniform (bound sqrt(6 / d_out)... on rows of d_out, as torch's
    kaiming_uniform_ with fan_in = d_out), each row rescaled to decoder_norm; W_enc = W_dec.T (the
    encoder starts as the decoder's transpose, Conerly et al. 2024) where the widths agree, else a
    kaiming-uniform [d_in, d_sae] with columns of the same norm; biases 0; W_skip 0; threshold const."""
    bound = np.sqrt(6.0 / cfg.d_out)                      # torch.nn.init.kaiming_uniform_, a = 0: gain sqrt(2)
    W_dec = rng.uniform(-bound, bound, (cfg.d_sae, cfg.d_out)).astype(np.float32)
    W_dec *= np.float32(decoder_norm) / np.linalg.norm(W_dec, axis=1, keepdims=True)
    if cfg.d_in == cfg.d_out:
        W_enc = np.ascontiguousarray(W_dec.T)
    else:
        W_enc = rng.uniform(-1, 1, (cfg.d_in, cfg.d_sae)).astype(np.float32)
        W_enc *= np.float32(decoder_norm) / np.linalg.norm(W_enc, axis=0, keepdims=True)
    p = {"W_enc": W_enc, "b_enc": np.zeros(cfg.d_sae, np.float32), "W_dec": W_dec,
         "b_dec": np.zeros(cfg.d_out, np.float32)}
    if cfg.kind == "skip-transcoder":
        p["W_skip"] = np.zeros((cfg.d_out, cfg.d_in), np.float32)
    if cfg.has_threshold:
        p["threshold"] = np.full(cfg.d_sae, threshold, np.float32)
    return p


# --- forward / backward ------------------------------------------------------------------------
def encode(p, cfg, x, train=False):
    """x [B, d_in] -> (Sparse activations [B, d_sae], sae_in [B, d_in], pre [B, d_sae])"""
    sae_in = x - p["b_dec"] if cfg.apply_b_dec_to_input else x                  # [B, d_in]
    pre = sae_in @ p["W_enc"] + p["b_enc"]                                        # [B, d_in] -> [B, d_sae]
    acts = activate(pre, cfg.act, cfg.k, p.get("threshold"), cfg.bandwidth, train)
    return acts, sae_in, pre


def decode(p, cfg, acts, x=None):
    """Sparse [B, d_sae] (and x [B, d_in] for the skip) -> out [B, d_out]"""
    out = np.broadcast_to(p["b_dec"], (acts.shape[0], cfg.d_out)).copy()        # [B, d_out]
    kernels.sparse_decode(acts.ptr, acts.idx, acts.val, p["W_dec"], out)        # += a @ W_dec, k rows per token
    if cfg.kind == "skip-transcoder":
        out += x @ p["W_skip"].T                                                  # [B, d_in] -> [B, d_out]
    return out


def forward(p, cfg, x, train=False):
    """x [B, d_in] -> out [B, d_out], cache (what backward needs)"""
    x = np.ascontiguousarray(x, dtype=p["W_enc"].dtype)
    acts, sae_in, pre = encode(p, cfg, x, train)
    out = decode(p, cfg, acts, x)
    return out, (x, sae_in, pre, acts)


def decoder_backward(p, cfg, acts, dout):
    """The decode's gradient on the support: dout [B, d_out] -> dval [nnz] (dL/da), dW_dec [d_sae, d_out]"""
    dval = np.empty(acts.val.size, dout.dtype)
    kernels.dots_on_support(acts.ptr, acts.idx, dout, p["W_dec"], dval)         # dL/da = dout @ W_dec.T, on the support
    dW_dec = np.zeros_like(p["W_dec"])
    kernels.latent_outer(*by_latent(acts, acts.val), dout, dW_dec)              # a.T @ dout
    return dval, dW_dec


def encoder_backward(p, cfg, acts, sae_in, dpre):
    """dpre [nnz] on the support -> dW_enc [d_in, d_sae], db_enc [d_sae], d(b_dec) through sae_in [d_in]"""
    dW_enc_t = np.zeros((cfg.d_sae, cfg.d_in), sae_in.dtype)
    kernels.latent_outer(*by_latent(acts, dpre), sae_in, dW_enc_t)              # (sae_in.T @ dpre).T
    db_enc = np.bincount(acts.idx, weights=dpre, minlength=cfg.d_sae).astype(dpre.dtype)
    # sae_in = x - b_dec: d b_dec = -sum_b dpre_b @ W_enc.T = -W_enc @ db_enc
    db_dec_in = -(p["W_enc"] @ db_enc) if cfg.apply_b_dec_to_input else None
    return np.ascontiguousarray(dW_enc_t.T), db_enc, db_dec_in
