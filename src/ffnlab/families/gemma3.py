"""Gemma 3: Gemma 2's block with an RMSNorm over each q/k head, no soft-caps, five sliding layers in
six with their own RoPE base (rope_local_base_freq, unscaled). The multimodal config's LM is its
text_config (model_type gemma3_text). Its config.json is read (sizing); its weights are
loaded from GGUF files only (no hf_tensors)."""
from .record import Family, Graph

FAMILY = Family(
    arch="gemma3", hf_types=("gemma3", "gemma3_text"), activation="gelu_tanh",
    graph=Graph(sa_out=True, q_scaled="Qcur_scaled"))
