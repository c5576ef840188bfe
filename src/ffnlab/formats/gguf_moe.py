"""Mixture-of-experts GGUF files: llama.cpp's metadata keys, stacked expert tensors, and its rules.

  {arch}.expert_count -> n_expert              {arch}.expert_used_count -> n_expert_used (top-k)
  {arch}.expert_feed_forward_length -> d_ff    (qwen2moe, qwen3moe; llama and olmoe: feed_forward_length)
  {arch}.expert_shared_feed_forward_length -> d_ff_shexp (qwen2moe)
Tensors (ggml shapes, fastest axis first): ffn_gate_inp {d_model, E}; ffn_gate_exps / ffn_up_exps
{d_model, d_ff, E}; ffn_down_exps {d_ff, d_model, E}; Qwen2-MoE's shared expert ffn_gate_inp_shexp
{d_model}, ffn_{gate,up}_shexp {d_model, d_ff_shexp}, ffn_down_shexp {d_ff_shexp, d_model}.

No key says whether the k chosen probabilities are renormalised: each graph hard-codes it in
its build_moe_ffn call (src/models/*.cpp), and so does EXPERT_NORM here. A llama file with
ffn_gate_inp tensors is a Mixtral. RoPE: llama rotates adjacent pairs; the three others NEOX.
"""
from ..errors import ModelFileError, UsageError

# GGUF arch -> build_moe_ffn's norm_w in llama.cpp's graph for it
EXPERT_NORM = {"llama": True, "qwen2moe": False, "qwen3moe": True, "olmoe": False}
MOE_ARCHS = tuple(a for a in EXPERT_NORM if a != "llama")     # the archs that only exist as MoE


def moe_fields(key, arch, names, path) -> dict:
    """The ModelConfig fields of a MoE file (key(k, default, kind, lo, hi) reads {arch}.k) -> {} for
    a dense llama file."""
    if arch not in EXPERT_NORM or (arch == "llama" and "blk.0.ffn_gate_inp.weight" not in names):
        return {}
    E = key("expert_count")
    k = key("expert_used_count")
    if k > E:
        raise ModelFileError(f"{path}: {arch}.expert_used_count = {k} exceeds {arch}.expert_count = {E}")
    kw = dict(ffn="moe", n_expert=E, n_expert_used=k, expert_norm=EXPERT_NORM[arch], ffn_bias=False)
    if arch in ("qwen2moe", "qwen3moe"):
        kw["d_ff"] = key("expert_feed_forward_length", 0, lo=0) or None
    if arch == "qwen2moe":
        kw["d_ff_shexp"] = key("expert_shared_feed_forward_length", 0, lo=0)
    if arch == "olmoe":
        kw["qk_norm_full"] = True
    return {f: v for f, v in kw.items() if v is not None}


def check_expert_tensors(cfg, shapes, path):
    """Every layer's stacked expert tensors hold expert_count experts (their slowest ggml axis):
    a file whose metadata and tensors disagree fails here, naming the tensor."""
    for il in range(cfg.n_layer):
        for t in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            name = f"blk.{il}.{t}.weight"
            ne = shapes.get(name)
            if ne is None:
                raise ModelFileError(f"{path}: missing tensor {name} (a MoE layer)")
            if ne[-1] != cfg.n_expert:
                raise ModelFileError(f"{path}: tensor {name} holds {ne[-1]} experts (ggml shape "
                                     f"{{{', '.join(map(str, ne))}}}) but {cfg.arch}.expert_count is {cfg.n_expert}")


def gguf_moe_arch(cfg) -> str:
    """The llama.cpp architecture that runs this MoE config exactly, or UsageError saying why none does."""
    arch = cfg.arch if cfg.arch in MOE_ARCHS else "llama"
    why = []
    if cfg.expert_norm != EXPERT_NORM[arch]:
        why.append(f"expert_norm={cfg.expert_norm} (llama.cpp's {arch} graph "
                   f"{'always renormalises' if EXPERT_NORM[arch] else 'never renormalises'} the top-k weights)")
    if bool(cfg.d_ff_shexp) != (arch == "qwen2moe"):
        why.append(f"d_ff_shexp={cfg.d_ff_shexp} (a shared expert is qwen2moe's, and qwen2moe needs one)")
    if cfg.qk_norm != (arch in ("qwen3moe", "olmoe")) or cfg.qk_norm_full != (arch == "olmoe"):
        why.append(f"qk_norm={cfg.qk_norm}, qk_norm_full={cfg.qk_norm_full} (not {arch}'s q/k norms)")
    if cfg.attn_bias != (arch == "qwen2moe") or cfg.attn_out_bias:
        why.append(f"attn_bias={cfg.attn_bias}, attn_out_bias={cfg.attn_out_bias} "
                   f"({arch} has {'q/k/v biases only' if arch == 'qwen2moe' else 'no attention biases'})")
    for f in ("post_attn_norm", "post_ffn_norm", "embed_scale", "sliding_window", "final_logit_softcap",
              "attn_scale", "fused_qkv"):
        if getattr(cfg, f):
            why.append(f"{f}={getattr(cfg, f)!r} (needs off)")
    if arch != "llama" and cfg.rope_pairing != "neox":
        why.append(f"rope_pairing={cfg.rope_pairing!r} ({arch} rotates NEOX pairs)")
    if cfg.norm != "rmsnorm" or cfg.positions != "rope" or cfg.rope_scale != 1.0:
        why.append("needs RMSNorm and unscaled RoPE")
    if cfg.q_dim != cfg.d_model and arch != "qwen3moe":                 # qwen3moe reads key_length
        why.append(f"n_head*head_dim={cfg.q_dim} != d_model={cfg.d_model}")
    if arch == "olmoe" and cfg.n_kv_head != cfg.n_head:
        why.append("grouped-query attention (llama.cpp's olmoe reads a d_model-wide attn_k_norm)")
    if why:
        raise UsageError(f"cannot export this mixture of experts to GGUF {arch}: {'; '.join(why)}")
    return arch


def write_moe_keys(w, cfg, arch):
    """The expert keys llama.cpp's loader reads for arch."""
    w.add_expert_count(cfg.n_expert)
    w.add_expert_used_count(cfg.n_expert_used)
    if arch in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(cfg.d_ff)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(cfg.d_ff_shexp)
