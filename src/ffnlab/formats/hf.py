"""Load a Hugging Face model directory: config.json + *.safetensors (+ tokenizer.json).

HF tensor names are mapped to GGUF names so the rest of ffnlab sees one vocabulary:
  GPT-2:  wte/wpe, h.L.ln_1, attn.c_attn (fused qkv), attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f
          Conv1D stores weights [in, out]: they are transposed to [out, in].
  Llama, Mistral, Qwen2, Qwen3: model.embed_tokens, model.layers.L.{input_layernorm,
          self_attn.{q,k,v,o}_proj, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head;
          Qwen3 adds self_attn.{q,k}_norm [head_dim]
  Phi-3:  self_attn.qkv_proj [q_dim + 2*kv_dim, hidden] -> attn_qkv (split by head counts in the model);
          mlp.gate_up_proj [2*d_ff, hidden] -> gate rows first, then up: split into ffn_gate, ffn_up
HF keeps Q/K rows in rotate_half order (llama.cpp's converter permutes them for GGUF), so an HF
Llama runs with the neox pairing here.
"""
import glob
import os
import time

import numpy as np

from ..errors import ModelFileError
from ..families import FAMILIES, family
from ..families.llama import GATE_UP
from ..model import Model
from ..model.params import param_shapes
from .hf_config import config_from_hf, flat_rope_parameters, load_hf_config
from .hf_families import family_tensor
from .hf_moe import expert_entries, read_experts
from .hf_names import gguf_name
from .hf_tokenizer import tokenizer_from_hf
from .safetensors_io import read_tensors, safetensors_index
from .tokenizer import check_vocab

def load_hf(path, dtype=np.float32, progress=None) -> Model:
    t0 = time.perf_counter()
    d, cfg_path = load_hf_config(path)
    d = flat_rope_parameters(d)
    cfg = config_from_hf(d, cfg_path)                 # refuses RoPE scalings and fields it cannot compute
    if family(cfg.arch).hf_tensors is None or not family(cfg.arch).runnable:
        loadable = [t for f in FAMILIES.values() if f.runnable and f.hf_tensors is not None for t in f.hf_types]
        raise ModelFileError(f"{cfg_path}: model_type {d.get('model_type')!r} cannot be loaded from an HF "
                             f"directory (supported: {', '.join(loadable)}; use a GGUF for others)")
    if cfg.positions == "rope":
        cfg.rope_pairing = "neox"                   # HF q/k rows are in rotate_half order
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelFileError(f"{path}: no *.safetensors weights (ffnlab never unpickles *.bin files)")
    tok = tokenizer_from_hf(path, d)                  # checked before any weight is read
    check_vocab(tok, cfg.vocab_size, os.path.join(path, "tokenizer.json"), cfg_path)
    index = safetensors_index(files)
    experts = expert_entries(index, cfg, cfg_path) if cfg.moe else {}   # per-expert tensors, stacked below
    entries = _weight_entries(index, cfg, cfg_path)   # every check before any read
    if cfg.tie_embeddings:
        entries.pop("output.weight", None)
    elif "output.weight" not in entries:
        cfg.tie_embeddings = True                   # some checkpoints omit lm_head when it equals the table
    for il in range(cfg.n_layer):                     # a fused gate_up stands for both halves
        if f"blk.{il}.{GATE_UP}.weight" in entries:
            entries.setdefault(f"blk.{il}.ffn_gate.weight", None)
            entries.setdefault(f"blk.{il}.ffn_up.weight", None)
    missing = [n for n in param_shapes(cfg) if n not in entries and n not in experts]
    if missing:
        raise ModelFileError(f"{path}: missing weight for {missing[0]} ({len(missing)} missing)")
    params = read_experts(experts, dtype)
    shapes = param_shapes(cfg)
    for e, a in read_tensors([e for e in entries.values() if e is not None]):
        name = gguf_name(e.name, cfg.arch)
        a = a.astype(dtype)
        if name.endswith(f".{GATE_UP}.weight"):
            blk = name.removesuffix(f"{GATE_UP}.weight")
            params[blk + "ffn_gate.weight"], params[blk + "ffn_up.weight"] = (
                np.ascontiguousarray(a[:cfg.d_ff]), np.ascontiguousarray(a[cfg.d_ff:]))  # gate rows, then up rows
            continue
        if a.ndim == 2 and _conv1d(cfg, name):
            a = a.T                                 # Conv1D [in, out] -> [out, in]
        a = family_tensor(name, a, cfg)             # Gemma 2's 1 + w norms, GPT-NeoX's per-head qkv
        params[name] = np.ascontiguousarray(a).reshape(shapes.get(name, a.shape))
    m = Model(cfg, params, tok, source=path, pack_weights=True)
    m.load_seconds = time.perf_counter() - t0
    return m


def _conv1d(cfg, name):
    """GPT-2's Conv1D layers store [in, out]; its embedding tables do not."""
    return family(cfg.arch).hf_tensors.conv1d and name not in ("token_embd.weight", "position_embd.weight")


def _weight_entries(index, cfg, cfg_path) -> dict:
    """{GGUF name: TensorEntry} for the tensors ffnlab uses, each checked against the shape config.json
    implies. A tensor of a layer the config does not have (num_hidden_layers smaller than the
    weights) is an error: running without it would silently drop a layer."""
    expected = param_shapes(cfg)
    out = {}
    for hf_name, e in index.items():
        name = gguf_name(hf_name, cfg.arch)
        if name is None:
            continue
        gate_up = name.endswith(f".{GATE_UP}.weight")
        half = name.replace(GATE_UP, "ffn_up")            # a fused gate_up is two ffn_up-shaped halves
        if half not in expected and name != "output.weight":
            raise ModelFileError(f"{e.file}: tensor {hf_name} has no place in the model {cfg_path} describes "
                                 f"({cfg.n_layer} layers, d_ff {cfg.d_ff})")
        shape = tuple(reversed(e.shape)) if len(e.shape) == 2 and _conv1d(cfg, name) else e.shape
        want = expected.get(half, (cfg.vocab_size, cfg.d_model))
        if gate_up:
            want = (2 * want[0],) + tuple(want[1:])
        if tuple(shape) == (1,) + tuple(want):        # Qwen2-MoE's shared_expert_gate [1, d_model] is a vector
            shape = tuple(want)
        if shape != tuple(want):
            raise ModelFileError(f"{e.file}: tensor {hf_name} has shape {list(e.shape)}, config.json implies "
                                 f"{list(want) if not _conv1d(cfg, name) or len(want) != 2 else list(reversed(want))}")
        out[name] = e
    return out
