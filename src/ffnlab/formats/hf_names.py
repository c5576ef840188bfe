"""HF tensor names -> GGUF tensor names, from each family's record (families/<arch>.py hf_tensors)."""
import re

from ..families import family
from .hf_moe import moe_gguf_name


def gguf_name(hf_name, arch):
    """HF tensor name -> GGUF tensor name, or None for tensors ffnlab does not use (families/<arch>.py
    hf_tensors: rotary inv_freq buffers, attention masks and a tied lm_head have none)."""
    t = family(arch).hf_tensors
    if t is None:
        return None
    n = hf_name.removeprefix(t.prefix)
    if n in t.top:
        return t.top[n]
    m = re.fullmatch(t.layers + r"\.(\d+)\.(.+)\.(weight|bias)", n)
    if m and m.group(2) in t.block:
        return f"blk.{m.group(1)}.{t.block[m.group(2)]}.{m.group(3)}"
    if t.moe_names:
        moe = moe_gguf_name(hf_name)                # routers, shared experts, q/k norms (hf_moe.py)
        return moe[0] if moe and moe[1] is None else None
    return None
