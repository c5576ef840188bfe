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
