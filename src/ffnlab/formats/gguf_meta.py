"""GGUF metadata and tensor directory -> ModelConfig, without reading any tensor data.

    reader = open_gguf(path)                 # gguf.GGUFReader, with clear errors for bad files
    cfg = config_from_gguf(reader, path)     # ModelConfig from the {arch}.* keys + tensor names
    infos = tensor_infos(reader)             # name, ggml shape, type, elements, bytes per tensor

GGUFReader memory-maps the file and parses only the header, the key/value metadata and the
tensor directory; the tensor data stays on disk untouched (nothing is dequantized here).

Metadata keys read, for arch in {gpt2, llama, qwen2, gemma2, gemma3, gptneox, olmo2}:
  {arch}.embedding_length -> d_model          {arch}.feed_forward_length -> d_ff
  {arch}.block_count -> n_layer               {arch}.context_length -> n_ctx
  {arch}.attention.head_count -> n_head       {arch}.attention.head_count_kv -> n_kv_head (default n_head)
  {arch}.attention.key_length -> head_dim (default d_model / n_head)
  {arch}.attention.layer_norm_epsilon (gpt2, gptneox) or .layer_norm_rms_epsilon (others) -> norm_eps
  {arch}.rope.freq_base -> rope_theta (default 10000, llama.cpp's default)
  {arch}.rope.dimension_count -> rope_dim when below head_dim (partial rotary: GPT-NeoX's n_rot)
  gptneox.use_parallel_residual -> parallel_residual (required, as llama.cpp requires it)
  gemma2.attn_logit_softcapping / .final_logit_softcapping -> attn_softcap / final_logit_softcap
      (llama.cpp's defaults 50 and 30 when absent: its gemma2 graph always caps both)
  {arch}.rope.scaling.type / .factor (linear) -> rope_scale; yarn, longrope (a factor other than 1) refused
  {arch}.attention.sliding_window (+ .sliding_window_pattern) -> sliding window (gemma2, gemma3);
      llama, qwen3, phi3: every layer slides (Mistral, Phi-3; llama.cpp itself ignores the key there)
  {arch}.rope.freq_base_swa -> rope_theta_local (gemma3, default 10000)
  tokenizer.ggml.tokens (its length) or {arch}.vocab_size -> vocab_size (else token_embd's rows)
What the keys do not say is read from the tensor names: biases, the gate (gated FFN), q/k
norms, post norms, a fused qkv, and tied embeddings (no output.weight).
gptneox's MLP is exact GELU here: the Pythia models it holds were trained with exact GELU (HF's
"gelu"); llama.cpp's ggml_gelu is the tanh approximation, a difference verify's tolerance and
arith="ggml" account for, while ffnlab reading its own GGUF export gives its own logits.
Phi-3 keeps gate and up in one ffn_up [2*d_ff rows] (formats/gguf.py splits it); Llama 3's
rope_freqs.weight is read there too.
"""
import contextlib
import math
import os
from dataclasses import dataclass

from ..config import MAX_DIM, MAX_LAYERS, ConfigError, ModelConfig
from ..errors import ModelFileError
from ..families import family, gguf_archs
from .gguf_arrays import ArrayReader
from .gguf_check import check_gguf
from .gguf_moe import check_expert_tensors, moe_fields
from .jsonfile import check_regular_file

ARCHS = gguf_archs()                               # families/: one module per architecture
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
    ModelFileError naming the file; the structure is checked (gguf_check.py) before the reader runs."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise ModelFileError(f"{path}: no such file")
    check_regular_file(path, "GGUF file")
    check_gguf(path)
    try:
        with _plain_ndarray_views():
            reader = ArrayReader(path)            # gguf.GGUFReader, array fields parsed whole (gguf_arrays.py)
    except Exception as e:                   # what the check above does not foresee, still one line
        raise ModelFileError(f"{path}: corrupt GGUF ({type(e).__name__}: {str(e)[:200]})") from None
    return reader


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


def field_value(field, path):
    """A GGUFReader field's Python value; invalid UTF-8 in it is a ModelFileError naming the key."""
    try:
        return field.contents()
    except UnicodeDecodeError as e:
        raise ModelFileError(f"{path}: GGUF metadata key '{field.name}' holds invalid UTF-8 ({e.reason})") from None


def tokenizer_meta(reader, path) -> dict:
    """The tokenizer.* keys -> {key: Python value} (lists as lists), for gguf_tokenizer.py."""
    return {k: field_value(f, path) for k, f in reader.fields.items() if k.startswith("tokenizer.")}


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
            out[key] = field_value(field, "GGUF")
    return out


def get_key(reader, key, path, default=..., kind=None, lo=None, hi=None):
    """One metadata value; a missing key raises ModelFileError naming it (unless a default is given).
    kind (int, float, str, bool, list): the value must be one (an int is a float; a bool is neither),
    finite and within [lo, hi] -- so head_count 0, a NaN epsilon or a string block count fail here."""
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise ModelFileError(f"{path}: missing GGUF metadata key '{key}'")
        return default
    v = field_value(field, path)
    if kind is None:
        return v
    number = isinstance(v, (int, float)) and not isinstance(v, bool)
    ok = (number and (kind is float or isinstance(v, int))) if kind in (int, float) else isinstance(v, kind)
    if not ok:
        raise ModelFileError(f"{path}: GGUF metadata key '{key}' must be {_KIND[kind]}, found {str(v)[:60]!r}")
    if kind in (int, float):
        if not math.isfinite(v) or (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ModelFileError(f"{path}: GGUF metadata key '{key}' = {v} is outside [{lo}, {hi}]")
        v = float(v) if kind is float else v
    return v


_KIND = {int: "an integer", float: "a number", str: "a string", bool: "a bool", list: "an array"}


# The general.* keys ffnlab reads and the type the GGUF spec gives each (docs/gguf.md in ggml:
# architecture, name and type are strings; file_type, quantization_version and alignment are
# uint32). Checked together at the start of a load, so a wrong type is one line naming the key,
# whichever of them a later step would have read first.
GENERAL_KEYS = {"general.architecture": str, "general.name": str, "general.type": str,
                "general.file_type": int, "general.quantization_version": int, "general.alignment": int}
U32_MAX = 2**32 - 1


def check_general_keys(reader, path):
    """Each general.* key ffnlab reads, when present, has its spec's type (ModelFileError naming it)."""
    for key, kind in GENERAL_KEYS.items():
        if kind is int:
            get_key(reader, key, path, None, int, 0, U32_MAX)
        else:
            get_key(reader, key, path, None, kind)


def file_type_name(reader, path="GGUF") -> str:
    """general.file_type as llama-quantize names it (Q4_K_M, Q8_0, F16, ...), or '' when absent."""
    from gguf.constants import LlamaFileType

    ft = get_key(reader, "general.file_type", path, None, int, 0, U32_MAX)
    if ft is None:
        return ""
    try:
        return LlamaFileType(ft).name.replace("MOSTLY_", "").replace("ALL_", "")
    except ValueError:
        return f"file_type {ft}"


def config_from_gguf(reader, path) -> ModelConfig:
    """A GGUFReader's metadata + tensor names -> ModelConfig (what llama.cpp would build)."""
    path = os.fspath(path)
    check_general_keys(reader, path)
    arch = get_key(reader, "general.architecture", path, kind=str)
    if arch not in ARCHS:
        raise ModelFileError(f"{path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")
    names = {t.name for t in reader.tensors}
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}

    def key(k, default=..., kind=int, lo=1, hi=MAX_DIM):
        return get_key(reader, f"{arch}.{k}", path, default, kind, lo, hi)

    d_model, n_head = key("embedding_length"), key("attention.head_count")
    n_layer = key("block_count", hi=MAX_LAYERS)
    _check_blocks(names, n_layer, path)                          # before any per-layer shape is built
    d_ff = get_key(reader, f"{arch}.feed_forward_length", path)
    if isinstance(d_ff, list):                                   # a per-layer list: ffnlab needs one width
        if not d_ff or not all(type(x) is int for x in d_ff):
            raise ModelFileError(f"{path}: {arch}.feed_forward_length must be integers, found {str(d_ff)[:60]}")
        widths = set(d_ff)
        if len(widths) != 1:
            raise ModelFileError(f"{path}: {arch}.feed_forward_length varies per layer ({sorted(widths)}); "
                                 f"ffnlab needs one d_ff")
        d_ff = widths.pop()
    else:
        d_ff = key("feed_forward_length")
    fam = family(arch)                                           # families/<arch>.py
    eps_key = "attention.layer_norm_epsilon" if fam.layernorm else "attention.layer_norm_rms_epsilon"
    has = lambda t: f"blk.0.{t}" in names                       # noqa: E731
    act = fam.activation
    gated = has("ffn_gate.weight") or fam.graph.fused_gate_up   # Phi-3: gate rows inside ffn_up
    moe = moe_fields(key, arch, names, path)                     # {} for a dense file
    if not fam.dense_ffn and not gated and not moe:
        raise ModelFileError(f"{path}: missing tensor blk.0.ffn_gate.weight ({arch} has a gated FFN)")
    kw = dict(
        arch=arch, n_layer=n_layer, d_model=d_model, n_head=n_head,
        n_kv_head=key("attention.head_count_kv", n_head),
        head_dim=key("attention.key_length", d_model // n_head),
        d_ff=d_ff, ffn=_GATED_KIND[act] if gated else act,
        ffn_bias=has("ffn_up.bias"), attn_bias=has("attn_q.bias") or has("attn_qkv.bias"),
        attn_out_bias=has("attn_output.bias"), fused_qkv=has("attn_qkv.weight"),
        norm="layernorm" if has("attn_norm.bias") else "rmsnorm", norm_eps=key(eps_key, kind=float, lo=1e-30, hi=1.0),
        post_attn_norm=has("post_attention_norm.weight"), post_ffn_norm=has("post_ffw_norm.weight"),
        qk_norm=has("attn_q_norm.weight"),
        positions="learned" if "position_embd.weight" in names else "rope",
        rope_pairing=fam.gguf_pairing,           # llama: the converter permuted Q/K rows to adjacent pairs
        rope_theta=key("rope.freq_base", 10000.0, float, 1e-30, 1e30),
        vocab_size=_vocab_size(reader, arch, shapes, path), n_ctx=key("context_length"),
        tie_embeddings="output.weight" not in names,
        name=get_key(reader, "general.name", path, "", str))
    kw.update(fam.gguf_flags)                                    # what the graph hard-codes (OLMo 2: post norms only)
    scaling = get_key(reader, f"{arch}.rope.scaling.type", path, "linear", str)
    factor = key("rope.scaling.factor", 0.0, float, 0.0, 1e30)
    if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
        # yarn / longrope change every rotation angle (and yarn the attention scale): refused, not ignored
        raise ModelFileError(f"{path}: {arch}.rope.scaling.type = {scaling!r} (factor {factor:g}) is not implemented "
                             f"(ffnlab runs linear RoPE scaling and Llama 3's rope_freqs.weight)")
    if scaling == "linear" and factor > 0:
        kw["rope_scale"] = factor
    n_rot = key("rope.dimension_count", kw["head_dim"])
    if n_rot > kw["head_dim"]:
        raise ModelFileError(f"{path}: {arch}.rope.dimension_count = {n_rot} exceeds the head width {kw['head_dim']}")
    if kw["positions"] == "rope" and n_rot < kw["head_dim"]:
        kw["rope_dim"] = n_rot                                   # partial rotary (GPT-NeoX)
    kw.update(family_keys(reader, arch, path))
    if arch in ("gemma2", "gemma3"):
        kw.update(_gemma(reader, arch, path, kw))
    elif fam.gguf_window:
        # every layer slides (pattern 0): written by convert_hf_to_gguf for Phi-3 and by ffnlab's
        # export for Mistral; llama.cpp's llama and phi3 graphs do not apply it (HF does)
        kw["sliding_window"] = key("attention.sliding_window", 0, int, 0, MAX_DIM)
    kw.update(moe)
    try:
        cfg = ModelConfig(**kw)
        if cfg.moe:
            check_expert_tensors(cfg, shapes, path)
        return cfg
    except ConfigError as e:                 # e.g. embedding_length not a multiple of head_count
        raise ModelFileError(f"{path}: the metadata describes no valid model: {e}") from None


def family_keys(reader, arch, path) -> dict:
    """The {arch}.* keys a family adds (families/<arch>.py gguf_keys), typed as the config field's
    default: {config field: value}."""
    out = {}
    for f, (k, default) in family(arch).gguf_keys.items():
        kind = type(getattr(ModelConfig, f))
        out[f] = get_key(reader, f"{arch}.{k}", path, default, kind, *((0, 1e30) if kind in (int, float) else ()))
    return out


def _check_blocks(names, n_layer, path):
    """Every blk.N tensor has N < block_count, and blk.{block_count-1} exists: checked against the
    tensor names, so a block count of 2^32-1 fails before any per-layer shape is built."""
    layers = {int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if layers and max(layers) >= n_layer:
        raise ModelFileError(f"{path}: tensor blk.{max(layers)}.* but block_count is {n_layer}")
    if layers and n_layer - 1 not in layers:
        raise ModelFileError(f"{path}: block_count is {n_layer} but the file has no tensors for "
                             f"blk.{n_layer - 1} (its highest block is {max(layers)})")


def _gemma(reader, arch, path, kw) -> dict:
    """llama.cpp's Gemma rules (llama-model.cpp load_hparams, models/gemma3.cpp):
    - token embeddings scaled by sqrt(d_model);
    - q scaled by 1/sqrt(head_dim), except the 27B models (Gemma 2: 46 layers, Gemma 3: 62 layers),
      which use 1/sqrt(d_model / n_head); llama.cpp reads no query_pre_attn_scalar key;
    - sliding-window layers: il % n < n - 1 slides, n = 2 (Gemma 2) or
      {arch}.attention.sliding_window_pattern, default 6 (Gemma 3);
    - Gemma 3's sliding layers use RoPE base {arch}.rope.freq_base_swa, default 10000, unscaled;
    - Gemma 2 soft-caps attention scores and logits always (defaults 50 and 30); Gemma 3 caps its
      logits only when {arch}.final_logit_softcapping is present."""
    big = kw["n_layer"] == (46 if arch == "gemma2" else 62)
    out = {"embed_scale": True,
           "attn_scale": 1.0 / math.sqrt(kw["d_model"] / kw["n_head"] if big else kw["head_dim"]),
           # Gemma 3 files must carry the window; llama.cpp defaults Gemma 2's to 4096
           "sliding_window": get_key(reader, f"{arch}.attention.sliding_window", path,
                                     4096 if arch == "gemma2" else ..., int, 1, MAX_DIM),
           "sliding_window_pattern": 2,
           "final_logit_softcap": get_key(reader, f"{arch}.final_logit_softcapping", path,
                                          30.0 if arch == "gemma2" else 0.0, float, 0.0, 1e30)}
    if arch == "gemma2":                     # llama.cpp's gemma2 always soft-caps the attention scores
        out["attn_softcap"] = get_key(reader, "gemma2.attn_logit_softcapping", path, 50.0, float, 1e-30, 1e30)
    if arch == "gemma3":
        out["sliding_window_pattern"] = _swa_pattern(get_key(reader, f"{arch}.attention.sliding_window_pattern",
                                                             path, 6), kw["n_layer"], path)
        out["rope_theta_local"] = get_key(reader, f"{arch}.rope.freq_base_swa", path, 10000.0, float, 1e-30, 1e30)
    return out


def _swa_pattern(value, n_layer, path) -> int:
    """A scalar pattern n, or a per-layer list of 'is sliding' flags that must repeat with one period
    (ModelConfig describes the layers by that period)."""
    if not isinstance(value, (list, tuple)):
        if type(value) is not int or not 0 < value <= MAX_LAYERS:
            raise ModelFileError(f"{path}: attention.sliding_window_pattern must be a positive integer, found {value!r:.40}")
        return value
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
    v = get_key(reader, f"{arch}.vocab_size", path, None, int, 1, MAX_DIM)
    if v is not None:
        return v
    if "token_embd.weight" not in shapes:
        raise ModelFileError(f"{path}: no tokenizer.ggml.tokens, no {arch}.vocab_size and no token_embd.weight")
    return shapes["token_embd.weight"][1]                      # ggml ne = (d_model, vocab)
