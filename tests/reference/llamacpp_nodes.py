"""llama.cpp's node sequence of one forward, shared by test_trace_llamacpp.py and test_gguf_families.py."""
from ffnlab.tracing.llamacpp import KQ_NODES


N_KV_PAD = 256


def sequence(nodes, T):
    """(name, op, ne) with kq's key axis checked and replaced by a marker."""
    out = []
    for n in nodes:
        ne = tuple(n.ne)
        if n.name.split("-")[0] in KQ_NODES:
            assert ne[0] in (T, -(-T // N_KV_PAD) * N_KV_PAD), (n.name, ne)
            ne = ("keys",) + ne[1:]
        out.append((n.name, n.op, ne))
    return out
