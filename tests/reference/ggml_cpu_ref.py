"""ggml's own CPU kernels, called through ctypes from the libggml-cpu that llama-cpp-python ships:
the reference the ggml-arithmetic tests hold ffnlab's transcriptions to, bit for bit.

Only exported C symbols are used (quantize_row_q8_*, ggml_vec_dot_*, ggml_vec_soft_max_f32,
ggml_vec_swiglu_f32, ggml_vec_silu_f32); each test skips when the library or a symbol is missing.
"""
import ctypes
import glob
import os

import numpy as np
import pytest

F32P = ctypes.POINTER(ctypes.c_float)


def _lib():
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("llama-cpp-python is not installed")
    libs = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so*"))
    if not libs:
        pytest.skip("llama-cpp-python ships no libggml-cpu.so")
    lib = ctypes.CDLL(sorted(libs)[0])
    lib.ggml_cpu_init()                     # fills the fp16 tables the kernels read
    return lib


LIB = None


def lib():
    global LIB
    if LIB is None:
        LIB = _lib()
    return LIB


def fn(name):
    f = getattr(lib(), name, None)
    if f is None:
        pytest.skip(f"libggml-cpu has no {name}")
    return f


def has_avx2():
    return bool(lib().ggml_cpu_has_avx2()) and bool(lib().ggml_cpu_has_fma())


# ggml-common.h: block_q8_0 {f16 d; int8 qs[32]}, block_q8_1 {f16 d, s; int8 qs[32]},
# block_q8_K {float d; int8 qs[256]; int16 bsums[16]} (gguf-py's table has an older Q8_1 size)
BLOCKS = {"q8_0": (32, 34), "q8_1": (32, 36), "q8_K": (256, 292)}


def quantize_row(kind, x):
    """ggml's quantize_row_<kind> of a float32 row -> the raw block bytes"""
    elems, nbytes = BLOCKS[kind]
    x = np.ascontiguousarray(x, np.float32)
    out = np.zeros(x.size // elems * nbytes, np.uint8)
    fn("quantize_row_" + kind)(x.ctypes.data_as(F32P), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(x.size))
    return out


def vec_dot(name, n, wrow, yrow):
    """ggml_vec_dot_<name>(n, &s, 0, w, 0, y, 0, 1) -> s"""
    s = ctypes.c_float(0)
    wrow, yrow = np.ascontiguousarray(wrow), np.ascontiguousarray(yrow)
    fn("ggml_vec_dot_" + name)(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0),
                               wrow.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0),
                               yrow.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0), ctypes.c_int(1))
    return np.float32(s.value)


def soft_max(x, mx):
    """ggml_vec_soft_max_f32(n, y, x, max) -> (y = exp(x - max), the float64 sum)"""
    x = np.ascontiguousarray(x, np.float32)
    y = np.empty_like(x)
    f = fn("ggml_vec_soft_max_f32")
    f.restype = ctypes.c_double
    s = f(ctypes.c_int(x.size), y.ctypes.data_as(F32P), x.ctypes.data_as(F32P), ctypes.c_float(mx))
    return y, s


def swiglu(x, g):
    x, g = np.ascontiguousarray(x, np.float32), np.ascontiguousarray(g, np.float32)
    y = np.empty_like(x)
    fn("ggml_vec_swiglu_f32")(ctypes.c_int(x.size), y.ctypes.data_as(F32P), x.ctypes.data_as(F32P),
                              g.ctypes.data_as(F32P))
    return y


def llama_logits(path, ids, steps=0, repack=False, n_ctx=256):
    """llama.cpp through llama-cpp-python's C API: the prompt `ids` in one decode (logits for every
    position), then `steps` greedy tokens, one decode each. flash attention off, f16 K/V cache
    (its defaults otherwise); repack=False keeps the weights in their file layout (the products
    verify traces; llama.cpp's default repacks Q4_0/Q4_K/Q6_K... for other kernels, see
    docs/glass-box.md). -> (prompt logits [T, V], generated ids [steps], their logits [steps, V])"""
    from ffnlab.tracing.llamacpp import _lib
    L, _ = _lib()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = L.llama_model_load_from_file(os.fspath(path).encode(), mp)
    assert model, f"llama.cpp could not load {path}"
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(n_ctx, -(-(len(ids) + steps) // 256) * 256)
    cp.flash_attn_type = 0
    cp.n_threads = cp.n_threads_batch = 2
    ctx = L.llama_init_from_model(model, cp)
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    batch = L.llama_batch_init(max(len(ids), 1), 0, 1)

    def decode(toks, pos0):
        for i, tok in enumerate(toks):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(tok), pos0 + i, 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = len(toks)
        assert L.llama_decode(ctx, batch) == 0
        return np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, i), shape=(n_vocab,))
                         for i in range(len(toks))], np.float32)

    try:
        prompt = decode(ids, 0)
        gen, gen_logits, last = [], [], prompt[-1]
        for s in range(steps):
            tok = int(np.argmax(last))
            gen.append(tok)
            last = decode([tok], len(ids) + s)[0]
            gen_logits.append(last)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        L.llama_model_free(model)
    return prompt, gen, np.array(gen_logits, np.float32).reshape(steps, n_vocab)
