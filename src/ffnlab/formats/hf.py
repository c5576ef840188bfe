"""Load a Hugging Face model directory: config.json + *.safetensors (+ tokenizer.json).

HF tensor names are mapped to GGUF names so the rest of ffnlab sees one vocabulary:
  GPT-2:  wte/wpe, h.L.ln_1, attn.c_attn (fused qkv), attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj, ln_f
          Conv1D stores weights [in, out]: they are transposed to [out, in].
  Llama, Mistral, Qwen2: model.embed_tokens, model.layers.L.{input_layernorm, self_attn.{q,k,v,o}_proj,
          post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head
HF keeps Q/K rows in rotate_half order (llama.cpp's converter permutes them for GGUF), so an HF
Llama runs with the neox pairing here.
"""
import glob
import json
import os
import re
import time

import numpy as np

from ..errors import ModelFileError
from ..model import Model
from ..model.params import param_shapes
from .hf_config import config_from_hf, flat_rope_parameters, load_hf_config
from .tokenizer import Tokenizer

_GPT2 = {
    "wte.weight": "token_embd.weight", "wpe.weight": "position_embd.weight",
    "ln_f.weight": "output_norm.weight", "ln_f.bias": "output_norm.bias",
}
_GPT2_BLOCK = {
    "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
    "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down",
}
_LLAMA = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
          "lm_head.weight": "output.weight"}
_LLAMA_BLOCK = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name, arch):
    """HF tensor name -> GGUF tensor name, or None for tensors ffnlab does not use."""
    if arch == "gpt2":
        n = hf_name.removeprefix("transformer.")
        if n in _GPT2:
            return _GPT2[n]
        m = re.fullmatch(r"h\.(\d+)\.(.+)\.(weight|bias)", n)
        if m and m.group(2) in _GPT2_BLOCK:
            return f"blk.{m.group(1)}.{_GPT2_BLOCK[m.group(2)]}.{m.group(3)}"
        return None                                  # attn.bias / attn.masked_bias mask buffers, lm_head (tied)
    if hf_name in _LLAMA:
        return _LLAMA[hf_name]
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", hf_name)
    if m and m.group(2) in _LLAMA_BLOCK:
        return f"blk.{m.group(1)}.{_LLAMA_BLOCK[m.group(2)]}.{m.group(3)}"
    return None


def load_hf(path, dtype=np.float32, progress=None) -> Model:
    from safetensors.numpy import load_file

    t0 = time.perf_counter()
    d, cfg_path = load_hf_config(path)
    d = flat_rope_parameters(d)
    cfg = config_from_hf(d, cfg_path)
    scaling = (d.get("rope_scaling") or {}).get("rope_type", (d.get("rope_scaling") or {}).get("type", "default"))
    if scaling not in ("default", "linear"):
        raise ModelFileError(f"{cfg_path}: rope scaling type {scaling!r} is not supported (ffnlab runs "
                             f"'default' and 'linear' RoPE; anything else would give wrong logits)")
    if cfg.arch not in ("gpt2", "llama", "qwen2"):
        raise ModelFileError(f"{cfg_path}: model_type {d.get('model_type')!r} cannot be loaded from an HF "
                             f"directory (supported: gpt2, llama, mistral, qwen2; use a GGUF for others)")
    if cfg.arch != "gpt2":
        cfg.rope_pairing = "neox"                   # HF q/k rows are in rotate_half order
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelFileError(f"{path}: no *.safetensors weights (ffnlab never unpickles *.bin files)")
    expected = param_shapes(cfg)
    params = {}
    for f in files:
        try:
            tensors = load_file(f)
        except Exception as e:                      # safetensors raises its own error types
            raise ModelFileError(f"{f}: unreadable safetensors file ({e})") from None
        for hf_name, a in tensors.items():
            name = gguf_name(hf_name, cfg.arch)
            if name is None:
                continue
            a = a.astype(dtype)
            if cfg.arch == "gpt2" and a.ndim == 2 and name != "token_embd.weight" and name != "position_embd.weight":
                a = a.T                             # Conv1D [in, out] -> [out, in]
            if name in expected and a.shape != expected[name]:
                raise ModelFileError(f"{f}: tensor {hf_name} has shape {list(a.shape)}, config.json implies "
                                     f"{list(expected[name])}")
            params[name] = np.ascontiguousarray(a)
    if cfg.tie_embeddings:
        params.pop("output.weight", None)
    elif "output.weight" not in params:
        cfg.tie_embeddings = True                   # some checkpoints omit lm_head when it equals the table
    missing = [n for n in param_shapes(cfg) if n not in params]
    if missing:
        raise ModelFileError(f"{path}: missing weight for {missing[0]} ({len(missing)} missing)")
    m = Model(cfg, params, _hf_tokenizer(path, d), source=path, pack_weights=True)
    m.load_seconds = time.perf_counter() - t0
    return m


def _hf_tokenizer(path, config):
    f = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(f):
        return None
    from tokenizers import Tokenizer as HFTokenizer
    tk = HFTokenizer.from_file(f)
    tk.post_processor = None                        # BOS is added by Tokenizer.encode, as llama.cpp does
    tc = {}
    tcf = os.path.join(path, "tokenizer_config.json")
    if os.path.isfile(tcf):
        with open(tcf, encoding="utf-8") as fh:
            tc = json.load(fh)

    def tok_id(key):
        v = tc.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        return tk.token_to_id(v) if isinstance(v, str) else None

    bos = tok_id("bos_token") if tok_id("bos_token") is not None else config.get("bos_token_id")
    eos = tok_id("eos_token") if tok_id("eos_token") is not None else config.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0]
    add_bos = bool(tc.get("add_bos_token", config.get("model_type") in ("llama", "mistral")))
    return Tokenizer(tk, bos_id=bos, eos_id=eos, add_bos=add_bos, chat_template=tc.get("chat_template"))
