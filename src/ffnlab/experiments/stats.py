"""Statistics of seeded runs: intervals a reader can check, and the loss-oscillation measure.

    t_interval(xs)          mean and its 95% Student-t interval: mean +- t(0.975, n-1) * s / sqrt(n),
                            s the sample std (ddof 1): scipy.stats.t.interval(0.95, n-1, mean, sem)
    bootstrap_interval(xs)  the percentile interval of the mean over resamples of the seeds with
                            replacement: every one of the n^n resamples when n^n <= EXACT_LIMIT
                            (the exact bootstrap distribution), else MC_RESAMPLES seeded draws
    paired(a, b)            a - b by seed (a seed fixes the init and the batch order of both runs):
                            the mean difference, its t and bootstrap intervals, and the relative
                            difference a/b - 1 per seed with its t interval
    unpaired(a, b)          mean(a) - mean(b) for runs whose seeds do not pair (two implementations
                            that draw their own init): Welch's interval, the standard error
                            sqrt(s_a^2/n_a + s_b^2/n_b) with Welch-Satterthwaite degrees of freedom
    oscillation(loss)       how much the training loss jumps around its own trend: the RMS of
                            loss[t] - mean(loss[t-w:t]) (the trailing moving average of the w steps
                            before), and the number of spikes, steps where loss[t] exceeds that
                            average by more than spike_frac of it
    band(curves)            per step: the mean over seeds and its t interval (seed bands on plots)
"""
import itertools
import math

import numpy as np
from scipy import stats as _scipy_stats

CONFIDENCE = 0.95
EXACT_LIMIT = 50_000         # n^n resamples enumerated exactly up to n = 6 seeds
MC_RESAMPLES = 20_000
BOOTSTRAP_SEED = 20261201


def t_quantile(p, df):
    """The p quantile of Student's t with df degrees of freedom."""
    return float(_scipy_stats.t.ppf(p, df))


def t_interval(xs, confidence=CONFIDENCE):
    """-> (mean, lo, hi); lo = hi = nan for fewer than two finite values."""
    x = np.asarray([v for v in xs if v is not None and math.isfinite(v)], np.float64)
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    sem = float(x.std(ddof=1)) / math.sqrt(len(x))
    h = t_quantile(0.5 + confidence / 2, len(x) - 1) * sem
    return m, m - h, m + h


def bootstrap_means(xs, limit=EXACT_LIMIT, resamples=MC_RESAMPLES, seed=BOOTSTRAP_SEED):
    """-> the means of the bootstrap resamples of xs (all n^n of them when n^n <= limit)."""
    x = np.asarray(xs, np.float64)
    n = len(x)
    if n ** n <= limit:
        idx = np.array(list(itertools.product(range(n), repeat=n)))             # [n^n, n]
    else:
        idx = np.random.default_rng(seed).integers(0, n, (resamples, n))        # [resamples, n]
    return x[idx].mean(axis=1)


def bootstrap_interval(xs, confidence=CONFIDENCE, **kw):
    """-> (lo, hi): the percentile interval of the bootstrap means (numpy's linear quantiles)."""
    x = [v for v in xs if v is not None and math.isfinite(v)]
    if len(x) < 2:
        return float("nan"), float("nan")
    lo, hi = np.quantile(bootstrap_means(x, **kw), [0.5 - confidence / 2, 0.5 + confidence / 2])
    return float(lo), float(hi)


def paired(a, b, confidence=CONFIDENCE) -> dict:
    """a, b: {seed: value} (or equal-length lists by seed) -> the statistics of a - b over the
    seeds both have a finite value for."""
    if not isinstance(a, dict):
        a, b = dict(enumerate(a)), dict(enumerate(b))
    seeds = sorted(s for s in a if s in b and _finite(a[s]) and _finite(b[s]))
    d = [a[s] - b[s] for s in seeds]
    rel = [a[s] / b[s] - 1 for s in seeds if b[s] != 0]
    m, lo, hi = t_interval(d, confidence)
    blo, bhi = bootstrap_interval(d, confidence)
    rm, rlo, rhi = t_interval(rel, confidence)
    return {"n": len(seeds), "seeds": seeds, "diffs": d, "mean": m, "lo": lo, "hi": hi,
            "sd": float(np.std(d, ddof=1)) if len(d) > 1 else float("nan"),
            "boot_lo": blo, "boot_hi": bhi, "rel_mean": rm, "rel_lo": rlo, "rel_hi": rhi,
            "excludes_zero": bool(len(d) > 1 and (lo > 0 or hi < 0))}


def unpaired(a, b, confidence=CONFIDENCE) -> dict:
    """a, b: values of independent runs -> mean(a) - mean(b) and its Welch t interval
    (scipy.stats.ttest_ind(a, b, equal_var=False).confidence_interval())"""
    x = np.asarray([v for v in a if _finite(v)], np.float64)
    y = np.asarray([v for v in b if _finite(v)], np.float64)
    d = float(x.mean() - y.mean()) if len(x) and len(y) else float("nan")
    if len(x) < 2 or len(y) < 2:
        return {"n": (len(x), len(y)), "mean": d, "lo": float("nan"), "hi": float("nan"), "df": float("nan")}
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(x) - 1) + vb ** 2 / (len(y) - 1)) if se > 0 else float(len(x) + len(y) - 2)
    h = t_quantile(0.5 + confidence / 2, df) * se
    return {"n": (len(x), len(y)), "mean": d, "lo": d - h, "hi": d + h, "df": float(df)}


def _finite(v):
    return v is not None and math.isfinite(v)


def summary(xs, confidence=CONFIDENCE) -> dict:
    """-> mean, t interval, sample std, n of the finite values."""
    x = [v for v in xs if _finite(v)]
    m, lo, hi = t_interval(x, confidence)
    return {"n": len(x), "mean": m, "lo": lo, "hi": hi, "sd": float(np.std(x, ddof=1)) if len(x) > 1 else float("nan")}


# --- loss oscillation -------------------------------------------------------------------------
def moving_average(loss, window):
    """-> ma [len(loss) - window]: ma[i] = mean(loss[i : i + window]), the trailing average of
    the window steps before step i + window."""
    c = np.concatenate([[0.0], np.cumsum(np.asarray(loss, np.float64))])
    return (c[window:-1] - c[:-window - 1]) / window


def oscillation(loss, window=25, skip=0, spike_frac=0.05) -> dict:
    """loss: the training loss of every step -> {"spread": RMS of loss - trailing mean,
    "spikes": count of steps above (1 + spike_frac) x trailing mean}, over steps >= skip + window."""
    x = np.asarray(loss, np.float64)[skip:]
    if len(x) <= window:
        return {"spread": float("nan"), "spikes": 0, "steps": 0}
    ma = moving_average(x, window)                                  # [len - window]
    r = x[window:] - ma                                             # residual of steps window.. of x
    return {"spread": float(np.sqrt(np.mean(r ** 2))), "spikes": int(np.sum(x[window:] > (1 + spike_frac) * ma)),
            "steps": int(len(r))}


def steps_to(loss, level, window=25):
    """The first step (1-based) whose trailing moving average is at or below level, or None."""
    ma = moving_average(loss, window)
    hit = np.nonzero(ma <= level)[0]
    return int(hit[0] + window) if len(hit) else None


def band(curves, confidence=CONFIDENCE):
    """curves: [seeds][steps] (equal lengths) -> mean, lo, hi per step (t interval over seeds)."""
    c = np.asarray(curves, np.float64)                              # [S, T]
    m = c.mean(axis=0)
    if c.shape[0] < 2:
        return m, m, m
    h = t_quantile(0.5 + confidence / 2, c.shape[0] - 1) * c.std(axis=0, ddof=1) / math.sqrt(c.shape[0])
    return m, m - h, m + h
