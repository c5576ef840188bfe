"""`ffnlab inspect -m MODEL`: architecture, FFN kind and the tensor table, from metadata only."""
COMMAND = "inspect"
HELP = "show a model's architecture, MLP shape and tensor table (reads metadata only, no weights)"


def add_arguments(p):
    from .common import add_model_flag, refuse_together
    add_model_flag(p, "a .gguf file, an HF model directory or config.json, an installed model (smollm2, gemma3), "
                      "or a preset name (alias or HF repo id); default: the default model (smollm2)", presets=True)
    p.add_argument("--preset", metavar="NAME", default=None,
                   help="a preset model: an alias (llama3-8b, gpt2) or HF repo id that `ffnlab compare --list` shows")
    refuse_together(p, "MODEL", "--preset", "give one model")
    p.add_argument("--all-blocks", action="store_true", help="list the tensors of every block (default: block 0 "
                   "and the tensors outside the blocks)")
    p.add_argument("--json", action="store_true", help="print the report as JSON, with block 0's FFN view "
                   "(ffn_view: hidden_size, intermediate_size, ffn_up_weight_shape, ... in ggml order)")


def run(args):
    import json

    from ..analysis.report import inspect_report
    from ..analysis.source import load_source

    r = inspect_report(load_source(args.preset or args.model), all_blocks=args.all_blocks)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(render(r))
    return 0


def _ffn_detection(m) -> str:
    if m["gated"]:
        act = "SiLU" if m["ffn"] == "swiglu" else "tanh GELU"
        return f"{m['ffn_label']}: act(gate(x)) * up(x) -> down; ffn_gate present, {m['arch']} activation {act}"
    return f"{m['ffn_label']}: act(up(x)) -> down; no ffn_gate"


def render(r) -> str:
    from ..analysis.text import count, nbytes, table, yes_no

    m = r["model"]
    where = m["path"] or m["source"]
    biases = [n for n, b in (("q/k/v", m["attn_bias"]), ("attn output", m["attn_out_bias"]), ("FFN", m["ffn_bias"])) if b]
    norm = m["norm"] + ("" if m["pre_norm"] else ", no pre-norms") + (", q/k norm" if m["qk_norm"] else "") \
        + (", post-attention norm" if m["post_attn_norm"] else "") + (", post-FFN norm" if m["post_ffn_norm"] else "")
    every = f"every {m['sliding_window_pattern']}th layer global" if m["sliding_window_pattern"] else "every layer"
    sw = f", sliding window {m['sliding_window']} ({every})" if m["sliding_window"] else ""
    rows = [
        ["model", m["name"] + (f"  [{m['file_type']}]" if m["file_type"] else "")],
        ["from", f"{m['kind']}: {where}"],
        ["architecture", m["arch"]],
        ["d_model (hidden_size)", m["d_model"]],
        ["d_ff (intermediate_size)", f"{m['d_ff']}  (ratio {m['ratio']:.3f})"],
        ["FFN", _ffn_detection(m)],
        ["biases", ", ".join(biases) or "none"],
        ["norm", f"{norm} (eps {m['norm_eps']:g})"],
        ["heads / KV heads / head_dim", f"{m['n_head']} / {m['n_kv_head']} / {m['head_dim']}"],
        ["layers", m["n_layer"]],
        ["vocab", m["vocab_size"]],
        ["context", f"{m['n_ctx']} ({m['positions']} positions"
                    + (f", RoPE base {m['rope_theta']:g}" if m["positions"] == "rope" else "") + sw + ")"],
        ["tied embeddings", yes_no(m["tie_embeddings"])],
    ]
    # rows only families that have them print (GPT-NeoX, Gemma 2)
    if m["positions"] == "rope" and m["rope_dim"] != m["head_dim"]:
        rows.insert(-2, ["rotary dims", f"{m['rope_dim']} of {m['head_dim']} per head (partial RoPE)"])
    if m["parallel_residual"]:
        rows.insert(-1, ["residual", "parallel: x + attn(attn_norm(x)) + ffn(ffn_norm(x))"])
    if m["attn_softcap"] or m["final_logit_softcap"]:
        caps = [f"{what} {c:g}" for what, c in (("attention", m["attn_softcap"]), ("logits", m["final_logit_softcap"])) if c]
        rows.insert(-1, ["soft-caps (c*tanh(x/c))", ", ".join(caps)])
    plain_qk = m["attn_scale"] in (0, m["head_dim"] ** -0.5)      # 1/sqrt(head_dim), set or implied
    scales = [f"{what} {m[k]:g}" for what, k in (("embeddings x", "embedding_multiplier"), ("q.k x", "attn_scale"),
                                               ("residual adds x", "residual_multiplier"),
                                               ("logits /", "logits_scaling"))
              if m[k] and not (k == "attn_scale" and plain_qk)]
    if scales:                                             # Granite; q.k alone: a query_pre_attn_scalar of its own
        rows.insert(-1, ["scalings", ", ".join(scales)])
    if m["no_rope_layer_step"]:                            # SmolLM3
        n = m["no_rope_layer_step"]
        rows.insert(-1, ["layers without RoPE", f"every {n}th (il + 1 divisible by {n}: NoPE)"])
    out = ["\n".join(f"{k:28s} {v}" for k, v in rows), ""]
    if m["kind"] != "gguf":
        out.append("(no file: tensors as convert_hf_to_gguf.py --outtype f16 would write them)")
    trows = [[t["name"], "{" + ", ".join(map(str, t["ggml_shape"])) + "}", "[" + ", ".join(map(str, t["shape"])) + "]",
              t["type"], f"{t['bytes']:,d}", f"{t['bits_per_weight']:.2f}"] for t in r["tensors"]]
    title = "Tensors" + ("" if r["all_blocks"] else " (block 0 and non-block tensors; --all-blocks for all)")
    out += [title, table(trows, ["name", "ggml shape", "logical shape", "type", "bytes", "bits/weight"], "lllrrr"), ""]
    tot = r["totals_by_type"]
    rows = [[t, s["tensors"], f"{s['elements']:,d}", f"{s['bytes']:,d}", nbytes(s["bytes"]),
             f"{8 * s['bytes'] / s['elements']:.2f}"] for t, s in sorted(tot.items(), key=lambda kv: -kv[1]["bytes"])]
    all_b = sum(s["bytes"] for s in tot.values())
    rows.append(["all", sum(s["tensors"] for s in tot.values()), f"{r['params_in_file']:,d}", f"{all_b:,d}",
                 nbytes(all_b), f"{8 * all_b / r['params_in_file']:.2f}"])
    out += ["Totals by tensor type", table(rows, ["type", "tensors", "elements", "bytes", "size", "bits/weight"]), ""]
    label = "in the file" if m["kind"] == "gguf" else "in the tensor list"
    out.append(f"Parameters {label}: {count(r['params_in_file'])}; from the config: {count(r['params_from_config'])}")
    return "\n".join(out)
