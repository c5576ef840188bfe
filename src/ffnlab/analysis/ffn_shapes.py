"""The MLP's shape table for a config, computed by running the real ffn_forward.

Nothing here is typed in. The layer's FFN tensors get the shapes param_shapes(cfg) gives them
(as zero-stride arrays: no memory), ffn_forward runs on a dummy input, and its tracer hook
(emit) reports every node with its array; the table is read off those arrays:

  GPT-2 small:  [T,768] -> up [T,3072] -> gelu [T,3072] -> down [T,768]
  Llama 2 7B:   [T,4096] -> gate [T,11008], up [T,11008] -> silu(gate)*up [T,11008] -> down [T,4096]

The dummy input is a batch of ZERO sequences of T tokens, [0, T, d_model]: every shape is still
computed by the forward, but no arithmetic is done, so a 405B model's MLP costs nothing.
"""
from dataclasses import asdict, dataclass

import numpy as np

from ..config import ModelConfig
from ..errors import UsageError
from ..ops.activations import ACTIVATIONS
from ..model.ffn import FFN_KINDS, ffn_forward
from ..model.nodes import describe
from ..model.weights import layer_weights
from ..model.params import param_shapes

# short names for the presets of analysis/presets.py (which also accepts every alias and HF repo id)

# how the flow line names the activation (GPT-2's tanh GELU is "gelu" in the papers and in nanoGPT)
ACT_LABEL = {"gelu": "gelu", "gelu_tanh": "gelu", "relu": "relu", "silu": "silu"}


@dataclass
class Step:
    step: str                        # up | gate | gelu | silu(gate) | silu(gate)*up | down ...
    node: str                        # llama.cpp graph name of the output (ffn_up_b, ffn_swiglu, ...)
    op: str                          # ggml op(s) that produce it, e.g. "MUL_MAT+ADD"
    shape: tuple                     # output shape [T, features]; T is "T" when no -T was given
    weight: tuple | None = None      # [out, in]
    bias: tuple | None = None        # [out]
    weight_params: int = 0
    bias_params: int = 0

    @property
    def params(self):
        return self.weight_params + self.bias_params


def ffn_config(d_model, d_ff, ffn="gelu_tanh", bias=None, name="", n_layer=1):
    """A config holding just what sizes an MLP; bias defaults to the usual choice (dense yes, gated no)."""
    if ffn not in FFN_KINDS:
        raise UsageError(f"--ffn must be one of {', '.join(FFN_KINDS)}, got {ffn!r}")
    if FFN_KINDS[ffn].moe:
        raise UsageError(f"{name or 'this model'} has a mixture of experts: `ffnlab shapes` draws one dense or gated "
                         f"MLP; `ffnlab analyze` sizes the experts (total and active parameters), `ffnlab trace` "
                         f"shows their ffn_moe_* nodes")
    if bias is None:
        bias = not FFN_KINDS[ffn].gated
    return ModelConfig(arch="custom", n_layer=n_layer, d_model=d_model, n_head=1, d_ff=d_ff, ffn=ffn, ffn_bias=bias,
                       positions="learned", name=name or "a custom config")


def preset_ffn_config(name):
    """-> the ModelConfig of a preset (analysis/presets.py), by short name, alias or HF repo id."""
    from .presets import preset_config
    cfg, _ = preset_config(name)
    return cfg


def _zeros(shape, dtype):
    # a read-only view of one zero with every stride 0: the shape of the tensor, none of its memory
    return np.broadcast_to(np.zeros((), dtype), shape)


def ffn_shape_table(cfg, T=None):
    """Run ffn_forward for one layer of cfg on a [0, T, d_model] input; -> list[Step] and the flow line.

    T: token count to show (None: the token axis is printed as "T")."""
    shapes = param_shapes(_one_layer(cfg))
    params = {n: _zeros(s, np.float32) for n, s in shapes.items()}
    x = np.zeros((0, T or 1, cfg.d_model), np.float32)                # zero sequences of T tokens

    nodes = []                                                        # (name, op, srcs, shape)

    def record(name, a, op=None, srcs=None, bare=False):              # a hook that observes (model/hooks.py)
        nodes.append((name, *describe(name, None, op, srcs), a.shape))   # op and srcs: model/nodes.py's table
        return a
    y, cache = ffn_forward(x, layer_weights(params, cfg, 0).ffn, cfg.ffn, record)
    act = cache.act
    k = FFN_KINDS[cfg.ffn]
    act_name, gated, act_node = k.act, k.gated, k.node

    def token_shape(shape):
        # [0, T, features] -> [T, features]: drop the empty batch axis, label the token axis
        return ("T" if T is None else T,) + tuple(shape[2:])

    steps = []
    for name, op, srcs, shape in nodes:
        tensor = next(("blk.0." + s for s in srcs if s and "." in s), None)   # the weight or bias it reads
        if op == "ADD" and tensor and tensor.endswith(".bias"):     # a bias joins its matmul's row
            st = steps[-1]
            st.node, st.op, st.shape = name, st.op + "+ADD", token_shape(shape)
            st.bias, st.bias_params = shapes[tensor], int(np.prod(shapes[tensor]))
            continue
        if name == act_node:
            label = ACT_LABEL[act_name]
            if gated:                                                 # act(gate) exists only inside the GLU op
                steps.append(Step(f"{label}(gate)", "-", ACTIVATIONS[act_name].op, token_shape(act.shape)))
                label = f"{label}(gate)*up"
            steps.append(Step(label, name, op, token_shape(shape)))
            continue
        step = tensor.split(".")[-2].removeprefix("ffn_")            # blk.0.ffn_up.weight -> up
        steps.append(Step(step, name, op, token_shape(shape), shapes[tensor], None, int(np.prod(shapes[tensor]))))
    assert steps[-1].shape == token_shape(y.shape)
    return steps, flow_line(steps, token_shape(x.shape))


def _one_layer(cfg):
    d = cfg.to_dict()
    d["n_layer"] = 1
    return ModelConfig.from_dict(d)


def fmt_shape(s):
    return "[" + ",".join(str(n) for n in s) + "]" if s is not None else "-"


def flow_line(steps, in_shape):
    """[T,768] -> up [T,3072] -> gelu [T,3072] -> down [T,768]; gate and up side by side."""
    parts, pending = [fmt_shape(in_shape)], []
    for st in steps:
        if st.step in ("gate", "up") and any(s.step == "gate" for s in steps):
            pending.append(f"{st.step} {fmt_shape(st.shape)}")
            if len(pending) == 2:
                parts.append(", ".join(pending))
            continue
        if st.node == "-":                                            # act(gate) is shown inside the product
            continue
        parts.append(f"{st.step} {fmt_shape(st.shape)}")
    return " -> ".join(parts)


def render_table(cfg, steps, flow, T=None):
    title = cfg.name or cfg.arch
    bias = "with bias" if cfg.ffn_bias else "no bias"
    lines = [f"MLP of {title}: d_model {cfg.d_model}, d_ff {cfg.d_ff}, ffn {cfg.ffn}, {bias}", "", flow, ""]
    head = ("step", "node", "op", "output", "weight", "bias", "params")
    rows = [head] + [(s.step, s.node, s.op, fmt_shape(s.shape), fmt_shape(s.weight), fmt_shape(s.bias),
                      _fmt_params(s)) for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  ".join(c.ljust(w) if i < len(head) - 1 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    total = sum(s.params for s in steps)
    lines.append("")
    lines.append(f"MLP parameters per layer: {total:,}" +
                 (f"  (x {cfg.n_layer} layers = {total * cfg.n_layer:,})" if cfg.n_layer > 1 else ""))
    if T is not None:
        acts = sum(int(np.prod(s.shape)) for s in steps)
        lines.append(f"activations for T={T}: {acts:,} values per layer (every row's output)")
    return "\n".join(lines)


def _fmt_params(s):
    if not s.weight_params:
        return "-"
    return f"{s.weight_params:,}" + (f" + {s.bias_params:,}" if s.bias_params else "")


def table_json(cfg, steps, flow, T=None):
    total = sum(s.params for s in steps)
    return {"config": {"name": cfg.name, "d_model": cfg.d_model, "d_ff": cfg.d_ff, "ffn": cfg.ffn,
                       "ffn_bias": cfg.ffn_bias, "n_layer": cfg.n_layer},
            "T": T, "flow": flow,
            "steps": [dict(asdict(s), shape=list(s.shape), weight=None if s.weight is None else list(s.weight),
                           bias=None if s.bias is None else list(s.bias), params=s.params) for s in steps],
            "params_per_layer": total, "params_all_layers": total * cfg.n_layer}
