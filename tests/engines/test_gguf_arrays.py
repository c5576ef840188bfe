"""formats/gguf_arrays.ArrayReader against gguf.GGUFReader: the same fields, values and tensors."""
import gguf
import pytest
from models import model_path, tiny_gguf

from ffnlab.formats.gguf_arrays import ArrayReader

pytestmark = pytest.mark.slow


def same_as_gguf(path):
    ours, theirs = ArrayReader(path), gguf.GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key, f in theirs.fields.items():
        assert ours.fields[key].types == f.types, key
        assert ours.fields[key].contents() == f.contents(), key
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            assert int(ours.fields[key].parts[3][0]) == int(f.parts[3][0]), key    # the item type, as gguf_rewrite reads it
    assert [(t.name, t.tensor_type, t.data_offset) for t in ours.tensors] == \
           [(t.name, t.tensor_type, t.data_offset) for t in theirs.tensors]


def test_a_tiny_gguf_reads_the_same(tmp_path):
    same_as_gguf(tiny_gguf(tmp_path / "t.gguf"))                # tokens, merges (strings), token types (ints)


@pytest.mark.slow
def test_smollm2_reads_the_same():
    same_as_gguf(model_path("smollm2"))                  # 49k tokens, 49k merges, token types


def test_string_parts_are_read_on_demand_and_index_like_a_list(tmp_path):
    """A string array's parts: gguf's leading five, then one view per string (gguf keeps a length
    and a bytes view per string), made when read; negative indices and slices as a list's"""
    ours = ArrayReader(tiny_gguf(tmp_path / "t.gguf"))
    theirs = gguf.GGUFReader(tmp_path / "t.gguf")
    f, g = ours.fields["tokenizer.ggml.tokens"], theirs.fields["tokenizer.ggml.tokens"]
    strings = [bytes(g.parts[j]) for j in g.data]
    assert len(f.data) == len(g.data) and len(f.parts) == 5 + len(strings)
    assert [bytes(f.parts[i]) for i in f.data] == strings
    for i in range(5):
        assert bytes(f.parts[i]) == bytes(g.parts[i]), i                 # key, value type, item type, count
    assert bytes(f.parts[-1]) == strings[-1] and bytes(f.parts[-2]) == strings[-2]
    assert [bytes(p) for p in f.parts[5:9]] == strings[:4]
    assert f.contents(7) == g.contents(7) and f.contents(slice(2, 6)) == g.contents(slice(2, 6))
    with pytest.raises(IndexError):
        f.parts[len(f.parts)]


def test_string_spans_stops_at_a_string_past_the_end():
    import numpy as np

    from ffnlab.formats.gguf_arrays import string_spans
    buf = np.frombuffer(np.array([3, 0, 1, 2], np.uint64).tobytes()[:8] + b"abc" + (0).to_bytes(8, "little")
                        + (5).to_bytes(8, "little") + b"xy", np.uint8)    # "abc", "", then 5 bytes with 2 left
    starts, lens, end = string_spans(buf, 0, 2)
    assert (starts.tolist(), lens.tolist(), end) == ([8, 19], [3, 0], 19)
    assert string_spans(buf, 0, 3)[2] == -1
    huge = np.frombuffer((2**64 - 1).to_bytes(8, "little"), np.uint8)  # a length past any file
    assert string_spans(huge, 0, 1)[2] == -1
