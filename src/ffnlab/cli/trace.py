"""ffnlab trace: print every named node of one forward pass, in llama-eval-callback's format."""
import json
import math
import sys

COMMAND = "trace"
HELP = "run one forward pass and print every named tensor (llama-eval-callback format)"


def add_arguments(p):
    from .common import add_lora_arguments, add_model_argument, add_prompt_arguments, refuse_together
    add_model_argument(p)
    add_lora_arguments(p)
    add_prompt_arguments(p)
    p.add_argument("--filter", metavar="REGEX", default=None,
                   help="only nodes whose name matches REGEX at its start (like llama-eval-callback's "
                        "--tensor-filter; use '.*x' to match anywhere)")
    p.add_argument("--values", action="store_true",
                   help="also print the first/last 3 entries per dimension and the sum, as llama-eval-callback does")
    p.add_argument("--layout", choices=("ggml", "logical"), default="ggml",
                   help="ggml: shapes as ggml ne[0..3], fastest axis first (default); logical: numpy order, "
                        "e.g. 'ffn_up-0 [2, 3072]'")
    p.add_argument("--dump", metavar="DIR", default=None,
                   help="write each matching node's array to DIR as NNNN-<name>.npy plus DIR/index.json")
    p.add_argument("--json", action="store_true", help="print one JSON object (nodes, shapes, sums) instead of lines")
    p.add_argument("--check-finite", action="store_true",
                   help="stop at the first node holding NaN/Inf, name it and print its inputs' statistics (exit 1)")
    refuse_together(p, "--layout", "--json", "the JSON holds both layouts (shape: logical, ne: ggml)")


def json_safe(x):
    """Non-finite floats as strings, so the output is strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if isinstance(x, list):
        return [json_safe(v) for v in x]
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    return x


def no_match(pattern, names):
    """The line for a --filter that matched none of the forward's nodes: the nearest names, and the
    node kinds (ffn_up, attn_norm, ...) with an example of each."""
    import difflib
    import re
    close = difflib.get_close_matches(pattern, names, n=3, cutoff=0.5)
    loose = [n for n in names if re.search(pattern, n)][:3]         # matches somewhere but not at the start
    kinds = list(dict.fromkeys(n.rsplit("-", 1)[0] if n.rsplit("-", 1)[-1].isdigit() else n for n in names))
    hint = (f"; these contain it: {', '.join(loose)} (the filter matches at the start of a name: '.*{pattern}')"
            if loose else f"; did you mean {' or '.join(close)}?" if close else "")
    return (f"--filter {pattern!r} matches none of the {len(names)} nodes{hint}; node kinds: {', '.join(kinds[:24])}"
            f"{' ...' if len(kinds) > 24 else ''} (per layer as KIND-L, e.g. {names[len(names) // 2]})")


def run(args):
    import re

    import numpy as np

    from ..errors import UsageError
    from ..quant import ggml_path
    from ..tracing import NonFiniteError, Tracer
    from ..tracing.api import attached
    from ..tracing.dump import Dumper
    from ..tracing.format import ggml_line, logical_line, node_record, values_block
    from .common import model_and_prompt

    if args.filter is not None:
        try:
            re.compile(args.filter)
        except re.error as e:
            raise UsageError(f"--filter {args.filter!r} is not a valid regex: {e}") from None
    prompt, model, ids = model_and_prompt(args)
    dumper = Dumper(args.dump, model.source, prompt, ids) if args.dump else None
    path = ggml_path.PATH if model.arith.name == "ggml" else None
    if path and not args.json:                 # llama-eval-callback prints no such line: only in ggml mode
        print(f"# arith ggml: llama.cpp's {path} code path (quant/ggml_path.py; FFNLAB_GGML_PATH forces one)")
    records = []
    line = logical_line if args.layout == "logical" else ggml_line

    def on_node(node):
        if args.json:
            records.append(node_record(node, values=args.values))
        else:
            sys.stdout.write(line(node) + "\n")
            if args.values:
                sys.stdout.write(values_block(node.array))
        if dumper:
            dumper.add(node)
        node.array = None                      # printed / written: no need to hold it

    class Counting(Tracer):                    # every node the forward emits, filtered or not
        checked = 0
        matched = 0
        names = {}                             # every name, in order, for a filter that matched none

        def observe(self, full, *a, **kw):
            self.checked += 1
            self.names.setdefault(full, None)
            if self.matches(full):
                self.matched += 1
            return super().observe(full, *a, **kw)

    tracer = Counting(filter=args.filter, keep=True, params=model.params, on_node=on_node,
                      check_finite=args.check_finite)
    bad = None
    try:
        with attached(model, tracer), np.errstate(all="ignore"):   # overflow is what --check-finite reports
            model.forward(np.asarray(ids))
    except NonFiniteError as e:
        bad = e
    finally:
        if dumper:
            dumper.close()
    if args.filter is not None and not tracer.matched and not args.check_finite:   # --check-finite reports anyway
        raise UsageError(no_match(args.filter, list(tracer.names)))
    if args.json:
        from ..threads import threads
        out = {"model": model.source, "threads": threads(), "arith": model.arith.name, "ggml_path": path,
               "prompt": prompt, "ids": [int(i) for i in ids], "nodes": records}
        if args.check_finite:
            out["non_finite"] = None if bad is None else {
                "node": bad.node.name, "op": bad.node.op, "stats": bad.stats,
                "inputs": [{"name": n, "stats": st} for n, st in bad.inputs]}
        print(json.dumps(json_safe(out)))
    elif bad is not None:
        print("\n".join(bad.report()))
    elif args.check_finite:
        print(f"every node is finite ({tracer.checked} nodes checked)")
    return 1 if bad is not None else 0
