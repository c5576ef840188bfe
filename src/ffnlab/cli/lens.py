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
    from ..interventions.common import prompt_ids
    from ..interventions.lens import logit_lens
    from ..pictures import check_page, written
    from .common import load_model
    check_page(args.html, "--html")                    # before the work, not after it
    model = load_model(args, quiet=args.json)
    ids = prompt_ids(model, args.prompt)
    r = logit_lens(model, ids, args.node, args.top)
    if args.json:
        from ..interventions.common import token_strings
        print(json.dumps({"node": args.node, "tokens": token_strings(model, ids), "top_ids": r["top_ids"],
                          "top_logits": r["top_logits"]}))
    else:
        print(render_text(model, ids, r, args.node, args.prompt, args.positions, args.top))
    sys.stdout.flush()                                 # the table stands whatever happens to the page
    if args.html:
        with written(args.html, "--html"):
            write_html(args.html, model, ids, r, args.node, args.prompt)
        print(f"HTML: {args.html}", file=sys.stderr)
    return 0


WIDTH = 12                     # display columns per position in the text view


def render_text(model, ids, r, node, prompt, positions="all", top=5):
    """The text view: a row per layer, a column per position; cell = the lens's top-1 token there,
    i.e. its prediction of the token that comes *after* the column's token."""
    from ..token_text import fit, token_label
    from ..pictures import model_label
    tok = model.tokenizer
    cols = range(len(ids)) if positions == "all" else [len(ids) - 1]
    lines = [f"logit lens of {model_label(model)} on {prompt!r}",
             f"rows: {node}-L through the final norm and head; column: a prompt token; cell: the top-1 "
             f"prediction of the token after it (␣ = space, ↵ = newline)",
             "layer " + " ".join(fit(token_label(tok, ids[t]), WIDTH) for t in cols)]
    for il, row in enumerate(r["top_ids"]):
        lines.append(f"{il:>5} " + " ".join(fit(token_label(tok, row[t][0]), WIDTH) for t in cols))
    last = r["top_ids"][-1][-1]
    lines.append(f"after the last token, the last layer's top {top}: " +
                 ", ".join(token_label(tok, i) for i in last))
    return "\n".join(lines)


def _cell(label, share, tip):
    """One table cell: white text on the darker shades, so a confident cell stays readable."""
    ink = "#fff" if share > 0.55 else "#111"
    return (f'<td title="{html.escape(tip)}" style="background:rgba(40,90,200,{share:.2f});color:{ink}">'
            f'{html.escape(label)}</td>')


def write_html(path, model, ids, r, node, prompt):
    """One self-contained table: a cell per layer and position, its top-1 token (the prediction of the
    next token), shaded by its softmax share among the top K, the top K with logits on hover."""
    import numpy as np

    from ..pictures import model_label
    from ..token_text import token_label
    tok = model.tokenizer
    rows = []
    for il, (top_ids, logits) in enumerate(zip(r["top_ids"], r["top_logits"])):
        cells = []
        for t in range(len(ids)):
            z = np.array(logits[t])
            share = float(np.exp(z[0] - z.max()) / np.exp(z - z.max()).sum())
            tip = "\n".join(f"{token_label(tok, i)}  {v:.2f}" for i, v in zip(top_ids[t], logits[t]))
            label = token_label(tok, top_ids[t][0])
            cells.append(_cell(label, share, f"layer {il}, after {token_label(tok, ids[t])}:\n{tip}"))
        rows.append(f"<tr><th>{il}</th>{''.join(cells)}</tr>")
    head = "".join(f"<th>{html.escape(token_label(tok, i))}</th>" for i in ids)
    k = len(r["top_ids"][0][0])
    page = (f"<!doctype html><meta charset=utf-8><title>logit lens: {html.escape(model_label(model))}: "
            f"{html.escape(prompt)}</title>"
            "<style>body{font:13px 'DejaVu Sans','Noto Sans','Noto Sans CJK SC',sans-serif;color:#111;background:#fff}"
            "td,th{border:1px solid #ccc;padding:2px 5px;white-space:pre;max-width:9em;overflow:hidden;"
            "text-overflow:ellipsis;font-family:'DejaVu Sans Mono','Noto Sans Mono','Noto Sans CJK SC',monospace}"
            "th{background:#f3f3f3}table{border-collapse:collapse}p{max-width:60em}</style>"
            f"<h3>logit lens: {html.escape(model_label(model))}</h3>"
            f"<p>prompt: <code>{html.escape(prompt)}</code></p>"
            f"<p>Each row reads <b>{html.escape(node)}-L</b> through the final norm and the LM head. A column is a "
            f"prompt token; its cell is the top-1 prediction of the token <i>after</i> it. Shade: that token's share "
            f"of the softmax over the top {k}; hover for the list. ␣ = space, ↵ = newline.</p>"
            f"<table><tr><th>layer</th>{head}</tr>{''.join(rows)}</table>")
    with open(path, "w", encoding="utf-8") as f:
        f.write(page)
