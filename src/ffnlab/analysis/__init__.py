"""Sizing without weights: parameters, FLOPs, memory, alignment and LoRA from a config.

Everything here reads a ModelConfig (from a preset, an HF config.json or GGUF metadata) and,
for a GGUF, its tensor list; no tensor data is ever read. The CLI commands `inspect`,
`analyze` and `compare` (cli/) print what these modules compute.
"""
