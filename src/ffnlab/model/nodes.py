"""The node table: what llama.cpp's eval callback prints for each named node of the forward,
its ggml op and its sources, so that the math line only names the node:

    up = hook("ffn_up", linear_forward(x, w.up))          # MUL_MAT  ffn_up.weight, ffn_norm

A hook call passes op or srcs itself only where the node is built another way in some
families or configs (a bias follows, a fused matrix, a cache view whose shape is the call's);
those calls say so where they are. Sources are in tracing/tracer.py's notation, plus
"a|b": the first of these nodes the block has emitted (ffn_up_b where the up bias exists,
else ffn_up). Only observers read the table (a hook with nothing attached never looks).
"""
from ..kinds import FFN_KINDS

# the activation (dense) or GLU (gated) node: whichever of these the block's FFN kind emitted
ACT = "|".join(dict.fromkeys(k.node for k in FFN_KINDS.values() if not k.moe))
ROWS = ("GET_ROWS", ("token_embd.weight", "inp_tokens"))                 # the token embedding's rows
DOWN = ("MUL_MAT", ("ffn_down.weight", ACT))                              # the FFN's down projection
ATTN_RESIDUAL = ("ADD", ("residual_scaled_attn|attn_post_norm|attn_out", "inp"))

NODES = {
    # the embedding (llama.cpp's build_inp_embd)
    "embd": ROWS,
    "embd_rows": ROWS,                                                   # Granite: rows, then embd scales them
    "inp_scaled": ("SCALE", ("embd",)),                                  # Gemma: times sqrt(d_model)
    "pos_embd": ("GET_ROWS", ("position_embd.weight", "inp_pos")),
    "inpL": ("ADD", ("embd", "pos_embd")),
    # attention (build_attn): the projections, GPT-2's fused one, the output projection
    "wqkv": ("MUL_MAT", ("attn_qkv.weight", "attn_norm")),
    "wqkv_b": ("ADD", ("wqkv", "attn_qkv.bias")),
    "Qcur": ("MUL_MAT", ("attn_q.weight", "attn_norm")),
    "Kcur": ("MUL_MAT", ("attn_k.weight", "attn_norm")),
    "Vcur": ("MUL_MAT", ("attn_v.weight", "attn_norm")),
    "Qcur_normed": ("MUL", ("norm", "attn_q_norm.weight")),             # Gemma 3, Qwen3, OLMo 2: head norms
    "Kcur_normed": ("MUL", ("norm", "attn_k_norm.weight")),
    "kq_scaled_1": ("SCALE", ("kq",)),                                   # Gemma 2's soft-cap: kq / c,
    "kq_tanh": ("TANH", ("kq_scaled_1",)),                               # tanh,
    "kq_scaled_2": ("SCALE", ("kq_tanh",)),                              # times c
    "kq_soft_max": ("SOFT_MAX", ("kq_scaled_2|kq", "attn_inp_kq_mask")),
    "attn_out_w": ("MUL_MAT", ("attn_output.weight", "kqv_out")),        # before the output bias
    "attn_out": ("MUL_MAT", ("attn_output.weight", "kqv_out")),
    # the residual stream: the attention's residual add (sa_out in Gemma's graphs), the block's
    # output, and Granite's multiplier on each sub-layer's output before its add
    "residual_scaled_attn": ("SCALE", ("attn_post_norm|attn_out",)),
    "ffn_inp": ATTN_RESIDUAL,
    "sa_out": ATTN_RESIDUAL,
    "residual_scaled_ffn": ("SCALE", ("ffn_post_norm|ffn_out|ffn_moe_out",)),
    "l_out": ("ADD", ("residual_scaled_ffn|ffn_post_norm|ffn_out|ffn_moe_out", "sa_out|ffn_inp")),
    # the FFN (build_ffn)
    "ffn_gate": ("MUL_MAT", ("ffn_gate.weight", "ffn_norm")),
    "ffn_gate_b": ("ADD", ("ffn_gate", "ffn_gate.bias")),
    "ffn_up": ("MUL_MAT", ("ffn_up.weight", "ffn_norm")),
    "ffn_up_b": ("ADD", ("ffn_up", "ffn_up.bias")),
    # the activation or GLU: its op is the FFN kind's (kinds.py: GELU_ERF or GELU for ffn_gelu)
    **{k.node: (None, ("ffn_gate_b|ffn_gate", "ffn_up_b|ffn_up") if k.gated else ("ffn_up_b|ffn_up",))
       for k in FFN_KINDS.values() if not k.moe},
    "ffn_down": DOWN,                                                    # before the down bias
    "ffn_out": DOWN,
    # a mixture of experts (build_moe_ffn)
    "ffn_moe_logits": ("MUL_MAT", ("ffn_gate_inp.weight", "ffn_norm")),
    "ffn_moe_probs": ("SOFT_MAX", ("ffn_moe_logits",)),
    "ffn_moe_argsort": ("ARGSORT", ("ffn_moe_probs",)),
    "ffn_moe_topk": ("VIEW", ("ffn_moe_argsort",)),
    "ffn_moe_weights": ("GET_ROWS", ("ffn_moe_probs", "ffn_moe_topk")),
    "ffn_moe_weights_sum": ("SUM_ROWS", ("ffn_moe_weights",)),
    "ffn_moe_weights_sum_clamped": ("CLAMP", ("ffn_moe_weights_sum",)),
    "ffn_moe_weights_norm": ("DIV", ("ffn_moe_weights", "ffn_moe_weights_sum_clamped")),
    "ffn_moe_gate": ("MUL_MAT_ID", ("ffn_gate_exps.weight", "ffn_norm", "ffn_moe_topk")),
    "ffn_moe_up": ("MUL_MAT_ID", ("ffn_up_exps.weight", "ffn_norm", "ffn_moe_topk")),
    "ffn_moe_swiglu": ("SWIGLU", ("ffn_moe_gate", "ffn_moe_up")),
    "ffn_moe_down": ("MUL_MAT_ID", ("ffn_down_exps.weight", "ffn_moe_swiglu", "ffn_moe_topk")),
    "ffn_moe_weighted": ("MUL", ("ffn_moe_down", "ffn_moe_weights_norm|ffn_moe_weights")),
    # the sum of the k experts' views of ffn_moe_weighted (k > 2: src0 is llama.cpp's unnamed running sum)
    "ffn_moe_out": ("ADD", ("ffn_moe_weighted", "ffn_moe_weighted")),
    # Qwen2-MoE's shared expert: the dense nodes, ffn_shexp for their result, then its gate
    "ffn_shexp": ("MUL_MAT", ("ffn_down_shexp.weight", ACT)),
    "ffn_shexp_gate_inp": ("MUL_MAT", ("ffn_gate_inp_shexp.weight", "ffn_norm")),
    "ffn_shexp_gate": ("DIV", ("ffn_shexp_gate_inp",)),                  # llama.cpp: silu(z) / z
    "ffn_shexp_out": ("MUL", ("ffn_shexp", "ffn_shexp_gate")),
}


# the shared expert's dense products read its own tensors (llama.cpp: blk.L.ffn_gate_shexp.weight, ...)
SHEXP_SRCS = {n: (NODES[n][1][0].replace(".weight", "_shexp.weight"),) + NODES[n][1][1:] for n in ("ffn_gate", "ffn_up")}


def describe(name, prev, op=None, srcs=None):
    """The node `name`'s op and srcs: those the hook call gave, the table's for the rest.
    prev: the node hooked just before it. A product right after its own LoRA delta
    (`{name}_lora_scaled`, training/lora.py) is llama.cpp's build_lora_mm sum: an ADD over the
    same sources."""
    if op is not None and srcs is not None:
        return op, srcs
    row = NODES.get(name)
    if row is None:
        raise KeyError(f"node {name!r} is not in model/nodes.py's table: its hook call must give op and srcs")
    if op is None:
        op = "ADD" if row[0] == "MUL_MAT" and prev == name + "_lora_scaled" else row[0]
    return op, row[1] if srcs is None else srcs
