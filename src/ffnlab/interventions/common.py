"""What the interventions share: prompts as token ids, one-token targets, node checks, float weights."""
import numpy as np

from ..errors import UsageError


def prompt_ids(model, text, flag="-p"):
    """text -> [T] ids (with BOS when the tokenizer adds one)."""
    if model.tokenizer is None:
        raise UsageError(f"{model.source}: the model has no tokenizer, so it cannot read {flag} text")
    ids = model.tokenizer.encode(text)
    if not ids:
        raise UsageError(f"{flag} {text!r} encodes to no tokens")
    if len(ids) > model.config.n_ctx:
        raise UsageError(f"{flag} has {len(ids)} tokens, more than the context length {model.config.n_ctx}")
    return np.array(ids)


def one_token(model, text, flag):
    """A token given as text (' Paris') or as #ID -> its id; it must be exactly one token."""
    tok = model.tokenizer
    if text.startswith("#") and text[1:].isdigit():
        i = int(text[1:])
        if not 0 <= i < model.config.vocab_size:
            raise UsageError(f"{flag} {text}: token id out of range (vocabulary {model.config.vocab_size})")
        return i
    ids = tok.encode(text, add_bos=False)
    if len(ids) != 1:
        pieces = " + ".join(repr(tok.token_text(i)) for i in ids) or "no tokens"
        raise UsageError(f"{flag} {text!r} is {len(ids)} tokens ({pieces}), not one; pick a single token "
                         f"(often with its leading space) or give #ID")
    return ids[0]


def token_strings(model, ids):
    """Each token decoded on its own (' Paris', not the BPE piece 'ĠParis')."""
    return [model.tokenizer.decode([int(i)]) for i in ids]


def layer_nodes(model, node, names):
    """node prefix ('l_out', 'ffn_swiglu') -> ['l_out-0', ..., 'l_out-{n_layer-1}'], each a node of the model."""
    want = [f"{node}-{il}" for il in range(model.config.n_layer)]
    missing = [n for n in want if n not in names]
    if missing:
        kinds = sorted({n.rsplit("-", 1)[0] for n in names if n.rsplit("-", 1)[-1].isdigit()})
        raise UsageError(f"--node {node}: the model has no node {missing[0]} (per-layer nodes: {', '.join(kinds)})")
    return want


def as_float(w):
    """A weight as a float array (a quantized tensor is dequantized)."""
    return w.dequantize() if hasattr(w, "dequantize") else np.asarray(w)
