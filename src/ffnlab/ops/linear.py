"""Linear layer y = x W^T + b: the one product every weight goes through.

Weights are stored [out, in], like nn.Linear and like the numpy view of a GGUF tensor
(whose ggml ne order is {in, out}). A weight is either a float array (training, HF files,
checkpoints), a quant.QuantTensor (GGUF blocks kept as they lie in the file), or a
ComposedWeight that computes its own product (training/lora.py: a frozen base plus a LoRA
adapter, or a frozen base alone); only this function and those objects know the difference.
"""
from ..quant import QuantTensor
from .matmul import matmul_rows, matmuls


class ComposedWeight:
    """A weight [out, in] that computes its own product: forward(x2 [N, in]) -> [N, out] and
    backward(dy2 [N, out], x2) -> (dx2 [N, in], its gradient or None when it learns nothing).
    forward's hook, when given, is called as hook(suffix, value [N, k], op, srcs) on the parts
    of the product (a LoRA adapter's, as llama.cpp's graph has them) and returns the value;
    "{node}" in a source name stands for the node the product feeds (the node itself, after
    its parts, is then an ADD: model/nodes.py)."""
    shape: tuple


def linear_forward(x, w, b=None, hook=None, node=None):
    """x: [..., in], w: [out, in] (array, QuantTensor or ComposedWeight), b: [out] or None -> y: [..., out]

    hook, node: the block's hook point and the name of the node this product feeds; only a
    ComposedWeight has parts to show (as `{node}_lora_a`, ...)."""
    if x.ndim == 1 and b is None and type(w) is QuantTensor:
        return w.matvec(x)                        # one token's vector (decoding): the fused kernel alone
    # one 2-D product over all leading axes: a stacked [B, T, in] @ [in, out] is B smaller GEMMs
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])               # [N, in]
    if isinstance(w, ComposedWeight):
        part = None
        if hook is not None and node is not None:
            def part(suffix, v, op, srcs):            # [N, k] shown as [..., k], like every node
                return hook(f"{node}_{suffix}", v.reshape(*lead, v.shape[-1]), op,
                            tuple(s.format(node=node) for s in srcs)).reshape(v.shape)
        y = w.forward(x2, part).reshape(*lead, w.shape[0])
    elif isinstance(w, QuantTensor):
        # the blocks are dequantized inside the product: a fused matrix-vector kernel for one row
        # (decoding), BLAS over cache-sized float32 tiles of rows for several (prefill)
        y2 = w.matvec(x2[0])[None] if x2.shape[0] == 1 else w.matmul(x2)
        y = y2.reshape(*lead, w.shape[0])
    elif x2.shape[0] == 1:
        # one row (decoding a token): a matrix-vector product over the [out, in] rows streams
        # the weights ~25% faster than a 1-row GEMM, and decode time is weight streaming
        y = (w @ x2[0]).reshape(*lead, w.shape[0])
    else:
        y = matmul_rows(x2, w.T).reshape(*lead, w.shape[0])   # [N, in] @ [in, out] -> [..., out]
    if b is not None:
        y += b                                    # y is a fresh array: adding in place is safe
    return y


def plain(w):
    """a float array (not a QuantTensor or ComposedWeight): its products can go to ops/matmul.matmuls"""
    return not isinstance(w, (ComposedWeight, QuantTensor))


def linear_forwards(x, ws):
    """x: [..., in], float weights ws [out_i, in] that read it (q, k, v; gate, up) -> [x W_i^T], the
    products in one go on the threads (ops/matmul.matmuls), each with linear_forward's bits"""
    x2 = x.reshape(-1, x.shape[-1])               # [N, in]
    if x2.shape[0] == 1:
        return [linear_forward(x, w) for w in ws]
    return [y.reshape(*x.shape[:-1], w.shape[0]) for y, w in zip(matmuls([(x2, w.T) for w in ws]), ws)]


def linear_backward(dy, x, w, has_bias=True):
    """dy: [..., out] -> dx: [..., in], dw: [out, in], db: [out] or None
    (a ComposedWeight's dw is its own gradient: a LoRA adapter's (dA, dB), None for a frozen weight)"""
    dx, ((dw, db),) = linear_backwards([dy], x, [w], [has_bias])
    return dx, dw, db


def linear_backwards(dys, x, ws, has_bias):
    """Weights that read the same x (q, k, v; gate, up): dys [..., out_i] -> dx [..., in], the sum of
    their input gradients in the order given, and [(dw_i, db_i)]. Float weights' products go to the
    threads in one go (ops/matmul.matmuls)."""
    if not all(plain(w) for w in ws):
        parts = [_backward_composed(dy, x, w, b) for dy, w, b in zip(dys, ws, has_bias)]
        dx = parts[0][0]
        for p in parts[1:]:
            dx = dx + p[0]
        return dx, [p[1:] for p in parts]
    x2 = x.reshape(-1, x.shape[-1])               # [N, in]
    dy2s = [dy.reshape(-1, dy.shape[-1]) for dy in dys]               # [N, out_i]
    products = matmuls([pair for dy2, w in zip(dy2s, ws)
                        for pair in ((dy2, w),    # [N, out] @ [out, in] -> [N, in]
                                     (dy2.T, x2))])                   # [out, N] @ [N, in] -> [out, in]
    dx = products[0]
    for d in products[2::2]:
        dx += d                                   # a fresh array: adding in place is safe
    grads = [(products[2 * i + 1], dy2.sum(axis=0) if b else None)   # dw [out, in], db [out]
             for i, (dy2, b) in enumerate(zip(dy2s, has_bias))]
    return dx.reshape(*x.shape[:-1], x.shape[-1]), grads


def _backward_composed(dy, x, w, has_bias):
    """linear_backward for a ComposedWeight, or a QuantTensor (which has no gradient)"""
    if isinstance(w, QuantTensor):
        raise TypeError(f"gradients need float weights, and this one is {w!r}: "
                        f"load the model with ffnlab.load(path, dequantize=True)")
    dy2 = dy.reshape(-1, dy.shape[-1])
    dx2, dw = w.backward(dy2, x.reshape(-1, x.shape[-1]))
    return dx2.reshape(*x.shape[:-1], w.shape[1]), dw, (dy2.sum(axis=0) if has_bias else None)
