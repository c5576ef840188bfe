"""GGUFReader with array fields parsed whole: one view per number array, one per string.

gguf.GGUFReader parses an array value element by element, keeping a numpy view per element, and
two (length, bytes) per string: SmolLM2's vocabulary (49k tokens, 49k merges, 49k token types)
becomes ~250k small arrays, Gemma 3's (262k tokens, scores and types) ~1M. Building them is most
of a model's load time and tens of MB of peak memory. ArrayReader keeps what ReaderField.contents()
reads, in the layout it reads it: a number array as [item type, count, all items] (data -> the
items), a string array as [item type, count, one uint8 view per string] (data -> each string).
The leading parts are as gguf's, so code that reads field.parts[3] for an array's item type still
works; contents() gives the same values (tests/test_gguf_arrays.py).
"""
import struct

import gguf
import numpy as np
from gguf import GGUFValueType


class ArrayReader(gguf.GGUFReader):
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
        buf, size, parts = memoryview(self.data), len(self.data), [raw_itype, alen]
        for _ in range(n):                                           # u64 length, then the bytes
            if offs + 8 > size:
                raise ValueError(f"string array of {n} runs past the end of the file")
            (k,) = struct.unpack_from("<Q", buf, offs)
            if offs + 8 + k > size:
                raise ValueError(f"a string of {k} bytes runs past the end of the file")
            parts.append(self.data[offs + 8:offs + 8 + k])
            offs += 8 + k
        return offs - orig_offs, parts, list(range(2, n + 2)), [GGUFValueType.ARRAY, itype]
