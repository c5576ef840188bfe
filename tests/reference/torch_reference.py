"""An independent PyTorch implementation of the ffnlab model, for tests.

Written from the math and PyTorch's own ops (F.linear, F.layer_norm, F.rms_norm, F.gelu,
torch.softmax, torch.view_as_complex, ...), never by calling ffnlab code. It reads the same
ModelConfig fields and the same dict of GGUF-named parameters ([out, in], nn.Linear layout),
so a test can feed both implementations one parameter dict and compare logits and gradients.
Norm weights are taken as stored in GGUF files: Gemma's RMSNorm scale (1 + w in HF) is the stored
weight itself, as llama.cpp's converter folds the 1 in.

  params_to_torch(params, dtype)        numpy dict -> torch dict (leaf tensors that require grad)
  forward(tp, cfg, ids)                 ids [B, T] -> logits [B, T, vocab]
  block_forward(x, tp, cfg, il, pos)    one pre-norm block, x [B, T, d_model]
  loss_and_grads(params, cfg, ids, targets, dtype)  -> loss, {name: numpy grad}
The per-op functions (gelu_tanh, rope_neox, rope_normal, causal_attention, ffn, ...) are
public too: the kernel tests use them as their references.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F


# --- ops ------------------------------------------------------------------------------------
def gelu(x):
    return F.gelu(x)                                  # exact: x * Phi(x)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


ACT = {"gelu": gelu, "gelu_tanh": gelu_tanh, "relu": F.relu, "silu": F.silu}

# FFN kind -> (activation, gated?)
FFN_KIND = {"gelu": ("gelu", False), "gelu_tanh": ("gelu_tanh", False), "relu": ("relu", False),
            "swiglu": ("silu", True), "geglu": ("gelu_tanh", True)}


def layernorm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rmsnorm(x, w, eps):
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def norm(x, tp, cfg, name):
    """The block's norm kind with tensors `name`.weight (and .bias for LayerNorm)."""
    if cfg.norm == "layernorm":
        return layernorm(x, tp[name + ".weight"], tp.get(name + ".bias"), cfg.norm_eps)
    return rmsnorm(x, tp[name + ".weight"], cfg.norm_eps)


def rope_inv_freq(head_dim, theta, dtype=torch.float64):
    """[head_dim/2]: theta^(-2i/head_dim)"""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)).to(dtype)


def llama3_inv_freq(inv_freq, factor, low_freq_factor, high_freq_factor, old_context_len):
    """Meta's apply_scaling (llama-models, Llama 3.1), frequency by frequency."""
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    new = []
    for freq in inv_freq.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            new.append(freq)
        elif wavelen > low_freq_wavelen:
            new.append(freq / factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            new.append((1 - smooth) * freq / factor + smooth * freq)
    return torch.tensor(new, dtype=torch.float64)


def rope_angles(pos, head_dim, theta, scale=1.0, llama3=()):
    """pos [T] -> angles [T, head_dim/2] in float64; llama3: (factor, low, high, original context)"""
    t = torch.as_tensor(np.asarray(pos), dtype=torch.float64) / scale
    inv = rope_inv_freq(head_dim, theta)
    if llama3:
        inv = llama3_inv_freq(inv, *llama3)
    return torch.outer(t, inv)


def rotate_half(x):
    """HF transformers' rotate_half: (x1, x2) -> (-x2, x1) on the two halves of the head."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def rope_neox(x, angles):
    """x [B, T, H, hd], angles [T, hd/2] -- HF apply_rotary_pos_emb (cos/sin repeated over both halves)."""
    emb = torch.cat((angles, angles), dim=-1)                     # [T, hd]
    cos = emb.cos().to(x.dtype)[:, None, :]                       # [T, 1, hd]
    sin = emb.sin().to(x.dtype)[:, None, :]
    return x * cos + rotate_half(x) * sin


def rope_normal(x, angles):
    """x [B, T, H, hd], angles [T, hd/2] -- Meta Llama's complex form: adjacent pairs (x0, x1) as x0 + i x1."""
    xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())   # [B, T, H, hd/2] complex
    rot = torch.polar(torch.ones_like(angles), angles)                        # e^{i angle}, [T, hd/2]
    rot = rot.to(xc.dtype)[:, None, :]                                        # [T, 1, hd/2]
    return torch.view_as_real(xc * rot).reshape(x.shape)


def allowed_mask(q_pos, k_pos, window=0):
    """bool [T, S]: key s visible to query t (causal, optionally within a sliding window)"""
    q = torch.as_tensor(np.asarray(q_pos))[:, None]
    k = torch.as_tensor(np.asarray(k_pos))[None, :]
    ok = k <= q
    if window:
        ok = ok & (q - k < window)
    return ok


def causal_attention(q, k, v, scale, allowed, softcap=0.0):
    """q [B, T, H, hd], k/v [B, S, Hkv, hd], allowed [T, S] -> out [B, H, T, hd]

    Plain attention; grouped-query heads by repeat_interleave, so query head h reads KV head
    h // (H / Hkv). softcap c (Gemma 2): scores -> c * tanh(scores / c) before the mask."""
    H, Hkv = q.shape[2], k.shape[2]
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)         # [B, heads, T|S, hd]
    k = k.repeat_interleave(H // Hkv, dim=1)                                 # [B, H, S, hd]
    v = v.repeat_interleave(H // Hkv, dim=1)
    scores = (q @ k.transpose(-1, -2)) * scale                               # [B, H, T, S]
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v                                 # [B, H, T, hd]


def ffn(x, tp, cfg, il):
    """The MLP of block il: dense down(act(up x)) or gated down(act(gate x) * up x), biases optional."""
    b = f"blk.{il}."
    if cfg.ffn == "moe":
        return moe(x, tp, cfg, il)
    act_name, gated = FFN_KIND[cfg.ffn]
    act = ACT[act_name]
    up = F.linear(x, tp[b + "ffn_up.weight"], tp.get(b + "ffn_up.bias"))               # [B, T, d_ff]
    if gated:
        gate = F.linear(x, tp[b + "ffn_gate.weight"], tp.get(b + "ffn_gate.bias"))
        h = act(gate) * up
    else:
        h = act(up)
    return F.linear(h, tp[b + "ffn_down.weight"], tp.get(b + "ffn_down.bias"))         # [B, T, d_model]


def moe(x, tp, cfg, il):
    """A mixture of SwiGLU experts, computed densely: every expert on every token, then each
    token's output is sum_e mask_e * w_e * expert_e(x) with mask_e = 1 for its top-k experts.
    The top-k choice (torch.topk) has no gradient; the weights flow back through the softmax."""
    b = f"blk.{il}."
    probs = torch.softmax(F.linear(x, tp[b + "ffn_gate_inp.weight"]), dim=-1)             # [B, T, E]
    top_p, top_i = torch.topk(probs, cfg.n_expert_used, dim=-1)                          # [B, T, K]
    if cfg.expert_norm:
        top_p = top_p / top_p.sum(dim=-1, keepdim=True)
    w = torch.zeros_like(probs).scatter(-1, top_i, top_p)                                # [B, T, E] zero off top-k
    gate = torch.einsum("btd,efd->btef", x, tp[b + "ffn_gate_exps.weight"])             # [B, T, E, d_ff]
    up = torch.einsum("btd,efd->btef", x, tp[b + "ffn_up_exps.weight"])
    out = torch.einsum("btef,edf->bted", F.silu(gate) * up, tp[b + "ffn_down_exps.weight"])   # [B, T, E, D]
    y = (out * w[..., None]).sum(dim=2)
    if cfg.d_ff_shexp:
        s = torch.sigmoid(x @ tp[b + "ffn_gate_inp_shexp.weight"])[..., None]             # [B, T, 1]
        sh = F.linear(F.silu(F.linear(x, tp[b + "ffn_gate_shexp.weight"])) * F.linear(x, tp[b + "ffn_up_shexp.weight"]),
                      tp[b + "ffn_down_shexp.weight"])
        y = y + s * sh
    return y


def attention(x, tp, cfg, il, pos, allowed):
    """The attention sub-layer of block il: x [B, T, d_model] (normed) -> [B, T, d_model]"""
    b = f"blk.{il}."
    B, T, _ = x.shape
    H, Hkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    if cfg.fused_qkv:
        qkv = F.linear(x, tp[b + "attn_qkv.weight"], tp.get(b + "attn_qkv.bias"))
        q, k, v = qkv.split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
    else:
        q = F.linear(x, tp[b + "attn_q.weight"], tp.get(b + "attn_q.bias"))
        k = F.linear(x, tp[b + "attn_k.weight"], tp.get(b + "attn_k.bias"))
        v = F.linear(x, tp[b + "attn_v.weight"], tp.get(b + "attn_v.bias"))
    if cfg.qk_norm_full:                                  # OLMoE: norm the whole projection, then split heads
        q = rmsnorm(q, tp[b + "attn_q_norm.weight"], cfg.norm_eps)
        k = rmsnorm(k, tp[b + "attn_k_norm.weight"], cfg.norm_eps)
    q = q.reshape(B, T, H, hd)
    k = k.reshape(B, T, Hkv, hd)
    v = v.reshape(B, T, Hkv, hd)
    if cfg.qk_norm and not cfg.qk_norm_full:
        q = rmsnorm(q, tp[b + "attn_q_norm.weight"], cfg.norm_eps)
        k = rmsnorm(k, tp[b + "attn_k_norm.weight"], cfg.norm_eps)
    if cfg.positions == "rope":
        sliding = _is_sliding(cfg, il)
        theta = cfg.rope_theta_local if (sliding and cfg.rope_theta_local) else cfg.rope_theta
        r = cfg.rope_dim or hd                            # partial rotary: the first r dims rotate
        # Gemma 3's local RoPE (rope_theta_local) is unscaled; one scaled RoPE otherwise
        angles = rope_angles(pos, r, theta, 1.0 if (sliding and cfg.rope_theta_local) else cfg.rope_scale,
                             cfg.rope_llama3)
        rope = rope_neox if cfg.rope_pairing == "neox" else rope_normal
        q = torch.cat([rope(q[..., :r], angles), q[..., r:]], dim=-1)
        k = torch.cat([rope(k[..., :r], angles), k[..., r:]], dim=-1)
    scale = cfg.attn_scale if cfg.attn_scale else 1.0 / math.sqrt(hd)
    out = causal_attention(q, k, v, scale, allowed, cfg.attn_softcap)       # [B, H, T, hd]
    out = out.transpose(1, 2).reshape(B, T, H * hd)
    return F.linear(out, tp[b + "attn_output.weight"], tp.get(b + "attn_output.bias"))


def _is_sliding(cfg, il):
    # Gemma 2/3: all layers slide except every sliding_window_pattern-th (the last of each group);
    # pattern 0 (Mistral, Phi-3): every layer slides
    n = cfg.sliding_window_pattern
    return bool(cfg.sliding_window and il >= cfg.sliding_window_start and (n == 0 or (il % n) != n - 1))


def block_forward(x, tp, cfg, il, pos, allowed=None):
    """x [B, T, d_model] -> [B, T, d_model]; allowed defaults to the layer's causal (window) mask.

    Pre norms unless cfg.pre_norm is false (OLMo 2); post norms when set (Gemma, OLMo 2);
    parallel_residual (GPT-NeoX): x + attn(attn_norm(x)) + ffn(ffn_norm(x))."""
    b = f"blk.{il}."
    if allowed is None:
        allowed = allowed_mask(pos, pos, cfg.sliding_window if _is_sliding(cfg, il) else 0)
    pre = (lambda t, name: norm(t, tp, cfg, b + name)) if cfg.pre_norm else (lambda t, name: t)
    a = attention(pre(x, "attn_norm"), tp, cfg, il, pos, allowed)
    if cfg.post_attn_norm:
        a = norm(a, tp, cfg, b + "post_attention_norm")
    if cfg.parallel_residual:
        return x + a + ffn(pre(x, "ffn_norm"), tp, cfg, il)
    h = x + a
    f = ffn(pre(h, "ffn_norm"), tp, cfg, il)
    if cfg.post_ffn_norm:
        f = norm(f, tp, cfg, b + "post_ffw_norm")
    return h + f


def forward(tp, cfg, ids):
    """ids [B, T] -> logits [B, T, vocab]"""
    ids = torch.as_tensor(np.atleast_2d(np.asarray(ids)))
    T = ids.shape[1]
    pos = np.arange(T)
    wte = tp["token_embd.weight"]
    x = wte[ids]                                                             # [B, T, d_model]
    if cfg.embed_scale:
        x = x * torch.tensor(math.sqrt(cfg.d_model), dtype=x.dtype)
    if cfg.positions == "learned":
        x = x + tp["position_embd.weight"][:T]
    for il in range(cfg.n_layer):
        x = block_forward(x, tp, cfg, il, pos)
    x = norm(x, tp, cfg, "output_norm")
    logits = F.linear(x, wte if cfg.tie_embeddings else tp["output.weight"])
    if cfg.final_logit_softcap:
        c = cfg.final_logit_softcap
        logits = c * torch.tanh(logits / c)
    return logits


# --- numpy <-> torch --------------------------------------------------------------------------
def params_to_torch(params, dtype=torch.float64, requires_grad=True):
    """{name: numpy array} -> {name: torch leaf tensor}"""
    return {k: torch.tensor(np.asarray(v), dtype=dtype, requires_grad=requires_grad) for k, v in params.items()}


def loss_and_grads(params, cfg, ids, targets, dtype=torch.float64):
    """Mean cross-entropy of forward(ids) against targets [B, T] -> (loss float, {name: numpy grad})"""
    tp = params_to_torch(params, dtype)
    logits = forward(tp, cfg, ids)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.as_tensor(np.asarray(targets)).reshape(-1))
    loss.backward()
    return loss.item(), {k: (v.grad if v.grad is not None else torch.zeros_like(v)).numpy() for k, v in tp.items()}


# --- comparing ffnlab with the reference ------------------------------------------------------
def to_numpy(t):
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def rel_err(got, want):
    """max |got - want| / max |want|: the error relative to the tensor's scale, so entries near
    zero are neither ignored nor held to an impossible relative standard."""
    got, want = np.asarray(to_numpy(got), dtype=np.float64), np.asarray(to_numpy(want), dtype=np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))


def assert_close(got, want, tol, what="tensor"):
    """The one comparison every reference test uses: same shape, all finite, rel_err <= tol."""
    got, want = to_numpy(got), to_numpy(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape}, reference {want.shape}"
    assert np.isfinite(got).all(), f"{what}: {np.size(got) - np.isfinite(got).sum()} non-finite values"
    err = rel_err(got, want)
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.0e}"
    return err
