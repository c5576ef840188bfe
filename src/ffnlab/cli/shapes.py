"""`ffnlab shapes`: the MLP's shape table for a config, computed by running ffn_forward."""
import argparse
import json

COMMAND = "shapes"
HELP = "print the MLP (FFN) shape table of a config: every intermediate, weight and bias shape, params per matrix"


def add_arguments(p):
    from .common import add_model_flag, positive, refuse_together
    add_model_flag(p, "a .gguf file, an HF directory or config.json, an installed model (smollm2, gemma3) or a "
                      "preset: the MLP fields are read from it (metadata only)", presets=True)
    p.add_argument("--preset", metavar="NAME",
                   help="a preset model: gpt2, llama (Llama 2 7B), smollm2, gemma3, or any alias / HF repo id "
                        "that `ffnlab compare --list` shows")
    p.add_argument("--d-model", type=positive("--d-model"), metavar="N", help="residual width (overrides the preset's)")
    p.add_argument("--d-ff", type=positive("--d-ff"), metavar="N", help="MLP hidden width (overrides the preset's)")
    p.add_argument("--ffn", metavar="KIND", help="gelu | gelu_tanh | relu | swiglu | geglu (default: the preset's, "
                                                  "else gelu_tanh)")
    p.add_argument("--bias", action=argparse.BooleanOptionalAction, default=None,
                   help="biases on up/gate/down (default: the preset's, else yes for dense and no for gated kinds)")
    p.add_argument("-T", type=positive("-T"), metavar="N", dest="T", help="show shapes for N tokens instead of the symbol T")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    refuse_together(p, "MODEL", "--preset", "give one model")


def config_from_args(args):
    """A preset's MLP fields (or the flags alone), each flag given overriding the preset's value."""
    from ..analysis.ffn_shapes import ffn_config, preset_ffn_config
    from ..errors import UsageError
    if args.T is not None and args.T <= 0:
        raise UsageError(f"-T must be a positive token count, got {args.T}")
    if args.model and args.preset:
        raise UsageError("give MODEL or --preset NAME, not both")
    if args.preset or args.model:
        p = preset_ffn_config(args.preset) if args.preset else _model_config(args.model)
        base = dict(d_model=p.d_model, d_ff=p.d_ff, ffn=p.ffn, bias=p.ffn_bias, name=p.name, n_layer=p.n_layer)
    elif args.d_model is None or args.d_ff is None:
        raise UsageError("give MODEL, --preset NAME, or both --d-model and --d-ff")
    else:
        base = dict(ffn="gelu_tanh", bias=None)
    for key, value in (("d_model", args.d_model), ("d_ff", args.d_ff), ("ffn", args.ffn), ("bias", args.bias)):
        if value is not None:
            base[key] = value
    if (args.preset or args.model) and (args.d_model, args.d_ff, args.ffn, args.bias) != (None,) * 4:
        base["name"] += " (modified)"
    return ffn_config(**base)


def _model_config(name):
    """A file / directory / installed model / preset -> its ModelConfig (named like compare's rows)."""
    from ..analysis.source import load_source
    src = load_source(name)
    cfg = src.cfg
    cfg.name = src.label if src.kind != "preset" else cfg.name
    return cfg


def run(args):
    from ..analysis.ffn_shapes import ffn_shape_table, render_table, table_json
    cfg = config_from_args(args)
    steps, flow = ffn_shape_table(cfg, args.T)
    if args.json:
        print(json.dumps(table_json(cfg, steps, flow, args.T), indent=2))
    else:
        print(render_table(cfg, steps, flow, args.T))
    return 0
