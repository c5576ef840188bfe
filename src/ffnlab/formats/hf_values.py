"""Values of an HF config.json that several families read alike: the dense activation's name and the
RoPE scaling block (hf_config.py and hf_families.py both use them)."""
from ..config import MAX_DIM, ConfigError
from .jsonfile import field

GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_tanh")


def dense_act(act, path, key):
    if act in GELU_TANH:
        return "gelu_tanh"
    if act == "gelu":
        return "gelu"
    if act == "relu":
        return "relu"
    raise ConfigError(f"{path}: field '{key}' = {act!r} is not an activation ffnlab knows (gelu, gelu_new, relu)")


def rope_scaling(rs, path) -> dict:
    """rope_scaling / rope_parameters -> ModelConfig fields. default, linear (positions / factor) and
    llama3 (per-frequency divisors, ops/rope.py) run; every other type is refused: running it as
    plain RoPE would be silently wrong."""
    kind = rs.get("rope_type", rs.get("type", "default"))
    where = f"{path}: rope_parameters"
    if kind in ("default", None):
        return {}
    if kind == "linear":
        return {"rope_scale": field(rs, "factor", float, where, lo=1e-30, hi=1e30)}
    if kind == "llama3":
        return {"rope_llama3": (field(rs, "factor", float, where, lo=1e-30, hi=1e30),
                                field(rs, "low_freq_factor", float, where, lo=1e-30, hi=1e30),
                                field(rs, "high_freq_factor", float, where, lo=1e-30, hi=1e30),
                                float(field(rs, "original_max_position_embeddings", int, where, lo=1, hi=MAX_DIM)))}
    raise ConfigError(f"{path}: field 'rope_parameters' has rope_type {kind!r}: not implemented (ffnlab runs "
                      f"'default', 'linear' and 'llama3' RoPE; anything else would give wrong logits)")
