"""`ffnlab compare -m A -m B ...` (or `ffnlab compare A B ...`): the MLP side by side for presets, config.json files and GGUFs."""
COMMAND = "compare"
HELP = "compare the MLP of several models side by side (d_model, d_ff, ratio, MLP params, MLP share)"


def add_arguments(p):
    from .common import add_models_flag, refuse_together
    add_models_flag(p, "a model to compare, repeatable: a preset name (alias or HF repo id), an installed model "
                       "(smollm2, gemma3), a .gguf file, an HF directory or a config.json file")
    p.add_argument("--list", action="store_true", help="list the presets with their sources and exit")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    refuse_together(p, "--list", "MODEL", "--list shows every preset")


def run(args):
    import json

    from ..analysis.presets import PRESETS
    from ..analysis.report import compare_row
    from ..analysis.source import load_source
    from ..errors import UsageError

    if args.list:
        rows = [{"alias": p.alias, "repo": p.repo, "source": p.source, "note": p.note} for p in PRESETS]
        print(json.dumps(rows, indent=1) if args.json else _render_list(rows))
        return 0
    if not args.models:
        raise UsageError("give at least one preset or model file (ffnlab compare --list shows the presets)")
    rows = [compare_row(load_source(m)) for m in args.models]
    print(json.dumps(rows, indent=1) if args.json else render(rows))
    return 0


def render(rows) -> str:
    from ..analysis.text import human, table

    cells = [[r["model"], r["d_model"], r["d_ff"], f"{r['ratio']:.2f}", r["ffn"], f"{r['mlp_params_per_layer']:,d}",
              r["n_layer"], f"{r['mlp_params']:,d} ({human(r['mlp_params'])})", f"{100 * r['mlp_share']:.1f}%",
              human(r["params_total"]), human(r["params_active"])] for r in rows]
    return table(cells, ["model", "d_model", "d_ff", "ratio", "FFN", "MLP params/layer", "layers", "MLP params",
                         "MLP share", "total params", "active"], "lrrrlrrrrrr")


def _render_list(rows) -> str:
    from ..analysis.text import table

    return table([[r["alias"], r["repo"], r["note"] or r["source"]] for r in rows], ["alias", "HF repo id", "source"],
                 "lll")
