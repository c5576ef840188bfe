"""LoRA: trainable parameters of rank-r adapters on chosen weight matrices.

An adapter on a matrix W [out, in] adds A [r, in] and B [out, r]: r * (in + out) parameters,
per matrix per layer. Targets use ffnlab's names or the usual HF module names:

  q (q_proj)  k (k_proj)  v (v_proj)  o (o_proj, GPT-2 attn.c_proj)
  gate (gate_proj)  up (up_proj, GPT-2 c_fc)  down (down_proj, GPT-2 mlp.c_proj)
  qkv (GPT-2 c_attn): on a fused-qkv model any of q/k/v means the one fused matrix, as PEFT
  sees GPT-2's c_attn.
"""
from ..errors import UsageError

ALIASES = {"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "out_proj": "o", "gate_proj": "gate",
           "up_proj": "up", "down_proj": "down", "c_attn": "qkv", "c_fc": "up", "attn_output": "o",
           "ffn_gate": "gate", "ffn_up": "up", "ffn_down": "down", "w1": "gate", "w3": "up", "w2": "down"}
TARGETS = ("q", "k", "v", "o", "qkv", "gate", "up", "down")
ALL_LINEAR = ("q", "k", "v", "o", "gate", "up", "down")
_MLP = ("gate", "up", "down")


GROUPS = {"all": ALL_LINEAR, "all-linear": ALL_LINEAR, "all_linear": ALL_LINEAR,
          "attn": ("q", "k", "v", "o"), "mlp": _MLP}


def parse_targets(text, flag="--lora-targets") -> list[str]:
    """'q,v' or 'q_proj,v_proj' or 'attn' (q,k,v,o) or 'mlp' (gate,up,down) or 'all' -> canonical target names"""
    out = []
    for t in (s.strip() for s in text.split(",") if s.strip()):
        for c in GROUPS.get(t.lower(), (ALIASES.get(t.lower(), t.lower()),)):
            if c not in TARGETS:
                raise UsageError(f"{flag}: unknown target {t!r} (use {', '.join(TARGETS)}, HF names like q_proj, "
                                 f"or attn, mlp, all)")
            if c not in out:
                out.append(c)
    if not out:
        raise UsageError(f"{flag} is empty")
    return out


def _matrices(cfg) -> dict:
    """target -> (in, out) of its weight, for one layer"""
    D, F, q, kv = cfg.d_model, cfg.d_ff, cfg.q_dim, cfg.kv_dim
    m = {"o": (q, D), "up": (D, F), "down": (F, D)}
    if cfg.gated:
        m["gate"] = (D, F)
    if cfg.fused_qkv:
        m["qkv"] = (D, q + 2 * kv)
    else:
        m.update({"q": (D, q), "k": (D, kv), "v": (D, kv)})
    return m


def lora_params(cfg, rank, targets, model_total) -> dict:
    if rank <= 0:
        raise UsageError(f"--lora-rank must be a positive integer, got {rank}")
    mats = _matrices(cfg)
    wanted = set(targets)
    if cfg.fused_qkv and wanted & {"q", "k", "v"}:
        wanted = (wanted - {"q", "k", "v"}) | {"qkv"}
    per_layer = {t: rank * (mats[t][0] + mats[t][1]) for t in TARGETS if t in wanted and t in mats}
    skipped = sorted(t for t in wanted if t not in mats)               # e.g. gate on a dense MLP
    total = cfg.n_layer * sum(per_layer.values())
    mlp = cfg.n_layer * sum(v for t, v in per_layer.items() if t in _MLP)
    return {"rank": rank, "targets": list(per_layer), "skipped": skipped,
            "per_layer": per_layer, "total": total, "attention": total - mlp, "mlp": mlp,
            "percent_of_model": 100.0 * total / model_total}
