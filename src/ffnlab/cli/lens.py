"""`ffnlab lens`: the logit lens, each layer's residual stream (or MLP output) read through the final norm and head."""
import html
import json
import sys

COMMAND = "lens"
HELP = "logit lens: each layer's l_out (or --node ffn_out) through the final norm and the LM head"


def add_arguments(p):
    from .common import add_model_argument, positive, refuse_together
    add_model_argument(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt")
    p.add_argument("--node", default="l_out", help="the per-layer node read (default l_out; ffn_out: the MLP's output alone)")
    p.add_argument("--top", type=positive("--top"), default=5, help="tokens kept per layer and position (default 5)")
    p.add_argument("--positions", choices=("all", "last"), default="all", help="text view: every position or the last (default all)")
    p.add_argument("--html", metavar="OUT.html", help="also write a table of every layer and position (top-1 token, "
                                                      "top-K on hover)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    refuse_together(p, "--positions", "--json", "--positions picks the text view's columns; the JSON holds every position")


def run(args):
    from ..interventions.common import prompt_ids, token_strings
    from ..interventions.lens import logit_lens
    from .common import load_model
    model = load_model(args, quiet=args.json)
    ids = prompt_ids(model, args.prompt)
    r = logit_lens(model, ids, args.node, args.top)
    tokens = token_strings(model, ids)
    dec = model.tokenizer.decode
    if args.json:
        print(json.dumps({"node": args.node, "tokens": tokens, "top_ids": r["top_ids"], "top_logits": r["top_logits"]}))
    else:
        cols = range(len(tokens)) if args.positions == "all" else [len(tokens) - 1]
        w = 12
        print(f"top-1 token of {args.node}-L through the final norm and head (rows: layers, columns: positions)")
        print("layer " + " ".join(f"{repr(tokens[t])[1:-1][:w]:>{w}}" for t in cols))
        for il, row in enumerate(r["top_ids"]):
            print(f"{il:>5} " + " ".join(f"{repr(dec([row[t][0]]))[1:-1][:w]:>{w}}" for t in cols))
        last = r["top_ids"][-1][-1]
        print(f"last layer, last position, top {args.top}: " + ", ".join(repr(dec([i])) for i in last))
    if args.html:
        write_html(args.html, args.node, tokens, r, dec)
        print(f"HTML: {args.html}", file=sys.stderr)
    return 0


def write_html(path, node, tokens, r, dec):
    """One self-contained table: a cell per layer and position, its top-1 token, shaded by its softmax
    share among the top K, the top K with logits in the title (hover)."""
    import numpy as np
    rows = []
    for il, (ids, logits) in enumerate(zip(r["top_ids"], r["top_logits"])):
        cells = []
        for t in range(len(tokens)):
            z = np.array(logits[t])
            share = float(np.exp(z[0] - z.max()) / np.exp(z - z.max()).sum())
            tip = "\n".join(f"{dec([i])!r} {v:.2f}" for i, v in zip(ids[t], logits[t]))
            cells.append(f'<td title="{html.escape(tip)}" style="background:rgba(40,90,200,{share:.2f})">'
                         f"{html.escape(dec([ids[t][0]]))}</td>")
        rows.append(f"<tr><th>{il}</th>{''.join(cells)}</tr>")
    head = "".join(f"<th>{html.escape(t)}</th>" for t in tokens)
    page = (f"<!doctype html><meta charset=utf-8><title>logit lens: {html.escape(node)}</title>"
            "<style>body{font:13px sans-serif}td,th{border:1px solid #ccc;padding:2px 5px;white-space:pre}"
            "table{border-collapse:collapse}</style>"
            f"<p>Top-1 token of <b>{html.escape(node)}-L</b> through the final norm and the LM head; shade: its share "
            f"of the softmax over the top {len(r['top_ids'][0][0])}; hover for the list.</p>"
            f"<table><tr><th>layer</th>{head}</tr>{''.join(rows)}</table>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
