"""Feature pages, as Neuronpedia shows a latent: how often it fires, its activation histogram, the text windows
where it fires hardest (and windows from lower quantile bins of its activations, each labelled with its range of
activations and its share of them: SAEDashboard's interval groups, cut at quantiles rather than at equal
widths), and the logit effect of its decoder row:
W_dec[j] scaled by the final norm's weight and read through the unembedding (the norm's 1/rms taken as a
constant: the direct effect on the logits, up to one positive factor), top +/- tokens and their histogram over
the vocabulary, and the most similar neurons of the block's MLP: the cosine of the latent's decoder row with each
neuron's down column (what the neuron writes) and of its encoder column with each neuron's up row (what the
neuron reads; also its gate row in a gated MLP).

The activations of up to max_tokens scored tokens are kept as (token, latent, value) entries: at most
max_tokens * L0 of them, bounded by the flag, not by the corpus. The scored tokens are one run of the text
(evaluation/activations.py: each from min_context on is scored once, in order), so a window's tokens carry the
latent's value at each of them (0 where it did not fire); a window is clipped to that run, so that no value is
one the dictionary did not compute.
"""
import html
import json
import re

import numpy as np

from .evaluate import reconstruct
from .harvest import blocks_for, capture

BINS = 24


def collect(model, p, cfg, windows, in_node, max_tokens, batch):
    """-> (token index in the text [E], latent [E], value [E], tokens read, (first, end): the text tokens scored)"""
    from ..evaluation.activations import batches
    tok_i, lat, val, n = [], [], [], 0
    read_from, read_to = None, 0                                     # the run of text tokens scored
    for first, ids in batches(windows.windows, batch):
        if n >= max_tokens:
            break
        B, T = ids.shape
        got, _ = capture(model, ids, [in_node], last_only=True, n_layer=blocks_for(in_node))
        pos, scored = windows.positions(first, B, T)
        _, acts = reconstruct(p, cfg, got[in_node][scored])
        on = acts.val > 0
        tok_i.append(pos[scored][acts.rows[on]]), lat.append(acts.idx[on]), val.append(acts.val[on])
        n += int(scored.sum())
        if scored.any():
            read_from = int(pos[scored].min()) if read_from is None else read_from
            read_to = int(pos[scored].max()) + 1
    cat = (lambda a: np.concatenate(a) if a else np.zeros(0))
    return (cat(tok_i).astype(np.int64), cat(lat).astype(np.int64), cat(val).astype(np.float32), n,
            (read_from or 0, read_to))


def window(tok, ids, dense, first, t, before=12, after=4):
    """text token t -> {"value", "token": t, "text": the window, t as [[t]], "tokens": [W] one string a token,
    "values": [W] the latent's activation at each, "at": t's place in them}. dense: [end - first] the latent's
    activation at each scored token, the window clipped to them."""
    a, b = max(first, t - before), min(first + len(dense), t + after + 1)
    dec = (lambda s: tok.decode([int(i) for i in s]))
    return {"value": round(float(dense[t - first]), 4), "token": int(t),
            "text": dec(ids[a:t]) + "[[" + dec(ids[t:t + 1]) + "]]" + dec(ids[t + 1:b]),
            "tokens": [dec([i]) for i in ids[a:b]],
            "values": [round(float(x), 4) for x in dense[a - first:b - first]], "at": int(t - a)}


def bin_label(q):
    """a quantile bin of feature_pages -> its one-line label: quantiles, range of activations, share of them"""
    lo, hi = q["quantile"]
    head = f"quantile {100 * lo:.0f}-{100 * hi:.0f}%"
    if q["range"] is None:
        return head + ": no activations"
    return f"{head}: activations {q['range'][0]:.4g} to {q['range'][1]:.4g} ({100 * q['contains']:.0f}% of them)"


def logit_effect(model, w_dec_row, n=10):
    """-> (top n (token, logit) by the largest, the n most negative, {"edges", "counts"}: histogram of all [n_vocab])"""
    w = model.params.get("output_norm.weight")
    v = w_dec_row * (np.asarray(w, np.float32) if w is not None else 1.0)
    z = np.asarray(model.head_logits(v[None].astype(np.float32)))[0].astype(np.float64)
    z -= z.mean()
    order = np.argsort(-z, kind="stable")
    tok = model.tokenizer
    as_list = (lambda idx: [{"token": tok.decode([int(i)]), "id": int(i), "logit": round(float(z[i]), 4)} for i in idx])
    counts, edges = np.histogram(z, BINS)
    hist = {"edges": [round(float(e), 5) for e in edges], "counts": counts.tolist()}
    return as_list(order[:n]), as_list(order[::-1][:n]), hist


def mlp_vectors(model, layer):
    """-> {"down": [d_ff, d_model] down columns, "up": [d_ff, d_model] up rows (+ "gate")} as float64 unit rows,
    or None where the block has no dense MLP (a mixture of experts)"""
    from ..interventions.common import as_float
    p = model.params
    blk = f"blk.{layer}."
    if blk + "ffn_down.weight" not in p or blk + "ffn_up.weight" not in p:
        return None
    vecs = {"down": as_float(p[blk + "ffn_down.weight"]).T, "up": as_float(p[blk + "ffn_up.weight"])}
    if blk + "ffn_gate.weight" in p:
        vecs["gate"] = as_float(p[blk + "ffn_gate.weight"])
    unit = (lambda m: m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-30))
    return {k: unit(np.asarray(v, np.float64)) for k, v in vecs.items()}


def similar_neurons(vecs, p, j, n=5):
    """latent j -> {"down": [{neuron, cosine}] by the decoder row, "up" (and "gate"): by the encoder column}:
    the n neurons of largest |cosine|, largest first"""
    out = {}
    for name, m in vecs.items():
        v = p["W_dec"][j] if name == "down" else p["W_enc"][:, j]
        if v.shape[0] != m.shape[1]:
            continue
        v = v.astype(np.float64)
        cos = m @ (v / max(np.linalg.norm(v), 1e-30))                          # [d_ff]
        top = np.argsort(-np.abs(cos), kind="stable")[:n]
        out[name] = [{"neuron": int(i), "cosine": round(float(cos[i]), 4)} for i in top]
    return out


def feature_pages(model, p, cfg, windows, ids, in_node, out_node, latents, top_n, top, max_tokens, batch):
    tok_i, lat, val, n, (first, end) = collect(model, p, cfg, windows, in_node, max_tokens, batch)
    counts = np.bincount(lat, minlength=cfg.d_sae)
    if latents is None:
        latents = [int(j) for j in np.argsort(-counts, kind="stable")[:top_n]]
    with_logits = cfg.d_out == model.config.d_model
    m = re.search(r"-(\d+)$", out_node)
    layer = int(m.group(1)) if m else None
    vecs = mlp_vectors(model, layer) if layer is not None else None
    pages = []
    for j in latents:
        sel = lat == j
        v, t = val[sel], tok_i[sel]
        order = np.argsort(-v, kind="stable")
        page = {"latent": int(j), "density": float(counts[j]) / max(n, 1), "count": int(counts[j]),
                "max": float(v.max()) if v.size else 0.0, "mean": float(v.mean()) if v.size else 0.0}
        if v.size:
            edges = np.linspace(0, float(v.max()), BINS + 1)
            page["hist"] = {"edges": [round(float(e), 5) for e in edges],
                            "counts": np.histogram(v, edges)[0].tolist()}
        else:
            page["hist"] = {"edges": [], "counts": []}
        dense = np.zeros(end - first, np.float32)                                # [scored tokens]: 0 = did not fire
        dense[t - first] = v
        page["windows"] = [window(model.tokenizer, ids, dense, first, int(t[i])) for i in order[:top]]
        qs, N = [], len(order)
        for lo, hi in ((0.5, 0.75), (0.25, 0.5), (0.0, 0.25)):                   # lower quantile bins of its values
            a, b = int(lo * N), int(hi * N)
            inside = order[N - b:N - a]                                          # largest first
            qs.append({"quantile": [lo, hi], "contains": (b - a) / max(N, 1),
                       "range": [round(float(v[inside[-1]]), 4), round(float(v[inside[0]]), 4)] if b > a else None,
                       "windows": [window(model.tokenizer, ids, dense, first, int(t[i])) for i in inside[:2]]})
        page["quantiles"] = qs
        if with_logits:
            page["logits_pos"], page["logits_neg"], page["logits_hist"] = logit_effect(model, p["W_dec"][j])
        else:
            page["logits_pos"] = page["logits_neg"] = []
        page["neurons"] = {"layer": layer, **similar_neurons(vecs, p, j)} if vecs else {}
        pages.append(page)
    return {"tokens": n, "d_sae": cfg.d_sae, "site_in": in_node, "site_out": out_node,
            "dead_fraction": float((counts == 0).mean()), "features": pages}


def svg_hist(h):
    if not h["counts"]:
        return "<p>never fired</p>"
    c = np.array(h["counts"], float)
    w, ht = 240, 60
    bw = w / len(c)
    bars = "".join(f'<rect x="{i * bw:.1f}" y="{ht - ht * x / c.max():.1f}" width="{bw - 1:.1f}" '
                   f'height="{ht * x / c.max():.1f}" fill="#c0392b"/>' for i, x in enumerate(c) if x)
    return f'<svg width="{w}" height="{ht}" class="hist">{bars}</svg><div class="axis">0 .. {h["edges"][-1]:.3g}</div>'


def mark(text):
    """escape, then show the [[token]] highlighted"""
    e = html.escape(text)
    return re.sub(r"\[\[(.*?)\]\]", r'<b class="tok">\1</b>', e, flags=re.S)


def write_html(path, pages, dirpath, source):
    parts = [f"<!doctype html><meta charset='utf-8'><title>features: {html.escape(dirpath)}</title>",
             "<style>body{font:14px sans-serif;margin:20px} .f{border:1px solid #ccc;margin:10px 0;padding:8px}"
             " .tok{background:#f5b7b1} pre{white-space:pre-wrap;margin:2px 0} .axis{font-size:11px;color:#555}"
             " .bin{font-size:13px;margin:8px 0 2px;color:#444}</style>",
             f"<h1>{html.escape(dirpath)}</h1><p>{html.escape(str(source))}: {pages['site_in']} &rarr; {pages['site_out']}, "
             f"{pages['d_sae']} latents, {pages['tokens']} tokens</p>",
             f"<script type='application/json' id='data'>{html.escape(json.dumps(pages, ensure_ascii=False), quote=False)}</script>"]
    for f in pages["features"]:
        pos = " ".join(html.escape(repr(t["token"])) for t in f["logits_pos"][:8])
        neg = " ".join(html.escape(repr(t["token"])) for t in f["logits_neg"][:8])
        wins = "".join(f"<pre>{w['value']:+.4g}  {mark(w['text'])}</pre>" for w in f["windows"])
        wins += "".join(f"<h3 class='bin'>{html.escape(bin_label(q))}</h3>"
                        + "".join(f"<pre>{w['value']:+.4g}  {mark(w['text'])}</pre>" for w in q["windows"])
                        for q in f.get("quantiles", []))
        nb = f.get("neurons") or {}
        near = "".join(f"<br>{html.escape(k)}: " + " ".join(f"{e['neuron']} ({e['cosine']:+.2f})" for e in nb[k])
                       for k in ("down", "up", "gate") if k in nb)
        near = f"<p class='neurons'>most similar neurons of layer {nb['layer']} (cosine){near}</p>" if near else ""
        parts.append(f"<div class='f' id='latent-{f['latent']}'><h2>latent {f['latent']}</h2>"
                     f"<p>density {f['density']:.4g} ({f['count']} tokens), max {f['max']:.4g}</p>{svg_hist(f['hist'])}"
                     f"<p>logits +: {pos}<br>logits &minus;: {neg}</p>{near}{wins}</div>")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(parts))
