"""Seeded malformed model files for the fuzz tests: small generated models, then one thing wrong.

Each builder returns cases [{"name", "argv"}] for tests/reference/fuzz.py. The mutation families:
truncations, bit flips, wrong types, absurd values, huge counts, malformed fields, in
GGUF files (tiny_gguf + gguf-py's GGUFWriter), HF directories, ffnlab checkpoints, tokenizers and
chat templates.
"""
import json
import logging
import os

import numpy as np

import models as M

RUN = ["-p", "hi", "-n", "2"]
logging.getLogger("gguf").setLevel(logging.ERROR)               # GGUFWriter warns on each overwritten key
# values that do not belong in a numeric field: zero, negative, huge, non-finite, wrong JSON types
BAD_JSON_VALUES = {"zero": 0, "neg": -1, "u32max": 2**32 - 1, "huge": 10**12, "float": 2.5, "nan": float("nan"),
                   "inf": float("inf"), "string": "64", "list": [64], "null": None, "object": {"a": 1}, "bool": True}


def run_case(name, model, *extra):
    return {"name": name, "argv": ["run", "-m", str(model), *RUN, *extra]}


# --- GGUF -------------------------------------------------------------------------------------------
def part_offset(reader, part):
    """Byte offset in the file of one numpy part of a GGUFReader field."""
    return int(part.ctypes.data - reader.data.ctypes.data)


def patched(src, dst, edits):
    """Copy src to dst with edits [(offset, bytes)] applied."""
    data = bytearray(open(src, "rb").read())
    for off, b in edits:
        data[off:off + len(b)] = b
    with open(dst, "wb") as f:
        f.write(data)
    return str(dst)


def rewrite_gguf(src, dst, kv=None, drop_keys=()):
    """Rewrite a GGUF with gguf.GGUFWriter: kv {key: (value, GGUFValueType, sub_type)} replaces or adds
    keys; drop_keys are left out. Tensors are copied as they are."""
    import gguf
    r = gguf.GGUFReader(str(src))
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture" or k in drop_keys or k in (kv or {}):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub_type=sub)
    for k, (v, t, sub) in (kv or {}).items():
        w.add_key_value(k, v, t, sub_type=sub)                # general.architecture: overwritten
    for t in r.tensors:
        data = np.array(t.data)
        # quantized blocks arrive as bytes [rows, bytes per row]: the writer derives their shape
        shape = None if data.dtype == np.uint8 else tuple(reversed([int(n) for n in t.shape]))
        w.add_tensor(t.name, data, raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(dst)


def gguf_byte_cases(tmp, rng):
    """Truncations and bit flips of a tiny GGUF, mostly in the header and directory."""
    import gguf
    base = M.tiny_gguf(tmp / "base.gguf")
    size = os.path.getsize(base)
    data_start = gguf.GGUFReader(base).data_offset
    cases = [run_case("gguf-intact", base)]
    cuts = sorted(set(int(x) for x in rng.integers(0, size, 30)) | {0, 4, 8, 16, 23, 24, data_start - 1, data_start,
                                                                    size - 1})
    for n in cuts:
        p = tmp / f"cut-{n}.gguf"
        p.write_bytes(open(base, "rb").read()[:n])
        cases.append(run_case(f"gguf-truncated-at-{n}", p))
    raw = open(base, "rb").read()
    for k in range(90):
        hi = data_start if k < 80 else size                   # 80 flips in header/directory, 10 anywhere
        edits = []
        for pos in rng.integers(4, hi, rng.integers(1, 4)):
            edits.append((int(pos), bytes([raw[pos] ^ (1 << int(rng.integers(0, 8)))])))
        p = patched(base, tmp / f"flip-{k}.gguf", edits)
        cases.append(run_case(f"gguf-bitflip-{k}-at-{[e[0] for e in edits]}", p))
    return cases


def gguf_structure_cases(tmp):
    """Counts, dimensions, types and offsets of the directory set to what they must not be."""
    import gguf
    base = M.tiny_gguf(tmp / "base-s.gguf")
    r = gguf.GGUFReader(base)
    u64 = lambda v: np.uint64(v).tobytes()          # noqa: E731
    u32 = lambda v: np.uint32(v).tobytes()          # noqa: E731
    edits = {"n-tensors-huge": [(8, u64(2**62))], "n-kv-huge": [(16, u64(2**40))], "version-9": [(4, u32(9))],
             "n-tensors-plus-1": [(8, u64(len(r.tensors) + 1))], "n-kv-plus-1": [(16, u64(len(r.fields) - 3 + 1))]}
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type"):
        f = r.fields[key]
        count_at = part_offset(r, f.parts[4])
        for v in (2**40, 2**63, len(f.data) + 1, len(f.data) * 3):
            edits[f"{key}-count-{v}"] = [(count_at, u64(v))]
        edits[f"{key}-elem-type-99"] = [(part_offset(r, f.parts[3]), u32(99))]
    f = r.fields["llama.block_count"]
    edits["key-length-huge"] = [(part_offset(r, f.parts[0]), u64(2**50))]
    edits["value-type-99"] = [(part_offset(r, f.parts[2]), u32(99))]
    for t in r.tensors[:3] + r.tensors[-2:]:
        name_len, name, n_dims, dims, ttype, offset = t.field.parts
        at = lambda p: part_offset(r, p)            # noqa: E731,B023
        edits.update({
            f"{t.name}-n-dims-5": [(at(n_dims), u32(5))],
            f"{t.name}-n-dims-0": [(at(n_dims), u32(0))],
            f"{t.name}-ne0-doubled": [(at(dims), u64(int(dims[0]) * 2))],
            f"{t.name}-ne0-huge": [(at(dims), u64(2**62))],
            f"{t.name}-type-99": [(at(ttype), u32(99))],
            f"{t.name}-type-f16": [(at(ttype), u32(int(gguf.GGMLQuantizationType.F16)))],
            f"{t.name}-type-q8_0": [(at(ttype), u32(int(gguf.GGMLQuantizationType.Q8_0)))],
            f"{t.name}-offset-plus-1": [(at(offset), u64(int(offset[0]) + 1))],
            f"{t.name}-offset-plus-32": [(at(offset), u64(int(offset[0]) + 32))],
            f"{t.name}-offset-wraps": [(at(offset), u64(2**64 - 32))],
            f"{t.name}-name-length-huge": [(at(name_len), u64(2**40))],
        })
    cases = []
    for i, (name, e) in enumerate(edits.items()):
        cases.append(run_case(f"gguf-{name}", patched(base, tmp / f"struct-{i}.gguf", e)))
    # invalid UTF-8 in a token, a key and a string value (same byte length as the valid text)
    marked = M.tiny_gguf(tmp / "marked.gguf")
    raw = open(marked, "rb").read()
    for what, old in (("general.architecture value", b"llama"), ("key", b"llama.block_count"),
                      ("token", b"\xc4\xa0")):
        at = raw.index(old)
        bad = b"\xff" * len(old)
        cases.append(run_case(f"gguf-invalid-utf8-{what}", patched(marked, tmp / f"utf8-{len(cases)}.gguf",
                                                                   [(at, bad)])))
    return cases


def gguf_metadata_cases(tmp):
    """Each config key and tokenizer key set to the wrong type or an absurd value."""
    import gguf
    T = gguf.GGUFValueType
    base = M.tiny_gguf(tmp / "base-m.gguf")
    values = {"zero": (0, T.UINT32, None), "neg": (-1, T.INT32, None), "u32max": (2**32 - 1, T.UINT32, None),
              "u64max": (2**64 - 1, T.UINT64, None), "nan": (float("nan"), T.FLOAT32, None),
              "inf": (float("inf"), T.FLOAT64, None), "neg-float": (-1.0, T.FLOAT32, None),
              "string": ("32", T.STRING, None), "array": ([32, 32], T.ARRAY, T.UINT32), "bool": (True, T.BOOL, None)}
    keys = ["llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
            "llama.attention.head_count_kv", "llama.context_length", "llama.attention.layer_norm_rms_epsilon",
            "llama.rope.freq_base", "llama.attention.key_length", "llama.vocab_size", "llama.rope.scaling.factor",
            "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.add_bos_token"]
    cases = []
    for key in keys:
        for vname, v in values.items():
            p = rewrite_gguf(base, tmp / f"meta-{len(cases)}.gguf", {key: v})
            cases.append(run_case(f"gguf-{key}={vname}", p))
    for vname, v in {"string-mamba": ("mamba", T.STRING, None), "u32": (7, T.UINT32, None)}.items():
        p = rewrite_gguf(base, tmp / f"meta-{len(cases)}.gguf", {"general.architecture": v})
        cases.append(run_case(f"gguf-general.architecture={vname}", p))
    for key in ("llama.embedding_length", "llama.block_count", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
                "tokenizer.ggml.merges", "llama.attention.layer_norm_rms_epsilon"):
        p = rewrite_gguf(base, tmp / f"meta-{len(cases)}.gguf", drop_keys=(key,))
        cases.append(run_case(f"gguf-missing-{key}", p))
    return cases


def gguf_tokenizer_cases(tmp):
    import gguf
    T = gguf.GGUFValueType
    base = M.tiny_gguf(tmp / "base-t.gguf")
    tokens = gguf.GGUFReader(base).fields["tokenizer.ggml.tokens"].contents()
    n = len(tokens)
    arr = lambda v, sub: (v, T.ARRAY, sub)          # noqa: E731
    edits = {
        "merges-no-space": {"tokenizer.ggml.merges": arr(["he"], T.STRING)},
        "merges-three-parts": {"tokenizer.ggml.merges": arr(["h e l"], T.STRING)},
        "merges-unknown-token": {"tokenizer.ggml.merges": arr(["\u4e00 \u4e8c"], T.STRING)},
        "merges-result-not-a-token": {"tokenizer.ggml.merges": arr(["a b"], T.STRING)},
        "merges-empty-part": {"tokenizer.ggml.merges": arr([" e"], T.STRING)},
        "merges-numbers": {"tokenizer.ggml.merges": arr([1, 2], T.UINT32)},
        "tokens-numbers": {"tokenizer.ggml.tokens": arr(list(range(n)), T.UINT32)},
        "tokens-duplicated": {"tokenizer.ggml.tokens": arr(["a"] * n, T.STRING)},
        "token-type-short": {"tokenizer.ggml.token_type": arr([1] * (n - 1), T.INT32)},
        "token-type-strings": {"tokenizer.ggml.token_type": arr(["x"] * n, T.STRING)},
        "token-type-99": {"tokenizer.ggml.token_type": arr([99] * n, T.INT32)},
        "scores-nan": {"tokenizer.ggml.scores": arr([float("nan")] * n, T.FLOAT32)},
        "scores-short": {"tokenizer.ggml.scores": arr([0.0], T.FLOAT32)},
        "bos-out-of-range": {"tokenizer.ggml.bos_token_id": (n + 5, T.UINT32, None)},
        "eos-out-of-range": {"tokenizer.ggml.eos_token_id": (2**31, T.UINT32, None)},
        "unk-out-of-range": {"tokenizer.ggml.unknown_token_id": (n, T.UINT32, None)},
        "eot-out-of-range": {"tokenizer.ggml.eot_token_id": (10**6, T.UINT32, None)},
        "model-unknown": {"tokenizer.ggml.model": ("wordpiece", T.STRING, None)},
        "model-llama": {"tokenizer.ggml.model": ("llama", T.STRING, None)},
        "pre-unknown": {"tokenizer.ggml.pre": ("klingon", T.STRING, None)},
        "pre-number": {"tokenizer.ggml.pre": (3, T.UINT32, None)},
        "chat-template-number": {"tokenizer.chat_template": (3, T.UINT32, None)},
        "add-space-prefix-string": {"tokenizer.ggml.add_space_prefix": ("yes", T.STRING, None)},
    }
    return [run_case(f"gguf-tokenizer-{name}", rewrite_gguf(base, tmp / f"tok-{i}.gguf", kv))
            for i, (name, kv) in enumerate(edits.items())]


def gguf_general_cases(tmp):
    """Every general.* key ffnlab reads (formats/gguf_meta.py GENERAL_KEYS) and every one the tiny
    file holds, set to a value of each wrong type: a string where the spec has a uint32 ("Q4" as
    general.file_type), numbers, a bool, an array where it has a string."""
    import gguf

    from ffnlab.formats.gguf_meta import GENERAL_KEYS
    T = gguf.GGUFValueType
    base = M.tiny_gguf(tmp / "base-g.gguf")
    keys = sorted(set(GENERAL_KEYS) | {k for k in gguf.GGUFReader(base).fields if k.startswith("general.")})
    values = {"string": ("Q4", T.STRING, None), "u32": (7, T.UINT32, None), "neg": (-1, T.INT32, None),
              "u64-huge": (2**40, T.UINT64, None), "float": (2.5, T.FLOAT32, None), "bool": (True, T.BOOL, None),
              "array": ([1, 2], T.ARRAY, T.UINT32), "string-array": (["Q4"], T.ARRAY, T.STRING)}
    cases = []
    for key in keys:
        for vname, v in values.items():
            cases.append(run_case(f"gguf-{key}={vname}", rewrite_gguf(base, tmp / f"general-{len(cases)}.gguf", {key: v})))
    return cases


def gguf_vocab_cases(tmp):
    """tokenizer.ggml.tokens longer and shorter than token_embd's rows (llama.cpp refuses both)."""
    import gguf
    T = gguf.GGUFValueType
    base = M.tiny_gguf(tmp / "base-v.gguf")
    tokens = gguf.GGUFReader(base).fields["tokenizer.ggml.tokens"].contents()
    cases = []
    for name, toks in (("more-tokens-than-rows", tokens + [f"<extra{i}>" for i in range(10)]),
                       ("fewer-tokens-than-rows", tokens[:-1])):
        kv = {"tokenizer.ggml.tokens": (toks, T.ARRAY, T.STRING),
              "tokenizer.ggml.token_type": ([1] * len(toks), T.ARRAY, T.INT32)}
        if len(toks) < len(tokens):                           # keep the merges' results in the vocabulary
            kv["tokenizer.ggml.merges"] = (M.MERGES[:1], T.ARRAY, T.STRING)
        cases.append(run_case(f"gguf-vocab-{name}", rewrite_gguf(base, tmp / f"vocab-{len(cases)}.gguf", kv)))
    return cases


def overflow_gguf(tmp):
    """A tiny GGUF whose weights are finite float32 but whose products overflow it (every matrix
    times 1e18): the run must end cleanly, without NumPy's RuntimeWarning."""
    import gguf
    base = M.tiny_gguf(tmp / "base-o.gguf")
    r = gguf.GGUFReader(base)
    dst = tmp / "overflow.gguf"
    w = gguf.GGUFWriter(str(dst), arch=r.fields["general.architecture"].contents())
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(k, f.contents(), f.types[0], sub_type=sub)
    for t in r.tensors:
        a = np.array(t.data, np.float32)
        w.add_tensor(t.name, a * np.float32(1e18) if a.ndim == 2 else a, raw_shape=tuple(reversed(
            [int(n) for n in t.shape])), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return [run_case("gguf-weights-overflow-float32", dst)]


# --- HF directories ---------------------------------------------------------------------------------
HF_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
            "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
            "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
HF_CONFIG = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 32,
             "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}


def hf_dir(path, config=None, tokenizer=True, n_layer=2, vocab=256):
    """A tiny Llama HF directory written without transformers: config.json, model.safetensors under
    HF names, and a byte-level tokenizer.json -> {HF name: array}."""
    from safetensors.numpy import save_file

    from ffnlab.config import ModelConfig
    from ffnlab.model.params import init_params
    from ffnlab.training.data import byte_tokenizer
    os.makedirs(path, exist_ok=True)
    cfg = ModelConfig(arch="llama", n_layer=n_layer, d_model=32, n_head=4, n_kv_head=2, d_ff=64, vocab_size=vocab,
                      n_ctx=32, tie_embeddings=False)
    top = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
    tensors = {}
    for n, a in init_params(cfg, seed=0).items():
        if n in top:
            tensors[top[n]] = a
        else:
            _, il, short, kind = n.split(".")
            tensors[f"model.layers.{il}.{HF_NAMES[short]}.{kind}"] = a
    save_file(tensors, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({**HF_CONFIG, "vocab_size": vocab, **(config or {})}, f)
    if tokenizer:
        byte_tokenizer().tk.save(os.path.join(path, "tokenizer.json"))
    return tensors


def hf_cases(tmp):
    from safetensors.numpy import save_file
    cases = []

    def new(name, config=None, **kw):
        d = tmp / f"hf-{len(cases)}"
        t = hf_dir(d, config, **kw)
        cases.append(run_case(f"hf-{name}", d))
        return d, t

    new("intact")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "tie_word_embeddings",
                "model_type", "head_dim", "rope_scaling"):
        for vname, v in BAD_JSON_VALUES.items():
            new(f"config-{key}={vname}", {key: v})
    new("config-tie-string-false", {"tie_word_embeddings": "false"})
    new("config-fewer-layers-than-weights", {"num_hidden_layers": 1})
    new("config-more-layers-than-weights", {"num_hidden_layers": 3})
    new("config-rope-scaling-yarn", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    new("config-rope-scaling-linear-no-factor", {"rope_scaling": {"rope_type": "linear"}})
    new("config-model-type-mamba", {"model_type": "mamba"})
    for name, text in (("5000-digit-int", '{"model_type": "llama", "hidden_size": ' + "9" * 5000 + "}"),
                       ("deep-nesting", "[" * 100000 + "]" * 100000), ("truncated", json.dumps(HF_CONFIG)[:40]),
                       ("empty", ""), ("not-an-object", "[1, 2]")):
        d, _ = new(f"config-{name}")
        (d / "config.json").write_text(text)
    d, _ = new("config-not-utf8")
    (d / "config.json").write_bytes(b'{"model_type": "\xff\xfe"}')
    for name, text in (("truncated", None), ("empty", ""), ("wrong-type", '{"model": 5}'), ("list", "[]"),
                       ("model-null", '{"model": null}')):
        d, _ = new(f"tokenizer-json-{name}")
        tj = d / "tokenizer.json"
        tj.write_text(tj.read_text()[:200] if text is None else text)
    for name, edit in (("merge-result-unknown", lambda m: m["merges"].append("a b")),
                       ("merge-part-unknown", lambda m: m["merges"].append("\u4e00 a")),
                       ("merge-one-part", lambda m: m["merges"].append("ab")),
                       ("merge-number", lambda m: m["merges"].append(5)),
                       ("vocab-id-string", lambda m: m["vocab"].__setitem__("a", "0")),
                       ("vocab-list", lambda m: m.__setitem__("vocab", [1]))):
        d, _ = new(f"tokenizer-json-{name}")
        tj = json.loads((d / "tokenizer.json").read_text())
        edit(tj["model"])
        (d / "tokenizer.json").write_text(json.dumps(tj))
    for name, tc in (("add-bos-string", {"add_bos_token": "yes"}), ("bos-number", {"bos_token": 5}),
                     ("bos-object-no-content", {"bos_token": {"x": 1}}), ("chat-template-number", {"chat_template": 5}),
                     ("chat-template-list-no-default", {"chat_template": [{"name": "x", "template": "hi"}]}),
                     ("list", [1]), ("eos-unknown-token", {"eos_token": "<nope>"})):
        d, _ = new(f"tokenizer-config-{name}")
        (d / "tokenizer_config.json").write_text(json.dumps(tc))
    d, _ = new("tokenizer-config-truncated")
    (d / "tokenizer_config.json").write_text('{"bos_token": "<')
    d, _ = new("config-eos-id-out-of-range", {"eos_token_id": 10**6})
    d, _ = new("config-eos-id-string", {"eos_token_id": "</s>"})
    d, t = new("safetensors-truncated")
    st = d / "model.safetensors"
    st.write_bytes(st.read_bytes()[:1000])
    d, t = new("safetensors-header-garbage")
    raw = bytearray(st.read_bytes())
    raw[8:20] = b"\xff" * 12
    (d / "model.safetensors").write_bytes(bytes(raw))
    d, t = new("safetensors-header-length-huge")
    raw = bytearray((d / "model.safetensors").read_bytes())
    raw[0:8] = np.uint64(2**60).tobytes()
    (d / "model.safetensors").write_bytes(bytes(raw))
    d, t = new("safetensors-duplicate-shard")
    save_file({"model.norm.weight": t["model.norm.weight"]}, str(d / "z.safetensors"))
    d, t = new("safetensors-wrong-shape")
    save_file({**t, "model.norm.weight": np.ones(31, np.float32)}, str(d / "model.safetensors"))
    d, t = new("safetensors-missing-tensor")
    save_file({k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"}, str(d / "model.safetensors"))
    d, t = new("safetensors-int-tensor")
    save_file({**t, "model.norm.weight": np.ones(32, np.int32)}, str(d / "model.safetensors"))
    d, t = new("safetensors-nan-weight")
    bad = t["model.layers.0.mlp.down_proj.weight"].copy()
    bad[0, 0] = np.nan
    save_file({**t, "model.layers.0.mlp.down_proj.weight": bad}, str(d / "model.safetensors"))
    d, t = new("safetensors-f8-dtype")
    _f8_tensor(d / "model.safetensors", "model.norm.weight")
    d, t = new("safetensors-fifo")
    os.remove(d / "model.safetensors")
    os.mkfifo(d / "model.safetensors")
    d, t = new("safetensors-is-a-directory")
    os.remove(d / "model.safetensors")
    os.mkdir(d / "model.safetensors")
    d, t = new("config-is-a-fifo")
    os.remove(d / "config.json")
    os.mkfifo(d / "config.json")
    d, t = new("tokenizer-is-a-fifo")
    os.remove(d / "tokenizer.json")
    os.mkfifo(d / "tokenizer.json")
    return cases


def _f8_tensor(path, name):
    """Rewrite one tensor of a safetensors file as F8_E4M3 (same shape, one byte per element)."""
    import struct
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = raw[8 + n:]
    out, pos, tensors = {}, 0, []
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1):
        if k == "__metadata__":
            out[k] = v
            continue
        a, b = v["data_offsets"]
        data = body[a:b] if k != name else bytes(int(np.prod(v["shape"])))
        out[k] = {"dtype": "F8_E4M3" if k == name else v["dtype"], "shape": v["shape"],
                  "data_offsets": [pos, pos + len(data)]}
        tensors.append(data)
        pos += len(data)
    h = json.dumps(out).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(tensors))


def hf_gpt2_dir(path, vocab):
    """A tiny HF GPT-2 directory (ffnlab's export: Conv1D layouts, tied head) of `vocab` embedding
    rows and a byte tokenizer of 256 tokens."""
    from ffnlab.config import ModelConfig
    from ffnlab.formats.export_hf import export_hf
    from ffnlab.model.params import init_params
    from ffnlab.training.data import byte_tokenizer
    cfg = ModelConfig(arch="gpt2", n_layer=1, d_model=32, n_head=4, d_ff=64, ffn="gelu_tanh", norm="layernorm",
                      positions="learned", vocab_size=vocab, n_ctx=32, fused_qkv=True, attn_bias=True, ffn_bias=True,
                      attn_out_bias=True, tie_embeddings=True)
    export_hf(cfg, init_params(cfg, seed=0), byte_tokenizer(), str(path))
    return path


def vocab_cases(tmp):
    """Tokenizer and model vocabularies that disagree, in every format: tokenizer ids past the
    embedding's rows are refused at load (naming the tokenizer file, its size and the rows); more
    rows than tokens (a padded table, as real models have) runs. The prompt "hi" is two byte tokens,
    so a refused case would otherwise run: the check must come from the loader, not the prompt."""
    cases = gguf_vocab_cases(tmp)
    for rows in (200, 300):
        hf_dir(tmp / f"vocab-hf-{rows}", vocab=rows)
        cases.append(run_case(f"hf-llama-{rows}-rows-256-tokens", tmp / f"vocab-hf-{rows}"))
        cases.append(run_case(f"hf-gpt2-{rows}-rows-256-tokens", hf_gpt2_dir(tmp / f"vocab-gpt2-{rows}", rows)))
        cases.append(run_case(f"ckpt-{rows}-rows-256-tokens", checkpoint_dir(tmp / f"vocab-ckpt-{rows}", rows)))
    d = tmp / "vocab-hf-added"                               # 256 rows, one added token with id 1000
    hf_dir(d)
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["added_tokens"] = tj.get("added_tokens", []) + [{"id": 1000, "content": "<far>", "single_word": False,
                                                          "lstrip": False, "rstrip": False, "normalized": False,
                                                          "special": True}]
    (d / "tokenizer.json").write_text(json.dumps(tj))
    cases.append(run_case("hf-llama-added-token-id-past-the-rows", d))
    return cases


# --- ffnlab checkpoints -----------------------------------------------------------------------------
def checkpoint_dir(path, vocab=256):
    """A tiny ffnlab checkpoint (save_model: ffnlab.json, model.safetensors, tokenizer.json) of a
    byte tokenizer (256 tokens) and a model of `vocab` embedding rows."""
    from ffnlab.config import ModelConfig
    from ffnlab.model.params import init_params
    from ffnlab.training.checkpoint import save_model
    from ffnlab.training.data import byte_tokenizer, tokenizer_meta
    cfg = ModelConfig(**M.TINY)
    cfg.vocab_size = vocab
    tok = byte_tokenizer()
    save_model(str(path), cfg, init_params(cfg, seed=0), tok, tokenizer_meta(tok, "byte"))
    return str(path)


def copied_dir(base, d, json_name=None, obj=None, edit=None, files=None):
    """Copy directory base to d; then json_name gets a copy of obj passed through edit, and files
    {name: bytes or str, or None to delete} are written."""
    import shutil
    shutil.copytree(base, d)
    if edit is not None:
        o = json.loads(json.dumps(obj))
        edit(o)
        (d / json_name).write_text(json.dumps(o))
    for fname, content in (files or {}).items():
        if content is None:
            os.remove(d / fname)
        else:
            (d / fname).write_bytes(content if isinstance(content, bytes) else content.encode())
    return d


def checkpoint_cases(tmp):
    base = checkpoint_dir(tmp / "ckpt-base")
    meta = json.load(open(os.path.join(base, "ffnlab.json")))
    cases = []

    def variant(name, edit_meta=None, files=None):
        d = copied_dir(base, tmp / f"ckpt-{len(cases)}", "ffnlab.json", meta, edit_meta, files)
        cases.append(run_case(f"ckpt-{name}", d))

    variant("intact")
    for key in ("n_layer", "d_model", "n_head", "d_ff", "vocab_size", "n_ctx", "norm_eps", "rope_theta", "arch",
                "ffn", "tie_embeddings", "head_dim"):
        for vname, v in BAD_JSON_VALUES.items():
            variant(f"config-{key}={vname}", lambda m, k=key, v=v: m["config"].__setitem__(k, v))
    variant("arch-mamba", lambda m: m["config"].__setitem__("arch", "mamba"))
    variant("arch-bert", lambda m: m["config"].__setitem__("arch", "bert"))
    variant("config-unknown-field", lambda m: m["config"].__setitem__("n_experts", 8))
    variant("config-missing", lambda m: m.pop("config"))
    variant("config-list", lambda m: m.__setitem__("config", [1]))
    variant("format-wrong", lambda m: m.__setitem__("format", "gguf"))
    variant("version-2", lambda m: m.__setitem__("version", 2))
    for key, v in (("bos_id", 10**6), ("bos_id", "x"), ("eos_id", -1), ("add_bos", "yes"), ("chat_template", 5),
                   ("kind", None)):
        variant(f"tokenizer-{key}={v}", lambda m, k=key, v=v: m["tokenizer"].__setitem__(k, v))
    variant("tokenizer-meta-list", lambda m: m.__setitem__("tokenizer", [1]))
    raw = open(os.path.join(base, "ffnlab.json"), "rb").read()
    variant("meta-truncated", files={"ffnlab.json": raw[:50]})
    variant("meta-not-utf8", files={"ffnlab.json": b"\xff" + raw})
    variant("meta-nan", files={"ffnlab.json": raw.replace(b'"norm_eps": 1e-05', b'"norm_eps": NaN')})
    weights = open(os.path.join(base, "model.safetensors"), "rb").read()
    variant("weights-missing", files={"model.safetensors": None})
    variant("weights-truncated", files={"model.safetensors": weights[:len(weights) // 2]})
    variant("weights-empty", files={"model.safetensors": b""})
    variant("tokenizer-json-missing", files={"tokenizer.json": None})
    variant("tokenizer-json-truncated", files={"tokenizer.json": open(os.path.join(base, "tokenizer.json")).read()[:100]})
    variant("tokenizer-json-garbage", files={"tokenizer.json": b"\x00\xff" * 10})
    tj = json.load(open(os.path.join(base, "tokenizer.json")))
    tj["model"]["merges"] = ["a b"]
    variant("tokenizer-json-bad-merge", files={"tokenizer.json": json.dumps(tj).encode()})
    return cases


def resume_cases(tmp):
    """trainer.json and the state file it names, corrupted; each resumed with `ffnlab train --resume`."""
    from ffnlab.cli.main import main
    data = tmp / "data.txt"
    data.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    base = tmp / "train-base"
    small = ["--n-layer", "1", "--d-model", "16", "--n-head", "2", "--d-ff", "32", "--n-ctx", "16", "--seq-len", "16",
             "--batch", "2", "--eval-batches", "1", "--warmup", "0", "--quiet"]
    assert main(["train", "--data", str(data), "--out", str(base), "--steps", "2", *small]) == 0
    other = tmp / "train-other"
    assert main(["train", "--data", str(data), "--out", str(other), "--steps", "2", "--n-layer", "2", *small[2:]]) == 0
    rec = json.load(open(base / "trainer.json"))
    state = rec["state_file"]
    cases = []

    def variant(name, edit=None, files=None):
        d = copied_dir(base, tmp / f"resume-{len(cases)}", "trainer.json", rec, edit, files)
        # a finished run: resuming reads and checks everything, then has no step left to take
        cases.append({"name": f"resume-{name}", "argv": ["train", "--resume", "--out", str(d), "--quiet"]})

    variant("intact")
    for key in ("step", "state_file", "rng", "optimizer", "history", "train_seconds"):
        variant(f"missing-{key}", lambda r, k=key: r.pop(k))
        variant(f"{key}-string", lambda r, k=key: r.__setitem__(k, "x"))
    variant("state-file-etc-passwd", lambda r: r.__setitem__("state_file", "/etc/passwd"))
    variant("state-file-dotdot", lambda r: r.__setitem__("state_file", "../train-base/" + state))
    variant("rng-garbage", lambda r: r.__setitem__("rng", {"bit_generator": "PCG64", "state": 5}))
    variant("optimizer-t-negative", lambda r: r["optimizer"].__setitem__("t", -3))
    variant("history-train-number", lambda r: r["history"].__setitem__("train", 5))
    variant("trainer-json-truncated", files={"trainer.json": open(base / "trainer.json", "rb").read()[:30]})
    variant("trainer-json-list", files={"trainer.json": b"[1, 2]"})
    variant("state-missing", files={state: None})
    st = open(base / state, "rb").read()
    variant("state-truncated", files={state: st[:len(st) // 2]})
    variant("state-of-another-config", files={state: open(other / json.load(open(other / "trainer.json"))["state_file"],
                                                               "rb").read()})
    variant("settings-wrong-type", files={"ffnlab.json": json.dumps({**json.load(open(base / "ffnlab.json")),
                                                                     "train": {"settings": {"lr": "fast"}}}).encode()})
    for section in ("train", "tokenizer", "config"):
        variant(f"{section}-section-missing", files={"ffnlab.json": json.dumps({k: v for k, v in json.load(
            open(base / "ffnlab.json")).items() if k != section}).encode()})
    return cases


# --- chat templates ---------------------------------------------------------------------------------
CHAT_TEMPLATES = {
    "plain": "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}",
    "syntax-error": "{% for m in messages %}{{ m.content }",
    "unclosed-block": "{% if true %}hello",
    "undefined-method": "{{ messages[0].nope() }}",
    "undefined-filter": "{{ messages|frobnicate }}",
    "raise-exception": "{{ raise_exception('only user turns') }}",
    "division-by-zero": "{{ 1 / 0 }}",
    "type-error": "{{ messages + 1 }}",
    "index-error": "{{ messages[99].content }}",
    "infinite-loop": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
    "huge-repeat": "{{ 'x' * 10**10 }}",
    "huge-power": "{{ 7 ** 99999999 }}",
    "huge-center": "{{ 'x'|center(10**10) }}",
    "huge-output": "{% for i in range(99999) %}{{ 'y' * 99 }}{% endfor %}",
    "doubling": "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
                "{{ ns.s|length }}",
    "recursion": "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "format-width": "{{ '%0999999999d' % 1 }}",
    "sandbox-escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "sandbox-globals": "{{ raise_exception.__globals__ }}",
    "empty": "",
}


def chat_cases(tmp):
    import gguf
    T = gguf.GGUFValueType
    base = M.tiny_gguf(tmp / "base-chat.gguf")
    cases = []
    for name, tpl in CHAT_TEMPLATES.items():
        p = rewrite_gguf(base, tmp / f"chat-{len(cases)}.gguf", {"tokenizer.chat_template": (tpl, T.STRING, None)})
        cases.append({"name": f"chat-{name}", "argv": ["run", "-m", p, "--chat", *RUN]})
    return cases
