"""A small, independent GGUF v3 writer for tandem's test oracles (numpy only).

Written from the GGUF specification, not from llama.cpp's gguf-py, so that tandem's reader is
checked against a second implementation. Tensors are given as numpy arrays in PyTorch order
(outermost dimension first); the writer stores GGUF's ne[] innermost first.
"""
import struct

import numpy as np

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
ALIGNMENT = 32

# metadata value types
T_UINT8, T_INT8, T_UINT16, T_INT16, T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY, \
    T_UINT64, T_INT64, T_FLOAT64 = range(13)

# ggml tensor types
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30
GGML_Q5_0, GGML_Q4_K, GGML_Q6_K = 6, 12, 14
QK = 32
Q5_0_DTYPE = np.dtype([("d", "<f2"), ("qh", "<u4"), ("qs", "u1", (QK // 2,))])  # 22 bytes, packed
assert Q5_0_DTYPE.itemsize == 22
QK_K = 256  # k-quant super-block

# k-quant block layouts (ggml's block_q4_K / block_q6_K, little-endian, no padding)
Q4_K_DTYPE = np.dtype([("d", "<f2"), ("dmin", "<f2"), ("scales", "u1", (12,)), ("qs", "u1", (QK_K // 2,))])
Q6_K_DTYPE = np.dtype([("ql", "u1", (QK_K // 2,)), ("qh", "u1", (QK_K // 4,)), ("scales", "i1", (QK_K // 16,)),
                       ("d", "<f2")])
assert Q4_K_DTYPE.itemsize == 144 and Q6_K_DTYPE.itemsize == 210


def _str(s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(b)) + b


def _scalar(t, v):
    fmt = {T_UINT8: "<B", T_INT8: "<b", T_UINT16: "<H", T_INT16: "<h", T_UINT32: "<I",
           T_INT32: "<i", T_FLOAT32: "<f", T_BOOL: "<?", T_UINT64: "<Q", T_INT64: "<q",
           T_FLOAT64: "<d"}[t]
    return struct.pack(fmt, v)


def _value(t, v, elem_type=None):
    if t == T_STRING:
        return _str(v)
    if t == T_ARRAY:
        out = struct.pack("<IQ", elem_type, len(v))
        if elem_type == T_STRING:
            return out + b"".join(_str(x) for x in v)
        return out + b"".join(_scalar(elem_type, x) for x in v)
    return _scalar(t, v)


def quantize_q8_0(x):
    """ggml's reference Q8_0 quantizer. x: float32 [..., n], n % 32 == 0. Returns bytes."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    amax = np.abs(x).max(axis=1)
    d = amax / 127.0
    idv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.round(x * idv[:, None]).astype(np.int8)  # numpy rounds half to even; ggml roundf away
    q = np.where(np.abs(x * idv[:, None] - np.trunc(x * idv[:, None])) == 0.5,
                 np.trunc(x * idv[:, None]) + np.sign(x), q).astype(np.int8)
    out = np.zeros(x.shape[0], dtype=[("d", "<f2"), ("q", "i1", (QK,))])
    out["d"] = d.astype(np.float16)
    out["q"] = q
    return out.tobytes()


def quantize_q4_0(x):
    """ggml's reference Q4_0 quantizer. Returns bytes."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    d = (mx / -8.0).astype(np.float32)
    idv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(15, (x * idv[:, None] + 8.5).astype(np.int8)).astype(np.uint8)
    lo, hi = q[:, :QK // 2], q[:, QK // 2:]
    out = np.zeros(x.shape[0], dtype=[("d", "<f2"), ("qs", "u1", (QK // 2,))])
    out["d"] = d.astype(np.float16)
    out["qs"] = lo | (hi << 4)
    return out.tobytes()


def quantize_q5_0(x):
    """ggml's reference Q5_0 quantizer: d = (the largest-magnitude element) / -16, q = min(31,
    trunc(x / d + 16.5)); nibbles as Q4_0, the fifth bit of element j in bit j of qh. Returns bytes."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, QK)
    idx = np.abs(x).argmax(axis=1)
    mx = x[np.arange(x.shape[0]), idx]
    d = (mx / np.float32(-16.0)).astype(np.float32)
    idv = np.where(d != 0, np.float32(1.0) / np.where(d != 0, d, 1), 0).astype(np.float32)
    q = np.minimum(31, (x * idv[:, None] + np.float32(16.5)).astype(np.int8)).astype(np.uint32)
    out = np.zeros(x.shape[0], dtype=Q5_0_DTYPE)
    out["d"] = d.astype(np.float16)
    out["qs"] = ((q[:, :QK // 2] & 0xF) | ((q[:, QK // 2:] & 0xF) << 4)).astype(np.uint8)
    out["qh"] = (((q >> 4) & 1) << np.arange(QK, dtype=np.uint32)).sum(axis=1, dtype=np.uint64).astype(np.uint32)
    return out.tobytes()


def dequantize_q5_0(raw):
    """Q5_0 bytes -> float32 (n,): (q - 16) * d, q = Q4_0's nibble | (bit j of qh) << 4."""
    b = np.frombuffer(raw, dtype=Q5_0_DTYPE)
    lo = (b["qs"] & 0x0F).astype(np.int32)
    hi = (b["qs"] >> 4).astype(np.int32)
    q = np.concatenate([lo, hi], axis=1)
    bits = ((b["qh"][:, None] >> np.arange(QK, dtype=np.uint32)) & 1).astype(np.int32)
    q = (q | (bits << 4)) - 16
    return (q.astype(np.float32) * b["d"].astype(np.float32)[:, None]).astype(np.float32).reshape(-1)


def _q4_k_unpack_scales(s):
    """scales[12] (uint8, (nb, 12)) -> 6-bit scales and mins, (nb, 8) each. Sub-blocks 0..3 keep
    their scale and min in the low 6 bits of bytes j and j+4; sub-blocks 4..7 in the nibbles of
    byte j+4 (scale low, min high), with the top 2 bits in the spare top bits of bytes j-4 (scale)
    and j (min)."""
    s = s.astype(np.int32)
    sc = np.empty((s.shape[0], 8), np.int32)
    mn = np.empty((s.shape[0], 8), np.int32)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc, mn


def _q4_k_pack_scales(sc, mn):
    """Inverse of _q4_k_unpack_scales: (nb, 8) ints in 0..63 -> (nb, 12) uint8."""
    sc = sc.astype(np.int32)
    mn = mn.astype(np.int32)
    out = np.zeros((sc.shape[0], 12), np.int32)
    out[:, 0:4] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 4:8] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:] & 0xF) | ((mn[:, 4:] & 0xF) << 4)
    return out.astype(np.uint8)


def dequantize_q4_k(raw):
    """Q4_K bytes -> float32 (n,): x = (d * sc) * q - (dmin * m) in float32, q the nibble; group g
    of 64 elements = low nibbles of qs[32g:32g+32], then their high nibbles."""
    b = np.frombuffer(raw, dtype=Q4_K_DTYPE)
    nb = b.shape[0]
    sc, mn = _q4_k_unpack_scales(b["scales"])
    d1 = b["d"].astype(np.float32)[:, None] * sc.astype(np.float32)      # (nb, 8), exact
    m1 = b["dmin"].astype(np.float32)[:, None] * mn.astype(np.float32)
    qs = b["qs"].reshape(nb, 4, 32)
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(nb, 8, 32).astype(np.float32)
    y = d1[:, :, None] * q - m1[:, :, None]  # float32: the product is exact, one rounding in the subtraction
    return y.astype(np.float32).reshape(-1)


def dequantize_q6_k(raw):
    """Q6_K bytes -> float32 (n,): x = (d * scales[e // 16]) * (q - 32), q 6 bits. In each half h
    of 128 elements, quarter k (32 elements, l = 0..31) takes the low (k < 2) or high (k >= 2)
    nibble of ql[64h + 32 (k % 2) + l] and bits 2k, 2k+1 of qh[32h + l]."""
    b = np.frombuffer(raw, dtype=Q6_K_DTYPE)
    nb = b.shape[0]
    ql = b["ql"].reshape(nb, 2, 2, 32).astype(np.int32)  # (block, half, k % 2, l)
    qh = b["qh"].reshape(nb, 2, 32).astype(np.int32)
    quarters = []
    for k in range(4):
        lo = (ql[:, :, k % 2, :] >> (4 * (k // 2))) & 0xF
        hi = (qh >> (2 * k)) & 3
        quarters.append(lo | (hi << 4))
    q = np.stack(quarters, axis=2).reshape(nb, QK_K) - 32          # (block, 256)
    d = b["d"].astype(np.float32)[:, None] * b["scales"].astype(np.float32)  # (nb, 16), exact
    y = np.repeat(d, 16, axis=1) * q.astype(np.float32)
    return y.astype(np.float32).reshape(-1)


def quantize_q4_k(x):
    """A simple Q4_K quantizer (not ggml's search): per 32-element sub-block scale (max - min) / 15
    and min -min(x, 0); the super-block d, dmin = their maxima / 63 in f16; 6-bit scales and mins
    rounded; nibbles rounded against the stored values. Returns bytes."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 8, 32)
    nb = x.shape[0]
    lo = np.minimum(x.min(axis=2), 0)
    hi = x.max(axis=2)
    s = (hi - lo) / 15
    m = -lo
    d = (s.max(axis=1) / 63).astype(np.float16)
    dmin = (m.max(axis=1) / 63).astype(np.float16)
    df, dmf = d.astype(np.float32), dmin.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.clip(np.where(df[:, None] > 0, np.rint(s / df[:, None]), 0), 0, 63).astype(np.int32)
        lm = np.clip(np.where(dmf[:, None] > 0, np.rint(m / dmf[:, None]), 0), 0, 63).astype(np.int32)
        d1 = df[:, None] * ls.astype(np.float32)
        m1 = dmf[:, None] * lm.astype(np.float32)
        q = np.where(d1[:, :, None] > 0, np.rint((x + m1[:, :, None]) / d1[:, :, None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(nb, 4, 2, 32)
    out = np.zeros(nb, dtype=Q4_K_DTYPE)
    out["d"] = d
    out["dmin"] = dmin
    out["scales"] = _q4_k_pack_scales(ls, lm)
    out["qs"] = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)
    return out.tobytes()


def quantize_q6_k(x):
    """A simple Q6_K quantizer: per 16-element sub-block scale max|x| / 31, super-block d =
    max|scale| / 127 in f16, int8 scales rounded, q = round(x / (d * scale)) in -32..31, stored + 32.
    Returns bytes."""
    x = np.asarray(x, dtype=np.float32).reshape(-1, 16, 16)
    nb = x.shape[0]
    s = np.abs(x).max(axis=2) / 31
    d = (s.max(axis=1) / 127).astype(np.float16)
    df = d.astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        ls = np.clip(np.where(df[:, None] > 0, np.rint(s / df[:, None]), 0), -128, 127).astype(np.int32)
        d1 = df[:, None] * ls.astype(np.float32)
        q = np.where(d1[:, :, None] != 0, np.rint(x / d1[:, :, None]), 0)
    q = (np.clip(q, -32, 31) + 32).astype(np.int32).reshape(nb, 2, 4, 32)  # (block, half, k, l)
    ql = np.zeros((nb, 2, 2, 32), np.int32)
    qh = np.zeros((nb, 2, 32), np.int32)
    for k in range(4):
        ql[:, :, k % 2, :] |= (q[:, :, k, :] & 0xF) << (4 * (k // 2))
        qh |= (q[:, :, k, :] >> 4) << (2 * k)
    out = np.zeros(nb, dtype=Q6_K_DTYPE)
    out["ql"] = ql.reshape(nb, 128).astype(np.uint8)
    out["qh"] = qh.reshape(nb, 64).astype(np.uint8)
    out["scales"] = ls.astype(np.int8)
    out["d"] = d
    return out.tobytes()


def dequantize(ggml_type, raw, shape):
    """Inverse of the encoders above, to build the oracle on exactly the weights tandem sees."""
    n = int(np.prod(shape))
    if ggml_type == GGML_F32:
        return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    if ggml_type == GGML_F16:
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if ggml_type == GGML_BF16:
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape).copy()
    if ggml_type == GGML_Q8_0:
        b = np.frombuffer(raw, dtype=[("d", "<f2"), ("q", "i1", (QK,))])
        return (b["d"].astype(np.float32)[:, None] * b["q"].astype(np.float32)).reshape(shape)
    if ggml_type == GGML_Q4_0:
        b = np.frombuffer(raw, dtype=[("d", "<f2"), ("qs", "u1", (QK // 2,))])
        lo = (b["qs"] & 0x0F).astype(np.float32) - 8
        hi = (b["qs"] >> 4).astype(np.float32) - 8
        q = np.concatenate([lo, hi], axis=1)
        return (b["d"].astype(np.float32)[:, None] * q).reshape(shape)
    if ggml_type == GGML_Q5_0:
        return dequantize_q5_0(raw).reshape(shape)
    if ggml_type == GGML_Q4_K:
        return dequantize_q4_k(raw).reshape(shape)
    if ggml_type == GGML_Q6_K:
        return dequantize_q6_k(raw).reshape(shape)
    raise ValueError(f"unknown ggml type {ggml_type}")
    del n


def encode_tensor(ggml_type, arr):
    """float32 numpy array -> raw bytes of the given ggml type."""
    a = np.ascontiguousarray(arr, dtype=np.float32)
    if ggml_type == GGML_F32:
        return a.astype("<f4").tobytes()
    if ggml_type == GGML_F16:
        return a.astype("<f2").tobytes()
    if ggml_type == GGML_BF16:
        u = a.view(np.uint32).astype(np.uint64)
        r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
        return r.tobytes()
    if ggml_type == GGML_Q8_0:
        return quantize_q8_0(a)
    if ggml_type == GGML_Q4_0:
        return quantize_q4_0(a)
    if ggml_type == GGML_Q5_0:
        return quantize_q5_0(a)
    if ggml_type == GGML_Q4_K:
        return quantize_q4_k(a)
    if ggml_type == GGML_Q6_K:
        return quantize_q6_k(a)
    raise ValueError(f"unknown ggml type {ggml_type}")


class GGUFWriter:
    def __init__(self):
        self.kv = []       # (key, type, value, elem_type)
        self.tensors = []  # (name, ggml_type, shape (outermost first), raw bytes)

    def add(self, key, t, value, elem_type=None):
        self.kv.append((key, t, value, elem_type))

    def add_tensor(self, name, arr, ggml_type=GGML_F32):
        raw = encode_tensor(ggml_type, arr)
        self.tensors.append((name, ggml_type, tuple(arr.shape), raw))
        return raw

    def write(self, path):
        out = bytearray()
        out += GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(self.tensors), len(self.kv))
        for key, t, v, et in self.kv:
            out += _str(key) + struct.pack("<I", t) + _value(t, v, et)
        offset = 0
        offsets = []
        for name, gt, shape, raw in self.tensors:
            ne = list(reversed(shape))
            out += _str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
            out += struct.pack("<IQ", gt, offset)
            offsets.append(offset)
            offset += len(raw)
            offset = (offset + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
        pad = (-len(out)) % ALIGNMENT
        out += b"\0" * pad
        base = len(out)
        for (name, gt, shape, raw), off in zip(self.tensors, offsets):
            out += b"\0" * (base + off - len(out))
            out += raw
        with open(path, "wb") as f:
            f.write(out)


def _main():
    """python3 gguf_writer.py dequant q4_k|q6_k|q5_0 IN OUT: raw blocks in IN -> float32 OUT (for
    the C <-> python layout round trip in tests/unit/test_kquant.c)."""
    import sys
    dec = {"q4_k": dequantize_q4_k, "q6_k": dequantize_q6_k, "q5_0": dequantize_q5_0}
    if len(sys.argv) != 5 or sys.argv[1] != "dequant" or sys.argv[2] not in dec:
        sys.exit("usage: gguf_writer.py dequant q4_k|q6_k|q5_0 IN OUT")
    with open(sys.argv[3], "rb") as f:
        raw = f.read()
    y = dec[sys.argv[2]](raw)
    y.astype("<f4").tofile(sys.argv[4])


if __name__ == "__main__":
    _main()
