"""Tokenizer: a `tokenizers.Tokenizer` plus the special-token facts llama.cpp keeps in metadata.

Built from GGUF metadata (gguf_tokenizer.py), from an HF tokenizer.json, or byte-level for
models trained here. ids equal llama.cpp's for the same text: BOS is added per
tokenizer.ggml.add_bos_token and special tokens in the text are parsed.
"""
from __future__ import annotations

from ..errors import ModelFileError

PIECE = 1 << 16                 # characters of a long text encoded at a time (Tokenizer._pieces)


class Tokenizer:
    def __init__(self, tk, bos_id=None, eos_id=None, add_bos=False, chat_template=None, eot_ids=(), add_eos=False,
                 template_source=""):
        self.tk = tk                            # tokenizers.Tokenizer (no post-processor: BOS/EOS are ours)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.add_bos = add_bos                  # prepend BOS when encoding a prompt
        self.add_eos = add_eos                  # append EOS when encoding a prompt (tokenizers that ask for it)
        self.chat_template = chat_template      # jinja2 source from tokenizer.chat_template
        self.template_source = template_source  # where it came from, for error messages
        self.eot_ids = set(eot_ids) | ({eos_id} if eos_id is not None else set())   # ids that end generation
        self._joins = None                      # _newline_joins's answer, once asked

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """add_bos None: BOS and EOS as the tokenizer's configuration says; False: the text's ids only."""
        ids = []
        for piece in self._pieces(text):
            ids += self.tk.encode(piece, add_special_tokens=False).ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if add_bos is not False and self.add_eos and self.eos_id is not None:
            ids = ids + [self.eos_id]
        return ids

    def _pieces(self, text):
        """text in pieces of about PIECE characters whose ids, one after the other, are the whole text's: a
        tokenizers Encoding holds ~370 bytes a token (offsets, strings), so a corpus of millions of tokens is
        not encoded at once. A piece ends after a newline where no token can span the cut (_cut_at), for a
        normalizer that treats both sides alone as together; otherwise the text is one piece."""
        joins = self._newline_joins() if len(text) > 2 * PIECE else None
        start = 0
        while joins is not None and len(text) - start > 2 * PIECE:
            c = text.find("\n", start + PIECE)
            while c != -1 and not self._cut_at(text, c + 1, joins):
                c = text.find("\n", c + 1)
            if c == -1:
                break
            yield text[start:c + 1]
            start = c + 1
        yield text[start:]

    def _cut_at(self, text, c, joins):
        """text[c - 1] is a newline: a cut at c is a token boundary when neither neighbour of the newline is
        whitespace (a pre-tokenizer's run of whitespace ends differently at a piece's end), no token joins
        text[c] to a newline, and the text around the cut encodes as its two sides do"""
        if c + 1 >= len(text) or text[c - 2].isspace() or text[c].isspace() or text[c] in joins:
            return False
        left, right = text[max(0, c - 64):c], text[c:c + 64]
        enc = (lambda t: self.tk.encode(t, add_special_tokens=False).ids)
        return enc(left + right) == enc(left) + enc(right)

    def _newline_joins(self):
        """-> the characters some token's text has right after a newline, or None when the normalizer would
        see a piece other than within the whole text (SentencePiece's prefix space)"""
        if self._joins is None:
            norm = self.tk.normalizer
            if norm is not None and any(norm.normalize_str(a + b) != norm.normalize_str(a) + norm.normalize_str(b)
                                        for a, b in (("a\n", "b"), (" x.\n", "Y z"), ("\n", "1"))):
                self._joins = False
            else:
                texts = self.tk.decode_batch([[i] for i in range(max_token_id(self) + 1)], skip_special_tokens=False)
                self._joins = {t[i + 1] for t in texts for i in range(len(t) - 1) if t[i] == "\n"}
        return self._joins or None

    def decode(self, ids, skip_special=False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special)

    def token_text(self, i: int) -> str:
        return self.tk.id_to_token(i) or ""


def max_token_id(tok: Tokenizer) -> int:
    """The largest id the tokenizer can produce (its vocabulary and its added tokens): ids need
    not be dense, so the size alone can understate it."""
    ids = tok.tk.get_vocab(with_added_tokens=True).values()
    return max(ids, default=-1)


def check_vocab(tok, n_rows, tokenizer_file, model_file):
    """Every id tok can produce indexes a row of the embedding table [n_rows, d_model]; otherwise a
    ModelFileError naming both files. More rows than tokens is fine (real models pad the table:
    SmolLM2 and Gemma 3 do not, Qwen2's 151,936 rows hold 151,665 tokens); an id past the last row
    would index out of the table at the first such token, as llama.cpp refuses and transformers
    warns."""
    if tok is None:
        return
    top = max_token_id(tok)
    if top >= n_rows:
        raise ModelFileError(f"{tokenizer_file}: the tokenizer has {tok.vocab_size} tokens (ids up to {top}), but the "
                             f"model's embedding has {n_rows} rows ({model_file}): its ids must be < {n_rows}")


def bytes_to_unicode() -> dict:
    """GPT-2's byte -> printable character table (the ByteLevel alphabet): printable Latin-1
    bytes map to themselves, the other 68 (controls, space, ...) to U+0100.. in order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokenizer() -> Tokenizer:
    """Vocab 256: a BPE with the 256 byte characters and no merges, so token id == byte value.

    use_regex=False: no pre-splitting (with no merges it would not change the ids anyway);
    add_prefix_space=False: the text is encoded exactly as given.
    """
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models
    from tokenizers.pre_tokenizers import ByteLevel

    table = bytes_to_unicode()
    tk = HFTokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tk.pre_tokenizer = ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    return Tokenizer(tk)


def tokenizer_from_json(text: str, meta: dict) -> Tokenizer:
    """Rebuild a Tokenizer from tokenizer.json text and the facts kept next to it in ffnlab.json."""
    from tokenizers import Tokenizer as HFTokenizer
    return Tokenizer(HFTokenizer.from_str(text), bos_id=meta.get("bos_id"), eos_id=meta.get("eos_id"),
                     add_bos=bool(meta.get("add_bos", False)), chat_template=meta.get("chat_template"),
                     add_eos=bool(meta.get("add_eos", False)))
