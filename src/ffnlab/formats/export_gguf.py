"""Export an ffnlab checkpoint to a GGUF file that llama.cpp loads.

Two llama.cpp architectures can hold what ffnlab trains, with exactly their MLP:
  llama  RMSNorm, RoPE, SwiGLU MLP (gate/up/down), no biases         (preset tiny-llama)
  gpt2   LayerNorm, learned positions, fused qkv, biases, GELU-tanh MLP (preset tiny-gpt2)
llama.cpp hard-codes each architecture's activation, so a ReLU, exact-GELU or GeGLU MLP has no
GGUF home here; export those to HF (export_hf.py) instead.

Tensors keep ffnlab's names (they are GGUF names already); numpy [out, in] is ggml {in, out}.
Q/K rows: llama.cpp's LLAMA rope rotates adjacent pairs (x0, x1) -- ffnlab's "normal" pairing --
so a checkpoint trained with that pairing is already in GGUF order. A "neox" checkpoint (pairs
half a head apart, HF's rotate_half) gets the row permutation convert_hf_to_gguf.py applies.
"""
from __future__ import annotations

import json
import os

import numpy as np

from ..errors import UsageError
from ..families import FAMILIES, family
from ..progress import Progress
from .export_targets import config_mismatches
from .gguf_families import FAMILY_ARCHS, family_gguf_params, family_mismatches, write_family_keys
from .gguf_moe import gguf_moe_arch, write_moe_keys
from .gguf_write import copied_field, finish_atomically, writer_class

Q8_0_BLOCK = 32      # q8_0 packs 32 weights per block: only rows that are a multiple of 32 quantize


# llama.cpp architectures a RoPE model is written as (families/<arch>.py gguf_target): the flags each
# one's graph computes, and the features (beyond plain Llama) it reads from the file. A config whose
# arch names one of them is written as that arch; anything else RoPE-based as llama.
GGUF_TARGETS = {a: f.gguf_target for a, f in FAMILIES.items() if f.gguf_target}
PLAIN = "llama"          # the graph a RoPE model of no other target is written as (families/llama.py)


def gguf_arch(cfg) -> str:
    """The llama.cpp architecture that runs this config exactly, or UsageError saying why none does."""
    if cfg.moe:
        return gguf_moe_arch(cfg)                    # llama (Mixtral), qwen2moe, qwen3moe, olmoe
    if cfg.arch in FAMILY_ARCHS:                     # gemma2, gptneox, olmo2: formats/gguf_families.py
        why = family_mismatches(cfg)
        if why:
            raise UsageError(f"cannot export to GGUF {cfg.arch}: {'; '.join(why)}.{hf_hint(cfg)}")
        return cfg.arch
    why = []
    if cfg.positions == "learned":
        want, allow = dict(norm="layernorm", ffn="gelu_tanh", ffn_bias=True, attn_bias=True, attn_out_bias=True), ()
        arch = "gpt2"
    else:
        arch = cfg.arch if cfg.arch in GGUF_TARGETS else PLAIN
        want, allow = GGUF_TARGETS[arch]
    why += config_mismatches(cfg, want, allow)
    if arch == "gpt2" and cfg.n_kv_head != cfg.n_head:
        why.append("grouped-query attention (gpt2 needs n_kv_head == n_head)")
    if arch == "gpt2" and cfg.q_dim != cfg.d_model:
        why.append(f"n_head*head_dim={cfg.q_dim} != d_model={cfg.d_model}")
    if why:
        hint = (f" llama.cpp's {arch} architecture has a {'GELU-tanh' if arch == 'gpt2' else 'SwiGLU'} MLP; "
                f"a {cfg.ffn} MLP cannot be represented in GGUF" if cfg.ffn != want["ffn"] else "")
        raise UsageError(f"cannot export to GGUF {arch}: {'; '.join(why)}.{hint}{hf_hint(cfg)}")
    return arch


def window_warning(cfg, arch) -> str:
    """'' or one line: the file keeps the sliding window, but llama.cpp will not apply it."""
    # llama.cpp's llama and phi3 graphs attend to every position whatever the file's sliding_window says
    # (phi3 warns "Phi SWA is currently disabled"): the key is written for ffnlab and HF's sake
    if cfg.sliding_window and family(arch).llama_cpp_ignores_window:
        return (f"note: llama.cpp's {arch} graph ignores attention.sliding_window={cfg.sliding_window}: it attends to "
                f"all positions, so its logits differ from HF's (and ffnlab's) beyond {cfg.sliding_window} tokens")
    return ""


def hf_hint(cfg) -> str:
    """' -- use --to hf' when an HF export holds this config, else why neither format does."""
    from .export_hf import hf_family
    try:
        hf_family(cfg)
    except UsageError as e:
        return f"; --to hf cannot either ({str(e).split(': ', 1)[-1]})"
    return " -- use --to hf"


def neox_to_normal_rows(w, n_head):
    """Q/K rows of each head from (x_i, x_{i+hd/2}) pairing to adjacent pairs (x_2i, x_2i+1):
    convert_hf_to_gguf.py's permute(). w: [n_head*hd, ...]"""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(cfg, params, arch) -> dict:
    """-> {GGUF name: float32 array [out, in]} in llama.cpp's row order and layout."""
    params = {n: a.dequantize() if hasattr(a, "dequantize") else a for n, a in params.items()}   # a GGUF source
    params = family_gguf_params(cfg, params, arch) if arch in FAMILY_ARCHS else params
    if arch == "gpt2" and not cfg.fused_qkv:           # llama.cpp's gpt2 graph reads one fused attn_qkv
        for il in range(cfg.n_layer):
            for kind in ("weight", "bias"):
                parts = [params.pop(f"blk.{il}.attn_{x}.{kind}") for x in "qkv"]
                params[f"blk.{il}.attn_qkv.{kind}"] = np.concatenate(parts)      # [q_dim + 2*kv_dim, ...]
    if family(arch).graph.fused_gate_up:                # llama.cpp's phi3 reads gate and up as one ffn_up
        for il in range(cfg.n_layer):
            gate, up = params.pop(f"blk.{il}.ffn_gate.weight"), params.pop(f"blk.{il}.ffn_up.weight")
            params[f"blk.{il}.ffn_up.weight"] = np.concatenate([gate, up])       # [2*d_ff, d_model], gate first
    if cfg.rope_freq_factors:                           # Llama 3: what convert_hf_to_gguf.py writes
        params["rope_freqs.weight"] = np.asarray(cfg.rope_freq_factors, dtype=np.float32)   # [n_rot/2]
    out = {}
    for name, a in params.items():
        a = np.asarray(a, dtype=np.float32)
        # llama and the graphs like it rotate adjacent pairs: the converter's permutation (families/*.py
        # gguf_qk_permuted); the MoE archs rotate NEOX pairs themselves
        if family(arch).gguf_qk_permuted and cfg.rope_pairing == "neox":
            if name.endswith("attn_q.weight"):
                a = neox_to_normal_rows(a, cfg.n_head)
            elif name.endswith("attn_k.weight"):
                a = neox_to_normal_rows(a, cfg.n_kv_head)
        out[name] = np.ascontiguousarray(a)
    return out


def quantizable(name, a) -> bool:
    """q8_0 for the matrices (rows a multiple of 32), as llama.cpp's converter does; norms,
    biases and the learned position table stay f32."""
    return a.ndim == 2 and a.shape[-1] % Q8_0_BLOCK == 0 and name != "position_embd.weight"


# --- tokenizer ------------------------------------------------------------------------------
def tokenizer_fields(tok, tok_meta) -> list:
    """-> [(key, value, GGUFValueType, sub_type)] for tokenizer.ggml.*"""
    from gguf import GGUFValueType as T

    src = (tok_meta or {}).get("source", "")
    if (tok_meta or {}).get("kind") == "model" and src.endswith(".gguf") and os.path.isfile(src):
        return _copied_tokenizer_fields(src)
    model = json.loads(tok.tk.to_str())["model"]
    pre_name = _pre_tokenizer_name(json.loads(tok.tk.to_str()).get("pre_tokenizer") or {})
    if model.get("type") != "BPE" or pre_name is None:
        raise UsageError("cannot export this tokenizer to GGUF: only byte-level BPE tokenizers (ffnlab's byte and "
                         "bpe, a GGUF model's own, or an HF one whose split regexes llama.cpp names) are supported; "
                         "--to hf writes any tokenizer")
    vocab = tok.tk.get_vocab(with_added_tokens=True)
    tokens = [None] * len(vocab)
    for t, i in vocab.items():
        tokens[i] = t
    if None in tokens:
        raise UsageError("cannot export the tokenizer: its ids are not contiguous")
    special = {t.content for t in tok.tk.get_added_tokens_decoder().values() if t.special}
    types = [3 if t in special else 1 for t in tokens]          # 3 = CONTROL, 1 = NORMAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    fields = [("tokenizer.ggml.model", "gpt2", T.STRING, None),
              # GPT-2's pre-tokenizer regex (the one tokenizers' ByteLevel uses; with no merges, a
              # byte vocab, the split cannot change the ids), or the name of the HF regexes
              ("tokenizer.ggml.pre", pre_name, T.STRING, None),
              ("tokenizer.ggml.tokens", tokens, T.ARRAY, T.STRING),
              ("tokenizer.ggml.token_type", types, T.ARRAY, T.INT32),
              ("tokenizer.ggml.merges", merges, T.ARRAY, T.STRING),
              ("tokenizer.ggml.add_bos_token", bool(tok.add_bos), T.BOOL, None)]
    # llama.cpp's gpt2 vocab defaults BOS/EOS to id 11; the byte vocab has no special tokens,
    # so there is nothing truer to write there
    for key, val in (("bos_token_id", tok.bos_id), ("eos_token_id", tok.eos_id)):
        if val is not None:
            fields.append((f"tokenizer.ggml.{key}", int(val), T.UINT32, None))
    if tok.chat_template:
        fields.append(("tokenizer.chat_template", tok.chat_template, T.STRING, None))
    return fields


def _pre_tokenizer_name(pre) -> str | None:
    """tokenizer.json's pre_tokenizer -> the tokenizer.ggml.pre name llama.cpp splits text the same
    way for, or None. ByteLevel alone splits with GPT-2's regex; Split regexes followed by a
    ByteLevel that does not split again (what gguf_tokenizer.py builds from a GGUF) are looked up
    in llama.cpp's table (PRE_TOKENIZER_REGEXES)."""
    from .gguf_tokenizer import PRE_TOKENIZER_REGEXES
    if pre.get("type") == "ByteLevel":
        return "gpt-2"                   # as before: ffnlab's byte and bpe tokenizers
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if not steps or steps[-1].get("type") != "ByteLevel" or steps[-1].get("use_regex", True):
        return None
    regexes = []
    for st in steps[:-1]:
        if st.get("type") != "Split" or st.get("behavior") != "Isolated" or st.get("invert"):
            return None
        regexes.append((st.get("pattern") or {}).get("Regex"))
    for name in ("gpt-2", "smollm", "llama-bpe", "qwen2"):
        if PRE_TOKENIZER_REGEXES[name] == regexes:
            return name
    return None


def _copied_tokenizer_fields(src) -> list:
    """A model's own tokenizer: its tokenizer.* keys, copied from the GGUF it came from."""
    from gguf import GGUFReader

    r = GGUFReader(src)
    out = []
    for key, f in r.fields.items():
        if key.startswith("tokenizer."):
            out.append((key, *copied_field(f)))
    return out


# --- writing --------------------------------------------------------------------------------
def export_gguf(cfg, params, tok, tok_meta, out_path, qtype="f32"):
    """Write cfg + params + tokenizer as a GGUF file llama.cpp loads. qtype: f32 | q8_0"""
    import gguf

    if qtype not in ("f32", "q8_0"):
        raise UsageError(f"--type must be f32 or q8_0, got {qtype!r}")
    arch = gguf_arch(cfg)
    file_type = gguf.LlamaFileType.ALL_F32 if qtype == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0
    d = os.path.dirname(os.path.abspath(out_path))
    if not os.path.isdir(d):
        raise UsageError(f"{out_path}: the directory {d} does not exist")
    tmp = out_path + f".tmp-{os.getpid()}"
    w = writer_class()(tmp, arch)
    w.add_name(cfg.name or "ffnlab-trained")
    w.add_file_type(int(file_type))
    w.add_context_length(cfg.n_ctx)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_vocab_size(cfg.vocab_size)
    if arch in FAMILY_ARCHS:
        write_family_keys(w, cfg, arch)
    elif arch == "gpt2":
        w.add_layer_norm_eps(cfg.norm_eps)
    else:
        w.add_head_count_kv(cfg.n_kv_head)
        w.add_layer_norm_rms_eps(cfg.norm_eps)
        w.add_rope_freq_base(cfg.rope_theta)
        w.add_rope_dimension_count(cfg.n_rot)
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
        if cfg.rope_scale != 1.0:
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(cfg.rope_scale)
        if cfg.sliding_window:
            w.add_sliding_window(cfg.sliding_window)
    kinds = {float: gguf.GGUFValueType.FLOAT32, int: gguf.GGUFValueType.UINT32, bool: gguf.GGUFValueType.BOOL}
    for f, (key, _) in family(arch).gguf_keys.items():     # what a family adds (families/<arch>.py)
        w.add_key_value(f"{arch}.{key}", getattr(cfg, f), kinds[type(getattr(cfg, f))])
    if cfg.moe:
        write_moe_keys(w, cfg, arch)
    for key, val, vtype, sub in tokenizer_fields(tok, tok_meta):
        w.add_key_value(key, val, vtype, sub_type=sub)
    tensors = gguf_tensors(cfg, params, arch)
    bar = Progress(len(tensors), "exporting", delay=0.5)      # a large model: minutes of quantizing
    for name, a in tensors.items():
        bar.update(1, name)
        if qtype == "q8_0" and quantizable(name, a):
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)
    bar.close()
    finish_atomically(w, tmp, out_path)
    return out_path
