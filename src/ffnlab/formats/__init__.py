"""File formats: GGUF files, HF directories and ffnlab checkpoints in; GGUF/HF out.

Each reader produces a ModelConfig, a dict of GGUF-named float arrays and a Tokenizer, and is
done: the model never reaches back into a file.
"""
