"""How many of a transcoder's latents one MLP unit carries: for every latent that fires in a `features show
--json` page set, the largest |cosine| between its decoder row and one of the layer's down columns (the pages'
neurons.down[0]), against the same for random directions (the chance level at this width).

    ffnlab features show tc26 -m smollm2 --data heldout.txt --top-n 4608 --json > pages.json
    python3 scripts/feature_neuron_cosines.py pages.json -m smollm2 [--seed 0]
"""
import argparse
import json

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages")
    ap.add_argument("-m", "--model", default="smollm2")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import ffnlab
    from ffnlab.formats.installed import resolve_model
    with open(args.pages, encoding="utf-8") as f:
        pages = json.load(f)
    fired = [f for f in pages["features"] if f["count"] > 0]
    layer = fired[0]["neurons"]["layer"]
    top = np.array([abs(f["neurons"]["down"][0]["cosine"]) for f in fired])
    down = ffnlab.load(resolve_model(args.model), progress=False).weights().layers[layer].ffn.down
    W = down.dequantize() if hasattr(down, "dequantize") else np.asarray(down, np.float32)       # [d_model, d_ff]
    W = W / np.linalg.norm(W, axis=0, keepdims=True)
    r = np.random.default_rng(args.seed).standard_normal((pages["d_sae"], W.shape[0]))
    chance = np.abs((r / np.linalg.norm(r, axis=1, keepdims=True)) @ W).max(1)                  # [d_sae]
    print(f"layer {layer}: {len(fired)} latents firing; largest |cosine| with a down column: median {np.median(top):.3f}, "
          f"> 0.5 {np.mean(top > 0.5):.1%}, > 0.7 {np.mean(top > 0.7):.1%}; {len(chance)} random directions: median "
          f"{np.median(chance):.3f}, 99th percentile {np.quantile(chance, 0.99):.3f}")


if __name__ == "__main__":
    main()
