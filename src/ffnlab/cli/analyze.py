"""`ffnlab analyze MODEL`: parameters, FLOPs, memory, alignment, SwiGLU width and LoRA, from metadata only."""
COMMAND = "analyze"
HELP = "size a model without loading weights: params, FLOPs/token, memory, TP alignment, LoRA"

DEFAULT_QUANTS = "F16,Q8_0,Q6_K,Q5_K_M,Q4_K_M,Q4_0"


def add_arguments(p):
    from .common import add_model_flag, refuse_together
    add_model_flag(p, "a .gguf file, an HF model directory or config.json, an installed model (smollm2, gemma3), "
                      "or a preset name (alias like llama3-8b or HF repo id like meta-llama/Meta-Llama-3-8B); "
                      "default: the default model (smollm2)", presets=True)
    p.add_argument("--preset", metavar="NAME", default=None,
                   help="a preset model: an alias (llama3-8b, gpt2) or HF repo id that `ffnlab compare --list` shows")
    refuse_together(p, "MODEL", "--preset", "give one model")
    p.add_argument("--seq-len", type=int, default=2048, help="context length T (tokens) for FLOPs, KV cache and "
                   "activations (default 2048)")
    p.add_argument("--batch", type=int, default=1, help="batch size B (default 1)")
    p.add_argument("--dtype", default="f16", help="activation dtype: f32, f16, bf16 (default f16)")
    p.add_argument("--kv-dtype", default="f16", help="KV cache dtype: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 "
                   "(default f16)")
    p.add_argument("--quant", default=DEFAULT_QUANTS, help="comma list of llama-quantize file types (Q4_K_M, Q8_0, ...) "
                   f"or ggml types (Q4_K: every matrix that type) to size the weights for (default {DEFAULT_QUANTS})")
    p.add_argument("--tp", default="1,2,4,8", help="comma list of tensor-parallel degrees to check (default 1,2,4,8)")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA rank r (default 16)")
    p.add_argument("--lora-targets", default="all", help="comma list of LoRA target matrices: q,k,v,o,gate,up,down "
                   "or HF names (q_proj, ...); 'all' = every linear layer (default)")
    p.add_argument("--multiple-of", type=int, default=256, help="Llama's multiple_of for the SwiGLU width "
                   "(default 256)")
    p.add_argument("--ffn-dim-multiplier", type=float, default=None, help="Llama's ffn_dim_multiplier "
                   "(Llama 3: 1.3); default none")
    p.add_argument("--json", action="store_true", help="print the report as JSON (keys in docs/sizing.md)")


def parse_int_list(text, flag):
    from ..errors import UsageError

    try:
        vals = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"{flag} must be a comma list of integers, got {text!r}") from None
    if not vals or any(v <= 0 for v in vals):
        raise UsageError(f"{flag} values must be positive integers, got {text!r}")
    return vals


def check_options(args):
    """-> dict of analyze() keyword arguments; nonsense values raise UsageError (one line)."""
    from ..analysis.lora import parse_targets
    from ..analysis.quant import check_quant
    from ..analysis.report import DTYPES, KV_DTYPES
    from ..errors import UsageError

    for flag, v in (("--seq-len", args.seq_len), ("--batch", args.batch), ("--lora-rank", args.lora_rank),
                    ("--multiple-of", args.multiple_of)):
        if v <= 0:
            raise UsageError(f"{flag} must be a positive integer, got {v}")
    if args.ffn_dim_multiplier is not None and args.ffn_dim_multiplier <= 0:
        raise UsageError(f"--ffn-dim-multiplier must be > 0, got {args.ffn_dim_multiplier}")
    if args.dtype.lower() not in DTYPES:
        raise UsageError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if args.kv_dtype.lower() not in KV_DTYPES:
        raise UsageError(f"--kv-dtype must be one of {', '.join(KV_DTYPES)}, got {args.kv_dtype!r}")
    quants = [check_quant(q.strip()) for q in args.quant.split(",") if q.strip()]
    return dict(seq_len=args.seq_len, batch=args.batch, dtype=args.dtype.lower(), kv_dtype=args.kv_dtype.lower(),
                quants=quants, tp=parse_int_list(args.tp, "--tp"), lora_rank=args.lora_rank,
                lora_targets=parse_targets(args.lora_targets), multiple_of=args.multiple_of,
                ffn_dim_multiplier=args.ffn_dim_multiplier)


def run(args):
    import json

    from ..analysis.report import analyze
    from ..analysis.source import load_source

    opts = check_options(args)                  # flags first: a bad flag should not wait for a big file
    r = analyze(load_source(args.preset or args.model), **opts)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(render(r))
    return 0


def _pct(x):
    return f"{100 * x:.1f}%"


def render(r) -> str:
    from ..analysis.text import count, human, nbytes, table, yes_no

    m, s, p, f, mem = r["model"], r["settings"], r["params"], r["flops_per_token"], r["memory"]
    out = [f"{m['name']}  ({m['kind']}{', ' + m['source'] if m['source'] else ''}{', ' + m['path'] if m['path'] else ''})",
           f"  {m['arch']}: d_model {m['d_model']}, d_ff {m['d_ff']} ({m['ratio']:.2f}x), {m['ffn_label']}, "
           f"{m['n_layer']} layers, {m['n_head']} heads / {m['n_kv_head']} KV heads x {m['head_dim']}, "
           f"vocab {m['vocab_size']}, context {m['n_ctx']}", ""]

    # --- parameters
    pl = p["per_layer"]
    rows = [["embedding (token table)", "", count(p["embedding"])]]
    if p["position"]:
        rows.append(["positions (learned table)", "", count(p["position"])])
    for k, label in (("attn_q", "attention q"), ("attn_k", "attention k"), ("attn_v", "attention v"),
                     ("attn_output", "attention o"), ("attn_bias", "attention biases")):
        if pl[k]:
            rows.append([label, f"{pl[k]:,d}", count(pl[k] * m["n_layer"])])
    experts = f" ({m['n_expert']} experts)" if m["n_expert"] else ""
    for k, label in (("ffn_gate", "MLP gate" + experts), ("ffn_up", "MLP up" + experts),
                     ("ffn_down", "MLP down" + experts), ("ffn_bias", "MLP biases"),
                     ("ffn_gate_inp", "MoE router"), ("ffn_shexp", "shared expert + gate")):
        if pl.get(k):
            rows.append([label, f"{pl[k]:,d}", count(pl[k] * m["n_layer"])])
    rows.append(["norms (incl. final)", f"{pl['norm']:,d}", count(p["norm"])])
    rows.append(["LM head", "", "tied to the token table (0)" if p["lm_head_tied"] else count(p["lm_head"])])
    for k, v in p["extra"].items():
        rows.append([f"other: {k}", "", count(v)])
    rows.append(["total", f"{pl['total']:,d}", count(p["total"])])
    if p["active"] != p["total"]:
        rows.append([f"active per token ({m['n_expert_used']} of {m['n_expert']} experts)", "", count(p["active"])])
    out += ["Parameters", table(rows, ["component", "per layer", "total"]),
            f"MLP: {count(p['mlp'])} = {_pct(p['mlp_share'])} of all parameters, "
            f"{_pct(p['mlp_share_non_embedding'])} of the non-embedding {count(p['non_embedding'])}", ""]

    # --- FLOPs
    fl = f["per_layer"]
    rows = [["attention projections q,k,v,o", f"{fl['attn_q'] + fl['attn_k'] + fl['attn_v'] + fl['attn_output']:,d}",
             human(f["attention_projections"])],
            ["attention scores + weighted sum (2*2*S*q_dim)", f"{fl['attn_scores'] + fl['attn_weighted_sum']:,d}",
             human(f["attention_scores"])],
            [f"MLP: {f['mlp_formula']}", f"{f['mlp'] // m['n_layer']:,d}", human(f["mlp"])],
            ["LM head (2*d_model*vocab)", "", human(f["lm_head"])],
            ["forward", "", human(f["forward"])]]
    out += [f"FLOPs per token at context S={f['seq_len']} (matmuls only, 2*in*out each)",
            table(rows, ["component", "per layer", "all layers"]),
            f"MLP share of forward FLOPs: {_pct(f['mlp_share'])}; training ~3x forward = {human(f['training'])} "
            f"FLOPs/token", ""]

    # --- memory
    rows = []
    for q, w in mem["weights"].items():
        types = ", ".join(f"{t} x{n}" for t, n in sorted(w["types"].items(), key=lambda kv: -kv[1]))
        label = f"this file ({w['file_type']})" if q == "file" else q
        rows.append([label, f"{w['bits_per_weight']:.2f}", nbytes(w["bytes"]), f"{w['bytes']:,d}", types])
    ma, la = mem["mlp_activation_bytes"], mem["layer_activation_bytes"]
    over = f" -- beyond the model's context {m['n_ctx']}" if s["seq_len"] > m["n_ctx"] else ""
    out += [f"Memory (MB = 10^6 bytes; batch {s['batch']}, context {s['seq_len']}{over})",
            table(rows, ["weights", "bits/weight", "size", "bytes", "tensor types"], "lrrrl"),
            "ggml bits/weight: " + ", ".join(f"{t} {b:g}" for t, b in r["bits_per_weight"].items()),
            f"KV cache ({s['kv_dtype']}): {nbytes(mem['kv_cache_bytes'])} ({mem['kv_cache_bytes']:,d} bytes)"
            + (f"; with {_swa_cache_name(m)}: {nbytes(mem['kv_cache_swa_bytes'])}"
               if mem["kv_cache_swa_bytes"] != mem["kv_cache_bytes"] else ""),
            f"MLP activations per layer ({ma['dtype']}, {ma['elements_each']:,d} elements each = B*T*d_ff): "
            + (f"gate {nbytes(ma['gate'])} + up {nbytes(ma['up'])} = {nbytes(ma['together'])}" if ma["gate"]
               else f"up {nbytes(ma['up'])}"),
            f"One layer's forward, peak ({la['dtype']}, eager, keeping what backward needs): {nbytes(la['peak'])} "
            f"(kept {nbytes(la['kept'])} + transient {nbytes(la['transient'])})",
            f"Training forward, all layers kept for backward ({la['dtype']}): {nbytes(mem['training_activation_bytes'])}",
            ""]

    # --- alignment and tensor parallelism
    a = r["alignment"]
    rows = [[name, w] + [yes_no(a["divisible"][name][k]) for k in ("64", "128", "256")]
            for name, w in a["widths"].items()]
    out += ["Alignment", table(rows, ["width", "value", "/64", "/128", "/256"])]
    rows = [[n, yes_no(t["heads"]), "replicated" if t["kv_heads_replicated"] else yes_no(t["kv_heads"]),
             yes_no(t["d_ff"]), f"{t['d_ff_per_gpu']:g}", yes_no(t["even"])]
            for n, t in a["tensor_parallel"].items()]
    out += [table(rows, ["TP", "heads split", "KV heads split", "d_ff split", "d_ff/GPU", "all even"]), ""]

    # --- SwiGLU width
    sw = r["swiglu_width"]
    line = (f"SwiGLU equal-parameter width for d_model {sw['d_model']}: 8/3*d_model = {sw['equal_param_width_exact']:.1f}"
            f" -> {sw['equal_param_width']} (multiple_of {sw['multiple_of']})")
    if sw["ffn_dim_multiplier"]:
        line += f"; with ffn_dim_multiplier {sw['ffn_dim_multiplier']:g}: {sw['llama_rule_width']}"
    kind = "gated" if sw["gated"] else "dense (its SwiGLU equivalent would be the width above)"
    out += ["SwiGLU width", line,
            f"this model: d_ff {sw['d_ff']} = {sw['ratio_to_equal_param']:.2f}x the equal-parameter width, "
            f"{sw['ratio_to_d_model']:.2f}x d_model, {kind}", ""]

    # --- LoRA
    lo = r["lora"]
    per = ", ".join(f"{t} {v:,d}" for t, v in lo["per_layer"].items())
    out += [f"LoRA (rank {lo['rank']}, r*(in+out) per matrix): targets {', '.join(lo['targets'])}"
            + (f" (not in this model: {', '.join(lo['skipped'])})" if lo["skipped"] else ""),
            f"  per layer: {per}",
            f"  total {count(lo['total'])} = {lo['percent_of_model']:.3f}% of the model; "
            f"attention {count(lo['attention'])}, MLP {count(lo['mlp'])}"]
    return "\n".join(out)


def _swa_cache_name(m) -> str:
    """Who keeps only the window on sliding layers: llama.cpp's interleaved cache for Gemma-style
    patterns; when every layer slides (Mistral, Phi-3) transformers does, but llama.cpp's llama and
    phi3 graphs keep every position (they ignore the window)."""
    if m.get("sliding_window_pattern"):
        return "llama.cpp's sliding-window cache"
    return "transformers' sliding-window cache (llama.cpp's llama/phi3 graphs keep every position)"
