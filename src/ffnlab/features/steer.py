"""Steering with a dictionary's latents: `ffnlab run --features DIR --feature-steer L:LATENT:SCALE`.

    target += SCALE * W_dec[LATENT]        at every position, through an Editor (ffnlab.hooks)

The target is the node the dictionary writes: a transcoder's ffn_out-L (the MLP's output, before the
residual add), an SAE's own site. L picks, among the --features directories, the one whose target is in
block L (so several layers' transcoders can steer in one run); a latent's decoder row is the direction that
latent writes when it fires, so SCALE is in the units of the latent's activation.
"""
import re

import numpy as np

from ..errors import UsageError
from ..model.hooks import Editor
from .harvest import dictionary_for

SPEC = "L:LATENT:SCALE"


def layer_of(node):
    m = re.search(r"-(\d+)$", node)
    return int(m.group(1)) if m else None


def parse_spec(spec):
    """'L:LATENT:SCALE' -> (layer, latent, scale); one line on a malformed spec"""
    bits = spec.split(":")
    if len(bits) != 3 or not all(bits):
        raise UsageError(f"--feature-steer {spec!r}: expected {SPEC}, e.g. 5:123:8")
    try:
        layer, latent = int(bits[0]), int(bits[1])
    except ValueError:
        raise UsageError(f"--feature-steer {spec!r}: layer and latent must be integers ({SPEC})") from None
    try:
        scale = float(bits[2])
    except ValueError:
        raise UsageError(f"--feature-steer {spec!r}: scale {bits[2]!r} is not a number") from None
    if not np.isfinite(scale):
        raise UsageError(f"--feature-steer {spec!r}: scale must be finite, got {bits[2]}")
    return layer, latent, scale


def by_layer(model, dirs):
    """--features DIRs -> {layer: (dir, params, DictConfig, target node)}, each checked against the model"""
    out = {}
    for d in dirs:
        p, cfg, _, _, out_node = dictionary_for(model, d)
        il = layer_of(out_node)
        if il is None:
            raise UsageError(f"--features {d}: its target {out_node} is not a node of a block")
        if il in out:
            raise UsageError(f"--features {d} and {out[il][0]} both write block {il} ({out_node}); give one per layer")
        out[il] = (d, p, cfg, out_node)
    return out


def steer_vector(p, latent, scale):
    """scale * W_dec[latent], one float32 rounding of the float64 product -> [d_out]"""
    return (np.float64(scale) * p["W_dec"][latent].astype(np.float64)).astype(np.float32)


def feature_steer_editor(model, dirs, specs):
    """--features DIRs + --feature-steer specs -> (Editor, [record]): each spec adds its vector to its target"""
    dicts = by_layer(model, dirs)
    edits, record = {}, []
    for spec in specs:
        il, j, scale = parse_spec(spec)
        if not 0 <= il < model.config.n_layer:
            raise UsageError(f"--feature-steer {spec!r}: layer {il} is out of range ({model.source} has "
                             f"{model.config.n_layer} layers, 0..{model.config.n_layer - 1})")
        if il not in dicts:
            have = ", ".join(f"{k} ({v[0]})" for k, v in sorted(dicts.items()))
            raise UsageError(f"--feature-steer {spec!r}: no --features directory writes block {il} (they write: {have})")
        d, p, cfg, node = dicts[il]
        if not 0 <= j < cfg.d_sae:
            raise UsageError(f"--feature-steer {spec!r}: latent {j} is out of range ({d} has {cfg.d_sae} latents, "
                             f"0..{cfg.d_sae - 1})")
        edits.setdefault(node, []).append(steer_vector(p, j, scale))
        record.append({"kind": "feature-steer", "node": node, "features": d, "latent": j, "scale": scale})

    def add(vecs):
        def fn(value, name, positions):
            for v in vecs:                                  # in the order given, one float32 add each
                value = value + v.astype(value.dtype, copy=False)
            return value
        return fn
    return Editor({re.escape(node): add(vecs) for node, vecs in edits.items()}), record
