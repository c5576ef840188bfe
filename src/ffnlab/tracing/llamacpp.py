"""llama.cpp as a reference: run one decode and capture every node of its graph.

Uses llama-cpp-python's low-level C API. llama_context_params.cb_eval is the scheduler's eval
callback (ggml_backend_sched_eval_callback): for each graph node it is asked "do you want this
tensor?" (ask=True); answering yes makes the scheduler compute up to that node and call again
(ask=False) with the node's data ready. That is how llama.cpp's own llama-eval-callback tool
prints every intermediate. The settings follow what a node-by-node comparison needs:

  flash_attn_type = 0      plain attention, so kq / kq_soft_max / kqv exist as nodes
  use_extra_bufts = False  no CPU weight repacking (repacked kernels round differently)
  logits for every token   so the last layer keeps all T rows (llama.cpp's out_ids GET_ROWS
                           otherwise drops all but the requested rows)

The ggml_tensor struct below is ggml's (include/ggml.h) for the ggml that llama-cpp-python
0.3.x vendors; op and type names are asked from ggml itself (ggml_op_desc, ggml_type_name)
because their enum numbers shift between ggml versions.
"""
import ctypes
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import UsageError
from ..families import family
from ..threads import threads

GGML_MAX_DIMS, GGML_MAX_SRC, GGML_MAX_NAME, GGML_MAX_OP_PARAMS = 4, 10, 64, 64


class ggml_tensor(ctypes.Structure):
    pass


ggml_tensor._fields_ = [
    ("type", ctypes.c_int),
    ("buffer", ctypes.c_void_p),
    ("ne", ctypes.c_int64 * GGML_MAX_DIMS),       # elements per dim, ne[0] fastest
    ("nb", ctypes.c_size_t * GGML_MAX_DIMS),      # stride in bytes per dim
    ("op", ctypes.c_int),
    ("op_params", ctypes.c_int32 * (GGML_MAX_OP_PARAMS // 4)),
    ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(ggml_tensor) * GGML_MAX_SRC),
    ("view_src", ctypes.POINTER(ggml_tensor)),
    ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p),
    ("name", ctypes.c_char * GGML_MAX_NAME),
    ("extra", ctypes.c_void_p),
    ("padding", ctypes.c_char * 8),
]
_P = ctypes.POINTER(ggml_tensor)

# ggml type name -> numpy dtype of one element (the types an activation can have)
NUMPY_TYPE = {"f32": np.float32, "f16": np.float16, "i32": np.int32, "i64": np.int64}


@dataclass
class RefNode:
    """One node as llama.cpp's eval callback sees it."""
    name: str                    # e.g. "ffn_up-0", "Qcur-0 (view)", "node_42"
    op: str                      # ggml_op_desc: "MUL_MAT", "SWIGLU", "GELU", ...
    type: str                    # ggml_type_name: "f32", "f16"
    ne: tuple                    # ggml shape ne[0..3]
    srcs: list = field(default_factory=list)   # [(name, ne)]
    array: np.ndarray | None = None            # numpy [ne3, ne2, ne1, ne0] (float32), when kept


def _lib():
    try:
        import llama_cpp
        from llama_cpp import _ggml
    except ImportError as e:
        raise UsageError(f"--against llama.cpp needs llama-cpp-python (pip install llama-cpp-python): {e}") from None
    g = _ggml.libggml                  # libggml.so; libggml-base's symbols resolve through it
    g.ggml_op_desc.argtypes = [_P]
    g.ggml_op_desc.restype = ctypes.c_char_p
    g.ggml_type_name.argtypes = [ctypes.c_int]
    g.ggml_type_name.restype = ctypes.c_char_p
    g.ggml_nbytes.argtypes = [_P]
    g.ggml_nbytes.restype = ctypes.c_size_t
    g.ggml_backend_tensor_get.argtypes = [_P, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    g.ggml_backend_tensor_get.restype = None
    global _log_cb
    if _log_cb is None:
        # llama.cpp logs every load to stderr; keep its errors for our messages, drop the rest
        def log(level, text, _user):
            if level == 3:            # GGML_LOG_LEVEL_ERROR
                LOG_ERRORS.append(text.decode(errors="replace").strip())
        _log_cb = llama_cpp.llama_log_callback(log)
        llama_cpp.llama_log_set(_log_cb, None)
    return llama_cpp, g


LOG_ERRORS = []                       # llama.cpp's error log lines
_log_cb = None                        # the ctypes log callback, referenced for as long as it is set


def _read(t, tc, type_name, g):
    """The node's elements as numpy [ne3, ne2, ne1, ne0], following its strides (nb), so
    non-contiguous views (PERMUTE, GPT-2's Qcur/Kcur/Vcur slices of wqkv) read correctly."""
    dt = np.dtype(NUMPY_TYPE[type_name])
    n = g.ggml_nbytes(t)              # for a view: the byte span its strides cover
    buf = np.empty(n, np.uint8)
    g.ggml_backend_tensor_get(t, buf.ctypes.data, 0, n)
    shape = tuple(reversed(tc.ne))
    strides = tuple(reversed(tc.nb))
    a = np.lib.stride_tricks.as_strided(buf.view(dt), shape=shape, strides=strides)
    return np.array(a, dtype=np.float32 if dt.kind == "f" else dt)


def capture(path, ids, keep=None, n_threads=None, kv_f32=False, lora=None, repack=False):
    """Run llama.cpp on token ids (one sequence, positions 0..T-1, logits for every token)
    -> [RefNode] in evaluation order. keep(name) -> bool says which nodes' data to copy
    (default: every f32/f16 node whose name is not a view or an unnamed node_N).
    kv_f32: keep the KV cache in f32 instead of llama.cpp's default f16.
    lora: (adapter GGUF path, scale): a LoRA adapter on the model, as llama.cpp's --lora-scaled.
    repack: let llama.cpp repack weights for its CPU kernels (its default; off here so that each
    weight stays one tensor the callback can name, and the products are the plain ones)."""
    L, g = _lib()
    ids = [int(i) for i in ids]
    T = len(ids)
    if T == 0:
        raise UsageError("no tokens to run")
    if keep is None:
        def keep(name):
            return "(" not in name and not name.startswith("node_")
    nodes, errors = [], []

    def cb(t_ptr, ask, _user):
        if ask:
            return True               # yes: compute up to this node and show it to us
        try:
            t = ctypes.cast(t_ptr, _P)
            tc = t.contents
            name = tc.name.decode(errors="replace")
            type_name = g.ggml_type_name(tc.type).decode()
            srcs = [(s.contents.name.decode(errors="replace"), tuple(s.contents.ne)) for s in tc.src if s]
            node = RefNode(name, g.ggml_op_desc(t).decode(), type_name, tuple(tc.ne), srcs)
            if type_name in NUMPY_TYPE and keep(name):
                node.array = _read(t, tc, type_name, g)
            nodes.append(node)
        except Exception as e:        # an exception cannot cross the C boundary: keep it
            errors.append(e)
            return False              # abort the graph
        return True

    cb_c = L.ggml_backend_sched_eval_callback(cb)    # referenced until the decode is done
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_extra_bufts = repack
    model = L.llama_model_load_from_file(os.fspath(path).encode(), mp)
    if not model:
        why = f": {LOG_ERRORS[-1]}" if LOG_ERRORS else ""
        raise UsageError(f"{path}: llama.cpp could not load this file{why}")
    n_ctx = -(-T // 256) * 256        # llama.cpp pads the KV cache to 256 cells anyway
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = n_ctx
    cp.flash_attn_type = 0            # LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = cb_c
    if kv_f32:
        cp.type_k = cp.type_v = 0     # GGML_TYPE_F32
    cp.cb_eval_user_data = None
    cp.n_threads = cp.n_threads_batch = n_threads or threads()
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        L.llama_model_free(model)
        raise UsageError(f"{path}: llama.cpp could not create a context")
    adapter = None
    if lora is not None:
        adapter = L.llama_adapter_lora_init(model, os.fspath(lora[0]).encode())
        if not adapter or L.llama_set_adapters_lora(ctx, (L.llama_adapter_lora_p_ctypes * 1)(adapter), 1,
                                                    (ctypes.c_float * 1)(float(lora[1]))) != 0:
            L.llama_free(ctx)
            L.llama_model_free(model)
            why = f": {LOG_ERRORS[-1]}" if LOG_ERRORS else ""
            raise UsageError(f"{lora[0]}: llama.cpp could not apply this LoRA adapter{why}")
    batch = L.llama_batch_init(T, 0, 1)
    try:
        for i, tok in enumerate(ids):
            batch.token[i] = tok
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = True
        batch.n_tokens = T
        rc = L.llama_decode(ctx, batch)
    finally:
        L.llama_batch_free(batch)
        L.llama_free(ctx)
        if adapter:
            L.llama_adapter_lora_free(adapter)
        L.llama_model_free(model)
    if errors:
        raise errors[0]
    if rc != 0:
        raise UsageError(f"{path}: llama_decode failed with code {rc}")
    return nodes


# nodes with one column per KV-cache cell: llama.cpp pads the cache to 256 cells, so its arrays
# have n_kv >= S columns (the extra cells empty); Gemma 2's soft-capping adds three
KQ_NODES = ("kq", "kq_scaled_1", "kq_tanh", "kq_scaled_2", "kq_soft_max")


def is_auto_name(name):
    """Names llama.cpp makes up itself: views/reshapes/copies of a named node, and node_N."""
    return "(" in name or name.startswith("node_")


def is_kv_node(node):
    """KV-cache stores and reads: SET_ROWS into cache_k_lL / cache_v_lL and views of them."""
    return node.name.startswith("cache_") or node.op == "SET_ROWS"


def f32_copy(src, dst):
    """Write dst: the GGUF src with every tensor dequantized to F32 by gguf-py (the same
    dequantization ffnlab and transformers use) and the metadata copied. llama.cpp then runs
    float32 matmuls instead of rounding activations to 8 bits for quantized weights."""
    import gguf
    from gguf import GGUFReader

    from ..formats.gguf_write import copied_field, writer_class

    r = GGUFReader(os.fspath(src))
    w = writer_class()(os.fspath(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue                  # the writer writes these itself
        if key == "general.file_type":
            w.add_file_type(int(gguf.LlamaFileType.ALL_F32))
            continue
        value, vtype, sub = copied_field(f)
        w.add_key_value(key, value, vtype, sub_type=sub)
    for t in r.tensors:
        w.add_tensor(t.name, np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def ffnlab_only(name, arch):
    """Nodes ffnlab names where llama.cpp leaves an unnamed node_N: Gemma 3's q scale after
    RoPE (Qcur_scaled), the attention output projection (attn_out) in every graph but llama's,
    its product before the output bias (attn_out_w, GPT-2), the table rows before Granite's embedding
    multiplier (embd_rows: llama.cpp names the product embd), what a family's graph leaves unnamed
    (families/*.py graph.unnamed: Phi-3's first residual sum, ffn_inp), and a LoRA adapter's parts
    (build_lora_mm's mul_mat(a), mul_mat(b), scale: `{node}_lora_a`, `_lora_b`, `_lora_scaled`)."""
    base = name.rsplit("-", 1)[0]
    names = family(arch).graph
    return base in ("Qcur_scaled", "attn_out_w", "embd_rows") or (base == "attn_out" and not names.attn_out_named) \
        or base in names.unnamed or base.endswith(("_lora_a", "_lora_b", "_lora_scaled"))
