"""ggml arithmetic over the row-interleaved layouts (quant/ggml_packed.py, quant/ggml_int8.py): the
same bits as the row-at-a-time kernels of quant/ggml_kernels.py (which tests/unit/test_ggml_quants.py
holds to ggml's own code), for every packed type, one token and several (K-quants: ggml's
per-token vec_dot below 8 tokens, its tiled order from 8), rows that do not fill the last 64-row
group, and activations whose integer sums reach the float32-exactness limits the kernels rely on.
Every type has two paths, both held here: "int8" (ggml_int8.py / ggml_int8_k.py's byte
multiplies, what an AVX2 host's QuantTensor runs) and "float" (ggml_packed.py / ggml_packed_k.py's
float kernels, the fallback)."""
import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from ffnlab.ops import ggml_math
from ffnlab.quant import QuantTensor, ggml_int8, ggml_int8_k, ggml_kernels, ggml_packed, simd
from ffnlab.quant.blocks import F16_TABLE, table_for
from ffnlab.quant.ggml_quants import Q8Rows
from ggml_blocks import PAIRS, activations, random_blocks

TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.Q4_K, T.Q6_K]
BLOCK32 = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0]
CASES = [(t, p) for t in TYPES for p in ("int8", "float")]              # (type, path)
CASE_IDS = [f"{t.name}-{p}" for t, p in CASES]
INT8_LAYOUTS = (ggml_int8.LanePacked, ggml_int8_k.LaneKPacked)


def reference(qtype, data, a):
    y = np.empty((a.qs.shape[0], data.shape[0]), np.float32)
    ggml_kernels.gemm(int(qtype), data, F16_TABLE, a.qs, a.d, a.e, y)
    return y


def product(qtype, data, x, path):
    """x [N, n] times the blocks data on one path -> [N, rows]. "int8": a QuantTensor's product
    (pack() at load, quantized activation, the layout's kernels); "float": the float kernels
    called directly over their layout, as a host without AVX2 runs them."""
    rows, n = data.shape[0], x.shape[1]
    if path == "float":
        P = ggml_packed.pack(int(qtype), data, table_for(qtype), n, int8=False)
        assert not isinstance(P, INT8_LAYOUTS)
        return P.mul_q8(Q8Rows(PAIRS[qtype][0], x))
    if not simd.HAS_AVX2:
        pytest.skip("this CPU has no AVX2: the int8 path is not used here")
    w = QuantTensor(data, qtype, (rows, n), arith="ggml")
    w.pack(release=False)
    assert isinstance(w.packed, INT8_LAYOUTS)
    return w.matmul(x)


@pytest.mark.parametrize("qtype, path", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("tokens", [1, 3, 8, 13])
def test_packed_products_equal_the_reference_order(qtype, path, tokens):
    rng = np.random.default_rng(11)
    n, rows = 512, 100                                                 # 2 groups, the second part empty
    data = random_blocks(qtype, rows, n, rng)
    x = activations(rng, tokens, n)
    np.testing.assert_array_equal(product(qtype, data, x, path), reference(qtype, data, Q8Rows(PAIRS[qtype][0], x)))


@pytest.mark.parametrize("qtype, path", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("rows, blocks", [(1, 1), (7, 2), (63, 3), (65, 1), (130, 5)])
def test_odd_shapes_equal_the_reference_order(qtype, path, rows, blocks):
    """rows that fill no 8-row chunk, part of one, or spill into a last group; one block per row
    or a few; 1, 2, 5 and 9 tokens (K-quants: vec_dot order, then tiled)"""
    n = blocks * gguf.GGML_QUANT_SIZES[qtype][0]
    rng = np.random.default_rng(rows * 1000 + n)
    data = random_blocks(qtype, rows, n, rng)
    for tokens in (1, 2, 5, 9):
        x = activations(rng, tokens, n)
        np.testing.assert_array_equal(product(qtype, data, x, path), reference(qtype, data, Q8Rows(PAIRS[qtype][0], x)))


@pytest.mark.parametrize("qtype, path", CASES, ids=CASE_IDS)
def test_extreme_codes_stay_exact(qtype, path):
    """Every weight at its largest magnitude and every activation code at +-127: the integer
    lanes reach their bounds (Q6_K's half-superblock lanes 16,386,048 < 2^24), where a float32
    sum that was not exact would round."""
    rng = np.random.default_rng(12)
    n, rows = 512, 64
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.full((rows, n // elems, nbytes), 255, np.uint8)          # all code bits set: q = max
    raw[rows // 2:] = rng.integers(0, 256, raw[rows // 2:].shape, dtype=np.uint8)
    for o in PAIRS[qtype][2]:
        raw[:, :, o:o + 2] = np.full((rows, n // elems), 3e-3, np.float16)[..., None].view(np.uint8)
    if qtype == T.Q6_K:                                                # scales of -128 with q = 63
        raw[:rows // 2, :, 192:208] = 128
    data = raw.reshape(rows, -1)
    x = np.where(rng.random((9, n)) < 0.9, 1.0, -1.0).astype(np.float32) * 3.0   # |q_x| = 127 everywhere
    x[0] = 3.0
    for t in (1, 9):
        np.testing.assert_array_equal(product(qtype, data, x[:t], path), reference(qtype, data, Q8Rows(PAIRS[qtype][0], x[:t])))


@pytest.mark.parametrize("qtype, path", CASES[:8], ids=CASE_IDS[:8])        # the 32-weight types
def test_int8_lane_bounds(qtype, path):
    """The byte multiplies' limits: vpmaddubsw adds two u8 x s8 products into int16 (saturating
    past 32767). Q8_0's -128 (|w| = 128, sign(x, w) = -x) and 127 and Q5_0's -16 / 15, against
    activation codes +-127 of both signs: 2 x 128 x 127 = 32512 must come out exact; nibbles all 15
    (Q4_0: (15 - 8) x, Q4_1: 15 x) likewise. Rows alternate the extreme codes so every lane sees
    each sign combination."""
    rng = np.random.default_rng(16)
    n, rows = 256, 72
    data = random_blocks(qtype, rows, n, rng).reshape(rows, n // 32, -1)
    code0 = PAIRS[qtype][2][-1] + 2                                     # first code byte after the halves
    if qtype == T.Q8_0:
        data[:, :, code0:] = np.where(np.arange(rows)[:, None, None] % 2, 0x80, 0x7F)   # -128 / 127
    elif qtype == T.Q5_0:                                              # qh then nibbles: all 0 (-16) or all 1 (15)
        data[:, :, code0:] = np.where(np.arange(rows)[:, None, None] % 2, 0x00, 0xFF)
    else:
        data[:, :, code0:] = 0xFF                                       # every nibble 15
    data = data.reshape(rows, -1)
    x = np.where(rng.random((5, n)) < 0.5, 1.0, -1.0).astype(np.float32) * 2.0   # codes +-127
    a = Q8Rows(PAIRS[qtype][0], x)
    assert np.abs(a.qs).max() == 127
    np.testing.assert_array_equal(product(qtype, data, x, path), reference(qtype, data, a))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_packed_layout_dequantizes_to_gguf_values(qtype):
    rng = np.random.default_rng(13)
    data = random_blocks(qtype, 70, 256, rng)
    w = QuantTensor(data, qtype, (70, 256), arith="ggml")
    w.pack(release=False)
    ref = gguf.quants.dequantize(data, qtype).reshape(70, 256)
    np.testing.assert_array_equal(w.dequantize(), ref)
    ids = np.array([0, 69, 3, 64])
    np.testing.assert_array_equal(w[ids], ref[ids])                    # row lookups read the layout


@pytest.mark.parametrize("qtype", ggml_packed.STACKABLE, ids=lambda t: T(t).name)
def test_stacked_ggml_matrix_equals_its_parts(qtype):
    """q/k/v stacked into one product (one quantization of x, as each of ggml's three mul_mats
    makes the same one): each part's rows give the part's own product."""
    rng = np.random.default_rng(14)
    qtype = T(qtype)
    parts = [QuantTensor(random_blocks(qtype, r, 256, rng), qtype, (r, 256), arith="ggml") for r in (128, 64, 40)]
    x = activations(rng, 2, 256)
    alone = [reference(qtype, w.data, Q8Rows(PAIRS[qtype][0], x)) for w in parts]
    stack = QuantTensor.stacked(parts, release=False)
    assert stack is not None and stack.arith == "ggml"
    np.testing.assert_array_equal(stack.matmul(x), np.concatenate(alone, axis=1))
    np.testing.assert_array_equal(stack.matvec(x[0]), np.concatenate(alone, axis=1)[0])
    ref = np.concatenate([gguf.quants.dequantize(w.data, qtype).reshape(w.shape) for w in parts])
    np.testing.assert_array_equal(stack.dequantize(), ref)             # the parts' views dequantize too
    np.testing.assert_array_equal(parts[2][np.array([0, 39])], ref[[192, 231]])


def test_packed_types_are_the_ones_with_a_layout():
    assert set(ggml_packed.PACKED_TYPES) == {int(t) for t in TYPES}


def test_one_vector_ops_equal_the_general_ones():
    """ops/ggml_decode.py (decode_step's compiled RMSNorm, RoPE and attention) against
    ops/ggml_math.py's array versions, which the llama.cpp tests hold: the same bits."""
    from ffnlab.ops import ggml_decode, ggml_math
    rng = np.random.default_rng(15)
    for n in (5, 64, 576, 2049):            # the squares added one by one in float64, as ggml's loop
        x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)
        seq = 0.0
        for v in x:
            seq += float(np.float32(v * v))
        scale = np.float32(1.0) / np.sqrt(np.float32(seq / n) + np.float32(1e-5))
        assert ggml_math.rms_norm(x, None, 1e-5)[1][1][0] == scale
        assert ggml_decode.rms_norm1(x, np.ones(n, np.float32), 1e-5)[0] == x[0] * scale
    x, w = (rng.standard_normal(576) * 3).astype(np.float32), rng.standard_normal(576).astype(np.float32)
    np.testing.assert_array_equal(ggml_decode.rms_norm1(x, w, 1e-5), ggml_math.rms_norm(x, w, 1e-5)[0])
    cos, sin = ggml_math.rope_angles([37], 64, 10000.0)
    for neox in (False, True):
        qk = (rng.standard_normal((12, 64)) * 5).astype(np.float32)
        ref = ggml_math.rope(qk[None], cos, sin, "neox" if neox else "normal")[0]
        ggml_decode.rope1(qk, cos[0], sin[0], neox)
        np.testing.assert_array_equal(qk, ref)


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_ggml_decode_step_equals_forward(name):
    """The one-token path (model/decode.py with GGML) gives forward()'s bits, logits and cache."""
    from ffnlab.formats.installed import resolve_model
    from ffnlab.formats.load import load
    from ffnlab.model.transformer import forward
    m = load(resolve_model(name), arith="ggml", progress=False)      # scripts/install.sh --test installs both models
    ids = [1, 450, 1175, 310]
    fast, full = m.new_cache(n_ctx=16), m.new_cache(n_ctx=16)
    tok = int(np.argmax(m.forward_last(ids, fast)))
    m.forward_last(ids, full)
    for _ in range(4):
        a = m.forward_last([tok], fast)
        b = forward(m.params, m.config, np.asarray([[tok]]), kv=full, last_only=True, weights=m.weights(), arith=m.arith)[0][0, -1]
        np.testing.assert_array_equal(a, b)
        tok = int(np.argmax(a))
    for il in range(m.config.n_layer):
        np.testing.assert_array_equal(fast.k[il], full.k[il])
        np.testing.assert_array_equal(fast.v[il], full.v[il])


def test_model_logits_equal_without_avx2():
    """The whole model on the fallback kernels (FFNLAB_NO_AVX2=1, a fresh process: the choice is
    made at import) gives the int8 path's logits bit for bit: prompt (SmolLM2's Q4_1 / Q8_0,
    Gemma 3's Q5_0 / Q8_0 / Q4_K / Q6_K, 9 tokens: the K-quants' tiled order) and one decoded
    token (vec_dot order)."""
    import os
    import subprocess
    import sys
    code = ("import sys, numpy as np\n"
            "from ffnlab.formats.installed import resolve_model\n"
            "from ffnlab.formats.load import load\n"
            "from ffnlab.quant import ggml_int8, simd\n"
            "for name in ('smollm2', 'gemma3'):\n"
            "    m = load(resolve_model(name), arith='ggml', progress=False)\n"
            "    kv = m.new_cache(n_ctx=16)\n"
            "    a = m.forward_last([1, 450, 1175, 310, 5, 77, 901, 13, 2], kv)\n"
            "    b = m.forward_last([int(np.argmax(a))], kv)\n"
            "    np.save(sys.argv[1] + name + '.npy', np.stack([a, b]))\n"
            "    print(name, simd.HAS_AVX2, type(m.params['blk.0.ffn_up.weight'].packed).__name__)\n")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        out = {}
        for flag in ("0", "1"):
            env = dict(os.environ, FFNLAB_NO_AVX2=flag)
            r = subprocess.run([sys.executable, "-c", code, os.path.join(d, flag)], env=env, capture_output=True,
                               text=True, timeout=600)
            assert r.returncode == 0, r.stderr[-2000:]
            out[flag] = r.stdout
        if not simd.HAS_AVX2:
            pytest.skip("this CPU has no AVX2: both runs took the fallback")
        assert "LanePacked" in out["0"] and "True" in out["0"] and "LanePacked" not in out["1"], out
        for name in ("smollm2", "gemma3"):
            int8, fallback = (np.load(os.path.join(d, flag + name + ".npy")) for flag in ("0", "1"))
            np.testing.assert_array_equal(int8, fallback)


def test_to_f16_rounds_as_numpy_half():
    """ggml_math.to_f16 (bit arithmetic, compiled) against NumPy's float32 -> float16 -> float32
    (IEEE round to nearest, ties to even): 4M random bit patterns of every sign and exponent, and
    the edges: halves' ties, the subnormal boundary 2^-14, 65504 / 65520 (largest half, first
    value that rounds to infinity), zeros of both signs, infinities and NaN."""
    rng = np.random.default_rng(15)
    bits = rng.integers(0, 2**32, 1 << 22, dtype=np.uint64).astype(np.uint32)
    edges = np.array([0.0, -0.0, 2.0**-14, -(2.0**-14), 2.0**-24, 2.0**-25, 3 * 2.0**-25, 65504.0, 65519.99,
                      65520.0, -65520.0, np.inf, -np.inf, np.nan, 1 + 2.0**-11, 1 + 3 * 2.0**-11], np.float32)
    x = np.concatenate([bits.view(np.float32), edges])
    with np.errstate(over="ignore", invalid="ignore"):
        ref = x.astype(np.float16).astype(np.float32)
    got = ggml_math.to_f16(x)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])
