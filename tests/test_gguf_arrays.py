"""formats/gguf_arrays.ArrayReader against gguf.GGUFReader: the same fields, values and tensors."""
import gguf
import pytest
from models import model_path, tiny_gguf

from ffnlab.formats.gguf_arrays import ArrayReader


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
