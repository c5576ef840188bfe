"""A TopK SAE trained by ffnlab against one trained by SAELens's own trainer, with the same recipe on the same
activations and budget, both evaluated by `features eval`'s code (which equals SAELens's run_evals:
scripts/saelens_evals.py) on the same held-out text.

    python3 scripts/saelens_quality.py --data train.txt --heldout heldout.txt --rows 262144 --out DIR \
        [-m smollm2] [--layer 12] [--width 4608] [--k 32] [--batch 512] [--lr 1e-3] [--eval-tokens 20000] \
        [--seeds 0,1,2] [--variant as-is|bdec0|project]

The rows: l_out-L of the model on the first windows of --data (ffnlab's harvest, f32 arithmetic), shuffled once
with seed 0 and saved (DIR/rows.npy). ffnlab: `features train`'s Trainer on those rows (ArrayHarvest: its own
buffer and draws, one pass). SAELens: SAETrainer on the same rows in their saved order
(tests/reference/features_saelens_train.py says how the recipe maps onto its options). One SAE per seed from
each side (the seed draws the initial weights; ffnlab's also its buffer's draws), each kept in DIR/NAME-sSEED
with its evaluation (eval.json), so a second call with more seeds trains only the new ones. --variant changes
one thing in ffnlab's recipe (DIR/ffnlab-VARIANT-sSEED): bdec0 starts b_dec at zero, as SAELens does, instead of
at the rows' mean; project removes from W_dec's gradient its component along each row before the step (the
part that renormalising the rows undoes; SAELens's rescale_acts_by_decoder_norm differentiates through the
row norms, which leaves that component out). Prints a row per SAE and, over the seeds, ffnlab - SAELens with Welch's 95% interval (the two sides' seeds do not pair).
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

VARIANTS = ("as-is", "bdec0", "project")
HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "tests", "reference")
sys.path.insert(0, REFERENCE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--data", required=True)
    ap.add_argument("--heldout", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--layer", type=int, default=12)
    ap.add_argument("--rows", type=int, default=262144)
    ap.add_argument("--width", type=int, default=4608)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-tokens", type=int, default=20000)
    ap.add_argument("--seeds", default="0", help="comma-separated seeds, each trained on both sides")
    ap.add_argument("--variant", choices=VARIANTS, default="as-is",
                    help="ffnlab's recipe: as-is; bdec0: b_dec starts at zero (SAELens's start); project: W_dec's "
                         "gradient without its component along each (unit) row")
    ap.add_argument("-t", "--threads", type=int, default=1)
    args = ap.parse_args()
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ[var] = str(args.threads)

    import ffnlab
    from ffnlab.evaluation.activations import DEFAULT_MIN_CONTEXT, context_windows
    from ffnlab.features import saelens_io
    from ffnlab.features.dictionary import DictConfig
    from ffnlab.features.evaluate import evaluate_dictionary
    from ffnlab.features.harvest import ActivationBuffer, ArrayHarvest, stream_rows
    from ffnlab.features.trainer import FeatureSettings, Trainer
    from ffnlab.experiments.stats import summary, unpaired
    from ffnlab.formats.installed import resolve_model
    import pytest
    from saelens_env import saelens_python
    try:
        py = saelens_python()
    except pytest.skip.Exception as e:
        raise SystemExit(f"SAELens: {e}") from None

    os.makedirs(args.out, exist_ok=True)
    model = ffnlab.load(resolve_model(args.model), progress=False)
    tok = model.tokenizer
    site = f"l_out-{args.layer}"

    def windows(path):
        with open(path, encoding="utf-8") as f:
            ids = np.array(tok.encode(f.read(), add_bos=False), dtype=np.int64)
        return context_windows(ids, 128, DEFAULT_MIN_CONTEXT, tok.bos_id if tok.add_bos else None)

    rows_path = os.path.join(args.out, "rows.npy")
    if not os.path.exists(rows_path):
        # row i of the harvest goes to place where[i] of the file: the file is the harvest permuted once
        # (file[j] = harvest[perm[j]]), written as the rows arrive, so memory holds one chunk, not the rows
        where = np.argsort(np.random.default_rng(0).permutation(args.rows))
        part = rows_path + ".part"
        n, t, mm = 0, time.perf_counter(), None
        for _, x, _ in stream_rows(model, windows(args.data), site, site, 4):
            if mm is None:
                mm = np.lib.format.open_memmap(part, "w+", np.float32, (args.rows, x.shape[1]))
            x = x[:args.rows - n]
            mm[where[n:n + len(x)]] = x
            n += len(x)
            if n >= args.rows:
                break
        if n < args.rows:
            if mm is not None:
                del mm
                os.remove(part)
            raise SystemExit(f"{args.data}: {n} rows, fewer than --rows {args.rows}")
        mm.flush()
        del mm
        os.replace(part, rows_path)
        print(f"harvest: {n} rows of {site} in {time.perf_counter() - t:.0f} s", flush=True)
    x = np.load(rows_path, mmap_mode="r")
    steps = len(x) // args.batch
    cfg = DictConfig(kind="sae", act="topk", d_in=x.shape[1], d_sae=args.width, d_out=x.shape[1], k=args.k)
    held = windows(args.heldout)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "src"), REFERENCE]))

    buffer_rows = ActivationBuffer.rows_for(FeatureSettings().buffer_mb, cfg.d_in, cfg.d_out)

    def recipe(seed):
        """ffnlab's settings for one seed, and the same recipe in the words of SAELens's side."""
        s = FeatureSettings(tokens=steps * args.batch, batch=args.batch, lr=args.lr, dead_window=len(x) // 10,
                            ckpt_every=0, normalize="scale", seed=seed,
                            project_decoder_grad=args.variant == "project",
                            b_dec_init="zero" if args.variant == "bdec0" else "mean")
        theirs = {"d_sae": args.width, "k": args.k, "batch": args.batch, "steps": steps, "lr": args.lr,
                  "warmup": s.warmup_steps(), "dead_steps": s.dead_window // args.batch,
                  "norm_batches": max(1, buffer_rows // args.batch), "threads": args.threads, "seed": seed}
        return s, theirs

    def train_ffnlab(s, out):
        buffer = ActivationBuffer(buffer_rows, cfg.d_in, cfg.d_out, 1)
        trainer = Trainer(cfg, s, ArrayHarvest(np.asarray(x), np.asarray(x), buffer), {})
        t = time.perf_counter()
        trainer.init_b_dec()
        while trainer.step < s.steps:
            trainer.train_step()
        seconds = time.perf_counter() - t
        saelens_io.save(out, trainer.params(), cfg, saelens_io.cfg_dict(cfg, site, site, args.model, {}))
        return seconds

    def train_saelens(theirs, out):
        r = subprocess.run([py, os.path.join(REFERENCE, "features_saelens_train.py"), rows_path, out,
                            json.dumps(theirs)], capture_output=True, env=env)
        if r.returncode:
            raise SystemExit(r.stderr.decode()[-3000:])
        return json.loads(r.stdout.decode().strip().splitlines()[-1])["seconds"]

    ours = "ffnlab" if args.variant == "as-is" else f"ffnlab-{args.variant}"
    runs = {ours: {}, "SAELens": {}}
    for seed in [int(v) for v in args.seeds.split(",")]:
        s, theirs = recipe(seed)
        for name in (ours, "SAELens"):
            d = os.path.join(args.out, f"{name.lower()}-s{seed}")
            done = os.path.join(d, "eval.json")
            if not os.path.exists(done):
                os.makedirs(d, exist_ok=True)
                seconds = train_saelens(theirs, d) if name == "SAELens" else train_ffnlab(s, d)
                p, c, _ = saelens_io.load(d)
                m = evaluate_dictionary(model, p, c, held, site, site, args.eval_tokens, 4)
                m.pop("density")
                m["train_seconds"] = seconds
                with open(done, "w") as f:
                    json.dump({"seed": seed, "settings": theirs, **m}, f, indent=1)
            with open(done) as f:
                runs[name][seed] = json.load(f)

    some = next(iter(runs[ours].values()))
    print(f"TopK SAE on {site}, {args.width} latents, k {args.k}: {len(x)} rows ({steps} steps of {args.batch}); "
          f"held out: {some['tokens']} tokens of {args.heldout}; ffnlab's recipe: {args.variant}")
    print("| trainer | seed | FVU | L0 | CE spliced | CE loss score | KL score | dead | dense | train seconds |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for name in runs:
        for seed, m in sorted(runs[name].items()):
            print(f"| {name} | {seed} | {m['fvu']:.4f} | {m['l0']:.1f} | {m['ce_spliced']:.4f} | {m['ce_loss_score']:.4f} | "
                  f"{m['kl_score']:.4f} | {100 * m['dead_fraction']:.1f}% | {100 * m['dense_fraction']:.2f}% | "
                  f"{m['train_seconds']:.0f} |")
    table = {}
    for key in ("fvu", "ce_loss_score", "kl_score"):
        a, b = [m[key] for m in runs[ours].values()], [m[key] for m in runs["SAELens"].values()]
        table[key] = {ours: summary(a), "SAELens": summary(b), "difference": unpaired(a, b)}
        u = table[key]["difference"]
        if len(a) < 2 or len(b) < 2:
            print(f"{key}: {ours} {np.mean(a):.4f}, SAELens {np.mean(b):.4f}; difference {u['mean']:+.4f} "
                  "(no interval: it needs two seeds a side)")
            continue
        print(f"{key}: {ours} {np.mean(a):.4f} (sd {table[key][ours]['sd']:.4f}), SAELens {np.mean(b):.4f} "
              f"(sd {table[key]['SAELens']['sd']:.4f}); difference {u['mean']:+.4f} [{u['lo']:+.4f}, {u['hi']:+.4f}]")
    with open(os.path.join(args.out, f"results-{ours}.json"), "w") as f:
        json.dump({"rows": len(x), "runs": runs, "summary": table}, f, indent=1)


if __name__ == "__main__":
    main()
