"""Writing GGUF files: a GGUFWriter that accepts empty arrays, and an atomic finish.

Shared by the exporter (formats/export_gguf.py) and the MLP pruner (pruning/gguf_rewrite.py).
"""
import os


def writer_class():
    import gguf

    class Writer(gguf.GGUFWriter):
        """GGUFWriter refuses empty arrays, but the format has them (a count of 0) and llama.cpp
        reads them; the byte tokenizer's merge list is one, and llama.cpp requires the key."""

        def _pack_val(self, val, vtype, add_vtype, sub_type=None):
            if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0 and sub_type is not None:
                head = self._pack("I", vtype) if add_vtype else b""
                return bytes(head + self._pack("I", sub_type) + self._pack("Q", 0))
            return super()._pack_val(val, vtype, add_vtype, sub_type)

    return Writer


def copied_field(f):
    """(value, type, array item type or None) of a GGUFReader field, as GGUFWriter.add_key_value
    takes them. An empty array has no item in f.types; its item type is the part after the
    array's own type tag (parts: key length, key, type, item type, count)."""
    import gguf

    vtype = f.types[0]
    if vtype != gguf.GGUFValueType.ARRAY:
        return f.contents(), vtype, None
    sub = f.types[1] if len(f.types) > 1 else gguf.GGUFValueType(int(f.parts[3][0]))
    return f.contents(), vtype, sub


def finish_atomically(writer, tmp, out_path):
    """Write header, metadata and tensors to tmp, then rename it to out_path: a reader never
    sees a half-written file, and a failure leaves no temporary file behind."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out_path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def copy_fields(reader, writer, d_ff_key=None, n_keep=None):
    """Every metadata key of the source, in order (a pruned file: d_ff_key, its feed_forward_length, set to n_keep)."""
    from gguf import GGUFValueType as T

    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":     # the writer writes these itself
            continue
        if key == "general.alignment":
            writer.add_custom_alignment(int(f.contents()))
            continue
        vtype, sub = f.types[0], None
        if vtype == T.ARRAY:                                           # an empty array lists no item type:
            sub = f.types[1] if len(f.types) > 1 else T(int(f.parts[3][0]))   # read it from the raw parts
        value = f.contents()
        if key == d_ff_key:                                            # one width, or one per layer
            value = [n_keep] * len(value) if vtype == T.ARRAY else n_keep
        writer.add_key_value(key, value, vtype, sub_type=sub)
