"""Training from scratch: data and tokenizers, AdamW, the loop, crash-safe checkpoints,
FFN ablations and their plots. `ffnlab train` / `ffnlab ablate` are the front doors."""
