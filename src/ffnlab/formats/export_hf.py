"""Export a model (checkpoint, GGUF, HF directory) to a Hugging Face directory that transformers'
AutoModelForCausalLM loads: config.json + model.safetensors + tokenizer.json/tokenizer_config.json.

The transformers class is chosen by the config's flags:
  GPT2LMHeadModel   LayerNorm, learned positions, fused qkv, biases; dense MLP with
                    activation_function gelu_new (= gelu_tanh), gelu (erf) or relu
  Llama, Mistral, Qwen2, Qwen3, Phi-3: RMSNorm, RoPE, gated MLP (formats/export_hf_llama.py)
  Gemma 2, GPT-NeoX, OLMo 2 (formats/hf_families.py); the mixtures of experts (formats/hf_moe.py)
Other mixes (e.g. the ablation's RMSNorm + RoPE + ReLU) have no transformers class and are
refused with the reason.

Layouts: GPT-2's Conv1D stores weights [in, out], the transpose of ffnlab's [out, in].
Llama's q/k rows are in rotate_half order (pairs half a head apart, ffnlab's "neox"); a
checkpoint trained with the "normal" (adjacent pairs) pairing gets the inverse of
convert_hf_to_gguf.py's permutation.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import UsageError
from .export_hf_llama import CLASS as LLAMA_CLASS
from .export_hf_llama import llama_config, llama_family, llama_tensors, normal_to_neox_rows
from .export_targets import config_mismatches
from .hf_families import HF_CLASS, family_hf_config, family_hf_mismatches, family_hf_tensors
from .hf_moe import MOE_TYPES, hf_moe_config, hf_moe_tensors, hf_moe_type

HF_GPT2_ACT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}


def hf_family(cfg) -> str:
    """'gpt2' | 'llama' -- the transformers class that runs this config exactly -- or UsageError.
    A mixture of experts: 'mixtral' | 'qwen2_moe' | 'qwen3_moe' | 'olmoe' (formats/hf_moe.py)."""
    if cfg.moe:
        return hf_moe_type(cfg)
    if cfg.arch in HF_CLASS:                         # gemma2, gptneox, olmo2: formats/hf_families.py
        why = family_hf_mismatches(cfg)
        if why:
            raise UsageError(f"cannot export to HF ({HF_CLASS[cfg.arch]}): " + "; ".join(why))
        return cfg.arch
    if cfg.positions == "rope":                      # llama, mistral, qwen2, qwen3, phi3: export_hf_llama.py
        return llama_family(cfg)
    why = []
    if cfg.ffn not in HF_GPT2_ACT:
        why.append(f"ffn={cfg.ffn!r}: GPT-2's MLP is dense ({', '.join(HF_GPT2_ACT)}); a gated MLP needs RoPE (Llama)")
    want = dict(norm="layernorm", ffn_bias=True, attn_bias=True, attn_out_bias=True, tie_embeddings=True)
    if cfg.n_kv_head != cfg.n_head:
        why.append("grouped-query attention (GPT-2 needs n_kv_head == n_head)")
    why += config_mismatches(cfg, want)
    if cfg.q_dim != cfg.d_model:
        why.append(f"n_head*head_dim={cfg.q_dim} != d_model={cfg.d_model}")
    if why:
        raise UsageError("cannot export to HF (GPT2LMHeadModel): " + "; ".join(why))
    return "gpt2"


def hf_config(cfg, family, tok) -> dict:
    common = {"vocab_size": cfg.vocab_size, "bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id,
              "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32"}
    if family == "gpt2":
        return {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": cfg.d_model,
                "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_inner": cfg.d_ff, "n_positions": cfg.n_ctx,
                "n_ctx": cfg.n_ctx, "activation_function": HF_GPT2_ACT[cfg.ffn], "layer_norm_epsilon": cfg.norm_eps,
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "scale_attn_weights": True, **common}
    if family in MOE_TYPES:
        return hf_moe_config(cfg, family, common)
    if family in HF_CLASS:
        return family_hf_config(cfg, common)
    return llama_config(cfg, family, common)


def hf_tensors(cfg, params, family) -> dict:
    """GGUF-named [out, in] arrays -> HF-named arrays in HF layout."""
    if family in HF_CLASS:
        return family_hf_tensors(cfg, params)
    if family in LLAMA_CLASS:
        return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in llama_tensors(cfg, params, family).items()}
    out = {}
    if family == "gpt2":
        out["transformer.wte.weight"] = params["token_embd.weight"]
        out["transformer.wpe.weight"] = params["position_embd.weight"]
        out["transformer.ln_f.weight"] = params["output_norm.weight"]
        out["transformer.ln_f.bias"] = params["output_norm.bias"]
        blocks = {"attn_norm": "ln_1", "attn_output": "attn.c_proj", "ffn_norm": "ln_2", "ffn_up": "mlp.c_fc",
                  "ffn_down": "mlp.c_proj", "attn_qkv": "attn.c_attn"}
        for il in range(cfg.n_layer):
            p = {n.removeprefix(f"blk.{il}."): a for n, a in params.items() if n.startswith(f"blk.{il}.")}
            if not cfg.fused_qkv:                               # GPT-2 keeps q, k, v as one matrix
                p["attn_qkv.weight"] = np.concatenate([p.pop(f"attn_{x}.weight") for x in "qkv"])
                p["attn_qkv.bias"] = np.concatenate([p.pop(f"attn_{x}.bias") for x in "qkv"])
            for name, a in p.items():
                base, kind = name.rsplit(".", 1)
                hf = f"transformer.h.{il}.{blocks[base]}.{kind}"
                # Conv1D weights are [in, out]; norm weights and biases are vectors
                out[hf] = a.T if (kind == "weight" and a.ndim == 2) else a
        return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}
    out["model.embed_tokens.weight"] = params["token_embd.weight"]
    out["model.norm.weight"] = params["output_norm.weight"]
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["output.weight"]
    names = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    if family in MOE_TYPES:                                 # the experts and router come from hf_moe.py
        names = {k: v for k, v in names.items() if not k.startswith("ffn_") or k == "ffn_norm"}
    for il in range(cfg.n_layer):
        if family in MOE_TYPES:
            out.update(hf_moe_tensors(cfg, params, family, il))
            for which in ("q", "k", "v", "output"):
                b = params.get(f"blk.{il}.attn_{which}.bias")
                if b is not None:
                    out[f"model.layers.{il}.self_attn.{which if which != 'output' else 'o'}_proj.bias"] = b
        for short, hf in names.items():
            a = params[f"blk.{il}.{short}.weight"]
            if cfg.rope_pairing == "normal" and short in ("attn_q", "attn_k"):
                a = normal_to_neox_rows(a, cfg.n_head if short == "attn_q" else cfg.n_kv_head)
            out[f"model.layers.{il}.{hf}.weight"] = a
    return {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in out.items()}


def tokenizer_config(tok, n_ctx) -> dict:
    def text(i):
        return tok.tk.id_to_token(i) if i is not None else None
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": n_ctx,
           "bos_token": text(tok.bos_id), "eos_token": text(tok.eos_id), "add_bos_token": bool(tok.add_bos),
           "clean_up_tokenization_spaces": False}
    if tok.chat_template:
        cfg["chat_template"] = tok.chat_template
    return cfg


def export_hf(cfg, params, tok, out_dir):
    """Write an HF model directory (created if needed) for cfg + params + tokenizer."""
    from .hf_tokenizer import tokenizer_json
    from safetensors.numpy import save_file

    family = hf_family(cfg)
    params = {n: a.dequantize() if hasattr(a, "dequantize") else a for n, a in params.items()}   # a GGUF source
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{out_dir}: cannot create the output directory ({e.strerror})") from None
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(hf_config(cfg, family, tok), f, indent=2)
    weights = os.path.join(out_dir, "model.safetensors")
    save_file(hf_tensors(cfg, params, family), weights, metadata={"format": "pt"})
    # safetensors creates the file 0600; give it the mode the other files get (0666 less the umask)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(weights, 0o666 & ~umask)
    tokenizer_json(tok).save(os.path.join(out_dir, "tokenizer.json"))     # its post_processor adds BOS/EOS
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, cfg.n_ctx), f, indent=2)
    return out_dir
