"""GGUF metadata and tensor directory -> ModelConfig, without reading any tensor data.

    reader = open_gguf(path)                 # gguf.GGUFReader, with clear errors for bad files
    cfg = config_from_gguf(reader, path)     # ModelConfig from the {arch}.* keys + tensor names
    infos = tensor_infos(reader)             # name, ggml shape, type, elements, bytes per tensor

GGUFReader memory-maps the file and parses only the header, the key/value metadata and the
tensor directory; the tensor data stays on disk untouched (nothing is dequantized here).

Metadata keys read, for arch in {gpt2, llama, qwen2, gemma2, gemma3}:
  {arch}.embedding_length -> d_model          {arch}.feed_forward_length -> d_ff
  {arch}.block_count -> n_layer               {arch}.context_length -> n_ctx
  {arch}.attention.head_count -> n_head       {arch}.attention.head_count_kv -> n_kv_head (default n_head)
  {arch}.attention.key_length -> head_dim (default d_model / n_head)
  {arch}.attention.layer_norm_epsilon (gpt2) or .layer_norm_rms_epsilon (others) -> norm_eps
  {arch}.rope.freq_base -> rope_theta (default 10000, llama.cpp's default)
  {arch}.rope.scaling.type / .factor (linear) -> rope_scale
  {arch}.attention.sliding_window (+ .sliding_window_pattern) -> sliding window (gemma2, gemma3)
  {arch}.rope.freq_base_swa -> rope_theta_local (gemma3, default 10000)
  tokenizer.ggml.tokens (its length) or {arch}.vocab_size -> vocab_size (else token_embd's rows)
What the keys do not say is read from the tensor names: biases, the gate (gated FFN), q/k
norms, post norms, a fused qkv, and tied embeddings (no output.weight).
"""
import contextlib
import math
import os
from dataclasses import dataclass

from ..config import ModelConfig
from ..errors import ModelFileError

ARCHS = ("gpt2", "llama", "qwen2", "gemma2", "gemma3")
_ACTIVATION = {"gpt2": "gelu_tanh", "llama": "silu", "qwen2": "silu", "gemma2": "gelu_tanh", "gemma3": "gelu_tanh"}
_GATED_KIND = {"silu": "swiglu", "gelu_tanh": "geglu"}


@dataclass(frozen=True)
class TensorInfo:
    name: str            # GGUF tensor name, e.g. "blk.0.ffn_up.weight"
    ne: tuple            # ggml shape, fastest axis first: ffn_up is (d_model, d_ff)
    type: str            # ggml type name: F32, F16, Q4_K, ...
    n_elements: int
    n_bytes: int

    @property
    def shape(self) -> tuple:
        """The logical (numpy, row-major) shape: ne reversed, ffn_up is (d_ff, d_model)."""
        return tuple(reversed(self.ne))

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.n_bytes / self.n_elements


def open_gguf(path):
    """-> gguf.GGUFReader. Missing file, wrong magic, or a truncated/corrupt file raise
    ModelFileError naming the file."""
    import gguf

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelFileError(f"{path}: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelFileError(f"{path}: not a GGUF file (first bytes {magic!r}, expected b'GGUF')")
    try:
        with _plain_ndarray_views():
            reader = gguf.GGUFReader(path)
    except Exception as e:                   # the reader raises ValueError/IndexError/... on short files
        short = _tensor_past_the_end(path)
        if short:
            raise ModelFileError(f"{path}: truncated: {short}") from None
        raise ModelFileError(f"{path}: truncated or corrupt GGUF ({type(e).__name__}: {e})") from None
    size = os.path.getsize(path)
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise ModelFileError(f"{path}: truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes}, "
                                 f"file has {size}")
    return reader


def _tensor_past_the_end(path):
    """After GGUFReader failed: read only the tensor directory and name the first tensor whose data
    runs past the end of the file (an interrupted download) -> a message, or None.
    Reaches into GGUFReader's tensor-info fields; if those ever change, the caller's generic message stays."""
    import gguf
    import numpy

    found = []

    class _Directory(gguf.GGUFReader):
        def _build_tensors(self, start_offs, fields):           # map no tensor data
            size = len(self.data)
            for f in fields:
                name = bytes(f.parts[1]).decode("utf-8", "replace")
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(f.parts[4][0]))]
                end = int(start_offs + f.parts[5][0]) + int(numpy.prod(f.parts[3])) * type_size // block
                if end > size:
                    found.append(f"tensor {name} ends at byte {end}, file has {size}")
                    break
            self.tensors = []

    try:
        _Directory(path)
    except Exception:
        return None
    return found[0] if found else None


@contextlib.contextmanager
def _plain_ndarray_views():
    """Make GGUFReader slice a plain ndarray view of its memory map instead of the np.memmap itself.

    The reader takes two slices per vocabulary string (Gemma 3: 262k tokens), and every slice of an
    np.memmap runs memmap.__getitem__ and __array_finalize__ in Python; on a plain view of the same
    mapping the parse is about 3x faster. The bytes, and the tensors' .data, are the same mapped file.
    Only gguf.gguf_reader's own `np` name is swapped, for the duration of the constructor."""
    import numpy
    from gguf import gguf_reader

    class _Numpy:
        def __getattr__(self, name):
            return getattr(numpy, name)

        @staticmethod
        def memmap(*args, **kwargs):
            return numpy.memmap(*args, **kwargs).view(numpy.ndarray)   # the view keeps the mapping alive

    if getattr(gguf_reader, "np", None) is not numpy:                  # a gguf that no longer works this way
        yield
        return
    gguf_reader.np = _Numpy()
    try:
        yield
    finally:
        gguf_reader.np = numpy


def tensor_infos(reader) -> list[TensorInfo]:
    """The tensor directory, in file order. Sizes come from the directory, not the data."""
    return [TensorInfo(t.name, tuple(int(n) for n in t.shape), t.tensor_type.name, int(t.n_elements),
                       int(t.n_bytes)) for t in reader.tensors]


def metadata(reader) -> dict:
    """key -> value for every scalar/string key; arrays become their length (as 'len(key)')."""
    import gguf

    out = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            out[key] = f"[{len(field.data)} items]"
        else:
            out[key] = field.contents()
    return out


def get_key(reader, key, path, default=...):
    """One metadata value; a missing key raises ModelFileError naming it (unless a default is given)."""
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise ModelFileError(f"{path}: missing GGUF metadata key '{key}'")
        return default
    return field.contents()


def file_type_name(reader) -> str:
    """general.file_type as llama-quantize names it (Q4_K_M, Q8_0, F16, ...), or '' when absent."""
    from gguf.constants import LlamaFileType

    ft = reader.fields.get("general.file_type")
    if ft is None:
        return ""
    try:
        return LlamaFileType(int(ft.contents())).name.replace("MOSTLY_", "").replace("ALL_", "")
    except ValueError:
        return f"file_type {int(ft.contents())}"


def config_from_gguf(reader, path) -> ModelConfig:
    """A GGUFReader's metadata + tensor names -> ModelConfig (what llama.cpp would build)."""
    path = os.fspath(path)
    arch = get_key(reader, "general.architecture", path)
    if arch not in ARCHS:
        raise ModelFileError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")
    names = {t.name for t in reader.tensors}
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}

    def key(k, default=...):
        return get_key(reader, f"{arch}.{k}", path, default)

    d_model, n_head = int(key("embedding_length")), int(key("attention.head_count"))
    d_ff = get_key(reader, f"{arch}.feed_forward_length", path)
    if not isinstance(d_ff, int):                               # a per-layer list: ffnlab needs one width
        widths = set(int(x) for x in d_ff)
        if len(widths) != 1:
            raise ModelFileError(f"{path}: {arch}.feed_forward_length varies per layer ({sorted(widths)}); "
                                 f"ffnlab needs one d_ff")
        d_ff = widths.pop()
    eps_key = "attention.layer_norm_epsilon" if arch == "gpt2" else "attention.layer_norm_rms_epsilon"
    has = lambda t: f"blk.0.{t}" in names                       # noqa: E731
    act = _ACTIVATION[arch]
    gated = has("ffn_gate.weight")
    if arch != "gpt2" and not gated:
        raise ModelFileError(f"{path}: missing tensor blk.0.ffn_gate.weight ({arch} has a gated FFN)")
    kw = dict(
        arch=arch, n_layer=int(key("block_count")), d_model=d_model, n_head=n_head,
        n_kv_head=int(key("attention.head_count_kv", n_head)),
        head_dim=int(key("attention.key_length", d_model // n_head)),
        d_ff=d_ff, ffn=_GATED_KIND[act] if gated else act,
        ffn_bias=has("ffn_up.bias"), attn_bias=has("attn_q.bias") or has("attn_qkv.bias"),
        attn_out_bias=has("attn_output.bias"), fused_qkv=has("attn_qkv.weight"),
        norm="layernorm" if has("attn_norm.bias") else "rmsnorm", norm_eps=float(key(eps_key)),
        post_attn_norm=has("post_attention_norm.weight"), post_ffn_norm=has("post_ffw_norm.weight"),
        qk_norm=has("attn_q_norm.weight"),
        positions="learned" if "position_embd.weight" in names else "rope",
        rope_pairing="normal" if arch == "llama" else "neox",
        rope_theta=float(key("rope.freq_base", 10000.0)),
        vocab_size=_vocab_size(reader, arch, shapes, path), n_ctx=int(key("context_length")),
        tie_embeddings="output.weight" not in names,
        name=str(get_key(reader, "general.name", path, "")))
    if arch == "gpt2":
        kw["rope_pairing"] = "normal"                           # unused: GPT-2 has learned positions
    scaling = get_key(reader, f"{arch}.rope.scaling.type", path, "linear")
    factor = float(get_key(reader, f"{arch}.rope.scaling.factor", path, 0.0) or 0.0)
    if scaling == "linear" and factor > 0:
        kw["rope_scale"] = factor
    if arch in ("gemma2", "gemma3"):
        kw.update(_gemma(reader, arch, path, kw))
    return ModelConfig(**kw)


def _gemma(reader, arch, path, kw) -> dict:
    """llama.cpp's Gemma rules (llama-model.cpp load_hparams, models/gemma3.cpp):
    - token embeddings scaled by sqrt(d_model);
    - q scaled by 1/sqrt(head_dim), except the 27B models (Gemma 2: 46 layers, Gemma 3: 62 layers),
      which use 1/sqrt(d_model / n_head); llama.cpp reads no query_pre_attn_scalar key;
    - sliding-window layers: il % n < n - 1 slides, n = 2 (Gemma 2) or
      {arch}.attention.sliding_window_pattern, default 6 (Gemma 3);
    - Gemma 3's sliding layers use RoPE base {arch}.rope.freq_base_swa, default 10000, unscaled;
    - a final logit softcap only when {arch}.final_logit_softcapping is present."""
    big = kw["n_layer"] == (46 if arch == "gemma2" else 62)
    out = {"embed_scale": True,
           "attn_scale": 1.0 / math.sqrt(kw["d_model"] / kw["n_head"] if big else kw["head_dim"]),
           # Gemma 3 files must carry the window; llama.cpp defaults Gemma 2's to 4096
           "sliding_window": int(get_key(reader, f"{arch}.attention.sliding_window", path,
                                         4096 if arch == "gemma2" else ...)),
           "sliding_window_pattern": 2,
           "final_logit_softcap": float(get_key(reader, f"{arch}.final_logit_softcapping", path, 0.0))}
    if arch == "gemma3":
        out["sliding_window_pattern"] = _swa_pattern(get_key(reader, f"{arch}.attention.sliding_window_pattern",
                                                             path, 6), kw["n_layer"], path)
        out["rope_theta_local"] = float(get_key(reader, f"{arch}.rope.freq_base_swa", path, 10000.0))
    return out


def _swa_pattern(value, n_layer, path) -> int:
    """A scalar pattern n, or a per-layer list of 'is sliding' flags that must repeat with one period
    (ModelConfig describes the layers by that period)."""
    if not isinstance(value, (list, tuple)):
        return int(value)
    flags = [bool(v) for v in value]
    for n in range(1, len(flags) + 1):
        if all(f == (il % n < n - 1) for il, f in enumerate(flags)):
            return n
    raise ModelFileError(f"{path}: attention.sliding_window_pattern {flags} is not periodic "
                         f"(ffnlab needs 'every Nth layer is global')")


def _vocab_size(reader, arch, shapes, path) -> int:
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None:
        return len(tokens.data)
    v = get_key(reader, f"{arch}.vocab_size", path, None)
    if v is not None:
        return int(v)
    if "token_embd.weight" not in shapes:
        raise ModelFileError(f"{path}: no tokenizer.ggml.tokens, no {arch}.vocab_size and no token_embd.weight")
    return shapes["token_embd.weight"][1]                      # ggml ne = (d_model, vocab)
