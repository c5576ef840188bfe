"""The quantization gap: one dictionary on two computations of the same model (another GGUF of it -- another
quantization -- or another arithmetic, f32 | ggml), on the same text.

    features eval DIR -m F16.gguf --compare-model Q4_1.gguf        the quantized file's activations
    features eval DIR -m Q4_1.gguf --compare-arith ggml            llama.cpp's numerics on the same weights

Each side gets evaluate.py's metrics (FVU, CE loss score, KL score: each against its own clean forward);
per latent, on the same scored tokens (the same windows of token ids), with a_t and b_t its activations at
token t on the first and on the second side (0 where it does not fire):
    correlation   Pearson's r of (a_t) and (b_t) over the tokens      (None where either side is constant)
    density       the fraction of tokens it fires on, on each side; the change is second - first
"""
import numpy as np

from .dictionary import encode
from .harvest import blocks_for, capture


def site_rows(model, ids, in_node, scored):
    """ids [B, T] -> in_node's value at the scored positions [R, d_in] float32 (the first blocks only)"""
    got, _ = capture(model, ids, [in_node], last_only=True, n_layer=blocks_for(in_node))
    return np.ascontiguousarray(got[in_node][scored], np.float32)


def latent_keys(acts):
    """Sparse -> (row * d_sae + latent [nnz firing], value [nnz firing])"""
    on = acts.val > 0
    return acts.rows[on] * acts.shape[1] + acts.idx[on], acts.val[on].astype(np.float64)


def compare_latents(model_a, model_b, p, cfg, windows, in_node, max_tokens, batch):
    """-> {"tokens", "correlation" [d_sae] (nan: undefined), "density_a" [d_sae], "density_b" [d_sae]}"""
    from ..evaluation.activations import batches
    N = cfg.d_sae
    s = {k: np.zeros(N) for k in ("a", "b", "aa", "bb", "ab")}
    fires = {"a": np.zeros(N, np.int64), "b": np.zeros(N, np.int64)}
    n = 0
    for first, ids in batches(windows.windows, batch):
        if n >= max_tokens:
            break
        _, scored = windows.positions(first, *ids.shape)
        ka, va = latent_keys(encode(p, cfg, site_rows(model_a, ids, in_node, scored))[0])
        kb, vb = latent_keys(encode(p, cfg, site_rows(model_b, ids, in_node, scored))[0])
        for side, k, v in (("a", ka, va), ("b", kb, vb)):
            lat = k % N
            s[side] += np.bincount(lat, weights=v, minlength=N)
            s[side * 2] += np.bincount(lat, weights=v * v, minlength=N)
            fires[side] += np.bincount(lat, minlength=N)
        both, ia, ib = np.intersect1d(ka, kb, assume_unique=True, return_indices=True)    # fires on both sides
        s["ab"] += np.bincount(both % N, weights=va[ia] * vb[ib], minlength=N)
        n += int(scored.sum())
    n = max(n, 1)
    mean_a, mean_b = s["a"] / n, s["b"] / n
    var_a, var_b = s["aa"] / n - mean_a ** 2, s["bb"] / n - mean_b ** 2
    cov = s["ab"] / n - mean_a * mean_b
    with np.errstate(invalid="ignore", divide="ignore"):
        # a variance below float64's rounding of its own second moment is a constant (a latent that never fires)
        defined = (var_a > 1e-12 * np.maximum(s["aa"] / n, 1e-300)) & (var_b > 1e-12 * np.maximum(s["bb"] / n, 1e-300))
        corr = np.where(defined, cov / np.sqrt(var_a * var_b), np.nan)
    return {"tokens": n, "correlation": corr, "density_a": fires["a"] / n, "density_b": fires["b"] / n}


def summary(c, top=10):
    """compare_latents' arrays -> the JSON's per-latent lists and a few figures over the latents"""
    corr, da, db = c["correlation"], c["density_a"], c["density_b"]
    alive = (da > 0) | (db > 0)
    ok = ~np.isnan(corr)
    change = db - da
    worst = [int(j) for j in np.argsort(np.where(ok, corr, np.inf), kind="stable")[:top] if ok[j]]
    moved = [int(j) for j in np.argsort(-np.abs(change), kind="stable")[:top] if change[j] != 0]
    rnd = (lambda v: None if np.isnan(v) else round(float(v), 6))
    return {"tokens": c["tokens"], "alive": int(alive.sum()),
            "correlation_mean": rnd(corr[ok].mean()) if ok.any() else None,
            "correlation_median": rnd(np.median(corr[ok])) if ok.any() else None,
            "density_change_mean_abs": rnd(np.abs(change[alive]).mean()) if alive.any() else 0.0,
            "lowest_correlation": [{"latent": j, "correlation": rnd(corr[j]), "density": rnd(da[j]),
                                    "density_compare": rnd(db[j])} for j in worst],
            "largest_density_change": [{"latent": j, "density": rnd(da[j]), "density_compare": rnd(db[j]),
                                        "correlation": rnd(corr[j])} for j in moved],
            "per_latent": {"correlation": [rnd(v) for v in corr], "density": [rnd(v) for v in da],
                           "density_compare": [rnd(v) for v in db]}}
