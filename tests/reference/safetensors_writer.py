"""A small, independent safetensors writer for tandem's test oracles (numpy only).

Format: 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the data.
"""
import json
import struct

import numpy as np


def bf16_bytes(a):
    """float32 array -> bfloat16 bytes, round to nearest even (what torch's .to(bfloat16) does)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def encode(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":
        return bf16_bytes(a)
    raise ValueError(dtype)


def decode(raw, dtype, shape):
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).copy()
    if dtype == "F16":
        return np.frombuffer(raw, dtype="<f2").astype(np.float32).reshape(shape)
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape).copy()
    raise ValueError(dtype)


def write(path, tensors, dtype="F32", metadata=None):
    """tensors: dict name -> float32 numpy array. Returns dict name -> the float32 values as stored
    (after rounding to dtype), so an oracle can run on exactly what was written."""
    header, blobs, stored, off = {}, [], {}, 0
    for name, a in tensors.items():
        raw = encode(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        stored[name] = decode(raw, dtype, a.shape)
        off += len(raw)
    if metadata:
        header["__metadata__"] = metadata
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((-len(h)) % 8)  # align data to 8 bytes, as the reference implementation does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)
    return stored
