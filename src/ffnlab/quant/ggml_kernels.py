"""ggml's integer dot products: a quantized weight row times an 8-bit activation row, with ggml's
scale arithmetic (ggml-cpu/arch/x86/quants.c, the AVX2 build llama-cpp-python runs here).

  gemm(qtype, data, table, qs, d, e, y, 16)    W [rows] as blocks x quantized rows [N] -> y [N, rows]

Per block the integer sum is exact (int32); what differs between engines is the float part, so
that is written out as ggml writes it:
  Q4_0 / Q5_0 / Q8_0 x Q8_0   eight float32 lanes, lane l holding elements 4l..4l+3 of each block
                              (mul_sum_i8_pairs_float), acc_l = fma(d_w * d_x, sum_l, acc_l), then
                              hsum_float_8's pairing ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
                              llamafile's tinyBLAS (sgemm.cpp, prompt batches) has the same lanes.
  Q4_1 / Q5_1 x Q8_1          the same lanes for d_w d_x sum(q_w q_x), plus sum over blocks of
                              m_w * s_x in one float32 (s_x = f16(d_x sum q_x), quantize_row_q8_1).
  K-quants x Q8_K             as the AVX2 code: eight int32 lanes of scale * q.x sums (the lane
                              layouts in _dot_q2_k, _dot_q3_k, _dot_q4_k, _dot_q5_k, _dot_q6_k),
                              fma(d_x f16(d_w), lane, acc), hsum_float_8; the mins in lanes of
                              their own (Q2_K: folded into acc first; Q4_K: four lanes; Q5_K: one
                              float). An AVX-512 build runs this same AVX2 code.
  K-quants, 8+ tokens         ggml's tiled matmul (ggml-cpu/tiled/): _dot_k_tiled.
A loaded model's products run quant/ggml_packed.py (the same arithmetic over 64 rows at a time,
in the layout made at load) for Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K; these row kernels compute
the other types, and are the reference order the packed kernels are tested against.
A fused multiply-add is computed in float64 (the product of two float32 values is exact there)
and rounded to float32: it differs from a hardware FMA only by a double rounding, rarely.
"""
import numpy as np
from numba import njit, prange

from .types import Q2_K, Q3_K, Q4_0, Q4_1, Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, QT
from .unpack import fifth_bit, half_float, k_scale_min, q3_scale, q6_code, u32

JIT = dict(cache=True, nogil=True, fastmath=False)   # no fastmath: the float32 roundings are ggml's
ROWS_PER_TASK = 16
TILED_MIN_BATCH = 8                          # ggml-cpu/tiled/tiled.cpp: K-quant batches of 8+ tokens go tiled


@njit(**JIT)
def _fma(a, b, c):
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))


@njit(**JIT)
def _hsum8(acc):
    """hsum_float_8: (l0+l4, l1+l5, l2+l6, l3+l7) -> ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))"""
    a0, a1, a2, a3 = acc[0] + acc[4], acc[1] + acc[5], acc[2] + acc[6], acc[3] + acc[7]
    return (a0 + a2) + (a1 + a3)


@njit(**JIT)
def _nibble_lanes(row, qo, qx, xo, lo_off, acc, dd, hb):
    """The 4-bit types: elements 0-15 are the low nibbles of 16 bytes, 16-31 the high ones;
    hb: Q5's 32 high bits (0 for Q4), lo_off: the offset subtracted from each weight (8, 16 or 0)."""
    for l in range(4):
        s_lo = 0
        s_hi = 0
        for k in range(4):
            j = 4 * l + k
            byte = np.int32(row[qo + j])
            w_lo = (byte & 15) | fifth_bit(hb, j)
            w_hi = (byte >> 4) | fifth_bit(hb, j + 16)
            s_lo += (w_lo - lo_off) * np.int32(qx[xo + j])
            s_hi += (w_hi - lo_off) * np.int32(qx[xo + 16 + j])
        acc[l] = _fma(dd, s_lo, acc[l])
        acc[4 + l] = _fma(dd, s_hi, acc[4 + l])


@njit(**JIT)
def _dot_32(qtype, row, table, qx, dx, sx, acc):
    """One weight row of a 32-block type x one Q8_0 / Q8_1 row -> float32"""
    acc[:] = 0
    summs = np.float32(0.0)
    for b in range(dx.shape[0]):
        xo = b * 32
        if qtype == Q8_0:
            o = b * QT[Q8_0].block_bytes
            dd = half_float(row, o, table) * dx[b]
            for l in range(8):
                s = 0
                for k in range(4):
                    s += ((np.int32(row[o + 2 + 4 * l + k]) ^ 128) - 128) * np.int32(qx[xo + 4 * l + k])
                acc[l] = _fma(dd, s, acc[l])
        elif qtype == Q4_0:
            o = b * QT[Q4_0].block_bytes
            _nibble_lanes(row, o + 2, qx, xo, 8, acc, half_float(row, o, table) * dx[b], 0)
        elif qtype == Q5_0:
            o = b * QT[Q5_0].block_bytes
            _nibble_lanes(row, o + 6, qx, xo, 16, acc, half_float(row, o, table) * dx[b], u32(row, o + 2))
        elif qtype == Q4_1:
            o = b * QT[Q4_1].block_bytes
            summs += half_float(row, o + 2, table) * sx[b]
            _nibble_lanes(row, o + 4, qx, xo, 0, acc, half_float(row, o, table) * dx[b], 0)
        else:                                                          # Q5_1
            o = b * QT[Q5_1].block_bytes
            summs += half_float(row, o + 2, table) * sx[b]
            _nibble_lanes(row, o + 8, qx, xo, 0, acc, half_float(row, o, table) * dx[b], u32(row, o + 4))
    return _hsum8(acc) + summs


@njit(**JIT)
def _unpack_k(qtype, row, o, table, q, sc, mn):
    """One 256-block of a K-quant -> integer weights q [256] (offsets applied), sub-block scales
    sc and mins mn ([16] for 16-wide sub-blocks, [8] for 32-wide), -> (d, dmin, sub-block width)"""
    if qtype == Q4_K or qtype == Q5_K:
        for s in range(8):
            a, m = k_scale_min(row, o + 4, s)
            sc[s], mn[s] = np.int32(a), np.int32(m)
            qo, shift = o + (16 if qtype == Q4_K else 48) + (s // 2) * 32, 4 * (s % 2)
            for l in range(32):
                v = (np.int32(row[qo + l]) >> shift) & 15
                if qtype == Q5_K:
                    v |= fifth_bit(np.int32(row[o + 16 + l]), s)
                q[s * 32 + l] = v
        return half_float(row, o, table), half_float(row, o + 2, table), 32
    if qtype == Q6_K:
        for h in range(2):
            ql, qh, so = o + 64 * h, o + 128 + 32 * h, o + 192 + 8 * h
            for l in range(32):
                a, c, hh = np.int32(row[ql + l]), np.int32(row[ql + l + 32]), np.int32(row[qh + l])
                q[128 * h + l] = q6_code(a, hh, 0) - 32
                q[128 * h + l + 32] = q6_code(c, hh, 1) - 32
                q[128 * h + l + 64] = q6_code(a, hh, 2) - 32
                q[128 * h + l + 96] = q6_code(c, hh, 3) - 32
            for g in range(8):                                         # int8 scales, one per 16 weights
                sc[8 * h + g] = (np.int32(row[so + g]) ^ 128) - 128
                mn[8 * h + g] = 0
        return half_float(row, o + 208, table), np.float32(0.0), 16
    if qtype == Q3_K:
        for g in range(16):
            h, s = g // 8, (g // 2) % 4
            sc[g], mn[g] = q3_scale(row, o + 96, g), 0
            qo, mo = o + 32 + h * 32 + (g % 2) * 16, o + (g % 2) * 16
            for l in range(16):
                v = (np.int32(row[qo + l]) >> (2 * s)) & 3
                q[g * 16 + l] = v - 4 * (1 - ((np.int32(row[mo + l]) >> (g // 2)) & 1))
        return half_float(row, o + 108, table), np.float32(0.0), 16
    # Q2_K
    for g in range(16):
        h, s = g // 8, (g // 2) % 4
        sc[g], mn[g] = np.int32(row[o + g]) & 15, np.int32(row[o + g]) >> 4
        qo = o + 16 + h * 32 + (g % 2) * 16
        for l in range(16):
            q[g * 16 + l] = (np.int32(row[qo + l]) >> (2 * s)) & 3
    return half_float(row, o + 80, table), half_float(row, o + 82, table), 16



@njit(**JIT)
def _dot_q4_k(row, table, qx, dx, bsums, acc):
    """Q4_K x Q8_K as ggml_vec_dot_q4_K_q8_K's AVX2 code: lane i (of 8) sums scale_s * q.x over
    elements 4i..4i+3 of every 32-wide sub-block s; the mins go to 4 lanes, lane k holding
    min_2k bsum_2k + min_2k+1 bsum_2k+1 (bsums of 32); acc = fma(d, lane, acc) per superblock."""
    acc[:] = 0
    m0 = m1 = m2 = m3 = np.float32(0.0)
    for b in range(dx.shape[0]):
        o, xo = b * QT[Q4_K].block_bytes, b * 256
        d = dx[b] * half_float(row, o, table)
        dmin = -dx[b] * half_float(row, o + 2, table)
        lanes = np.zeros(8, np.int32)
        mins = np.zeros(4, np.int32)
        for s in range(8):
            sc, m = k_scale_min(row, o + 4, s)
            bs = np.int32(bsums[b * 16 + 2 * s]) + np.int32(bsums[b * 16 + 2 * s + 1])
            mins[s // 2] += np.int32(m) * bs
            qo, shift = o + 16 + (s // 2) * 32, 4 * (s % 2)
            for i in range(8):
                t = 0
                for k in range(4):
                    e = 4 * i + k
                    t += ((np.int32(row[qo + e]) >> shift) & 15) * np.int32(qx[xo + s * 32 + e])
                lanes[i] += np.int32(sc) * t
        for i in range(8):
            acc[i] = _fma(d, np.float32(lanes[i]), acc[i])
        m0 = _fma(dmin, np.float32(mins[0]), m0)
        m1 = _fma(dmin, np.float32(mins[1]), m1)
        m2 = _fma(dmin, np.float32(mins[2]), m2)
        m3 = _fma(dmin, np.float32(mins[3]), m3)
    return _hsum8(acc) + ((m0 + m2) + (m1 + m3))


@njit(**JIT)
def _dot_q5_k(row, table, qx, dx, bsums, acc):
    """Q5_K x Q8_K as ggml_vec_dot_q5_K_q8_K's AVX2 code: Q4_K's lanes (lane i sums scale_s * q.x
    over elements 4i..4i+3 of every 32-wide sub-block s) with 5-bit q (sub-block s takes bit s of
    qh); the mins summed to one integer per superblock, summs = fma(dmin, that, summs);
    acc = fma(d, lane, acc); the result hsum_float_8(acc) + summs."""
    acc[:] = 0
    summs = np.float32(0.0)
    for b in range(dx.shape[0]):
        o, xo = b * QT[Q5_K].block_bytes, b * 256
        d = dx[b] * half_float(row, o, table)
        dmin = -dx[b] * half_float(row, o + 2, table)
        lanes = np.zeros(8, np.int32)
        mins = np.int32(0)
        for s in range(8):
            sc, m = k_scale_min(row, o + 4, s)
            mins += np.int32(m) * (np.int32(bsums[b * 16 + 2 * s]) + np.int32(bsums[b * 16 + 2 * s + 1]))
            qo, shift = o + 48 + (s // 2) * 32, 4 * (s % 2)
            for i in range(8):
                t = 0
                for k in range(4):
                    e = 4 * i + k
                    q = ((np.int32(row[qo + e]) >> shift) & 15) | fifth_bit(np.int32(row[o + 16 + e]), s)
                    t += q * np.int32(qx[xo + s * 32 + e])
                lanes[i] += np.int32(sc) * t
        summs = _fma(dmin, np.float32(mins), summs)
        for i in range(8):
            acc[i] = _fma(d, np.float32(lanes[i]), acc[i])
    return _hsum8(acc) + summs


@njit(**JIT)
def _dot_q2_k(row, table, qx, dx, bsums, acc):
    """Q2_K x Q8_K as ggml_vec_dot_q2_K_q8_K's AVX2 code: per superblock first
    acc_i = fma(dmin, min_2i bsum_2i + min_2i+1 bsum_2i+1, acc_i), then acc_i = fma(d, lane_i, acc_i),
    lane i summing scale * q.x over elements 4i..4i+3 of each 32-wide group (the group's two
    16-wide sub-blocks: lanes 0-3 and 4-7); the result hsum_float_8(acc)."""
    acc[:] = 0
    for b in range(dx.shape[0]):
        o, xo = b * QT[Q2_K].block_bytes, b * 256
        d = dx[b] * half_float(row, o + 80, table)
        dmin = -dx[b] * half_float(row, o + 82, table)
        lanes = np.zeros(8, np.int32)
        for j in range(2):                                           # 128-wide halves
            for k in range(4):                                       # 32-wide groups: bits 2k of qs[32j:32j+32]
                for i in range(8):
                    t = 0
                    for u in range(4):
                        e = 4 * i + u
                        q = (np.int32(row[o + 16 + 32 * j + e]) >> (2 * k)) & 3
                        t += q * np.int32(qx[xo + 128 * j + 32 * k + e])
                    lanes[i] += (np.int32(row[o + 8 * j + 2 * k + i // 4]) & 15) * t
        for i in range(8):
            m = (np.int32(row[o + 2 * i]) >> 4) * np.int32(bsums[b * 16 + 2 * i]) \
                + (np.int32(row[o + 2 * i + 1]) >> 4) * np.int32(bsums[b * 16 + 2 * i + 1])
            acc[i] = _fma(dmin, np.float32(m), acc[i])
            acc[i] = _fma(d, np.float32(lanes[i]), acc[i])
    return _hsum8(acc)


@njit(**JIT)
def _dot_q3_k(row, table, qx, dx, bsums, acc):
    """Q3_K x Q8_K as ggml_vec_dot_q3_K_q8_K's AVX2 code: q = low 2 bits - 4 where the hmask bit
    is clear (-4..3), lane i summing scale * q.x over elements 4i..4i+3 of each 32-wide group as
    in _dot_q2_k (scales: the 6-bit values - 32); acc = fma(d, lane, acc); hsum_float_8(acc)."""
    acc[:] = 0
    for b in range(dx.shape[0]):
        o, xo = b * QT[Q3_K].block_bytes, b * 256
        d = dx[b] * half_float(row, o + 108, table)
        lanes = np.zeros(8, np.int32)
        for j in range(2):                                           # 128-wide halves
            for k in range(4):                                       # 32-wide groups: bits 2k of qs, bit 4j+k of hmask
                for i in range(8):
                    t = 0
                    for u in range(4):
                        e = 4 * i + u
                        q = (np.int32(row[o + 32 + 32 * j + e]) >> (2 * k)) & 3
                        if not (np.int32(row[o + e]) >> (4 * j + k)) & 1:
                            q -= 4
                        t += q * np.int32(qx[xo + 128 * j + 32 * k + e])
                    lanes[i] += q3_scale(row, o + 96, 8 * j + 2 * k + i // 4) * t
        for i in range(8):
            acc[i] = _fma(d, np.float32(lanes[i]), acc[i])
    return _hsum8(acc)


@njit(**JIT)
def _dot_q6_k(row, table, qx, dx, bsums, acc):
    """Q6_K x Q8_K as ggml_vec_dot_q6_K_q8_K's AVX2 code: unsigned 6-bit q (0..63) times x, lane i
    summing scale * q.x over elements 4i..4i+3 of each 32-wide group, minus 32 (scale_2i bsum_2i
    + scale_2i+1 bsum_2i+1) (the -32 offset folded in per lane); acc = fma(d, lane, acc)."""
    acc[:] = 0
    for b in range(dx.shape[0]):
        o, xo = b * QT[Q6_K].block_bytes, b * 256
        d = dx[b] * half_float(row, o + 208, table)
        lanes = np.zeros(8, np.int32)
        for h in range(2):
            ql, qh, so = o + 64 * h, o + 128 + 32 * h, o + 192 + 8 * h
            for g4 in range(4):                                      # 32-groups at 128h + 32 g4
                for i in range(8):
                    t = 0
                    for k in range(4):
                        l = 4 * i + k
                        q = q6_code(np.int32(row[ql + l + (32 if g4 % 2 else 0)]), np.int32(row[qh + l]), g4)
                        t += q * np.int32(qx[xo + 128 * h + 32 * g4 + l])
                    sc = (np.int32(row[so + 2 * g4 + i // 4]) ^ 128) - 128
                    lanes[i] += sc * t
        for i in range(8):
            sc0 = (np.int32(row[o + 192 + 2 * i]) ^ 128) - 128
            sc1 = (np.int32(row[o + 192 + 2 * i + 1]) ^ 128) - 128
            lanes[i] -= 32 * (sc0 * np.int32(bsums[b * 16 + 2 * i]) + sc1 * np.int32(bsums[b * 16 + 2 * i + 1]))
            acc[i] = _fma(d, np.float32(lanes[i]), acc[i])
    return _hsum8(acc)


@njit(**JIT)
def _dot_k_tiled(qtype, nbytes, row, table, qx, dx, bsums, q, sc, mn):
    """A K-quant row x a Q8_K row as ggml's tiled matmul (ggml-cpu/tiled, AVX2 microtile), which
    llama.cpp takes for a batch of TILED_MIN_BATCH tokens or more: per 256-slab the exact integers
    s1 = sum scale_j (q.x)_j and s2 = sum min_j bsum_j, res = d_w s1 - dmin_w s2 (an FMA),
    acc = fma(res, d_x, acc): d_w first, then d_x (vec_dot multiplies d_x d_w first)."""
    acc = np.float32(0.0)
    for b in range(dx.shape[0]):
        d, dmin, width = _unpack_k(qtype, row, b * nbytes, table, q, sc, mn)
        xo = b * 256
        s1 = 0
        s2 = 0
        for j in range(256 // width):
            s = 0
            for l in range(width):
                s += q[j * width + l] * np.int32(qx[xo + j * width + l])
            s1 += sc[j] * s
            if width == 16:
                s2 += mn[j] * bsums[b * 16 + j]
            else:
                s2 += mn[j] * (bsums[b * 16 + 2 * j] + bsums[b * 16 + 2 * j + 1])
        res = d * np.float32(s1)
        res = _fma(-dmin, np.float32(s2), res)
        acc = _fma(res, dx[b], acc)
    return acc


# The batched kernel keeps ggml's order exactly but vectorizes over tokens: a weight row is unpacked
# once into integers, the activation codes are laid out [n, N] (tokens contiguous), and each lane's
# update acc = d * lane + acc runs over all tokens at once. `contract` lets LLVM fuse that multiply
# and add into the FMA instruction ggml uses (the only multiply-add in these loops, so nothing else
# is fused); no other fastmath flag, so nothing is reordered.
BATCH = dict(cache=True, nogil=True, fastmath={"contract"})


@njit(**JIT)
def _unpack_32(qtype, row, table, w, dw, mw):
    """One row of a 32-block type -> integer weights w [n] (offsets applied), d [nb], m [nb]"""
    for b in range(dw.shape[0]):
        if qtype == Q8_0:
            o = b * QT[Q8_0].block_bytes
            dw[b] = half_float(row, o, table)
            for e in range(32):
                w[b * 32 + e] = (np.int32(row[o + 2 + e]) ^ 128) - 128
            continue
        hb = 0
        if qtype == Q4_0:
            o = b * QT[Q4_0].block_bytes
            qo, off = o + QT[Q4_0].qs_at, QT[Q4_0].zero
        elif qtype == Q5_0:
            o = b * QT[Q5_0].block_bytes
            qo, off = o + QT[Q5_0].qs_at, QT[Q5_0].zero
            hb = u32(row, o + 2)
        elif qtype == Q4_1:
            o = b * QT[Q4_1].block_bytes
            qo, off = o + QT[Q4_1].qs_at, QT[Q4_1].zero
            mw[b] = half_float(row, o + 2, table)
        else:                                                          # Q5_1
            o = b * QT[Q5_1].block_bytes
            qo, off = o + QT[Q5_1].qs_at, QT[Q5_1].zero
            mw[b] = half_float(row, o + 2, table)
            hb = u32(row, o + 4)
        dw[b] = half_float(row, o, table)
        for j in range(16):
            byte = np.int32(row[qo + j])
            w[b * 32 + j] = ((byte & 15) | fifth_bit(hb, j)) - off
            w[b * 32 + 16 + j] = ((byte >> 4) | fifth_bit(hb, j + 16)) - off


@njit(parallel=True, **BATCH)
def gemm32_batch(qtype, data, table, qxt, dxt, sxt, y):
    """32-block types x many tokens, in _dot_32's order: qxt [n, N] int32 codes (token-minor),
    dxt / sxt [nb, N] the block scales / Q8_1 sums -> y [N, rows]"""
    rows, n, N = data.shape[0], qxt.shape[0], qxt.shape[1]
    nb = n // 32
    has_min = qtype == Q4_1 or qtype == Q5_1
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        w = np.empty(n, np.int32)
        dw = np.empty(nb, np.float32)
        mw = np.zeros(nb, np.float32)
        acc = np.empty((8, N), np.float32)
        lane = np.empty(N, np.int32)
        dd = np.empty(N, np.float32)
        summs = np.empty(N, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            _unpack_32(qtype, data[r], table, w, dw, mw)
            acc[:] = 0
            summs[:] = 0
            for b in range(nb):
                for t in range(N):
                    dd[t] = dw[b] * dxt[b, t]
                if has_min:
                    for t in range(N):
                        summs[t] += mw[b] * sxt[b, t]                # an exact product: fused or not, the same
                for l in range(8):
                    e0 = b * 32 + 4 * l
                    w0, w1, w2, w3 = w[e0], w[e0 + 1], w[e0 + 2], w[e0 + 3]
                    for t in range(N):
                        lane[t] = w0 * qxt[e0, t] + w1 * qxt[e0 + 1, t] + w2 * qxt[e0 + 2, t] + w3 * qxt[e0 + 3, t]
                    for t in range(N):
                        acc[l, t] = dd[t] * np.float32(lane[t]) + acc[l, t]    # one FMA, as ggml's
            for t in range(N):
                a0, a1 = acc[0, t] + acc[4, t], acc[1, t] + acc[5, t]
                a2, a3 = acc[2, t] + acc[6, t], acc[3, t] + acc[7, t]
                y[t, r] = ((a0 + a2) + (a1 + a3)) + summs[t]


@njit(parallel=True, **BATCH)
def gemv32(qtype, data, table, qx, dx, sx, y):
    """32-block types x one token, in _dot_32's order with the hardware FMA: qx [n] int32, dx / sx
    [nb] -> y [rows] (decoding: the weight row is unpacked to integers and multiplied by qx in one
    vectorized pass; then, block by block, each of ggml's eight lanes adds the sum of its four
    products with one FMA. Integer sums are exact in any order, so only the FMA chain keeps ggml's)"""
    rows, n = data.shape[0], qx.shape[0]
    nb = n // 32
    has_min = qtype == Q4_1 or qtype == Q5_1
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        w = np.empty(n, np.int32)
        p = np.empty(n, np.int32)
        dw = np.empty(nb, np.float32)
        mw = np.zeros(nb, np.float32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            _unpack_32(qtype, data[r], table, w, dw, mw)
            for e in range(n):
                p[e] = w[e] * qx[e]
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
            summs = np.float32(0.0)
            for b in range(nb):
                o = b * 32
                dd = dw[b] * dx[b]
                if has_min:
                    summs += mw[b] * sx[b]
                a0 = dd * np.float32(p[o] + p[o + 1] + p[o + 2] + p[o + 3]) + a0     # one FMA per lane, as ggml's
                a1 = dd * np.float32(p[o + 4] + p[o + 5] + p[o + 6] + p[o + 7]) + a1
                a2 = dd * np.float32(p[o + 8] + p[o + 9] + p[o + 10] + p[o + 11]) + a2
                a3 = dd * np.float32(p[o + 12] + p[o + 13] + p[o + 14] + p[o + 15]) + a3
                a4 = dd * np.float32(p[o + 16] + p[o + 17] + p[o + 18] + p[o + 19]) + a4
                a5 = dd * np.float32(p[o + 20] + p[o + 21] + p[o + 22] + p[o + 23]) + a5
                a6 = dd * np.float32(p[o + 24] + p[o + 25] + p[o + 26] + p[o + 27]) + a6
                a7 = dd * np.float32(p[o + 28] + p[o + 29] + p[o + 30] + p[o + 31]) + a7
            y[r] = (((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))) + summs


@njit(parallel=True, **JIT)
def gemmk_batch(qtype, nbytes, data, table, qxt, dxt, bst, y):
    """K-quants x 8+ tokens in _dot_k_tiled's order, vectorized over the tokens: qxt [n, N] int32,
    dxt [n/256, N], bst [n/16, N] int32 (the Q8_K bsums) -> y [N, rows]"""
    rows, n, N = data.shape[0], qxt.shape[0], qxt.shape[1]
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        q = np.empty(256, np.int32)
        sc = np.empty(16, np.int32)
        mn = np.empty(16, np.int32)
        acc = np.empty(N, np.float32)
        s1 = np.empty(N, np.int32)
        s2 = np.empty(N, np.int32)
        part = np.empty(N, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            acc[:] = 0
            for b in range(n // 256):
                d, dmin, width = _unpack_k(qtype, data[r], b * nbytes, table, q, sc, mn)
                s1[:] = 0
                s2[:] = 0
                for j in range(256 // width):
                    part[:] = 0
                    for l in range(width):
                        e = b * 256 + j * width + l
                        qe = q[j * width + l]
                        for t in range(N):
                            part[t] += qe * qxt[e, t]
                    for t in range(N):
                        s1[t] += sc[j] * part[t]
                    for u in range(width // 16):
                        for t in range(N):
                            s2[t] += mn[j] * bst[b * 16 + j * (width // 16) + u, t]
                for t in range(N):
                    res = _fma(-dmin, np.float32(s2[t]), d * np.float32(s1[t]))
                    acc[t] = _fma(res, dxt[b, t], acc[t])
            for t in range(N):
                y[t, r] = acc[t]


@njit(parallel=True, **JIT)
def gemm(qtype, data, table, qs, d, e, y):
    """data: [rows, row_bytes] uint8 blocks, (qs, d, e): the quantized activation rows
    (quant/ggml_quants.py's Q8Rows: [N, n] int8, block scales, Q8_1's s or Q8_K's bsums)
    -> y: [N, rows] float32"""
    rows, N = data.shape[0], qs.shape[0]
    kbytes = QT[qtype].block_bytes if QT[qtype].block_weights == 256 else 0   # a K-quant's block: tiled batches
    for task in prange((rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        acc = np.zeros(8, np.float32)
        q = np.zeros(256, np.int32)
        sc = np.zeros(16, np.int32)
        mn = np.zeros(16, np.int32)
        for r in range(task * ROWS_PER_TASK, min(rows, (task + 1) * ROWS_PER_TASK)):
            for t in range(N):
                if kbytes and N >= TILED_MIN_BATCH:
                    y[t, r] = _dot_k_tiled(qtype, kbytes, data[r], table, qs[t], d[t], e[t], q, sc, mn)
                elif qtype == Q4_K:
                    y[t, r] = _dot_q4_k(data[r], table, qs[t], d[t], e[t], acc)
                elif qtype == Q6_K:
                    y[t, r] = _dot_q6_k(data[r], table, qs[t], d[t], e[t], acc)
                elif qtype == Q5_K:
                    y[t, r] = _dot_q5_k(data[r], table, qs[t], d[t], e[t], acc)
                elif qtype == Q2_K:
                    y[t, r] = _dot_q2_k(data[r], table, qs[t], d[t], e[t], acc)
                elif qtype == Q3_K:
                    y[t, r] = _dot_q3_k(data[r], table, qs[t], d[t], e[t], acc)
                else:
                    y[t, r] = _dot_32(qtype, data[r], table, qs[t], d[t], e[t], acc)
