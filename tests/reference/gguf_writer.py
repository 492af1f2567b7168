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
QK = 32


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
