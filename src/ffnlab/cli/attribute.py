"""`ffnlab attribute`: direct logit attribution of MLP hidden units for a target token."""
import json

COMMAND = "attribute"
HELP = "direct logit attribution of MLP units: which units of which layer write the target's logit"


def add_arguments(p):
    from .common import add_model_argument, positive
    add_model_argument(p)
    p.add_argument("-p", "--prompt", required=True, help="the prompt (attribution at its last position)")
    p.add_argument("--target", required=True, help="the token: text (' Paris') or #ID")
    p.add_argument("--top", type=positive("--top"), default=5, help="units listed per layer (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


NOTE_RANK = 5                  # a target below the model's top 5 predictions gets a note


def run(args):
    import sys

    from ..interventions.attribution import attribute
    from ..interventions.common import one_token, prompt_ids
    from ..token_text import token_label
    from .common import load_model
    model = load_model(args, quiet=args.json)
    ids = prompt_ids(model, args.prompt)
    target = one_token(model, args.target, "--target")
    r = attribute(model, ids, target, args.top)
    m = f" -m {args.model}" if args.model else ""
    for lay in r["layers"]:                             # each unit's own page: what makes it fire
        lay["neurons"] = [f"ffnlab neurons{m} --layer {lay['layer']} --neuron {u} --data TEXT_FILE"
                          for u, _, _ in lay["units"] + lay["negative"]]
    note = target_note(model, args.target, target, r)
    if note:
        print(f"ffnlab attribute: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"target": model.tokenizer.decode([target]), "target_id": target, "note": note, **r}))
        return 0
    tok = model.tokenizer
    print(f"direct logit attribution to {token_label(tok, target)} (#{target}; logit {r['logit']:.3f}, the model's "
          f"prediction #{r['rank'] + 1}) of {r['node']}-L units at the last position")
    print(f"{'layer':>5} {'MLP total':>10}  units (unit: attribution = activation x down column . direction), "
          f"most positive | most negative")
    for lay in r["layers"]:
        up = "  ".join(f"{u}: {a:+.3f}" for u, a, _ in lay["units"] if a > 0) or "-"
        down = "  ".join(f"{u}: {a:+.3f}" for u, a, _ in lay["negative"]) or "-"
        print(f"{lay['layer']:>5} {lay['total']:>+10.3f}  {up}  |  {down}")
    print("what makes the strongest units fire (TEXT_FILE: any text, e.g. a Wikipedia dump):")
    strongest = sorted(((abs(a), lay["layer"], u) for lay in r["layers"] for u, a, _ in lay["units"] + lay["negative"]),
                       reverse=True)[:3]
    for _, il, u in strongest:
        print(f"  ffnlab neurons{m} --layer {il} --neuron {u} --data TEXT_FILE")
    return 0


def target_note(model, text, target, r):
    """A line when the target is not among the model's top predictions: which token is, and, for a
    target typed without its leading space, whether ' TEXT' is one token the model ranks higher."""
    if r["rank"] < NOTE_RANK:
        return None
    from ..token_text import token_label
    tok = model.tokenizer
    note = (f"--target {text!r} ({token_label(tok, target)}, logit {r['logit']:.2f}) is the model's prediction "
            f"#{r['rank'] + 1}; its top prediction is {token_label(tok, r['top_id'])} (#{r['top_id']}, logit "
            f"{r['top_logit']:.2f})")
    if not text.startswith((" ", "#")):
        spaced = tok.encode(" " + text, add_bos=False)
        if len(spaced) == 1:
            note += f"; did you mean {' ' + text!r}, with its leading space (#{spaced[0]})?"
    return note
