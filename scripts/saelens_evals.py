"""An SAE's metrics from `features eval`'s code and from SAELens's own run_evals (in TransformerLens), on the same
HF model and the same held-out token windows, side by side. tests/engines/test_features_evals_vs_saelens.py does
the same on a small random Llama; this runs it on a real one (docs/features.md has SmolLM2's figures).

    ffnlab export -m smollm2 --to hf smol-hf
    python3 scripts/saelens_evals.py --model smol-hf --dict SAE_DIR --data heldout.txt --layer 12 \
        [--windows 16 --ctx 128]

The SAE must reconstruct l_out-L (TransformerLens: blocks.L.hook_resid_post). Each window is BOS + ctx - 1 text
tokens, every position but BOS scored, one batch; SAELens runs in the venv tests/reference/saelens_env.py names.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "tests", "reference")
sys.path.insert(0, REFERENCE)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="an HF directory (LlamaForCausalLM)")
    ap.add_argument("--dict", required=True, help="the SAE's directory (cfg.json + sae_weights.safetensors)")
    ap.add_argument("--data", required=True, help="held-out text")
    ap.add_argument("--layer", type=int, required=True)
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=128)
    args = ap.parse_args()

    import ffnlab
    from ffnlab.evaluation.activations import ContextWindows
    from ffnlab.features.evaluate import evaluate_dictionary
    from ffnlab.features.harvest import dictionary_for
    from ffnlab.features.saelens_io import load
    from saelens_env import saelens_python

    import pytest
    try:
        py = saelens_python()
    except pytest.skip.Exception as e:
        raise SystemExit(f"SAELens: {e}") from None
    model = ffnlab.load(args.model, progress=False)
    p, cfg, _, in_node, out_node = dictionary_for(model, args.dict, load(args.dict))
    site = f"l_out-{args.layer}"
    if cfg.kind != "sae" or in_node != site:
        raise SystemExit(f"{args.dict}: a {cfg.kind} on {in_node}; run_evals takes an SAE on {site}")
    with open(args.data, encoding="utf-8") as f:
        ids = np.array(model.tokenizer.encode(f.read(), add_bos=False), dtype=np.int64)
    span = args.ctx - 1
    if len(ids) < args.windows * span:
        raise SystemExit(f"{args.data}: {len(ids)} tokens, fewer than --windows {args.windows} x {span}")
    bos = model.tokenizer.bos_id
    tokens = np.array([[bos, *ids[i * span:(i + 1) * span]] for i in range(args.windows)], dtype=np.int64)
    windows = ContextWindows(list(tokens), [0] * args.windows, [1] * args.windows, 1)
    ours = evaluate_dictionary(model, p, cfg, windows, site, site, 10 ** 9, args.windows)
    with tempfile.TemporaryDirectory() as tmp:
        np.save(os.path.join(tmp, "tokens.npy"), tokens)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "src"), REFERENCE]))
        r = subprocess.run([py, os.path.join(REFERENCE, "features_saelens_evals.py"), args.model, args.dict,
                            os.path.join(tmp, "tokens.npy"), f"blocks.{args.layer}.hook_resid_post"],
                           capture_output=True, env=env)
    if r.returncode:
        raise SystemExit(r.stderr.decode()[-3000:])
    theirs = json.loads(r.stdout.decode().strip().splitlines()[-1])
    m = theirs["metrics"]
    rows = [("L0", ours["l0"], m["sparsity"]["l0"]),
            ("explained variance", ours["explained_variance"], m["reconstruction_quality"]["explained_variance"]),
            ("MSE", ours["mse"], m["reconstruction_quality"]["mse"]),
            ("CE clean", ours["ce_clean"], m["model_performance_preservation"]["ce_loss_without_sae"]),
            ("CE spliced", ours["ce_spliced"], m["model_performance_preservation"]["ce_loss_with_sae"]),
            ("CE zero-ablated", ours["ce_ablated"], m["model_performance_preservation"]["ce_loss_with_ablation"]),
            ("CE loss score", ours["ce_loss_score"], m["model_performance_preservation"]["ce_loss_score"]),
            ("KL spliced", ours["kl_spliced"], m["model_behavior_preservation"]["kl_div_with_sae"]),
            ("KL zero-ablated", ours["kl_ablated"], m["model_behavior_preservation"]["kl_div_with_ablation"]),
            ("KL score", ours["kl_score"], m["model_behavior_preservation"]["kl_div_score"]),
            ("dead", ours["dead_fraction"], theirs["dead_fraction"]),
            ("dense", ours["dense_fraction"], theirs["dense_fraction"])]
    print(f"{args.dict} on {args.model}, {args.windows} windows of {args.ctx} ({ours['tokens']} scored tokens); "
          f"TransformerLens vs transformers logits: max |diff| {theirs['tl_vs_hf_logits']:.2e} "
          f"(scale {theirs['logit_scale']:.1f})")
    print("| metric | ffnlab features eval | SAELens run_evals | difference |\n|---|---|---|---|")
    for name, a, b in rows:
        print(f"| {name} | {a:.6g} | {b:.6g} | {a - b:+.2e} |")


if __name__ == "__main__":
    main()
