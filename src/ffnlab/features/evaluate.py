"""A dictionary's quality on held-out text: on the activations, and spliced into the model's forward.

On the scored rows (harvest.py's windows), with y the target node and y_hat the dictionary's output:
    L0                  latents firing per token (inference activations: topk; a threshold for jumprelu/batchtopk)
    MSE                 E ||y - y_hat||^2                              (sum over the width, mean over tokens)
    explained variance  1 - MSE / (E ||y||^2 - ||E y||^2)              (SAELens's ExplainedVarianceCalculator)
    FVU                 1 - explained variance
    dead / dense        latents firing on no token / on more than 10% of the tokens

Spliced (splice_fns, the hooks splice_hooks hands to ffnlab.hooks: the target node's value replaced by y_hat,
computed from the input node's value in the same forward, at every position but each window's first, BOS or
the attention sink that no dictionary is trained on, as SAELens's run_evals keeps its special tokens), as
run_evals defines them:
    CE loss score  (CE_ablated - CE_spliced) / (CE_ablated - CE_clean)   next-token loss at the scored
                                                                         positions that have a next token
    KL score       (KL_ablated - KL_spliced) / KL_ablated    KL(clean || new) at every scored position, averaged
ablated (ABLATIONS): "zero", the target node zeroed at every position, the first too (run_evals' zero
ablation, the default); "zero-after-first", zeroed at every position but each window's first; "mean", set
to the mean of the target over the first batch's scored rows at every position but the first.
tests/engines/test_features_evals_vs_saelens.py holds these to run_evals on the same model and tokens.
"""
import re

import numpy as np

from ..errors import UsageError
from ..model.hooks import Editor
from .choices import ABLATIONS
from . import dictionary as D
from .harvest import capture, dictionary_for


def reconstruct(p, cfg, x):
    """x [R, d_in] -> (y_hat [R, d_out] float32, Sparse activations)"""
    acts, _, _ = D.encode(p, cfg, np.ascontiguousarray(x, np.float32), train=False)
    return D.decode(p, cfg, acts, x), acts


def splice_fns(p, cfg, in_node, out_node, error=False, skip_first=True, record=None):
    """{node: fn} for ffnlab.hooks / Editor: out_node's value [..., T, d_out] replaced by the dictionary's output
    on in_node's value [..., T, d_in] of the same forward (in_node's fn keeps it; an SAE's two are one node).
    error: add the error term back, y_hat + (y - y_hat), summed in float64 so it gives y exactly (a float32
    difference of two float32 values is exact in float64, and so is adding it back), which makes the splice
    with its error term the clean forward bit for bit. skip_first: position 0 keeps its own value (BOS or the
    attention sink, which no dictionary is trained on). record: a list that receives (x, y, y_hat) per call."""
    seen = {}

    def take_input(value, name, positions):
        seen["x"] = value
        return None

    def replace(value, name, positions):
        x = seen.pop("x", value) if in_node != out_node else value
        lead, d_in = x.shape[:-1], x.shape[-1]
        y_hat, _ = reconstruct(p, cfg, x.reshape(-1, d_in))                      # [R, d_in] -> [R, d_out]
        y_hat = y_hat.reshape(*lead, -1)
        if record is not None:
            record.append((x, value, y_hat))
        if error:
            y_hat = (y_hat.astype(np.float64) + (value.astype(np.float64) - y_hat.astype(np.float64))).astype(value.dtype)
        if skip_first and positions[0] == 0:
            y_hat[..., 0, :] = value[..., 0, :]
        return np.ascontiguousarray(y_hat, dtype=value.dtype)

    # node names hold no regular-expression characters, so each key matches its node alone (Editor's patterns)
    return {in_node: take_input, out_node: replace} if in_node != out_node else {out_node: replace}


def splice(p, cfg, in_node, out_node, error=False, skip_first=True, record=None):
    """An Editor of splice_fns (features eval's spliced forward: model.forward(ids, hooks=splice(...)))"""
    return Editor(splice_fns(p, cfg, in_node, out_node, error, skip_first, record))


def splice_hooks(model, dirpath, error=False, skip_first=True):
    """A dictionary directory (cfg.json + sae_weights.safetensors) -> {node: fn} for ffnlab.hooks(model, ...):
    the dictionary spliced into the forward as `features eval` splices it. A transcoder's ffn_out-L becomes
    its output on ffn_norm-L's value, an SAE's site its reconstruction; error: plus the error term (the clean
    forward bit for bit); skip_first: position 0 left as it is. The directory is checked against the model
    first (harvest.dictionary_for: vocabulary, sites, widths), one line on a misfit.

        with ffnlab.hooks(model, splice_hooks(model, "tc12")):
            logits = model.forward(ids)
    """
    p, cfg, _, in_node, out_node = dictionary_for(model, dirpath)
    return splice_fns(p, cfg, in_node, out_node, error, skip_first)


def ablate(out_node, mean=None, skip_first=True):
    def fn(value, name, positions):
        r = np.zeros_like(value) if mean is None else np.broadcast_to(mean.astype(value.dtype), value.shape).copy()
        if skip_first and positions[0] == 0:
            r[..., 0, :] = value[..., 0, :]
        return r
    return Editor({re.escape(out_node): fn})


def log_softmax(z):
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def next_token_terms(logits, ids, scored, clean=None, rows=64):
    """logits [B, T, V], ids [B, T], scored [B, T] bool, clean: the clean forward's logits [B, T, V] or None ->
    (CE per scored position that has a next token [n], KL(clean || this) per scored position [m] or None).
    Log-softmax in float64, `rows` positions at a time: each row's value is the same however they are grouped,
    and memory stays at rows x V doubles, not B x T x V (262k-token vocabularies)."""
    b, t = np.nonzero(scored)                                                   # the rows of logits[scored]
    has_next = t < scored.shape[1] - 1                                          # the last position has no next token
    ce, kl = [], []
    for i in range(0, len(b), rows):
        bi, ti, nx = b[i:i + rows], t[i:i + rows], has_next[i:i + rows]
        lp = log_softmax(logits[bi, ti])                                        # [r, V]
        ce.append(-lp[np.nonzero(nx)[0], ids[bi[nx], ti[nx] + 1]])
        if clean is not None:
            cp = log_softmax(clean[bi, ti])
            kl.append((np.exp(cp) * (cp - lp)).sum(-1))
    ce = np.concatenate(ce) if ce else np.zeros(0)
    return ce, None if clean is None else (np.concatenate(kl) if kl else np.zeros(0))


def evaluate_dictionary(model, p, cfg, windows, in_node, out_node, max_tokens, batch, ablation="zero"):
    from ..evaluation.activations import batches
    if ablation not in ABLATIONS:
        raise UsageError(f"ablation {ablation!r}: not one of {', '.join(ABLATIONS)}")
    sums = {"sq_res": 0.0, "sq_norm": 0.0, "l0": 0.0}
    sum_y = None
    fires = np.zeros(cfg.d_sae, np.int64)
    ce = {"clean": [], "spliced": [], "ablated": []}
    kl = {"spliced": [], "ablated": []}
    n_rows, mean = 0, None
    for first, ids in batches(windows.windows, batch):
        if n_rows >= max_tokens:
            break
        B, T = ids.shape
        got, clean = capture(model, ids, (in_node, out_node), copy=True)
        _, scored = windows.positions(first, B, T)                               # [B, T]
        x, y = got[in_node][scored], got[out_node][scored]                       # [R, d]
        y_hat, acts = reconstruct(p, cfg, x)
        res = (y.astype(np.float64) - y_hat) ** 2
        sums["sq_res"] += float(res.sum())
        sums["sq_norm"] += float((y.astype(np.float64) ** 2).sum())
        sum_y = y.astype(np.float64).sum(0) + (0 if sum_y is None else sum_y)
        sums["l0"] += float(acts.l0().sum())
        fires += np.bincount(acts.idx[acts.val > 0], minlength=cfg.d_sae)
        n_rows += len(y)
        if ablation == "mean" and mean is None:
            mean = y.astype(np.float64).mean(0)
        c_clean, _ = next_token_terms(clean, ids, scored)
        spliced = model.forward(ids, hooks=splice(p, cfg, in_node, out_node))
        c_spl, k_spl = next_token_terms(spliced, ids, scored, clean)
        del spliced
        ablated = model.forward(ids, hooks=ablate(out_node, mean if ablation == "mean" else None,
                                                  skip_first=ablation != "zero"))
        c_abl, k_abl = next_token_terms(ablated, ids, scored, clean)
        del ablated, clean
        ce["clean"].append(c_clean), ce["spliced"].append(c_spl), ce["ablated"].append(c_abl)
        kl["spliced"].append(k_spl), kl["ablated"].append(k_abl)
    N = max(n_rows, 1)
    mse = sums["sq_res"] / N
    total_var = sums["sq_norm"] / N - float(((sum_y / N) ** 2).sum())
    ev = 1.0 - mse / total_var if total_var > 1e-10 else float(mse < 1e-10)
    m = {k: float(np.concatenate(v).mean()) for k, v in ce.items()}
    k = {n: float(np.concatenate(v).mean()) for n, v in kl.items()}
    density = fires / N
    return {"tokens": n_rows, "l0": sums["l0"] / N, "mse": mse, "explained_variance": ev, "fvu": 1.0 - ev,
            "dead_fraction": float((fires == 0).mean()), "dense_fraction": float((density > 0.1).mean()),
            "ce_clean": m["clean"], "ce_spliced": m["spliced"], "ce_ablated": m["ablated"],
            "ce_loss_score": (m["ablated"] - m["spliced"]) / (m["ablated"] - m["clean"]),
            "kl_spliced": k["spliced"], "kl_ablated": k["ablated"],
            "kl_score": (k["ablated"] - k["spliced"]) / k["ablated"], "ablation": ablation,
            "density": density}
