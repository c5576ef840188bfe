"""`ffnlab features train|eval|show`: sparse dictionaries (transcoders, SAEs) on a model's MLP, in SAELens's format."""
import json
import os
import sys

COMMAND = "features"
HELP = "MLP features: train a transcoder or SAE on a layer, evaluate it spliced into the forward, show its features"


def add_arguments(p):
    from ..features import ABLATIONS
    from .common import add_model_argument, nonneg, positive, positive_float
    from .neurons import add_min_context_argument
    p.add_argument("action", choices=("train", "eval", "show"),
                   help="train: fit a dictionary into --out; eval DIR: its metrics spliced into the model; "
                        "show DIR: its feature pages")
    p.add_argument("dir", nargs="?", default=None, metavar="DIR", help="eval/show: the dictionary directory "
                                                                         "(cfg.json + sae_weights.safetensors)")
    add_model_argument(p)
    p.add_argument("--data", help="UTF-8 text file: the training corpus (train) or held-out text (eval, show)")
    p.add_argument("--layer", type=int, help="train: block index L")
    p.add_argument("--kind", choices=("transcoder", "skip-transcoder", "sae"), default="transcoder",
                   help="transcoder: ffn_norm-L -> ffn_out-L (default); skip-transcoder: with a linear skip; "
                        "sae: reconstructs --site")
    p.add_argument("--site", default=None, metavar="NODE", help="--kind sae: the node to reconstruct (default l_out-L)")
    p.add_argument("--width", type=positive("--width"), default=None, help="latents (default: --expansion x d_model)")
    p.add_argument("--expansion", type=positive("--expansion"), default=8, help="latents per model dimension (default 8)")
    p.add_argument("--act", choices=("topk", "batchtopk", "jumprelu", "relu"), default="topk",
                   help="latent activation (default topk)")
    p.add_argument("--k", type=positive("--k"), default=32, help="topk/batchtopk: latents per token (default 32)")
    p.add_argument("--l1", type=nonneg("--l1", float), default=None,
                   help="relu: the decoder-norm-weighted L1 coefficient (default 5); jumprelu: the L0 coefficient "
                        "(default 0.01)")
    p.add_argument("--tokens", type=positive("--tokens"), default=None,
                   help="train: tokens to train on (default 200000; the corpus repeats if shorter); eval/show: "
                        "tokens to read at most (default 20000)")
    p.add_argument("--out", default=None, metavar="DIR", help="train: the directory to write (created)")
    p.add_argument("--resume", action="store_true", help="train: continue the run in --out from its last checkpoint")
    p.add_argument("--batch", type=positive("--batch"), default=1024, help="train: tokens per step (default 1024)")
    p.add_argument("--lr", type=positive_float("--lr"), default=3e-4, help="train: peak learning rate (default 3e-4)")
    p.add_argument("--warmup", type=nonneg("--warmup"), default=None, help="train: warm-up steps (default 5%% of them)")
    p.add_argument("--seed", type=nonneg("--seed"), default=0, help="train: seed of the init and the batches (default 0)")
    p.add_argument("--buffer-mb", type=positive_float("--buffer-mb"), default=64.0,
                   help="train: memory of the shuffled activation buffer in MiB (default 64)")
    p.add_argument("--normalize", choices=("scale", "none"), default="scale",
                   help="train: scale each site by a constant to mean row norm sqrt(width) while training, folded "
                        "into the saved weights (default scale; SAELens's expected_average_only_in); none: as they are")
    p.add_argument("--b-dec-init", choices=("mean", "zero"), default="mean",
                   help="train: b_dec's start, the targets' mean in the first buffer (default) or zero (SAELens 6's): "
                        "on an SAE the mean gives a lower FVU, zero a higher CE loss score; on a transcoder the mean did "
                        "better on both (docs/features.md)")
    p.add_argument("--dead-window", type=positive("--dead-window"), default=None,
                   help="train: a latent is dead after this many tokens without firing (default: a tenth of --tokens, "
                        "at least one batch and at most 100000, so that AuxK can act within a short run)")
    p.add_argument("--ckpt-every", type=nonneg("--ckpt-every"), default=50,
                   help="train: steps between checkpoints, 0 = only at the end (default 50)")
    p.add_argument("--ctx", type=positive("--ctx"), default=128, help="window length in tokens (default 128)")
    add_min_context_argument(p)
    p.add_argument("--windows", type=positive("--windows"), default=4, help="windows per forward (default 4)")
    p.add_argument("--compare-model", metavar="FILE", default=None,
                   help="eval: also evaluate on this other file of the same model (another quantization), on the "
                        "same tokens: the gap in FVU and CE loss score, and each latent's activation correlation "
                        "and density change between the two")
    p.add_argument("--compare-arith", choices=("f32", "ggml"), default=None,
                   help="eval: the second side's arithmetic (default: --arith); alone, -m's model in the other "
                        "arithmetic")
    p.add_argument("--ablation", choices=ABLATIONS, default="zero",
                   help="eval: what replaces the site for CE_ablated: zero (at every position, as SAELens's "
                        "run_evals; default), zero-after-first (every position but each window's first) or mean "
                        "(the site's mean, every position but the first)")
    p.add_argument("--features", default=None, metavar="I,J,...", help="show: these latents (default: the --top-n densest)")
    p.add_argument("--top-n", type=positive("--top-n"), default=10, help="show: how many latents without --features")
    p.add_argument("--top", type=positive("--top"), default=5, help="show: text windows per latent (default 5)")
    p.add_argument("--html", metavar="OUT.html", help="show: write one self-contained page of every shown latent")
    p.add_argument("--neuronpedia", metavar="OUTDIR", default=None,
                   help="show: also write OUTDIR/<latent>.json for each shown latent, in Neuronpedia's feature fields "
                        "(as SAEDashboard's Neuronpedia export writes them)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args):
    from ..errors import UsageError
    if args.action == "train":
        if args.dir is not None:
            raise UsageError(f"features train writes --out DIR; the positional {args.dir!r} is for eval and show")
        return train(args)
    if args.dir is None:
        raise UsageError(f"features {args.action} needs the dictionary directory: ffnlab features {args.action} DIR")
    if args.action != "eval" and (args.compare_model or args.compare_arith):
        raise UsageError(f"--compare-model and --compare-arith are flags of features eval, not features {args.action}")
    return evaluate(args) if args.action == "eval" else show(args)


# --- train ---------------------------------------------------------------------------------------
def _settings_and_cfg(args, model):
    from ..errors import UsageError
    from ..features.dictionary import DictConfig
    from ..features.harvest import check_sites, sites
    from ..features.trainer import FeatureSettings
    from .common import refuse_moe
    cfg = model.config
    if args.layer is None:
        raise UsageError("features train needs --layer L")
    if not 0 <= args.layer < cfg.n_layer:
        raise UsageError(f"--layer {args.layer} is out of range: {model.source} has {cfg.n_layer} layers "
                         f"(0..{cfg.n_layer - 1})")
    if args.kind != "sae":
        refuse_moe(cfg, model.source, "features train --kind " + args.kind)
    in_node, out_node = sites(args.kind, args.layer, args.site)
    check_sites(model, [in_node, out_node])
    from ..interventions.api import node_shapes
    shapes = node_shapes(model)
    d_in, d_out = shapes[in_node][-1], shapes[out_node][-1]
    width = args.width or args.expansion * d_in
    if args.act in ("topk", "batchtopk") and args.k > width:
        raise UsageError(f"--k {args.k} is larger than the dictionary's width {width}")
    if args.l1 is not None and args.act not in ("relu", "jumprelu"):
        raise UsageError(f"--l1 is the sparsity coefficient of relu and jumprelu; --act {args.act} is sparse by --k")
    coef = args.l1 if args.l1 is not None else {"relu": 5.0, "jumprelu": 0.01}.get(args.act, 0.0)
    if args.min_context >= args.ctx - 1:
        raise UsageError(f"--min-context {args.min_context} leaves nothing to score in a window of --ctx {args.ctx}")
    if args.ctx > cfg.n_ctx:
        raise UsageError(f"--ctx {args.ctx} is longer than the model's context length {cfg.n_ctx} ({model.source})")
    dcfg = DictConfig(args.kind, args.act, d_in, width, d_out, k=args.k)
    tokens = args.tokens or 200_000
    dead_window = args.dead_window or max(args.batch, min(100_000, tokens // 10))
    s = FeatureSettings(tokens=tokens, batch=args.batch, lr=args.lr,
                        warmup=-1 if args.warmup is None else args.warmup, coef=coef, dead_window=dead_window,
                        seed=args.seed, buffer_mb=args.buffer_mb, ckpt_every=args.ckpt_every, normalize=args.normalize,
                        b_dec_init=args.b_dec_init)
    return dcfg, s, in_node, out_node


def _windows(args, model, text):
    import numpy as np
    from ..errors import DataError
    from ..evaluation.activations import context_windows
    if model.tokenizer is None:
        raise DataError(f"{model.source}: the model has no tokenizer, so it cannot read {args.data}")
    tok = model.tokenizer
    ids = np.array(tok.encode(text, add_bos=False), dtype=np.int64)
    bos = tok.bos_id if tok.add_bos and tok.bos_id is not None else None
    cw = context_windows(ids, args.ctx, args.min_context, bos)
    if cw.n_scored == 0:
        raise DataError(f"{args.data}: {len(ids)} tokens, none with --min-context {args.min_context} tokens before it")
    return cw, ids


def train(args):
    import dataclasses

    from ..errors import UsageError
    from ..features.harvest import ActivationBuffer, Harvest
    from ..features.trainer import TRAINER_FILE, FeatureSettings, Trainer
    from ..formats.installed import resolve_model
    from ..progress import Progress
    from ..training.data import read_text
    from .common import load_model
    from ..runtime.executor import file_digest
    if not args.out:
        raise UsageError("features train needs --out DIR")
    record_path = os.path.join(args.out, TRAINER_FILE)
    record = None
    if os.path.isfile(record_path):
        if not args.resume:
            raise UsageError(f"--out {args.out} already holds a features run; add --resume to continue it or choose "
                             f"another --out")
        from ..formats.jsonfile import read_json_object
        record = read_json_object(record_path)
    elif os.path.exists(args.out) and (not os.path.isdir(args.out) or os.listdir(args.out)):
        raise UsageError(f"--out {args.out} exists and is not an empty directory")
    if not args.data:
        raise UsageError("features train needs --data TEXT")
    text = read_text(args.data)
    model_path = resolve_model(args.model)
    model = load_model(args)
    dcfg, s, in_node, out_node = _settings_and_cfg(args, model)
    digest = file_digest(model_path) if os.path.isfile(model_path) else None
    if record is not None:
        saved = {**dataclasses.asdict(FeatureSettings()), **record.get("settings", {})}   # fields added since: defaults
        if saved != dataclasses.asdict(s) or record.get("config") != dataclasses.asdict(dcfg):
            raise UsageError(f"--resume: the flags differ from the run in {args.out} (settings {saved}); give the "
                             f"same flags as the first command")
    cw, ids = _windows(args, model, text)
    rows = ActivationBuffer.rows_for(s.buffer_mb, dcfg.d_in, dcfg.d_out)
    if rows < 2 * s.batch:
        raise UsageError(f"--buffer-mb {s.buffer_mb} holds {rows} rows, fewer than two batches of --batch {s.batch}")
    meta = {"model_name": os.path.basename(str(model_path)), "hook_name": in_node, "hook_name_out": out_node,
            "ffnlab": {"model_sha256": digest, "model_arith": args.arith, "site_in": in_node, "site_out": out_node,
                       "layer": args.layer, "n_vocab": model.config.vocab_size, "data_sha256": file_digest(args.data),
                       "ctx": args.ctx, "min_context": args.min_context, "b_dec_init": "mean"}}
    if record is not None and record.get("model_sha256", digest) != digest:
        raise UsageError(f"--resume: {args.out} was trained on another model file")
    harvest = Harvest(model, cw, in_node, out_node, ActivationBuffer(rows, dcfg.d_in, dcfg.d_out, s.seed + 1),
                      args.windows)
    trainer = Trainer(dcfg, s, harvest, meta)
    os.makedirs(args.out, exist_ok=True)
    if record is not None:
        trainer.load(args.out, record)
    bar = Progress(s.steps, f"features train {in_node} -> {out_node}" if in_node != out_node else
                   f"features train {in_node}", unit="step")
    bar.update(trainer.step)
    import time
    t0, n0 = time.perf_counter(), trainer.step

    every = s.ckpt_every or max(1, s.steps // 20)      # unwatched (a log file): a plain line this often
    plain = not bar.enabled and not args.json

    def on_step(rec):
        dt = time.perf_counter() - t0
        note = (f"{(trainer.step - n0) * s.batch / max(dt, 1e-9):.0f} tok/s, "
                f"loss {rec['loss']:.4g}, mse {rec['mse']:.4g}, "     # loss: mse + aux | l1 | l0_loss, as minimised
                f"L0 {rec['l0']:.1f}, FVU {'n/a' if rec['fvu'] is None else format(rec['fvu'], '.3f')}, "   # None: a constant target
                f"dead {100 * rec['dead']:.1f}%")
        bar.update(1, note)
        if plain and (trainer.step % every == 0 or trainer.step == s.steps):
            bar.write(f"step {trainer.step}/{s.steps}: {note}")
    trainer.run(args.out, on_step)
    seconds = bar.close()
    last = trainer.history[-1] if trainer.history else {}
    summary = {"out": args.out, "model": model.source, "arith": args.arith, "kind": dcfg.kind, "act": dcfg.act,
               "site_in": in_node, "site_out": out_node, "d_in": dcfg.d_in, "d_sae": dcfg.d_sae, "k": dcfg.k,
               "steps": trainer.step, "tokens": trainer.step * s.batch, "last": last,
               "tokens_per_s": round((trainer.step - n0) * s.batch / max(seconds, 1e-9), 1),
               "corpus_tokens": int(len(ids)), "epochs_started": harvest.epoch + 1, "buffer_rows": rows}
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"{dcfg.kind} {in_node} -> {out_node}: {dcfg.d_sae} latents ({dcfg.act}), {trainer.step} steps of "
              f"{s.batch} tokens; last step loss {last.get('loss', float('nan')):.4g}, mse "
              f"{last.get('mse', float('nan')):.4g}, L0 {last.get('l0', 0):.1f}, "
              f"FVU {last.get('fvu') or float('nan'):.3f}, dead {100 * last.get('dead', 0):.1f}%; "
              f"{summary['tokens_per_s']:.0f} tok/s; wrote {args.out} (try: ffnlab features eval {args.out} "
              f"--data HELDOUT)")
    return 0


# --- eval and show -------------------------------------------------------------------------------
def _load_for(args):
    """DIR + -m -> (model, params, cfg, cfg dict, in node, out node), the dictionary checked against the model"""
    from ..features.harvest import dictionary_for
    from ..features.saelens_io import load as load_dictionary
    from ..formats.installed import resolve_model
    from .common import load_model
    from ..runtime.executor import file_digest
    loaded = load_dictionary(args.dir)                    # a bad directory is refused before the model loads
    model_path = resolve_model(args.model)
    model = load_model(args)
    p, dcfg, d, in_node, out_node = dictionary_for(model, args.dir, loaded)
    ours = d.get("ffnlab") if isinstance(d.get("ffnlab"), dict) else {}
    # another file of the same model (another quantization: the quantization gap) is allowed; it is reported
    want = ours.get("model_sha256")
    args.same_model_file = (file_digest(model_path) == want) if want and os.path.isfile(model_path) else None
    return model, p, dcfg, d, in_node, out_node


def evaluate(args):
    from ..features.evaluate import evaluate_dictionary
    from ..training.data import read_text
    from ..errors import UsageError
    if not args.data:
        raise UsageError("features eval needs --data HELDOUT")
    text = read_text(args.data)
    model, p, dcfg, d, in_node, out_node = _load_for(args)
    second = _second_model(args, model, (p, dcfg, d)) if args.compare_model or args.compare_arith else None
    cw, _ = _windows(args, model, text)
    tokens = args.tokens or 20_000
    m = _metrics(evaluate_dictionary(model, p, dcfg, cw, in_node, out_node, tokens, args.windows, args.ablation))
    m.update({"dir": args.dir, "model": model.source, "arith": args.arith, "site_in": in_node, "site_out": out_node,
              "same_model_file": args.same_model_file})
    if second is not None:
        from ..features.compare import compare_latents, summary
        model_b, arith_b = second
        mb = _metrics(evaluate_dictionary(model_b, p, dcfg, cw, in_node, out_node, tokens, args.windows, args.ablation))
        gap = {k: mb[k] - m[k] for k in ("fvu", "mse", "l0", "ce_loss_score", "kl_score", "ce_spliced", "ce_clean")}
        lat = summary(compare_latents(model, model_b, p, dcfg, cw, in_node, tokens, args.windows))
        m["compare"] = {"model": model_b.source, "arith": arith_b, **mb, "gap": gap, "latents": lat}
    if args.json:
        print(json.dumps(m))
        return 0
    print(f"{args.dir} on {model.source} ({args.arith}), {in_node} -> {out_node}, {m['tokens']} tokens:")
    _print_metrics(m, args.ablation)
    if second is not None:
        c, g, lat = m["compare"], m["compare"]["gap"], m["compare"]["latents"]
        print(f"on {c['model']} ({c['arith']}), the same tokens:")
        _print_metrics(c, args.ablation)
        print(f"  gap (second - first): FVU {g['fvu']:+.4f}  CE loss score {g['ce_loss_score']:+.4f}  KL score "
              f"{g['kl_score']:+.4f}  L0 {g['l0']:+.2f}")
        fmt = (lambda v: "-" if v is None else f"{v:.4f}")
        print(f"  latents ({lat['alive']} firing on either side): activation correlation mean "
              f"{fmt(lat['correlation_mean'])}, median {fmt(lat['correlation_median'])}; mean |density change| "
              f"{lat['density_change_mean_abs']:.3g}")
        print(f"  {'latent':>8} {'correlation':>12} {'density':>10} {'second':>10}   (lowest correlation)")
        for e in lat["lowest_correlation"][:5]:
            print(f"  {e['latent']:>8} {fmt(e['correlation']):>12} {e['density']:>10.4g} {e['density_compare']:>10.4g}")
        print(f"  {'latent':>8} {'correlation':>12} {'density':>10} {'second':>10}   (largest density change)")
        for e in lat["largest_density_change"][:5]:
            print(f"  {e['latent']:>8} {fmt(e['correlation']):>12} {e['density']:>10.4g} {e['density_compare']:>10.4g}")
    return 0


def _metrics(m):
    m.pop("density")
    return m


def _print_metrics(m, ablation):
    print(f"  L0 {m['l0']:.2f}  FVU {m['fvu']:.4f}  explained variance {m['explained_variance']:.4f}  "
          f"MSE {m['mse']:.4g}  dead {100 * m['dead_fraction']:.1f}%  dense {100 * m['dense_fraction']:.1f}%")
    print(f"  CE clean {m['ce_clean']:.4f}  spliced {m['ce_spliced']:.4f}  {ablation}-ablated "
          f"{m['ce_ablated']:.4f}  CE loss score {m['ce_loss_score']:.4f}  KL spliced {m['kl_spliced']:.4f}  "
          f"KL score {m['kl_score']:.4f}")


def _second_model(args, model, loaded):
    """--compare-model / --compare-arith -> (the second model, its arithmetic), checked to be the same model as
    -m's (layers, width, vocabulary) and to differ from it in its file or its arithmetic"""
    import argparse

    from ..errors import UsageError
    from ..features.harvest import dictionary_for
    from ..formats.installed import resolve_model
    from .common import load_model
    path_a = os.path.realpath(resolve_model(args.model))
    other = args.compare_model or args.model
    arith_b = args.compare_arith or args.arith
    path_b = resolve_model(other)
    if os.path.realpath(path_b) == path_a and arith_b == args.arith:
        raise UsageError(f"--compare-model {other} with --arith {arith_b} is the first model itself; give another "
                         f"file of the model (--compare-model) or the other arithmetic (--compare-arith)")
    model_b = load_model(argparse.Namespace(model=other, arith=arith_b))
    a, b = model.config, model_b.config
    for field in ("n_layer", "d_model", "vocab_size"):
        if getattr(a, field) != getattr(b, field):
            raise UsageError(f"--compare-model {other} is not the same model as {model.source} ({field} "
                             f"{getattr(b, field)}, against {getattr(a, field)})")
    dictionary_for(model_b, args.dir, loaded)
    return model_b, arith_b


def show(args):
    from ..errors import UsageError
    from ..features.neuronpedia import source_of, write_features
    from ..features.pages import bin_label, feature_pages, write_html
    from ..pictures import check_folder, check_page, model_label, written
    from ..training.data import read_text
    if not args.data:
        raise UsageError("features show needs --data TEXT (the windows its features are shown on)")
    check_page(args.html, "--html")
    if args.neuronpedia is not None:
        check_folder(args.neuronpedia, "--neuronpedia")
    text = read_text(args.data)
    model, p, dcfg, d, in_node, out_node = _load_for(args)
    latents = None
    if args.features:
        try:
            latents = [int(v) for v in args.features.split(",")]
        except ValueError:
            raise UsageError(f"--features must be latent numbers separated by commas, got {args.features!r}") from None
        bad = [j for j in latents if not 0 <= j < dcfg.d_sae]
        if bad:
            raise UsageError(f"--features {bad[0]} is out of range: {args.dir} has {dcfg.d_sae} latents")
    cw, ids = _windows(args, model, text)
    pages = feature_pages(model, p, dcfg, cw, ids, in_node, out_node, latents, args.top_n, args.top,
                          args.tokens or 20_000, args.windows)
    if args.json:
        print(json.dumps({"dir": args.dir, "model": model.source, **pages}, ensure_ascii=False))
    else:
        print(f"{args.dir}: {dcfg.d_sae} latents, {pages['tokens']} tokens of {args.data}")
        for f in pages["features"]:
            print(f"\nlatent {f['latent']}  density {f['density']:.4g}  max {f['max']:.4g}")
            print("  logits +: " + " ".join(repr(t["token"]) for t in f["logits_pos"][:8]))
            print("  logits -: " + " ".join(repr(t["token"]) for t in f["logits_neg"][:8]))
            nb = f.get("neurons") or {}
            for k, what in (("down", "decoder row . down column"), ("up", "encoder column . up row"),
                            ("gate", "encoder column . gate row")):
                if k in nb:
                    print(f"  neurons of layer {nb['layer']} ({what}): "
                          + "  ".join(f"{e['neuron']} {e['cosine']:+.2f}" for e in nb[k]))
            for w in f["windows"]:
                print(f"  {w['value']:+9.4g}  {w['text']!r}")
            for q in f["quantiles"]:
                print(f"  {bin_label(q)}")
                for w in q["windows"]:
                    print(f"    {w['value']:+9.4g}  {w['text']!r}")
    sys.stdout.flush()
    if args.html:
        with written(args.html, "--html"):
            write_html(args.html, pages, args.dir, model.source)
        print(f"wrote {args.html} ({len(pages['features'])} latents)", file=sys.stderr)
    if args.neuronpedia is not None:
        with written(args.neuronpedia, "--neuronpedia"):
            write_features(args.neuronpedia, pages, *source_of(d, args.dir, out_node, model_label(model)))
        print(f"wrote {args.neuronpedia}/<latent>.json ({len(pages['features'])} latents)", file=sys.stderr)
    return 0
