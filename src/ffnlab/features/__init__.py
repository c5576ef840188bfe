"""MLP features: sparse dictionaries (transcoders, skip-transcoders, SAEs) trained on a model's nodes.

    dictionary.py  the dictionary's config, parameters, forward and backward
    sparsity.py    its activations (topk, batchtopk, jumprelu, relu) and their gradients
    kernels.py     the sparse decode and its gradients (numba)
    losses.py      MSE, the decoder-norm L1, JumpReLU's L0, AuxK
    harvest.py     the model's activations at the sites, through hooks, into a bounded shuffled buffer
    trainer.py     AdamW, the schedule, unit-norm decoder rows, dead latents, crash-safe checkpoints
    saelens_io.py  SAELens's on-disk format (cfg.json + sae_weights.safetensors)
    evaluate.py    L0, FVU, CE loss score, KL score with the dictionary spliced into the forward
    pages.py       feature pages (JSON, HTML)
"""

# what replaces the site for CE_ablated (evaluate.py says what each does); here, where the CLI's parser can read it cheaply
ABLATIONS = ("zero", "zero-after-first", "mean")
