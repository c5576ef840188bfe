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


def run(args):
    from ..interventions.attribution import attribute
    from ..interventions.common import one_token, prompt_ids
    from .common import load_model
    model = load_model(args, quiet=args.json)
    ids = prompt_ids(model, args.prompt)
    target = one_token(model, args.target, "--target")
    r = attribute(model, ids, target, args.top)
    m = f" -m {args.model}" if args.model else ""
    for lay in r["layers"]:                             # each unit's own page: what makes it fire
        lay["neurons"] = [f"ffnlab neurons{m} --layer {lay['layer']} --neuron {u} --data TEXT_FILE"
                          for u, _, _ in lay["units"]]
    if args.json:
        print(json.dumps({"target": model.tokenizer.decode([target]), "target_id": target, **r}))
        return 0
    print(f"direct logit attribution to {model.tokenizer.decode([target])!r} (logit {r['logit']:.3f}) "
          f"of {r['node']}-L units at the last position")
    print(f"{'layer':>5} {'MLP total':>10}  top units (unit: attribution = activation x down column . direction)")
    for lay in r["layers"]:
        units = "  ".join(f"{u}: {a:+.3f}" for u, a, _ in lay["units"])
        print(f"{lay['layer']:>5} {lay['total']:>+10.3f}  {units}")
    print("what makes the strongest units fire (TEXT_FILE: any text, e.g. a Wikipedia dump):")
    for lay in sorted(r["layers"], key=lambda x: -x["units"][0][1])[:3]:
        print(f"  {lay['neurons'][0]}")
    return 0
