"""Memory: KV cache, MLP activations, and the activation working set of a forward.

KV cache: every layer stores a key and a value vector of kv_dim = n_kv_head*head_dim per
position, so bytes = 2 * n_layer * batch * context * kv_dim * bytes(kv dtype). With a sliding
window (Gemma), llama.cpp's SWA cache keeps only `window` positions in the sliding layers;
that figure is given next to the full one.

MLP activations of one layer: the gate and the up projection each produce B*T*d_ff numbers
(a dense FFN has only up); stated in the chosen dtype, e.g. Llama 3 8B, B=1, T=2048, fp16:
2048*14336*2 bytes = 58.7 MB each.

Activation working set ("peak activation of one layer's forward"): what an eager, unfused
forward holds at its worst moment inside one block when it keeps every intermediate the
backward needs, as ffnlab (model/block.py) and PyTorch autograd do. It is the sum of
  kept:       the arrays the block keeps for its backward, listed in layer_kept() below;
  transient:  what lives only for a moment: the attention's score buffers (raw q.k and the
              scaled scores, next to the kept probabilities, which the softmax exponentiates
              in place), the activation function's scratch
              array on [B, T, d_ff], and the block's residual-stream locals (layer_peak_bytes).
A training forward keeps every layer's `kept` set at once (model_forward_bytes, train=True).
Sizes are in the compute dtype; fp32 for ffnlab.
"""

_ACT_TEMPS = {"gelu": 0, "gelu_tanh": 1, "relu": 0, "swiglu": 1, "geglu": 1}   # [B,T,d_ff] scratch arrays


def kv_cache_bytes(cfg, batch, context, kv_bytes_per_elem) -> dict:
    """-> {"full": bytes with every layer holding `context` positions, "swa": with sliding layers
    holding min(context, window) (equal to full when the model has no sliding window)}"""
    per_pos = 2 * cfg.kv_dim * kv_bytes_per_elem * batch              # k and v
    full = cfg.n_layer * context * per_pos
    n_slide = sum(cfg.is_sliding(il) for il in range(cfg.n_layer))
    swa = (cfg.n_layer - n_slide) * context * per_pos + n_slide * min(context, cfg.sliding_window or context) * per_pos
    return {"full": int(full), "swa": int(swa)}


def ffn_rows(cfg):
    """(width, gated) of the FFN intermediates per token: d_ff; for a mixture of experts, the k
    chosen experts' d_ff each plus a shared expert's (ffn_moe_gate is [T, k, d_ff])."""
    if cfg.moe:
        return cfg.n_expert_used * cfg.d_ff + cfg.d_ff_shexp, True
    return cfg.d_ff, cfg.gated


def mlp_activation_bytes(cfg, batch, seq_len, bytes_per_elem) -> dict:
    """The FFN's widest intermediates in one layer: gate and up outputs, B*T*d_ff elements each
    (B*T*k*d_ff for k experts per token)."""
    F, gated = ffn_rows(cfg)
    each = int(batch * seq_len * F * bytes_per_elem)
    return {"gate": each if gated else 0, "up": each, "together": each * (2 if gated else 1),
            "elements_each": batch * seq_len * F}


def layer_kept(cfg, B, T, S) -> dict:
    """Elements one block keeps for its backward -> {what: elements}. T queries, S keys."""
    D, q, kv = cfg.d_model, cfg.q_dim, cfg.kv_dim
    F, gated = ffn_rows(cfg)
    BT = B * T
    kept = {
        "attn_norm (x_hat, output)": 2 * BT * D,
        "q, k, v projections": BT * (q + 2 * kv),
        "attention probabilities [B,H,T,S]": B * cfg.n_head * T * S,
        "attention output (merged heads)": BT * q,
        "ffn_norm (x_hat, output)": 2 * BT * D,
        "ffn gate, up, act, act*up" if gated else "ffn up, act": (4 if gated else 2) * BT * F,
    }
    if cfg.moe:                                       # router logits and probabilities, each expert's output
        kept["ffn router probs, expert outputs"] = BT * cfg.n_expert + BT * cfg.n_expert_used * D
    if cfg.qk_norm:
        kept["q/k norm x_hat"] = BT * (q + kv)
    if cfg.positions == "rope":
        kept["q, k after RoPE"] = BT * (q + kv)
    if cfg.post_attn_norm:
        kept["post-attention norm x_hat"] = BT * D
    if cfg.post_ffn_norm:
        kept["post-FFN norm x_hat"] = BT * D
    return kept


def layer_peak_bytes(cfg, B, T, S, bytes_per_elem) -> dict:
    """-> {"kept", "transient", "peak"} in bytes for one block's forward (its input not included).

    The peak is the largest of three moments, in the order the block runs:
      softmax:     what is kept up to the scores, plus raw q.k and the probabilities ([B,H,T,S]
                   each; in float32 one compiled pass scales, masks and normalises each row,
                   ops/train_kernels.py; other widths take NumPy's steps, which add the scaled
                   scores as a third) and the grouped copy of q;
      activation:  everything before the MLP's product, the MLP inputs (gate and up, or up), the
                   activation's scratch array (tanh-GELU: x^2, SiLU: exp(-|x|); none for ReLU and
                   erf-GELU) and its output, and the block's locals (attention output, x + attn);
      block end:   the whole kept set plus the locals and the FFN output and the block output."""
    D, q = cfg.d_model, cfg.q_dim
    F, gated = ffn_rows(cfg)
    BT = B * T
    k = layer_kept(cfg, B, T, S)
    kept = sum(k.values())
    probs = k["attention probabilities [B,H,T,S]"]
    before_scores = _kept_before_mlp(cfg, B, T, S) - probs - k["attention output (merged heads)"]
    softmax = before_scores + (2 if bytes_per_elem == 4 else 3) * probs + BT * q
    act_product = BT * F if gated else 0                               # act*up is made after the scratch is freed
    activation = kept - act_product + _ACT_TEMPS["swiglu" if cfg.moe else cfg.ffn] * BT * F + 2 * BT * D
    end = kept + 4 * BT * D
    peak = max(softmax, activation, end)
    return {"kept": int(kept * bytes_per_elem), "transient": int((peak - kept) * bytes_per_elem),
            "peak": int(peak * bytes_per_elem)}


def _kept_before_mlp(cfg, B, T, S):
    k = layer_kept(cfg, B, T, S)
    return sum(v for name, v in k.items() if not name.startswith(("ffn", "post-FFN")))


def model_forward_bytes(cfg, B, T, bytes_per_elem, train=True) -> dict:
    """Activation bytes of a whole forward over B x T tokens (no KV cache, S = T).

    train=True: every block's kept set stays alive for the backward, so the peak is
    n_layer * kept + the last block's transient + the embeddings and the logits [B,T,V]."""
    S = T
    layer = layer_peak_bytes(cfg, B, T, S, bytes_per_elem)
    BTD = int(B * T * cfg.d_model * bytes_per_elem)
    logits = int(B * T * cfg.vocab_size * bytes_per_elem)
    masks = T * S * (2 if cfg.sliding_window else 1)                  # boolean masks, one byte each
    held = (cfg.n_layer if train else 1) * layer["kept"]
    blocks_peak = held - layer["kept"] + layer["peak"] + BTD            # + the block's input
    head_peak = held + 3 * BTD + logits                                 # final norm x_hat, output, logits
    return {"kept_all_layers": held, "logits": logits, "peak": max(blocks_peak, head_peak) + masks}
