"""Training data: text file -> tokenizer -> token ids -> train/val split -> random batches.

Three tokenizers, all `tokenizers.Tokenizer`s wrapped in ffnlab's Tokenizer so checkpoints,
`ffnlab run` and the exporters treat them alike:
  byte   vocab 256, id = the UTF-8 byte (the default: nothing to train, nothing unknown)
  bpe    byte-level BPE trained on the data itself (GPT-2 style, <|endoftext|> is id 0)
  model  the tokenizer of a GGUF file or HF directory, through ffnlab.load
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..errors import DataError, UsageError
from ..formats.tokenizer import Tokenizer, byte_tokenizer

EOT = "<|endoftext|>"


def train_bpe_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """A byte-level BPE (GPT-2 pre-tokenizer regex) trained on `text`; <|endoftext|> is id 0."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, trainers
    from tokenizers.pre_tokenizers import ByteLevel

    if vocab_size < 257:
        raise UsageError(f"--vocab-size must be at least 257 for a BPE (256 bytes + {EOT}), got {vocab_size}")
    tk = HFTokenizer(models.BPE())
    tk.pre_tokenizer = ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT],
                                  initial_alphabet=ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator([text], trainer)
    eot = tk.token_to_id(EOT)
    return Tokenizer(tk, bos_id=eot, eos_id=eot)


def model_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of a GGUF file / HF directory / ffnlab checkpoint, read without its weights."""
    from ..formats.checkpoint import is_checkpoint, read_tokenizer
    tok = None
    if os.path.isdir(path) and is_checkpoint(path):
        tok = read_tokenizer(path)
    elif os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json")):
        from ..formats.hf_config import load_hf_config
        from ..formats.hf_tokenizer import tokenizer_from_hf
        tok = tokenizer_from_hf(path, load_hf_config(path)[0])
    elif os.path.isfile(path):
        from ..formats.gguf_meta import open_gguf, tokenizer_meta
        from ..formats.gguf_tokenizer import tokenizer_from_gguf
        tok = tokenizer_from_gguf(tokenizer_meta(open_gguf(path), path), path)
    if tok is None:
        raise UsageError(f"--tokenizer {path}: no tokenizer found (expected a .gguf file, an HF directory with "
                         f"tokenizer.json, or an ffnlab checkpoint)")
    return tok


def tokenizer_meta(tok: Tokenizer, kind: str, source: str = "") -> dict:
    """What ffnlab.json records about a tokenizer (tokenizer.json holds the rest)."""
    return {"kind": kind, "source": source, "bos_id": tok.bos_id, "eos_id": tok.eos_id,
            "add_bos": bool(tok.add_bos), "add_eos": bool(tok.add_eos), "chat_template": tok.chat_template}


def make_tokenizer(spec: str, text: str, vocab_size: int = 1024) -> tuple[Tokenizer, dict]:
    """spec: 'byte' | 'bpe' | a model path -> (Tokenizer, its ffnlab.json record)"""
    if spec == "byte":
        tok = byte_tokenizer()
        return tok, tokenizer_meta(tok, "byte")
    if spec == "bpe":
        tok = train_bpe_tokenizer(text, vocab_size)
        return tok, tokenizer_meta(tok, "bpe")
    if not os.path.exists(spec):
        raise UsageError(f"--tokenizer must be byte, bpe or the path of a model, got {spec!r} (no such file)")
    tok = model_tokenizer(spec)
    return tok, tokenizer_meta(tok, "model", os.path.abspath(spec))


def encode(tok: Tokenizer, tok_meta: dict, text: str) -> np.ndarray:
    """text -> ids [N] int32. The byte tokenizer's ids are the UTF-8 bytes themselves, which
    numpy reads directly (the same ids, 50x faster on a megabyte of text)."""
    if tok_meta.get("kind") == "byte":
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.int32)
    return np.asarray(tok.encode(text, add_bos=False), dtype=np.int32)


def read_text(path: str) -> str:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot read the data file ({e.strerror})") from None
    if not raw.strip():
        raise DataError(f"{path}: the data file is empty")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text (invalid byte at offset {e.start})") from None


def data_info(path: str, text: str, n_tokens: int) -> dict:
    """What a checkpoint records about its data; --resume checks the sha256 is unchanged."""
    import hashlib
    raw = text.encode("utf-8")
    return {"path": os.path.abspath(path), "sha256": hashlib.sha256(raw).hexdigest(),
            "bytes": len(raw), "tokens": n_tokens}


@dataclass
class TokenData:
    """Token ids split into a training part and a held-out tail."""
    train: np.ndarray                # [N_train] int32
    val: np.ndarray                  # [N_val] int32
    path: str = ""

    @classmethod
    def from_ids(cls, ids, seq_len: int, val_frac: float = 0.1, path: str = "") -> "TokenData":
        """Split off the last val_frac of the ids for validation; each part must hold a
        window of seq_len + 1 tokens (inputs plus the shifted targets)."""
        ids = np.asarray(ids, dtype=np.int32)
        if not 0.0 < val_frac < 1.0:
            raise UsageError(f"--val-frac must be between 0 and 1, got {val_frac}")
        n_val = int(len(ids) * val_frac)
        need = seq_len + 1
        where = path or "the data"
        if len(ids) < 2 * need or n_val < need or len(ids) - n_val < need:
            raise DataError(f"{where}: {len(ids)} tokens is too little for --seq-len {seq_len}: the train split "
                            f"and the {val_frac:g} validation split each need at least {need} tokens "
                            f"(at least {int(np.ceil(need / min(val_frac, 1 - val_frac)))} tokens in all)")
        return cls(ids[:-n_val], ids[-n_val:], path)


def sample_batch(ids: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator):
    """Random windows of ids -> x, y: [batch, seq_len] int, y is x shifted left by one."""
    starts = rng.integers(0, len(ids) - seq_len, size=batch)          # [batch] window starts
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]          # [batch, seq_len+1]
    w = ids[idx]
    return w[:, :-1], w[:, 1:]


def eval_batches(ids: np.ndarray, batch: int, seq_len: int, n_batches: int, seed: int = 1234):
    """The same fixed windows every evaluation (own RNG: evaluating never moves the training RNG)."""
    rng = np.random.default_rng(seed)
    return [sample_batch(ids, batch, seq_len, rng) for _ in range(n_batches)]
