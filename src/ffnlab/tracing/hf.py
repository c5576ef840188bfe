"""HF transformers as a reference: load the same GGUF, run it, capture its intermediates under
ffnlab's (llama.cpp's) node names.

transformers reads GGUF files itself (AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)),
dequantizing to float32, so both sides run the same weights in fp32. Intermediates come from
forward hooks on the modules (q_proj output = Qcur MUL_MAT, mlp.down_proj input = ffn_swiglu,
...) and, for what happens inside attention (q/k after RoPE, scores, probabilities, the
attention-weighted values), from an attention function registered with transformers'
AttentionInterface that does eager attention and records each step.

Layouts. Every array is returned in the numpy layout of ffnlab's node with the batch axis
dropped: [T, D] for the residual stream, [T, H, hd] for Qcur/Kcur/Vcur, [H, T, S] for kq and
kq_soft_max, [H, T, hd] for kqv. llama-arch GGUF files store the Q and K rows of each head
permuted (convert_hf_to_gguf.py's permute(), so that ggml's adjacent-pair RoPE equals HF's
rotate_half); transformers undoes that when it loads. The Qcur/Kcur nodes (MUL_MAT, RESHAPE,
ROPE) of such files are therefore put back into GGUF row order with the same permute before
comparing: a relabelling of the head-dim axis, no arithmetic. Every later node (kq, kq_soft_max,
kqv, ...) does not depend on the order and is compared as is.

Nodes HF has no module boundary for (the unscaled norm-L, Gemma's bare norm) are not captured.
"""
import contextlib
import io
import os

import numpy as np

from ..errors import UsageError
from ..families import FAMILIES, family, hf_family

CAPTURE = "ffnlab_capture"          # the name our attention function is registered under


def gguf_to_hf_permuted(gguf_arch, source):
    """True when the file's Q/K rows are in GGUF's permuted order relative to HF's: llama.cpp's
    converter permutes them for its llama architecture, and transformers undoes it on load."""
    return family(gguf_arch).gguf_qk_permuted and str(source).endswith(".gguf")


def permute_heads(x):
    """[..., hd] in HF's rotate_half order -> GGUF's order: GGUF index 2j+s = HF index s*hd/2 + j."""
    hd = x.shape[-1]
    return x.reshape(*x.shape[:-1], 2, hd // 2).swapaxes(-1, -2).reshape(x.shape)


def _register_capture(torch, records):
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        """Eager attention, recording each step. query [B, H, T, hd], key/value [B, Hkv, S, hd]."""
        cap = getattr(module.config, "attn_logit_softcapping", None)     # Gemma 2
        groups = query.shape[1] // key.shape[1]
        k = key.repeat_interleave(groups, dim=1)            # query head h reads KV head h // groups
        v = value.repeat_interleave(groups, dim=1)
        raw = query @ k.transpose(2, 3)                       # [B, H, T, S] unscaled q.k
        w = raw * scaling
        rec = {}
        if cap:                                               # c * tanh(scores / c), llama.cpp's three nodes
            rec = dict(scaled_1=w / cap, tanh=torch.tanh(w / cap))
            w = rec["scaled_2"] = rec["tanh"] * cap
        if attention_mask is not None:
            w = w + attention_mask[:, :, :, : k.shape[-2]]
        probs = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
        out = probs @ v                                      # [B, H, T, hd]
        records[module.layer_idx] = dict(q=query, k=key, raw=raw, scaling=scaling, probs=probs, out=out, **rec)
        return out.transpose(1, 2).contiguous(), probs

    AttentionInterface.register(CAPTURE, attention)
    AttentionMaskInterface.register(CAPTURE, eager_mask)


def load_hf(path, **config):
    """The GGUF file as a transformers model in float32. config: HF config fields its GGUF
    reader does not take from the file (GPT-2's n_positions)."""
    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM
    except ImportError as e:
        raise UsageError(f"--against hf needs transformers and torch: {e}") from None
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    path = os.fspath(path)
    if os.path.isdir(path):                                  # an HF directory (config.json + safetensors)
        where = dict(pretrained_model_name_or_path=path)
    elif path.endswith(".gguf"):
        where = dict(pretrained_model_name_or_path=os.path.dirname(os.path.abspath(path)),
                     gguf_file=os.path.basename(path))
    else:
        raise UsageError(f"{path}: --against hf loads a GGUF file or an HF directory")
    try:
        # its GGUF loader draws a tqdm bar that ignores disable_progress_bar(): keep stderr clean
        with contextlib.redirect_stderr(io.StringIO()):
            return AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32, **config)
    except (ValueError, KeyError, OSError, RuntimeError) as e:      # RuntimeError: its size-mismatch report
        raise UsageError(f"{path}: transformers cannot load this GGUF: {e}") from None


def _llama_hooks(model, gemma, permuted, on, hook_in, hook_out, out):
    """Llama, Mistral, Qwen2/3, Gemma 2/3 and OLMo 2: separate q/k/v projections, a gated MLP. OLMo 2
    has no input_layernorm and norms q/k whole ([T, q_dim]); Gemma 2 has no q/k norms; Qwen3 norms
    each head before HF's transpose. The post-FFN norm of Gemma 2 and OLMo 2 has no layer suffix
    (ffn_post_norm, as llama.cpp names it) and is not captured: one key per name here. Phi-3: one
    qkv_proj (llama.cpp's wqkv and its Q/K/V views) and one gate_up_proj (llama.cpp's ffn_up)."""
    inner = model.model
    olmo2 = model.config.model_type == "olmo2"
    bare_post_ffn = hf_family(model.config.model_type).graph.bare_ffn_post_norm   # families/<arch>.py
    for il, layer in enumerate(inner.layers):
        sa, mlp = layer.self_attn, layer.mlp
        hd = sa.head_dim
        if not olmo2:
            on(layer.input_layernorm, hook_out(f"attn_norm-{il}", "MUL"))
        if hasattr(sa, "qkv_proj"):                                      # Phi-3
            H, Hkv = model.config.num_attention_heads, model.config.num_key_value_heads

            def split(a, il=il, H=H, Hkv=Hkv, hd=hd):                    # [T, (H + 2 Hkv) hd] -> views
                parts = np.split(a, [H * hd, (H + Hkv) * hd], axis=-1)
                for part, node in zip(parts, ("Qcur", "Kcur", "Vcur")):
                    out[(f"{node}-{il}", "VIEW")] = part.reshape(part.shape[0], -1, hd)
                return a
            on(sa.qkv_proj, hook_out(f"wqkv-{il}", "MUL_MAT", split))
        for proj, node in ((getattr(sa, "q_proj", None), "Qcur"), (getattr(sa, "k_proj", None), "Kcur"),
                           (getattr(sa, "v_proj", None), "Vcur")):
            if proj is None:
                continue
            perm = permuted and node != "Vcur"

            def fix(a, perm=perm, node=node, il=il):
                heads = a.reshape(a.shape[0], -1, hd)                    # [T, h*hd] -> [T, h, hd]
                heads = permute_heads(heads) if perm else heads
                out[(f"{node}-{il}", "RESHAPE")] = heads
                return heads.reshape(a.shape)
            # with a bias (qwen2) the projection's output is llama.cpp's ADD node, else its MUL_MAT
            on(proj, hook_out(f"{node}-{il}", "ADD" if proj.bias is not None else "MUL_MAT", fix))
        if olmo2 or model.config.model_type == "qwen3":    # [T, q_dim] (OLMo 2) or [T, heads, hd] (Qwen3)
            on(sa.q_norm, hook_out(f"Qcur_normed-{il}", "MUL"))
            on(sa.k_norm, hook_out(f"Kcur_normed-{il}", "MUL"))
        elif getattr(sa, "q_norm", None) is not None:
            # the norms run on [B, heads, T, hd] (after HF's transpose(1, 2)) -> [T, heads, hd]
            on(sa.q_norm, hook_out(f"Qcur_normed-{il}", "MUL", lambda a: a.transpose(1, 0, 2)))
            on(sa.k_norm, hook_out(f"Kcur_normed-{il}", "MUL", lambda a: a.transpose(1, 0, 2)))
        on(sa.o_proj, hook_in(f"kqv_out-{il}", "CONT"))
        on(sa.o_proj, hook_out(f"attn_out-{il}", "ADD" if sa.o_proj.bias is not None else "MUL_MAT"))
        if gemma:
            on(layer.post_attention_layernorm, hook_out(f"attn_post_norm-{il}", "MUL"))
            on(layer.pre_feedforward_layernorm, hook_in(f"sa_out-{il}", "ADD"))
            on(layer.pre_feedforward_layernorm, hook_out(f"ffn_norm-{il}", "MUL"))
            if not bare_post_ffn:
                on(layer.post_feedforward_layernorm, hook_out(f"ffn_post_norm-{il}", "MUL"))
        elif olmo2:
            on(layer.post_attention_layernorm, hook_out(f"attn_post_norm-{il}", "MUL"))
            on(mlp, hook_in(f"ffn_inp-{il}", "ADD"))
        else:
            on(layer.post_attention_layernorm, hook_in(f"ffn_inp-{il}", "ADD"))
            on(layer.post_attention_layernorm, hook_out(f"ffn_norm-{il}", "MUL"))
        if hasattr(mlp, "gate_up_proj"):                                 # Phi-3: one [T, 2 d_ff] node
            on(mlp.gate_up_proj, hook_out(f"ffn_up-{il}", "MUL_MAT"))
        else:
            on(mlp.gate_proj, hook_out(f"ffn_gate-{il}", "MUL_MAT"))
            on(mlp.up_proj, hook_out(f"ffn_up-{il}", "MUL_MAT"))
        act = ("ffn_geglu", "GEGLU") if gemma else ("ffn_swiglu", "SWIGLU")
        on(mlp.down_proj, hook_in(f"{act[0]}-{il}", act[1]))
        on(mlp.down_proj, hook_out(f"ffn_out-{il}", "MUL_MAT"))
        on(layer, hook_out(f"l_out-{il}", "ADD"))
    if getattr(model.config, "embedding_multiplier", None):         # Granite: embd is the scaled rows
        on(inner.embed_tokens, hook_out("embd_rows", "GET_ROWS"))
    else:
        on(inner.embed_tokens, hook_out("inp_scaled" if gemma else "embd", "SCALE" if gemma else "GET_ROWS"))
    on(inner.norm, hook_out("result_norm", "MUL"))
    if getattr(model.config, "final_logit_softcapping", None) or getattr(model.config, "logits_scaling", None):
        # Gemma 2's capped logits, Granite's logits / logits_scaling: a SCALE
        on(model, lambda _mod, _inp, output: out.__setitem__(("result_output", "SCALE"),
                                                             output.logits[0].detach().float().numpy()))
    else:
        on(model.lm_head, hook_out("result_output", "MUL_MAT"))


def _gpt2_hooks(model, on, hook_in, hook_out, out):
    """GPT-2: one fused c_attn (llama.cpp's wqkv_b, then views Q, K, V), LayerNorms with bias
    (the ADD after norm and norm_w), c_fc -> GELU -> c_proj."""
    inner = model.transformer
    on(inner.wte, hook_out("embd", "GET_ROWS"))
    on(inner.wpe, hook_out("pos_embd", "GET_ROWS"))
    for il, layer in enumerate(inner.h):
        sa, mlp = layer.attn, layer.mlp
        H, hd = sa.num_heads, sa.head_dim
        if il == 0:
            on(layer, hook_in("inpL", "ADD"))

        def split(a, il=il, H=H, hd=hd):                               # [T, 3*D] -> views [T, H, hd]
            for part, node in zip(np.split(a, 3, axis=-1), ("Qcur", "Kcur", "Vcur")):
                out[(f"{node}-{il}", "VIEW")] = part.reshape(part.shape[0], H, hd)
            return a
        on(layer.ln_1, hook_out(f"attn_norm-{il}", "ADD"))
        on(sa.c_attn, hook_out(f"wqkv_b-{il}", "ADD", split))
        on(sa.c_proj, hook_in(f"kqv_out-{il}", "CONT"))
        on(sa.c_proj, hook_out(f"attn_out-{il}", "ADD"))
        on(layer.ln_2, hook_in(f"ffn_inp-{il}", "ADD"))
        on(layer.ln_2, hook_out(f"ffn_norm-{il}", "ADD"))
        on(mlp.c_fc, hook_out(f"ffn_up_b-{il}", "ADD"))
        on(mlp.c_proj, hook_in(f"ffn_gelu-{il}", "GELU"))
        on(mlp.c_proj, hook_out(f"ffn_out-{il}", "ADD"))
        on(layer, hook_out(f"l_out-{il}", "ADD"))
    on(inner.ln_f, hook_out("result_norm", "ADD"))
    on(model.lm_head, hook_out("result_output", "MUL_MAT"))


def _gemma2_gguf_fields(model, path):
    """transformers' GGUF reader leaves Gemma 2's soft-caps, window and query_pre_attn_scalar at
    their defaults: set them as llama.cpp reads the file (formats/gguf_meta.py's rules)."""
    from ..formats.gguf_meta import config_from_gguf, open_gguf
    cfg = config_from_gguf(open_gguf(path), path)
    c = model.config
    c.attn_logit_softcapping, c.final_logit_softcapping = cfg.attn_softcap, cfg.final_logit_softcap
    c.sliding_window = cfg.sliding_window
    for layer in model.model.layers:
        layer.self_attn.scaling = cfg.scale
        layer.self_attn.attn_logit_softcapping = cfg.attn_softcap
        if layer.self_attn.sliding_window:
            layer.self_attn.sliding_window = cfg.sliding_window


def _neox_hooks(model, on, hook_in, hook_out, out):
    """GPT-NeoX: LayerNorms with bias, one query_key_value whose rows are per head [H, 3, hd]
    (reordered to llama.cpp's [q; k; v] for wqkv_b and its Q/K/V views), a dense GELU MLP with
    biases, and (use_parallel_residual) the MLP reading the block input."""
    inner = model.gpt_neox
    on(inner.embed_in, hook_out("embd", "GET_ROWS"))
    for il, layer in enumerate(inner.layers):
        sa, mlp = layer.attention, layer.mlp
        H = model.config.num_attention_heads

        def split(a, il=il, H=H):                                       # [T, H*3*hd] -> [T, 3*H*hd]
            T, hd = a.shape[0], a.shape[1] // (3 * H)
            per = a.reshape(T, H, 3, hd)
            for j, node in enumerate(("Qcur", "Kcur", "Vcur")):
                out[(f"{node}-{il}", "VIEW")] = per[:, :, j]
            return per.transpose(0, 2, 1, 3).reshape(a.shape)
        on(layer.input_layernorm, hook_out(f"attn_norm-{il}", "ADD"))
        on(sa.query_key_value, hook_out(f"wqkv_b-{il}", "ADD", split))
        on(sa.dense, hook_in(f"kqv_out-{il}", "CONT"))
        on(sa.dense, hook_out(f"attn_out-{il}", "ADD"))
        if not layer.use_parallel_residual:
            on(layer.post_attention_layernorm, hook_in(f"ffn_inp-{il}", "ADD"))
        on(layer.post_attention_layernorm, hook_out(f"ffn_norm-{il}", "ADD"))
        on(mlp.dense_h_to_4h, hook_out(f"ffn_up_b-{il}", "ADD"))
        on(mlp.dense_4h_to_h, hook_in(f"ffn_gelu-{il}", "GELU_ERF" if model.config.hidden_act == "gelu" else "GELU"))
        on(mlp.dense_4h_to_h, hook_out(f"ffn_out-{il}", "ADD"))
        on(layer, hook_out(f"l_out-{il}", "ADD"))
    on(inner.final_layer_norm, hook_out("result_norm", "ADD"))
    on(model.get_output_embeddings(), hook_out("result_output", "MUL_MAT"))


def capture(path, ids, hf_model=None, gguf_arch=None, n_ctx=None, permuted=None):
    """Run the HF model on token ids -> {(node name, op): numpy array in ffnlab's node layout}.
    gguf_arch: the file's general.architecture (default: HF's model type, the same for llama).
    n_ctx: the file's context length; transformers' GGUF reader leaves GPT-2's n_positions at
    1024 whatever the file says, so a smaller position table would not load without it.
    permuted: whether HF's Q/K rows are in rotate_half order relative to ffnlab's (default: a
    llama-arch GGUF, see gguf_to_hf_permuted); path may also be an HF directory."""
    import torch

    if hf_model is None:
        hf_model = load_hf(path, **({"n_positions": n_ctx} if gguf_arch == "gpt2" and n_ctx else {}))
    model = hf_model
    mtype = model.config.model_type
    fam = hf_family(mtype)                                   # families/<arch>.py: hf_hooks
    if fam is None or not fam.hf_hooks:
        known = [t for f in FAMILIES.values() if f.hf_hooks for t in f.hf_types]
        raise UsageError(f"verify --against hf: no node map for HF model type {mtype!r} (supported: "
                         f"{', '.join(known)})")
    gemma = mtype.startswith("gemma")
    if mtype == "gemma2" and str(path).endswith(".gguf"):
        _gemma2_gguf_fields(model, path)
    permuted = gguf_to_hf_permuted(gguf_arch or mtype, path) if permuted is None else permuted
    out, attn, hooks = {}, {}, []

    def arr(t):
        a = t.detach().to(torch.float32).numpy()
        return a[0] if a.ndim >= 2 and a.shape[0] == 1 else a    # drop the batch of 1

    def hook_out(name, op, transform=None):
        def f(_mod, _inp, output):
            a = arr(output[0] if isinstance(output, tuple) else output)
            out[(name, op)] = transform(a) if transform else a
        return f

    def hook_in(name, op):
        def f(_mod, inputs, _output):
            out[(name, op)] = arr(inputs[0])
        return f

    def on(mod, fn):
        hooks.append(mod.register_forward_hook(fn))

    if fam.hf_hooks == "gpt2":
        _gpt2_hooks(model, on, hook_in, hook_out, out)
    elif fam.hf_hooks == "neox":
        _neox_hooks(model, on, hook_in, hook_out, out)
    else:
        _llama_hooks(model, gemma, permuted, on, hook_in, hook_out, out)

    _register_capture(torch, attn)
    previous = model.config._attn_implementation
    model.set_attn_implementation(CAPTURE)
    try:
        with torch.no_grad():
            model(torch.tensor([list(map(int, ids))]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
        model.set_attn_implementation(previous)

    if gemma:
        out[("embd", "GET_ROWS")] = model.model.embed_tokens.weight.detach()[list(map(int, ids))].numpy()
    for il, r in attn.items():
        q = arr(r["q"]).transpose(1, 0, 2)               # [H, T, hd] -> [T, H, hd]
        k = arr(r["k"]).transpose(1, 0, 2)               # [Hkv, S, hd] -> [S, Hkv, hd]
        if permuted:
            q, k = permute_heads(q), permute_heads(k)
        raw = arr(r["raw"])                               # [H, T, S]
        if "tanh" in r:                                   # Gemma 2's soft-capped scores
            for node, key in (("kq_scaled_1", "SCALE"), ("kq_tanh", "TANH"), ("kq_scaled_2", "SCALE")):
                out[(f"{node}-{il}", key)] = arr(r[node.removeprefix("kq_")])
        if fam.graph.q_scaled:
            # llama.cpp's Gemma and Phi-3 graphs scale q after RoPE (ffnlab: Qcur_scaled; Phi-3 names it
            # Qcur again), so their kq is scaled
            out[(f"Qcur-{il}", "ROPE")] = q
            out[f"{fam.graph.q_scaled}-{il}", "SCALE"] = q * np.float32(r["scaling"])
            raw = raw * np.float32(r["scaling"])
        elif mtype != "gpt2":                             # GPT-2 has no RoPE: its Q/K are the views
            out[(f"Qcur-{il}", "ROPE")] = q
        if mtype != "gpt2":
            out[(f"Kcur-{il}", "ROPE")] = k
        out[(f"kq-{il}", "MUL_MAT")] = raw
        out[(f"kq_soft_max-{il}", "SOFT_MAX")] = arr(r["probs"])
        out[(f"kqv-{il}", "MUL_MAT")] = arr(r["out"])
    return out
