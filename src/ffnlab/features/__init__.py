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
    choices.py     the command line's choices (the ablations), read without loading NumPy
    neuronpedia.py the pages as Neuronpedia's per-feature JSON (SAEDashboard's field names)

    from ffnlab.features import splice_hooks        # a trained dictionary in the forward, through ffnlab.hooks
    with ffnlab.hooks(model, splice_hooks(model, "tc12")): logits = model.forward(ids)
"""

from .choices import ABLATIONS  # noqa: F401 (the command line's parser reads it from here)


def __getattr__(name):
    """splice_hooks on first use (PEP 562, as ffnlab's own names): the command line's parser imports this
    package without loading numba"""
    if name != "splice_hooks":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .evaluate import splice_hooks
    return splice_hooks
