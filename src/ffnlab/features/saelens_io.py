"""SAELens's on-disk format: DIR/cfg.json + DIR/sae_weights.safetensors (sae_lens/saes/sae.py save_inference_model).

Tensor names and shapes are SAELens's (dictionary.py lists them); cfg.json holds SAELens's SAEConfig fields
(d_in, d_sae, dtype, device, apply_b_dec_to_input, normalize_activations, reshape_activations, metadata,
architecture, and k / d_out where the architecture has them), which SAE.load_from_disk reads, plus one
"ffnlab" object that SAELens's from_dict filters out: the kind and activation, the model file's sha256,
the site nodes, what the training ran. The architecture names:

    kind / act        sae                transcoder                  skip-transcoder
    relu              standard           transcoder                  skip_transcoder
    jumprelu          jumprelu           jumprelu_transcoder         jumprelu_skip_transcoder
    batchtopk         jumprelu           jumprelu_transcoder         jumprelu_skip_transcoder
    topk              topk               topk_transcoder (*)         topk_skip_transcoder (*)

BatchTopK is saved as SAELens saves it for inference: a JumpReLU whose threshold is the running one, the
same for every latent. (*) SAELens has no TopK transcoder class: those two names are ffnlab's own, and
SAELens refuses them by name.
"""
import json
import math
import os

import numpy as np

from ..errors import ModelFileError
from .dictionary import ACTS, KINDS, DictConfig, param_shapes

CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
ARCH = {("sae", "relu"): "standard", ("transcoder", "relu"): "transcoder",
        ("skip-transcoder", "relu"): "skip_transcoder",
        ("sae", "jumprelu"): "jumprelu", ("transcoder", "jumprelu"): "jumprelu_transcoder",
        ("skip-transcoder", "jumprelu"): "jumprelu_skip_transcoder",
        ("sae", "topk"): "topk", ("transcoder", "topk"): "topk_transcoder",
        ("skip-transcoder", "topk"): "topk_skip_transcoder"}
FROM_ARCH = {a: ka for ka, a in ARCH.items()}


def arch_of(cfg: DictConfig) -> str:
    return ARCH[(cfg.kind, "jumprelu" if cfg.act == "batchtopk" else cfg.act)]


def cfg_dict(cfg: DictConfig, hook_name, hook_name_out, model_name, ffnlab: dict) -> dict:
    d = {"d_in": cfg.d_in, "d_sae": cfg.d_sae, "dtype": "float32", "device": "cpu",
         "apply_b_dec_to_input": cfg.apply_b_dec_to_input, "normalize_activations": "none",
         "reshape_activations": "none", "architecture": arch_of(cfg),
         "metadata": {"model_name": model_name, "hook_name": hook_name, "hook_name_out": hook_name_out,
                      "prepend_bos": True}}
    if cfg.act == "topk":
        d["k"], d["rescale_acts_by_decoder_norm"] = cfg.k, False
    if cfg.kind != "sae":
        d["d_out"] = cfg.d_out
    d["ffnlab"] = {"kind": cfg.kind, "act": cfg.act, "k": cfg.k, "bandwidth": cfg.bandwidth,
                   "ste_to_input": cfg.ste_to_input, **ffnlab}
    return d


def inference_params(p, cfg):
    """the weights as SAELens's inference files hold them: batchtopk's scalar threshold spread over latents"""
    return {n: np.ascontiguousarray(a, np.float32) for n, a in p.items()}


def save_bytes(p, cfg, meta: dict):
    """-> (cfg.json bytes, sae_weights.safetensors bytes)"""
    from safetensors.numpy import save
    return (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode(), save(inference_params(p, cfg))


def save(dirpath, p, cfg, meta):
    from ..training.checkpoint import atomic_write
    c, w = save_bytes(p, cfg, meta)
    atomic_write(os.path.join(dirpath, WEIGHTS_FILE), w)
    atomic_write(os.path.join(dirpath, CFG_FILE), c)


def _field(d, key, kind, path, default=None):
    v = d.get(key, default)
    ok = isinstance(v, kind) and not isinstance(v, bool) if kind is int else isinstance(v, kind)
    if not ok:
        raise ModelFileError(f"{path}: field {key!r} should be {kind.__name__}, found {v!r}")
    return v


def load(dirpath):
    """DIR (ffnlab's or SAELens's) -> (params {name: float32 array}, DictConfig, cfg dict). One line on any fault."""
    cpath, wpath = os.path.join(dirpath, CFG_FILE), os.path.join(dirpath, WEIGHTS_FILE)
    for f in (cpath, wpath):
        if not os.path.isfile(f):
            raise ModelFileError(f"{dirpath}: no {os.path.basename(f)} (a dictionary directory holds {CFG_FILE} and "
                                 f"{WEIGHTS_FILE})")
    try:
        with open(cpath, encoding="utf-8") as f:
            d = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelFileError(f"{cpath}: not valid JSON ({e})") from None
    if not isinstance(d, dict):
        raise ModelFileError(f"{cpath}: should hold a JSON object, found {type(d).__name__}")
    arch = _field(d, "architecture", str, cpath, "standard")
    if arch not in FROM_ARCH:
        raise ModelFileError(f"{cpath}: architecture {arch!r} is not one ffnlab reads ({', '.join(sorted(FROM_ARCH))})")
    kind, act = FROM_ARCH[arch]
    ours = d.get("ffnlab") if isinstance(d.get("ffnlab"), dict) else {}
    if ours.get("act") in ACTS and ours.get("kind") in KINDS and (ours["kind"], ours["act"]) != (kind, act):
        if not (ours["act"] == "batchtopk" and act == "jumprelu" and ours["kind"] == kind):
            raise ModelFileError(f"{cpath}: ffnlab.kind/act {ours['kind']}/{ours['act']} disagree with architecture {arch!r}")
        act = "batchtopk"
    d_in = _field(d, "d_in", int, cpath)
    d_sae = _field(d, "d_sae", int, cpath)
    d_out = _field(d, "d_out", int, cpath) if kind != "sae" else d_in
    for name, v in (("d_in", d_in), ("d_sae", d_sae), ("d_out", d_out)):
        if v <= 0:
            raise ModelFileError(f"{cpath}: field {name!r} should be > 0, found {v}")
    k = _field(d, "k", int, cpath) if act == "topk" else int(ours.get("k", 0) or 0)
    if act == "topk" and not 0 < k <= d_sae:
        raise ModelFileError(f"{cpath}: field 'k' = {k} should be in 1..d_sae = {d_sae}")
    if d.get("normalize_activations", "none") != "none":
        raise ModelFileError(f"{cpath}: normalize_activations {d['normalize_activations']!r} is not read by ffnlab "
                             f"(only 'none')")
    if kind == "sae" and d.get("apply_b_dec_to_input") is False:
        raise ModelFileError(f"{cpath}: apply_b_dec_to_input false is not read by ffnlab (its SAEs centre on b_dec)")
    cfg = DictConfig(kind, act, d_in, d_sae, d_out, k=k, bandwidth=float(ours.get("bandwidth", 0.05)),
                     ste_to_input=bool(ours.get("ste_to_input", False)))
    try:
        from safetensors.numpy import load_file
        raw = load_file(wpath)
    except Exception as e:                       # safetensors raises its own error types for a corrupt header
        raise ModelFileError(f"{wpath}: not a readable safetensors file ({str(e).splitlines()[0][:200]})") from None
    want = param_shapes(cfg)
    p = {}
    for n, shape in want.items():
        if n not in raw:
            raise ModelFileError(f"{wpath}: no tensor {n!r} (a {arch} dictionary has {', '.join(want)})")
        a = raw[n]
        if tuple(a.shape) != shape:
            raise ModelFileError(f"{wpath}: tensor {n!r} has shape {tuple(a.shape)}, expected {shape} (from {CFG_FILE})")
        a = np.ascontiguousarray(a, np.float32)
        if not np.isfinite(a).all():
            raise ModelFileError(f"{wpath}: tensor {n!r} holds non-finite values")
        p[n] = a
    if act == "topk" and d.get("rescale_acts_by_decoder_norm"):
        # SAELens's TopK with pre * ||W_dec_i|| and a / ||W_dec_i||: the same map with the norms folded
        # into the encoder (its own _fold_norm_topk); already unit rows (save_inference_model's) stay as they are
        n = np.linalg.norm(p["W_dec"].astype(np.float64), axis=1)
        p["W_enc"] = (p["W_enc"] * n[None, :]).astype(np.float32)
        p["b_enc"] = (p["b_enc"] * n).astype(np.float32)
        p["W_dec"] = (p["W_dec"] / n[:, None]).astype(np.float32)
    if act == "batchtopk" and not math.isfinite(float(p["threshold"][0])):
        raise ModelFileError(f"{wpath}: batchtopk threshold is not finite")
    return p, cfg, d
