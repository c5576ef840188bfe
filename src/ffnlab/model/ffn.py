"""The FFN (MLP) family -- the heart of ffnlab. Every FFN kind, forward and backward.

  dense  (GPT-2, BERT):        y = down(act(up(x) + b_up)) + b_down        act in {gelu, gelu_tanh, relu}
  gated  (Llama SwiGLU,        y = down(act(gate(x)) * up(x))              act = SiLU for swiglu,
          Gemma GeGLU):                                                          GELU-tanh for geglu
  moe    (Mixtral, Qwen-MoE,   p = softmax(router(x)); the k largest p_e pick experts e;
          OLMoE):              y = sum_e w_e * swiglu_e(x)   w = those p (or p / sum p: norm_topk_prob)
                               [+ sigmoid(g . x) * swiglu_shared(x)]        (Qwen2-MoE's shared expert)
Biases are optional in dense and gated. x is the output of ffn_norm, shape [..., d_model].

Each named value passes through the hook (model/hooks.py) under llama.cpp's graph names
(llm_graph_context::build_ffn): ffn_up, ffn_up_b (after the up bias), ffn_gate, ffn_gate_b,
ffn_gelu / ffn_relu (dense) or ffn_swiglu / ffn_geglu (gated: act(gate) * up fused in one GLU
op), ffn_down (only when a down bias follows), and ffn_out for the FFN's result. A weight
source like "ffn_up.weight" is the block's own tensor (blk.L.ffn_up.weight).
A mixture of experts is hooked under build_moe_ffn's names: ffn_moe_logits, ffn_moe_probs,
ffn_moe_argsort / ffn_moe_topk (the chosen experts), ffn_moe_weights (their probabilities),
ffn_moe_weights_sum / _sum_clamped / _norm (norm_topk_prob), ffn_moe_gate, ffn_moe_up,
ffn_moe_swiglu, ffn_moe_down, ffn_moe_weighted, ffn_moe_out; Qwen2-MoE's shared expert adds
ffn_shexp_gate_inp, ffn_shexp_gate, the dense nodes with ffn_shexp for its result,
ffn_shexp_out, and ffn_out for the sum (models/qwen2moe.cpp).
"""
from typing import NamedTuple

import numpy as np

from ..ops.activations import ACTIVATIONS, glu_backward, sigmoid
from ..ops.linear import linear_backward, linear_backwards, linear_forward, linear_forwards, plain
from ..ops.softmax import softmax_backward, softmax_forward
from ..kinds import FFN_KINDS
from .arith import F32
from .hooks import identity
from .nodes import SHEXP_SRCS
from .weights import FFN_TENSOR, MOE_TENSOR, LayerWeights, MoEWeights  # noqa: F401 (FFN_TENSOR, MOE_TENSOR: the names)


class FFNCache(NamedTuple):
    """What ffn_backward needs from the forward."""
    x: np.ndarray                       # [..., d_model] the input (ffn_norm's output)
    up: np.ndarray                      # [..., d_ff] up(x) (+ b_up)
    gate: np.ndarray | None             # [..., d_ff] gate(x) (+ b_gate), gated kinds
    act: np.ndarray                     # [..., d_ff] act(gate) (gated) or act(up) (dense)
    h: np.ndarray                       # [..., d_ff] what enters down: act * up, or act


def ffn_forward(x, w: LayerWeights, kind, hook=identity, fused_gate_up=False, arith=F32):
    """x: [..., d_model] -> y: [..., d_model], FFNCache (MoECache for a mixture of experts)

    fused_gate_up: name the gate and up products as one node, ffn_up [..., 2*d_ff], as llama.cpp's
    Phi-3 graph does (its GGUF stores them as one matrix); the math is the same."""
    if isinstance(w, MoEWeights):
        return moe_forward(x, w, hook)
    k = FFN_KINDS[kind]
    if fused_gate_up and k.gated and w.gate_b is None and w.up_b is None:
        return _fused_gate_up_forward(x, w, k, hook, arith)
    gate, up, whole = _gate_up(x, w, k, hook)       # [..., d_ff] each, hooked (gate: None for dense kinds)
    if k.gated:
        if _compiled_glu(k.act, arith, gate, up, whole):
            act, h = arith.glu(gate, up, k.act == "gelu_tanh", whole)      # one pass over gate and up
        else:
            act = _act(k.act, arith)(gate)                                # [..., d_ff]
            h = act * up
        h = hook(k.node, h, k.op)                                         # [..., d_ff]
    else:
        act = h = hook(k.node, _act(k.act, arith)(up), k.op)              # [..., d_ff]
    y = linear_forward(h, w.down, hook=hook, node="ffn_down" if w.down_b is not None else "ffn_out")   # [..., d_model]
    if w.down_b is not None:
        y = hook("ffn_down", y)
        y = hook("ffn_out", y + w.down_b, "ADD", ("ffn_down", "ffn_down.bias"))   # the bias after the product
    else:
        y = hook("ffn_out", y)
    return y, FFNCache(x, up, gate, act, h)


def _gate_up(x, w, k, hook):
    """gate(x) (+ its bias; gated kinds, None for dense ones) and up(x) (+ its bias), through their
    hooks, however w holds them: one [gate, up] matrix (a GGUF's fused ffn_up), two float matrices
    multiplied at once, or each weight's own product -> gate, up, and the [gate, up] product while
    they are still its halves (else None)"""
    gu = linear_forward(x, w.gate_up) if w.gate_up is not None else None    # [..., 2*d_ff]: gate, up
    if gu is not None:
        made = (gu[..., :gu.shape[-1] // 2], gu[..., gu.shape[-1] // 2:])
    elif k.gated and plain(w.gate) and plain(w.up):
        made = tuple(linear_forwards(x, (w.gate, w.up)))                    # both products in one go
    else:
        made = (None, None)
    gate = None
    if k.gated:
        # gate before up, the order ggml executes them in (GLU's src0 is the gate)
        gate = made[0] if made[0] is not None else linear_forward(x, w.gate, hook=hook, node="ffn_gate")
        gate = hook("ffn_gate", gate)
        if w.gate_b is not None:
            gate = hook("ffn_gate_b", gate + w.gate_b)
    up = made[1] if made[1] is not None else linear_forward(x, w.up, hook=hook, node="ffn_up")
    up = hook("ffn_up", up)
    if w.up_b is not None:
        up = hook("ffn_up_b", up + w.up_b)                                # a new array: ffn_up stays
    return gate, up, (gu if gu is not None and gate is made[0] and up is made[1] else None)


def _compiled_glu(name, arith, gate, up, gu):
    """the kernel set's one-pass GLU (arith.glu) computes this activation as its act does, on float32
    gate and up that are the halves of one C-ordered product gu, or two C-ordered arrays"""
    if arith.glu is None or name not in ("silu", "gelu_tanh") or not gate.size:
        return False
    if gu is not None:
        return gu.dtype == np.float32 and gu.flags.c_contiguous
    return (gate.dtype == np.float32 and up.dtype == np.float32 and gate.shape == up.shape
            and gate.flags.c_contiguous and up.flags.c_contiguous)


def _act(name, arith):
    """the activation's forward in the kernel set's arithmetic (ggml's SiLU, GELU)"""
    return arith.act[name]


def _fused_gate_up_forward(x, w, k, hook, arith=F32):
    """Phi-3's graph: ffn_up = [gate; up] x, one node [..., 2*d_ff]; the GLU splits it."""
    if w.gate_up is not None:
        gu = linear_forward(x, w.gate_up)                                  # [..., 2*d_ff]
    else:
        gu = np.concatenate([linear_forward(x, w.gate), linear_forward(x, w.up)], axis=-1)
    gu = hook("ffn_up", gu)
    d_ff = gu.shape[-1] // 2
    gate, up = gu[..., :d_ff], gu[..., d_ff:]                              # [..., d_ff] views
    act = _act(k.act, arith)(gate)
    h = hook(k.node, act * up, k.op, ("ffn_up",))                          # [..., d_ff] from the one node
    y = hook("ffn_out", linear_forward(h, w.down))
    return y, FFNCache(x, up, gate, act, h)


def ffn_backward(dy, w: LayerWeights, kind, cache: FFNCache):
    """dy: [..., d_model] -> dx: [..., d_model], grads: {LayerWeights field: array}
    (of MoEWeights, for a mixture of experts)"""
    if isinstance(w, MoEWeights):
        return moe_backward(dy, w, cache)
    k = FFN_KINDS[kind]
    c = cache
    g = {}
    dh, g["down"], g["down_b"] = linear_backward(dy, c.h, w.down, w.down_b is not None)   # [..., d_ff]
    if k.gated:
        dup, dgate = glu_backward(dh, c.act, c.up, c.gate, k.act)   # d(act(gate) * up)/d up, d gate
        dx, ((g["up"], g["up_b"]), (g["gate"], g["gate_b"])) = linear_backwards(
            [dup, dgate], c.x, [w.up, w.gate], [w.up_b is not None, w.gate_b is not None])
    else:
        dup = ACTIVATIONS[k.act].backward(dh, c.up)
        dx, g["up"], g["up_b"] = linear_backward(dup, c.x, w.up, w.up_b is not None)
    return dx, {k: v for k, v in g.items() if v is not None}


# --- mixture of experts ---------------------------------------------------------------------
# llama.cpp clamps the sum of the chosen probabilities to the smallest normal float16 before
# dividing by it; the top-k of a softmax sums to at least k/E, so this only matters for E > 16k
WEIGHTS_SUM_MIN = 6.103515625e-5


def ffn_out_node(cfg):
    """The name of the FFN's result node: ffn_moe_out for experts alone, ffn_out otherwise."""
    return "ffn_moe_out" if FFN_KINDS[cfg.ffn].moe and not cfg.d_ff_shexp else "ffn_out"


class MoECache(NamedTuple):
    """What moe_backward needs from the forward (N = tokens, K = experts per token)."""
    x: np.ndarray                       # [N, d_model] the input, rows flattened
    probs: np.ndarray                   # [N, E] softmax of the router logits
    topk: np.ndarray                    # [N, K] int32 the chosen experts, most probable first
    wsum: np.ndarray | None             # [N, 1] sum of the chosen probabilities (clamped), when normalised
    weights: np.ndarray                 # [N, K] what each expert's output is multiplied by
    up: np.ndarray                      # [N*K, d_ff] row n*K + j: token n through expert topk[n, j]
    gate: np.ndarray                    # [N*K, d_ff]
    act: np.ndarray                     # [N*K, d_ff] silu(gate)
    h: np.ndarray                       # [N*K, d_ff] silu(gate) * up, the input of down
    out: np.ndarray                     # [N, K, d_model] each chosen expert's output, unweighted
    shexp: FFNCache | None              # the shared expert's cache
    shexp_y: np.ndarray | None          # [N, d_model] its output before the gate
    shexp_s: np.ndarray | None          # [N, 1] sigmoid(gate_inp_shexp . x)
    daux: np.ndarray | None = None      # [N, E] d(auxiliary loss)/d probs, set by training/moe_loss.py


def expert_groups(topk, n_expert):
    """topk [N, K] -> [(e, rows)]: the rows (n*K + j of the flattened assignments) routed to each
    used expert e. One stable sort: every expert then multiplies all its tokens in one product."""
    eid = topk.reshape(-1)
    order = np.argsort(eid, kind="stable")
    counts = np.bincount(eid, minlength=n_expert)
    ends = np.cumsum(counts)
    return [(e, order[end - n:end]) for e, (n, end) in enumerate(zip(counts, ends)) if n]


def experts_forward(a, w, groups):
    """a: [M, in] rows, w: [E, out, in], groups from expert_groups -> [M, out], each row through its expert"""
    y = np.empty((a.shape[0], w.shape[1]), np.result_type(a, w))
    for e, rows in groups:
        y[rows] = linear_forward(a[rows], w[e])                            # [n_e, in] -> [n_e, out]
    return y


def experts_backward(dy, a, w, groups):
    """dy: [M, out] -> da [M, in], dw [E, out, in] (zero for experts no row chose)"""
    da = np.zeros(a.shape, np.result_type(dy, w))
    dw = np.zeros(w.shape, np.result_type(dy, a))
    for e, rows in groups:
        da[rows], dw[e], _ = linear_backward(dy[rows], a[rows], w[e], False)
    return da, dw


def moe_forward(x, w: MoEWeights, hook=identity):
    """x: [..., d_model] -> y: [..., d_model], MoECache (llama.cpp's build_moe_ffn, softmax gating)"""
    lead, D = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, D)                                                 # [N, d_model]
    N, K, E = x2.shape[0], w.n_used, w.gate_inp.shape[0]

    def node(name, a, per_token=(), op=None, srcs=None):
        """hook a [N, ...] value as [..., *per_token] (the trace's shape); back to [N, ...]"""
        return hook(name, a.reshape(*lead, *(per_token or a.shape[1:])), op, srcs).reshape(a.shape)

    logits = node("ffn_moe_logits", linear_forward(x2, w.gate_inp))     # [N, E]
    probs = node("ffn_moe_probs", softmax_forward(logits.copy()))
    # top-k by a stable descending sort (ties keep the lower expert first), as llama.cpp: the
    # whole order (ffn_moe_argsort), then a view of its first k columns (ffn_moe_topk)
    order = node("ffn_moe_argsort", np.argsort(-probs, axis=-1, kind="stable").astype(np.int32))   # [N, E]
    topk = node("ffn_moe_topk", order[:, :K])                              # [N, K]
    if topk.size and (topk.min() < 0 or topk.max() >= E):
        raise ValueError(f"ffn_moe_topk holds expert {int(topk.max())}; the layer has {E}")
    weights = node("ffn_moe_weights", np.take_along_axis(probs, topk, -1), (K, 1))   # [N, K]
    wsum = None
    if w.norm:
        wsum = node("ffn_moe_weights_sum", weights.sum(-1, keepdims=True))
        wsum = node("ffn_moe_weights_sum_clamped",
                    np.maximum(wsum, np.asarray(WEIGHTS_SUM_MIN, wsum.dtype)))   # [N, 1]
        weights = node("ffn_moe_weights_norm", weights / wsum)
    groups = expert_groups(topk, E)
    xr = x2[np.repeat(np.arange(N), K)]                                    # [N*K, d_model] row n*K+j is token n
    # gate before up, the order ggml evaluates them in
    gate = node("ffn_moe_gate", experts_forward(xr, w.gate_exps, groups), (K, w.gate_exps.shape[1]))   # [N*K, d_ff]
    up = node("ffn_moe_up", experts_forward(xr, w.up_exps, groups), (K, w.up_exps.shape[1]))
    act = ACTIVATIONS["silu"].forward(gate)
    h = node("ffn_moe_swiglu", act * up, (K, up.shape[1]))
    out = node("ffn_moe_down", experts_forward(h, w.down_exps, groups), (K, D)).reshape(N, K, D)
    weighted = node("ffn_moe_weighted", out * weights[..., None])
    y = weighted[:, 0].copy()                                             # [N, d_model]
    for j in range(1, K):                                                 # llama.cpp adds the k views in order
        y += weighted[:, j]
    y = node("ffn_moe_out", y, op="CONT" if K == 1 else None, srcs=("ffn_moe_weighted",) if K == 1 else None)
    sh = sh_y = s = None
    if w.shexp is not None:
        def shexp_hook(name, a, op=None, srcs=None, bare=False):          # the shared FFN's result is ffn_shexp
            srcs = SHEXP_SRCS.get(name) if srcs is None else srcs         # its products read its own weights
            return hook("ffn_shexp" if name == "ffn_out" else name, a, op, srcs, bare)
        # the shared FFN, then its gate: the order ggml evaluates them in
        sh_y, sh = ffn_forward(x2.reshape(*lead, D), w.shexp, "swiglu", shexp_hook)
        sh_y = sh_y.reshape(N, D)
        z = node("ffn_shexp_gate_inp", linear_forward(x2, w.gate_inp_shexp[None]))   # [N, 1]
        s = node("ffn_shexp_gate", sigmoid(z))                            # llama.cpp: silu(z) / z
        y = node("ffn_out", y + node("ffn_shexp_out", sh_y * s), op="ADD", srcs=("ffn_moe_out", "ffn_shexp_out"))
    return y.reshape(*lead, D), MoECache(x2, probs, topk, wsum, weights, up, gate, act, h, out, sh, sh_y, s)


def moe_backward(dy, w: MoEWeights, c: MoECache):
    """dy: [..., d_model] -> dx [..., d_model], grads {MoEWeights field: array}

    Through the experts as through a gated FFN, and through the router: the chosen
    probabilities get dL/dw = dy . out, the others none; the softmax spreads that over every
    router row (the top-k choice itself is piecewise constant: no gradient, as in autograd)."""
    N, K, D = c.out.shape
    E = w.gate_inp.shape[0]
    dy2 = dy.reshape(N, D)
    g = {}
    groups = expert_groups(c.topk, E)
    dweights = np.einsum("nkd,nd->nk", c.out, dy2)                       # [N, K] dL/d weight
    dout = (dy2[:, None, :] * c.weights[..., None]).reshape(N * K, D)    # [N*K, d_model]
    dh, g["down_exps"] = experts_backward(dout, c.h, w.down_exps, groups)           # [N*K, d_ff]
    dup = dh * c.act                                                      # d(act * up)/d up
    dgate = ACTIVATIONS["silu"].backward(dh * c.up, c.gate)
    xr = c.x[np.repeat(np.arange(N), K)]
    dxr, g["up_exps"] = experts_backward(dup, xr, w.up_exps, groups)
    dxr_gate, g["gate_exps"] = experts_backward(dgate, xr, w.gate_exps, groups)
    dxr += dxr_gate
    dx = dxr.reshape(N, K, D).sum(axis=1)                                 # each token's K copies
    if w.norm:
        # weights = p / S with S = sum p (unless clamped): dL/dp_j = (dw_j - sum_i dw_i weights_i) / S
        dsel = dweights - (dweights * c.weights).sum(-1, keepdims=True) * (c.wsum > WEIGHTS_SUM_MIN)
        dsel /= c.wsum
    else:
        dsel = dweights
    dprobs = np.zeros_like(c.probs)
    np.put_along_axis(dprobs, c.topk.astype(np.intp), dsel.astype(dprobs.dtype), -1)   # [N, E]
    if c.daux is not None:
        dprobs += c.daux                                                  # the load-balancing loss
    dlogits = softmax_backward(dprobs, c.probs)
    dx_r, g["gate_inp"], _ = linear_backward(dlogits, c.x, w.gate_inp, False)
    dx += dx_r
    if w.shexp is not None:
        s = c.shexp_s                                                     # [N, 1]
        dx_sh, gs = ffn_backward((dy2 * s).reshape(c.shexp.x.shape), w.shexp, "swiglu", c.shexp)
        g.update({k + "_shexp": v for k, v in gs.items()})
        dz = (dy2 * c.shexp_y).sum(-1, keepdims=True) * s * (1 - s)       # through sigmoid
        g["gate_inp_shexp"] = (dz * c.x).sum(axis=0)                      # [d_model]
        dx += dx_sh.reshape(N, D) + dz * w.gate_inp_shexp
    return dx.reshape(dy.shape), g
