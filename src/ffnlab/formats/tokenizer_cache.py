"""A GGUF's tokenizer, built once and kept on disk, like numba's compiled kernels.

Building the `tokenizers` BPE from a GGUF's metadata (checking 49k tokens and merges, then the
Rust BPE tables) is about half of SmolLM2's load time; reading it back from its JSON takes a
third of that. The cache is keyed by content: a BLAKE2 hash of the file's whole header (every
metadata key and the tensor directory, the bytes before the tensor data), of this package's
tokenizer code and of the `tokenizers` version. A file edited in place, or a new ffnlab, misses
and builds again; so does any unreadable or damaged entry. Entries are JSON (never pickle),
written to a temporary name and renamed, so a reader never sees half a file.
Only byte-level BPE vocabularies (tokenizer.ggml.model "gpt2": SmolLM2, Llama 3, Qwen) are kept:
reading Gemma 3's SentencePiece-style one back from JSON took 2.1 s against 3.3 s to build it,
but peaked ~200 MB higher.

  FFNLAB_CACHE_DIR   where entries go (default ~/.cache/ffnlab, or $XDG_CACHE_HOME/ffnlab);
                     set it to an empty string to build every time.
"""
import hashlib
import json
import os
import tempfile

from tokenizers import Tokenizer as HFTokenizer

from .tokenizer import Tokenizer


def cache_dir() -> str | None:
    d = os.environ.get("FFNLAB_CACHE_DIR")
    if d is not None:
        return d or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ffnlab")


def _key(reader) -> str:
    import tokenizers

    from . import gguf_tokenizer, tokenizer
    h = hashlib.blake2b(digest_size=20)
    h.update(memoryview(reader.data[:reader.data_offset]))          # the header: metadata + tensor directory
    for mod in (gguf_tokenizer, tokenizer):
        with open(mod.__file__, "rb") as f:
            h.update(f.read())
    h.update(tokenizers.__version__.encode())
    return h.hexdigest()


def _entry(reader):
    d = cache_dir()
    field = reader.fields.get("tokenizer.ggml.model")
    if d is None or field is None or field.contents() != "gpt2":
        return None
    return os.path.join(d, "tokenizers", _key(reader) + ".json")


def load(reader) -> Tokenizer | None:
    """The cached tokenizer of this GGUF, or None (no entry, a damaged one, no cache)."""
    try:
        path = _entry(reader)
        if path is None or not os.path.isfile(path):
            return None
        with open(path, encoding="utf-8") as f:
            e = json.load(f)
        return Tokenizer(HFTokenizer.from_str(e["tokenizers"]), bos_id=e["bos_id"], eos_id=e["eos_id"],
                         add_bos=e["add_bos"], add_eos=e["add_eos"], chat_template=e["chat_template"],
                         eot_ids=e["eot_ids"], template_source=e["template_source"])
    except Exception:                     # a damaged or foreign entry: build again (tokenizers raises plain Exception)
        return None


def _compact(text: str) -> str:
    """tokenizers' JSON with the merges as "a b" strings (its older form) where no merged part
    holds a space, as byte-level BPE parts never do: reading SmolLM2's back takes 0.12 s, against
    0.20 s for the [a, b] pairs that to_str() writes"""
    doc = json.loads(text)
    merges = doc.get("model", {}).get("merges")
    if merges and all(isinstance(m, list) and len(m) == 2 and " " not in m[0] + m[1] for m in merges):
        doc["model"]["merges"] = [f"{a} {b}" for a, b in merges]
    return json.dumps(doc, ensure_ascii=False)


def store(reader, tok: Tokenizer) -> None:
    """Keep tok for the next load of this GGUF; a cache that cannot be written is skipped."""
    try:
        path = _entry(reader)
        if path is None:
            return
        os.makedirs(os.path.dirname(path), exist_ok=True)
        e = {"tokenizers": _compact(tok.tk.to_str()), "bos_id": tok.bos_id, "eos_id": tok.eos_id, "add_bos": tok.add_bos,
             "add_eos": tok.add_eos, "chat_template": tok.chat_template, "eot_ids": sorted(tok.eot_ids),
             "template_source": tok.template_source}
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(e, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return                            # an unwritable cache directory: the next load builds the tokenizer again
