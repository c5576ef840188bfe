"""The packed-weights cache (formats/pack_cache.py): a hit gives the very layout packing makes (every
array equal, q/k/v and gate/up stacked again) and the same logits bit for bit; an edited file, a
damaged entry or a disabled cache pack at load as before; the size limit evicts the oldest."""
import os

import numpy as np
import pytest
from quant_models import quant_model

import ffnlab
from ffnlab.formats import pack_cache
from ffnlab.quant import QuantTensor

IDS = np.array([0, 5, 70, 200, 9, 33, 101, 7])


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FFNLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FFNLAB_PACK_CACHE_MB", raising=False)
    return tmp_path / "cache" / "packed"


def _logits(m):
    """a prefill's logits and four decoding steps': the tiled and the one-token products"""
    kv = m.new_cache()
    steps = [m.forward_last(IDS[:4], kv)] + [m.forward_last(IDS[i:i + 1], kv) for i in range(4, 8)]
    return np.concatenate([m.forward(IDS).ravel(), np.concatenate(steps)])


def _layouts(m):
    return {n: w for n, w in m.params.items() if isinstance(w, QuantTensor)}


@pytest.mark.parametrize("qtype", ["Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_a_second_load_maps_the_same_layout(cache, tmp_path, qtype):
    path = quant_model(tmp_path, qtype)
    packed_now = ffnlab.load(path)
    assert not packed_now.pack_cached and len(list(cache.iterdir())) == 1
    back = ffnlab.load(path)
    assert back.pack_cached
    a, b = _layouts(packed_now), _layouts(back)
    assert a.keys() == b.keys()
    for name, w in a.items():
        for field in ("qs", "qh", "d", "m"):
            x, y = getattr(w.packed, field), getattr(b[name].packed, field)
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), (name, field)
        assert (w.stack is None) == (b[name].stack is None), name
    q, k, v = (b[f"blk.0.attn_{x}.weight"] for x in "qkv")
    assert q.stack is k.stack is v.stack is not None                  # stacked again: one product for q/k/v
    assert np.shares_memory(q.packed.qs, q.stack.packed.qs)            # as views of the one layout
    assert np.array_equal(_logits(back), _logits(packed_now))          # the same kernels on the same bytes


def test_an_edited_file_packs_again(cache, tmp_path):
    """Same header (types, shapes), other blocks: the file's size, time and inode are in the key."""
    path = quant_model(tmp_path, "Q4_0")
    ffnlab.load(path)
    other = quant_model(tmp_path, "Q4_0", name="other.gguf")         # new random blocks, the same header
    os.replace(other, path)
    m = ffnlab.load(path)
    assert not m.pack_cached
    assert np.array_equal(_logits(m), _logits(ffnlab.load(path, dequantize=False)))
    assert len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("damage", ["truncate", "index", "magic", "offset", "zero"])
def test_a_damaged_entry_is_ignored(cache, tmp_path, damage):
    path = quant_model(tmp_path, "Q4_1")
    want = _logits(ffnlab.load(path))
    (entry,) = cache.iterdir()
    raw = bytearray(entry.read_bytes())
    n = int.from_bytes(raw[8:16], "little")
    if damage == "truncate":
        raw = raw[:len(raw) // 2]
    elif damage == "index":
        raw[16 + n // 2] ^= 0xFF                                     # the JSON no longer parses (or lies)
    elif damage == "magic":
        raw[0] ^= 1
    elif damage == "zero":                                           # well-formed, but not Q4_1's layout (zero point 8)
        head = raw[16:16 + n].decode()
        assert '"zero": 0' in head
        raw[16:16 + n] = head.replace('"zero": 0', '"zero": 8', 1).encode()
    else:                                                            # an array past the end of the file
        head = raw[16:16 + n].decode()
        raw[16:16 + n] = head.replace('"arrays": [[0,', '"arrays": [[99999999999,', 1).encode()[:n].ljust(n)
    entry.write_bytes(bytes(raw))
    m = ffnlab.load(path)
    assert not m.pack_cached
    assert np.array_equal(_logits(m), want)


def test_the_cache_can_be_turned_off(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("FFNLAB_PACK_CACHE_MB", "0")
    path = quant_model(tmp_path, "Q4_0")
    ffnlab.load(path)
    assert not ffnlab.load(path).pack_cached and not cache.exists()
    monkeypatch.setenv("FFNLAB_CACHE_DIR", "")
    monkeypatch.delenv("FFNLAB_PACK_CACHE_MB")
    assert not ffnlab.load(path).pack_cached
    assert not ffnlab.load(path, arith="ggml").pack_cached             # ggml's layouts are packed at load


def test_the_size_limit_keeps_the_newest_entries(cache, tmp_path, monkeypatch):
    one = quant_model(tmp_path, "Q4_0", name="a.gguf")
    ffnlab.load(one)
    (first,) = cache.iterdir()
    size = first.stat().st_size
    monkeypatch.setenv("FFNLAB_PACK_CACHE_MB", str(1.5 * size / (1 << 20)))   # room for one entry
    assert size < pack_cache._limit() < 2 * size
    two = quant_model(tmp_path, "Q4_0", name="b.gguf")                   # other blocks: an entry of the same size
    ffnlab.load(two)
    assert [p.name for p in cache.iterdir()] != [first.name] and len(list(cache.iterdir())) == 1
    assert ffnlab.load(two).pack_cached and not ffnlab.load(one).pack_cached


def test_run_json_says_where_the_layout_came_from(cache, tmp_path, capsys):
    import json

    from ffnlab.cli.main import main
    path = quant_model(tmp_path, "Q4_0")
    for want in (False, True):
        assert main(["run", "-m", str(path), "-p", "ab", "-n", "2", "--temp", "0", "--json"]) == 0
        out = capsys.readouterr().out
        assert json.loads(out.strip().splitlines()[-1])["timings"]["packed_from_cache"] is want
