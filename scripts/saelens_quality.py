"""A TopK SAE trained by ffnlab against one trained by SAELens's own trainer, with the same recipe on the same
activations and budget, both evaluated by `features eval`'s code (which equals SAELens's run_evals:
scripts/saelens_evals.py) on the same held-out text.

    python3 scripts/saelens_quality.py --data train.txt --heldout heldout.txt --rows 262144 --out DIR \
        [-m smollm2] [--layer 12] [--width 4608] [--k 32] [--batch 512] [--lr 1e-3] [--eval-tokens 20000]

The rows: l_out-L of the model on the first windows of --data (ffnlab's harvest, f32 arithmetic), shuffled once
with seed 0 and saved (DIR/rows.npy). ffnlab: `features train`'s Trainer on those rows (ArrayHarvest: its own
buffer and draws, one pass). SAELens: SAETrainer on the same rows in their saved order
(tests/reference/features_saelens_train.py says how the recipe maps onto its options). Prints a table.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

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
        xs, n, t = [], 0, time.perf_counter()
        for _, x, _ in stream_rows(model, windows(args.data), site, site, 4):
            xs.append(x)
            n += len(x)
            if n >= args.rows:
                break
        x = np.concatenate(xs)[:args.rows]
        if len(x) < args.rows:
            raise SystemExit(f"{args.data}: {len(x)} rows, fewer than --rows {args.rows}")
        x = x[np.random.default_rng(0).permutation(len(x))]
        np.save(rows_path, x)
        print(f"harvest: {len(x)} rows of {site} in {time.perf_counter() - t:.0f} s", flush=True)
    x = np.load(rows_path)
    steps = len(x) // args.batch
    cfg = DictConfig(kind="sae", act="topk", d_in=x.shape[1], d_sae=args.width, d_out=x.shape[1], k=args.k)
    s = FeatureSettings(tokens=steps * args.batch, batch=args.batch, lr=args.lr, dead_window=len(x) // 10,
                        ckpt_every=0, normalize="scale")
    buffer = ActivationBuffer(ActivationBuffer.rows_for(s.buffer_mb, cfg.d_in, cfg.d_out), cfg.d_in, cfg.d_out, 1)
    trainer = Trainer(cfg, s, ArrayHarvest(x, x, buffer), {})
    ours_dir, theirs_dir = os.path.join(args.out, "ffnlab"), os.path.join(args.out, "saelens")
    t = time.perf_counter()
    trainer.init_b_dec()
    while trainer.step < s.steps:
        trainer.train_step()
    t_ours = time.perf_counter() - t
    os.makedirs(ours_dir, exist_ok=True)
    saelens_io.save(ours_dir, trainer.params(), cfg, saelens_io.cfg_dict(cfg, site, site, args.model, {}))
    settings = {"d_sae": args.width, "k": args.k, "batch": args.batch, "steps": steps, "lr": args.lr,
                "warmup": s.warmup_steps(), "dead_steps": s.dead_window // args.batch,
                "norm_batches": max(1, buffer.capacity // args.batch), "threads": args.threads}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "src"), REFERENCE]))
    r = subprocess.run([py, os.path.join(REFERENCE, "features_saelens_train.py"), rows_path, theirs_dir,
                        json.dumps(settings)], capture_output=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr.decode()[-3000:])
    theirs_run = json.loads(r.stdout.decode().strip().splitlines()[-1])
    held = windows(args.heldout)
    results = {}
    for name, d in (("ffnlab", ours_dir), ("SAELens", theirs_dir)):
        p, c, _ = saelens_io.load(d)
        m = evaluate_dictionary(model, p, c, held, site, site, args.eval_tokens, 4)
        m.pop("density")
        results[name] = m
    results["train_seconds"] = {"ffnlab": t_ours, "SAELens": theirs_run["seconds"]}
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"settings": settings, "rows": len(x), **results}, f, indent=1)
    a, b = results["ffnlab"], results["SAELens"]
    print(f"TopK SAE on {site}, {args.width} latents, k {args.k}: {len(x)} rows ({steps} steps of {args.batch}); "
          f"held out: {a['tokens']} tokens of {args.heldout}")
    print("| | FVU | explained var. | L0 | CE loss score | KL score | dead | train seconds |\n|---|---|---|---|---|---|---|---|")
    for name, m in (("ffnlab", a), ("SAELens", b)):
        print(f"| {name} | {m['fvu']:.4f} | {m['explained_variance']:.4f} | {m['l0']:.1f} | {m['ce_loss_score']:.4f} | "
              f"{m['kl_score']:.4f} | {100 * m['dead_fraction']:.1f}% | {results['train_seconds'][name]:.0f} |")
    print(f"ffnlab - SAELens: FVU {a['fvu'] - b['fvu']:+.4f}, CE loss score {a['ce_loss_score'] - b['ce_loss_score']:+.4f}")


if __name__ == "__main__":
    main()
