"""Feature pages (pages.py) as Neuronpedia's per-feature JSON: one OUTDIR/<index>.json a latent.

The field names are those of Neuronpedia's `Feature` and `Activation` rows as SAEDashboard writes them
(jbloomAus/SAEDashboard, sae_dashboard/neuronpedia/neuronpedia_export.py; the histograms as
sae_dashboard/utils_fns.py `HistogramData`: bar heights the counts, bar values the bins' midpoints). Only what
a feature page computes is written:

    modelId, layer, index          cfg.json metadata.neuronpedia_id "model/source" where it has one; else
                                   metadata.model_name (or the model file's name) and Neuronpedia's
                                   "{block}-{set}" with DIR's name as the set
    maxActApprox                   the largest activation read
    frac_nonzero                   density: the share of the read tokens it fires on
    freq_hist_data_bar_heights/values   its activation histogram
    pos_str/pos_values, neg_str/neg_values   the logit effect's top +/- tokens (centred over the vocabulary)
    logits_hist_data_bar_heights/values      the logit effect's histogram over the vocabulary
    neuron_alignment_indices/values          the MLP neurons whose down column is nearest its decoder row (cosine)
    activations                    each window: tokens, values, maxValue, maxValueTokenIndex, minValue,
                                   qualifyingTokenIndex (the token it was chosen for); a quantile bin's
                                   windows also binMin, binMax, binContains

Left out, not computed here: the correlated neurons and features, neuron_alignment_l1, DFA values, the
decoder's head distribution, the vector, and SAEDashboard's top-activation bin marks (binMin -1).
"""
import json
import os
import shutil
import tempfile

from .harvest import blocks_for


def source_of(cfg_dict, dirpath, site_out, model_file):
    """cfg.json's dict -> (modelId, layer: Neuronpedia's source id); model_file: the name where cfg.json has none"""
    meta = cfg_dict.get("metadata") if isinstance(cfg_dict.get("metadata"), dict) else {}
    np_id = meta.get("neuronpedia_id")
    if isinstance(np_id, str) and np_id.count("/") == 1:                       # SAELens's "gpt2-small/0-res-jb"
        return tuple(np_id.split("/"))
    block = blocks_for(site_out)
    name = os.path.basename(os.path.normpath(dirpath))
    return str(meta.get("model_name") or model_file), (f"{block - 1}-{name}" if block is not None else name)


def _bars(h):
    """pages.py {"edges": [B+1], "counts": [B]} -> (bar heights [B], bar values [B]: the midpoints)"""
    e = h["edges"]
    return list(h["counts"]), [round((a + b) / 2, 5) for a, b in zip(e[:-1], e[1:])]


def _activation(w, q=None):
    """a page's window (and its quantile bin) -> Neuronpedia's Activation fields"""
    vals = w["values"]
    top = max(vals)
    out = {"tokens": w["tokens"], "values": vals, "maxValue": top, "maxValueTokenIndex": vals.index(top),
           "minValue": min(vals), "qualifyingTokenIndex": w["at"]}
    if q is not None:
        out.update(binMin=q["range"][0], binMax=q["range"][1], binContains=q["contains"])
    return out


def feature_json(f, model_id, source):
    """one page of feature_pages -> Neuronpedia's Feature dict, its activations inside"""
    out = {"modelId": model_id, "layer": source, "index": str(f["latent"]), "maxActApprox": f["max"],
           "frac_nonzero": f["density"]}
    out["freq_hist_data_bar_heights"], out["freq_hist_data_bar_values"] = _bars(f["hist"])
    if f["logits_pos"]:
        out["pos_str"], out["pos_values"] = [e["token"] for e in f["logits_pos"]], [e["logit"] for e in f["logits_pos"]]
        out["neg_str"], out["neg_values"] = [e["token"] for e in f["logits_neg"]], [e["logit"] for e in f["logits_neg"]]
    if "logits_hist" in f:
        out["logits_hist_data_bar_heights"], out["logits_hist_data_bar_values"] = _bars(f["logits_hist"])
    down = (f.get("neurons") or {}).get("down")
    if down:
        out["neuron_alignment_indices"] = [e["neuron"] for e in down]
        out["neuron_alignment_values"] = [e["cosine"] for e in down]
    out["activations"] = ([_activation(w) for w in f["windows"]]
                          + [_activation(w, q) for q in f["quantiles"] for w in q["windows"]])
    return out


def write_features(outdir, pages, model_id, source):
    """pages (feature_pages) -> outdir/<index>.json each. All are written into a new folder beside outdir first,
    then moved in (a rename each), so that a failed write leaves outdir as it was. -> the paths written"""
    parent = os.path.dirname(os.path.abspath(outdir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(outdir)) + ".", dir=parent)
    try:
        names = []
        for f in pages["features"]:
            names.append(f"{f['latent']}.json")
            with open(os.path.join(tmp, names[-1]), "w", encoding="utf-8") as fh:
                json.dump(feature_json(f, model_id, source), fh, ensure_ascii=False)
        if not os.path.exists(outdir):
            os.rename(tmp, outdir)
        else:
            for n in names:
                os.replace(os.path.join(tmp, n), os.path.join(outdir, n))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return [os.path.join(outdir, n) for n in names]
