"""GGUFReader with array fields parsed whole: one view per number array, string arrays lazily.

gguf.GGUFReader parses an array value element by element, keeping a numpy view per element, and
two (length, bytes) per string: SmolLM2's vocabulary (49k tokens, 49k merges, 49k token types)
becomes ~250k small arrays, Gemma 3's (262k tokens, scores and types) ~1M. Building them is most
of a model's load time and tens of MB of peak memory, for strings a cached tokenizer never reads
(formats/tokenizer_cache.py). ArrayReader keeps what ReaderField.contents() reads, in the layout it
reads it: a number array as [item type, count, all items] (data -> the items), a string array as
[item type, count, one uint8 view per string] (data -> each string), where the string views are
made when read (StringParts: the strings' offsets, found by one compiled scan). The leading parts
are as gguf's, so code that reads field.parts[3] for an array's item type still works; contents()
gives the same values (tests/engines/test_gguf_arrays.py).
"""
from collections.abc import Sequence

import gguf
import numpy as np
from gguf import GGUFValueType
from gguf.gguf_reader import ReaderField
from numba import njit


@njit(cache=True, nogil=True)
def string_spans(buf, offs, n):
    """n GGUF strings from byte offs of buf (uint8), each a little-endian u64 length and then its
    bytes -> (starts [n] int64, lengths [n] int64, the offset after the last; -1 where a string
    runs past the end of buf). The caller checks that n strings could fit before calling."""
    starts = np.empty(n, np.int64)
    lens = np.empty(n, np.int64)
    size = buf.size
    for i in range(n):
        if offs + 8 > size:
            return starts, lens, -1
        k = np.uint64(0)
        for b in range(8):
            k |= np.uint64(buf[offs + b]) << np.uint64(8 * b)
        if k > np.uint64(size - offs - 8):                           # past the end (or a huge u64)
            return starts, lens, -1
        starts[i] = offs + 8
        lens[i] = np.int64(k)
        offs += 8 + np.int64(k)
    return starts, lens, offs


class StringParts(Sequence):
    """A string-array field's parts: gguf's leading parts (key, value type, item type, count),
    then one uint8 view per string, made when it is read."""

    def __init__(self, head, data, starts, lens):
        self.head, self.data, self.starts, self.lens = list(head), data, starts, lens

    def __len__(self):
        return len(self.head) + len(self.starts)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"part {i} of {len(self)}")
        if i < len(self.head):
            return self.head[i]
        s = int(self.starts[i - len(self.head)])
        return self.data[s:s + int(self.lens[i - len(self.head)])]


class ArrayReader(gguf.GGUFReader):
    def _build_fields(self, offs, count):
        """gguf's own loop over the metadata, but a string array's parts stay a StringParts and its
        data a range (gguf's would list them: `parts += field_parts` reads every one)"""
        for _ in range(count):
            orig_offs = offs
            kv_klen, kv_kdata = self._get_str(offs)
            offs += int(kv_klen.nbytes + kv_kdata.nbytes)
            raw_kv_type = self._get(offs, np.uint32)
            offs += int(raw_kv_type.nbytes)
            head = [kv_klen, kv_kdata, raw_kv_type]
            size, parts, idxs, types = self._get_field_parts(offs, raw_kv_type[0])
            if isinstance(parts, StringParts):
                parts.head = head + parts.head
                data = range(len(head) + idxs.start, len(head) + idxs.stop)
            else:
                parts, data = head + parts, [i + len(head) for i in idxs]
            self._push_field(ReaderField(orig_offs, str(bytes(kv_kdata), encoding="utf-8"), parts, data, types),
                             skip_sum=True)
            offs += size
        return offs

    def _get_field_parts(self, orig_offs, raw_type):
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, n, offs = GGUFValueType(int(raw_itype[0])), int(alen[0]), orig_offs + 12
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is not None:                                       # numbers: all n in one view
            items = self._get(offs, nptype, n)
            if len(items) != n:
                raise ValueError(f"array of {n} {itype.name} runs past the end of the file")
            return 12 + int(items.nbytes), [raw_itype, alen, items], [2], [GGUFValueType.ARRAY, itype]
        if itype != GGUFValueType.STRING:                            # arrays of arrays: gguf's own way
            return super()._get_field_parts(orig_offs, raw_type)
        if n > (len(self.data) - offs) // 8:                         # each string takes 8 bytes at least
            raise ValueError(f"string array of {n} runs past the end of the file")
        starts, lens, end = string_spans(np.asarray(self.data), offs, n)
        if end < 0:
            raise ValueError(f"string array of {n} runs past the end of the file")
        parts = StringParts([raw_itype, alen], self.data, starts, lens)
        return end - orig_offs, parts, range(2, n + 2), [GGUFValueType.ARRAY, itype]
