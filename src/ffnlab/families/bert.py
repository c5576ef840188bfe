"""BERT: an encoder, sized (ffnlab sizing tools) but not run."""
from .record import Family

FAMILY = Family(arch="bert", runnable=False, hf_types=("bert",), activation="gelu", dense_ffn=True, layernorm=True,
                hf_hooks="")
