"""Build a Tokenizer from GGUF metadata (tokenizer.ggml.*) with the `tokenizers` library.

  tokenizer.ggml.model = "gpt2":  byte-level BPE from tokens + merges; the pre-tokenizer
                                   regexes are llama.cpp's for tokenizer.ggml.pre (llama-vocab.cpp)
  tokenizer.ggml.model = "llama": SentencePiece-style: spaces become U+2581, the adjacent pair
                                   whose merged piece has the highest score merges first, unknown
                                   characters fall back to <0xXX> byte tokens (Gemma 3)
Control and user-defined tokens (token_type 3 and 4) are added as special tokens, so
"<|im_start|>" in a prompt is one id, as llama.cpp parses it.
"""
from array import array
from itertools import chain
import math

import numpy as np

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..errors import ModelFileError
from .tokenizer import Tokenizer

# llama.cpp token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# BPE pre-tokenizers for which llama.cpp adds BOS by default (llama-vocab.cpp: LLAMA_VOCAB_PRE_TYPE_LLAMA3)
BOS_PRE_TOKENIZERS = ("llama3", "llama-v3", "llama-bpe")

# tokenizer.ggml.pre -> the regexes llama.cpp applies one after the other (llama-vocab.cpp)
PRE_TOKENIZER_REGEXES = {
    "gpt2": [_GPT2],
    "gpt-2": [_GPT2],          # the name llama.cpp's converter writes for GPT-2's regex
    "default": [_GPT2],
    "smollm": [r"\p{N}", _GPT2],
    "starcoder": [r"\p{N}", _GPT2],
    "refact": [r"\p{N}", _GPT2],
    "llama-bpe": [_LLAMA3],
    "llama3": [_LLAMA3],
    "smaug-bpe": [_LLAMA3],
    "qwen2": [_QWEN2],
    "deepseek-r1-qwen": [_QWEN2],
}


def _field(meta, key, default=None):
    v = meta.get(key)
    return default if v is None else v


def _typed(meta, key, path, check, want, default=None):
    """meta[key] if check(value) holds, else a ModelFileError naming the key and what it should be."""
    v = meta.get(key)
    if v is None:
        return default
    if not check(v):
        raise ModelFileError(f"{path}: GGUF metadata key '{key}' must be {want}, found {str(v)[:60]!r}")
    return v


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _all_of(v, types):
    """Every item of the list v is of one of these exact types (bool is not an int here).
    map(type, ...) into a set runs in C: a 262k-token vocabulary is checked in milliseconds."""
    return set(map(type, v)) <= set(types)


def _check_tokenizer_meta(meta, path):
    """Types, lengths and ranges of every tokenizer.ggml.* key used, before `tokenizers` sees any
    (a malformed merge makes the tokenizers library panic in Rust). -> the merges as (A, B) pairs."""
    tokens = _typed(meta, "tokenizer.ggml.tokens", path, lambda v: isinstance(v, list) and v and _all_of(v, (str,)),
                    "a non-empty array of strings")
    n = len(tokens)
    _typed(meta, "tokenizer.ggml.token_type", path, lambda v: isinstance(v, list) and len(v) == n
           and _all_of(v, (int,)), f"an array of {n} integers (one per token)")
    _typed(meta, "tokenizer.ggml.scores", path, lambda v: isinstance(v, list) and len(v) == n
           and _all_of(v, (int, float)) and all(map(math.isfinite, v)),
           f"an array of {n} finite numbers (one per token)")
    for key in ("model", "pre", "chat_template"):
        _typed(meta, f"tokenizer.{'' if key == 'chat_template' else 'ggml.'}{key}", path,
               lambda v: isinstance(v, str), "a string")
    for key in ("add_bos_token", "add_eos_token", "add_space_prefix"):
        _typed(meta, f"tokenizer.ggml.{key}", path, lambda v: isinstance(v, bool), "a bool")
    for key in ("bos", "eos", "unknown", "eot", "eom", "padding"):
        _typed(meta, f"tokenizer.ggml.{key}_token_id", path, lambda v: _is_int(v) and 0 <= v < n,
               f"a token id in [0, {n})")
    merges = _typed(meta, "tokenizer.ggml.merges", path, lambda v: isinstance(v, list) and _all_of(v, (str,)),
                    "an array of strings", [])
    pairs = [m.split(" ", 1) for m in merges]
    vocab = set(tokens)
    # the common case in set operations; the loop below only runs to name the first bad merge
    if all(map(all, pairs)) and set(map(len, pairs)) <= {2} and set(chain.from_iterable(pairs)) <= vocab \
            and set(map("".join, pairs)) <= vocab:
        return pairs
    for i, m in enumerate(merges):
        a, sep, b = m.partition(" ")
        if not (a and sep and b) or a not in vocab or b not in vocab or a + b not in vocab:
            raise ModelFileError(f"{path}: tokenizer.ggml.merges[{i}] = {m[:40]!r} is not 'A B' with A, B and AB "
                                 f"all tokens")
    return pairs


def tokenizer_from_gguf(meta: dict, path: str) -> Tokenizer:
    """meta: GGUF key -> python value (lists as lists). -> Tokenizer"""
    kind = meta.get("tokenizer.ggml.model")
    tokens = meta.get("tokenizer.ggml.tokens")
    if kind is None or tokens is None:
        raise ModelFileError(f"{path}: no tokenizer in the GGUF metadata (tokenizer.ggml.model / tokenizer.ggml.tokens missing)")
    pairs = _check_tokenizer_meta(meta, path)
    types = _field(meta, "tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    if kind == "gpt2":
        if meta.get("tokenizer.ggml.merges") is None:             # llama.cpp refuses a BPE vocabulary without them
            raise ModelFileError(f"{path}: tokenizer.ggml.model is 'gpt2' but tokenizer.ggml.merges is missing")
        tk = _byte_level_bpe(meta, tokens, pairs, path)
    elif kind == "llama":
        tk = _sentencepiece_bpe(meta, tokens, types)
    else:
        raise ModelFileError(f"{path}: tokenizer.ggml.model = {kind!r} is not supported (expected 'gpt2' or 'llama')")
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)]
    tk.add_special_tokens(specials)
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    # llama.cpp (llama_vocab::impl::load): SentencePiece vocabularies and the Llama 3 family of BPE
    # pre-tokenizers add BOS, other BPE ones do not, unless tokenizer.ggml.add_bos_token says otherwise
    add_bos = _field(meta, "tokenizer.ggml.add_bos_token",
                     kind == "llama" or meta.get("tokenizer.ggml.pre") in BOS_PRE_TOKENIZERS)
    add_eos = _field(meta, "tokenizer.ggml.add_eos_token", False)
    eot = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if meta.get(k) is not None]
    # chat models end a turn with their own token (<|im_end|>, <end_of_turn>): stop there too
    for name in ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>"):
        i = tk.token_to_id(name)
        if i is not None:
            eot.append(i)
    return Tokenizer(tk, bos_id=bos, eos_id=eos, add_bos=add_bos, add_eos=add_eos,
                     chat_template=meta.get("tokenizer.chat_template"), eot_ids=eot,
                     template_source=f"{path}: tokenizer.chat_template")


def _byte_level_bpe(meta, tokens, pairs, path):
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZER_REGEXES:
        raise ModelFileError(f"{path}: tokenizer.ggml.pre = {pre!r} is not supported "
                             f"(known: {', '.join(sorted(PRE_TOKENIZER_REGEXES))})")
    merges = list(map(tuple, pairs))
    vocab = dict(zip(tokens, range(len(tokens))))
    # Llama 3's tokenizer takes a whole pre-token from the vocab before merging (ignore_merges)
    bpe = models.BPE(vocab, merges, ignore_merges=pre in ("llama-bpe", "llama3", "smaug-bpe"))
    tk = HFTokenizer(bpe)
    splits = [pre_tokenizers.Split(Regex(rx), behavior="isolated") for rx in PRE_TOKENIZER_REGEXES[pre]]
    tk.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    return tk


def _sentencepiece_bpe(meta, tokens, types):
    """SentencePiece-BPE as llama.cpp's llm_tokenizer_spm runs it: merges ranked by the score
    of the merged piece (highest first), expressed as BPE merges so `tokenizers` can run it.

    Each merge (A, B) -> AB is a split of a NORMAL token AB into two mergeable tokens; ties in
    score keep the token's id order, then the split's position (a shorter A first), which is the
    order they are found in, so a stable sort on the score alone ranks them. The candidates are
    kept as arrays of ids and each pair holds the vocabulary's own strings: Gemma 3 has 513k merges,
    and tuples of fresh substrings with their sort keys took ~130 MB more at the load's peak."""
    scores = _field(meta, "tokenizer.ggml.scores", [0.0] * len(tokens))
    vocab = {t: i for i, t in enumerate(tokens)}
    mergeable = bytearray(ty in (NORMAL, USER_DEFINED) for ty in types)
    score, left, right = array("d"), array("l"), array("l")
    for t, ty, s in zip(tokens, types, scores):
        if ty != NORMAL or len(t) < 2:
            continue
        for i in range(1, len(t)):
            a, b = vocab.get(t[:i]), vocab.get(t[i:])
            if a is not None and b is not None and mergeable[a] and mergeable[b]:
                score.append(-s)
                left.append(a)
                right.append(b)
    order = np.argsort(np.frombuffer(score, np.float64), kind="stable")
    pairs = [(tokens[left[k]], tokens[right[k]]) for k in order.tolist()]
    del score, left, right, order
    unk = meta.get("tokenizer.ggml.unknown_token_id")
    bpe = models.BPE(vocab, pairs, byte_fallback=True,
                     unk_token=tokens[unk] if unk is not None else None, fuse_unk=True)
    tk = HFTokenizer(bpe)
    norms = [normalizers.Replace(" ", "\u2581")]
    if meta.get("tokenizer.ggml.add_space_prefix", True):      # llama.cpp's SPM default: true
        norms.insert(0, normalizers.Prepend("\u2581"))
    tk.normalizer = normalizers.Sequence(norms)
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    return tk
