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
    p.add_argument("--features", action="append", default=[], metavar="DIR",
                   help="also attribute to the latents of this transcoder (ffnlab features train), spliced at its "
                        "layer: latent j's attribution = activation x W_dec[j] . direction (repeatable)")
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
    if args.features:
        from ..interventions.attribution import attribute_latents
        r["transcoders"] = attribute_latents(model, ids, target, transcoders(model, args.features), args.top)
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
    for t in r.get("transcoders", []):
        up = "  ".join(f"{j}: {a:+.3f}" for j, a, _ in t["latents"]) or "-"
        down = "  ".join(f"{j}: {a:+.3f}" for j, a, _ in t["negative"]) or "-"
        print(f"{t['layer']:>5} {t['ffn_out']:>+10.3f}  latents of {t['features']} ({t['firing']} firing; latent: "
              f"activation x W_dec row . direction; b_dec {t['b_dec']:+.3f}, error {t['error']:+.3f}"
              + (f", skip {t['skip']:+.3f}" if t["skip"] else "") + f"): {up}  |  {down}")
        best = (t["latents"] + t["negative"])
        if best:
            j = max(best, key=lambda e: abs(e[1]))[0]
            print(f"        its pages: ffnlab features show {t['features']}{m} --features {j} --data TEXT_FILE")
    print("what makes the strongest units fire (TEXT_FILE: any text, e.g. a Wikipedia dump):")
    strongest = sorted(((abs(a), lay["layer"], u) for lay in r["layers"] for u, a, _ in lay["units"] + lay["negative"]),
                       reverse=True)[:3]
    for _, il, u in strongest:
        print(f"  ffnlab neurons{m} --layer {il} --neuron {u} --data TEXT_FILE")
    return 0


def transcoders(model, dirs):
    """--features DIRs -> [(dir, params, DictConfig, in node, out node)], each checked against the model and
    writing an MLP's output (ffn_out-L), one per layer"""
    from ..errors import UsageError
    from ..features.harvest import dictionary_for
    out, seen = [], {}
    for d in dirs:
        p, cfg, _, in_node, out_node = dictionary_for(model, d)
        if not out_node.startswith("ffn_out-"):
            raise UsageError(f"--features {d}: it writes {out_node}; latent attribution reads dictionaries that "
                             f"write an MLP's output, ffn_out-L (a transcoder's target)")
        if out_node in seen:
            raise UsageError(f"--features {d} and {seen[out_node]} both write {out_node}; give one per layer")
        seen[out_node] = d
        out.append((d, p, cfg, in_node, out_node))
    return out


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
