"""Writes the sample files that tests/unit/test_{gguf,safetensors,config,model_load}.c parse.

Run with /usr/bin/python3 (numpy) from the repo root:
    /usr/bin/python3 tests/reference/make_format_samples.py [outdir]
outdir defaults to $TANDEM_TEST_DATA/formats or .cache/formats. The files come from the
independent writers gguf_writer.py and safetensors_writer.py; next to them go *.expect.json files
listing what was written (metadata values, tensor shapes, types and raw bytes as hex) so that the
C tests compare against this writer, not against numbers tandem produced.
"""
import json
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as gw  # noqa: E402
import safetensors_writer as sw  # noqa: E402


def outdir():
    if len(sys.argv) > 1:
        return sys.argv[1]
    base = os.environ.get("TANDEM_TEST_DATA") or ".cache"
    return os.path.join(base, "formats")


def values(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape).astype(np.float32) * 0.5


# -------------------------------------------------------------------------------------------
# GGUF: nested arrays are not supported by gguf_writer._value; extend it here (arrays of arrays).
_orig_value = gw._value


def _value(t, v, elem_type=None):
    if t == gw.T_ARRAY and elem_type == gw.T_ARRAY:
        out = struct.pack("<IQ", gw.T_ARRAY, len(v))
        for et, inner in v:
            out += _value(gw.T_ARRAY, inner, et)
        return out
    return _orig_value(t, v, elem_type)


gw._value = _value


def gguf_meta_sample(d):
    """meta.gguf: metadata of every type and tensors of every supported type."""
    w = gw.GGUFWriter()
    kv = [
        ("t.u8", gw.T_UINT8, 200), ("t.i8", gw.T_INT8, -100), ("t.u16", gw.T_UINT16, 60000),
        ("t.i16", gw.T_INT16, -30000), ("t.u32", gw.T_UINT32, 4000000000),
        ("t.i32", gw.T_INT32, -2000000000), ("t.f32", gw.T_FLOAT32, 1.5), ("t.bool", gw.T_BOOL, True),
        ("t.str", gw.T_STRING, "h\u00e9llo"), ("t.u64", gw.T_UINT64, 2**40 + 7),
        ("t.u64big", gw.T_UINT64, 2**63 + 5), ("t.i64", gw.T_INT64, -(2**40)),
        ("t.f64", gw.T_FLOAT64, 3.25), ("t.empty", gw.T_STRING, ""),
    ]
    for k, t, v in kv:
        w.add(k, t, v)
    w.add("t.arr_i32", gw.T_ARRAY, [1, -2, 3], gw.T_INT32)
    w.add("t.arr_f32", gw.T_ARRAY, [0.5, -1.25], gw.T_FLOAT32)
    w.add("t.arr_u8", gw.T_ARRAY, [7, 255], gw.T_UINT8)
    w.add("t.arr_bool", gw.T_ARRAY, [True, False, True], gw.T_BOOL)
    w.add("t.arr_u64", gw.T_ARRAY, [2**50], gw.T_UINT64)
    w.add("t.arr_f64", gw.T_ARRAY, [2.5, -0.125], gw.T_FLOAT64)
    w.add("t.arr_str", gw.T_ARRAY, ["a", "bc", "", "d\u00e9"], gw.T_STRING)
    w.add("t.arr_empty", gw.T_ARRAY, [], gw.T_INT32)
    w.add("t.arr_nested", gw.T_ARRAY, [(gw.T_INT32, [1, 2]), (gw.T_STRING, ["x"])], gw.T_ARRAY)
    w.add("general.architecture", gw.T_STRING, "llama")
    tensors = {}
    specs = [("f32", gw.GGML_F32, (3, 4)), ("f16", gw.GGML_F16, (2, 32)), ("bf16", gw.GGML_BF16, (5,)),
             ("q8_0", gw.GGML_Q8_0, (2, 64)), ("q4_0", gw.GGML_Q4_0, (3, 32)),
             ("f32_3d", gw.GGML_F32, (2, 3, 4)), ("f32_4d", gw.GGML_F32, (2, 1, 3, 2))]
    for i, (name, gt, shape) in enumerate(specs):
        raw = w.add_tensor("w." + name, values(shape, i), gt)
        tensors["w." + name] = {"shape": list(shape), "ggml_type": gt, "hex": raw.hex()}
    w.write(os.path.join(d, "meta.gguf"))
    exp = {"kv": {k: v for k, _, v in kv if k != "t.u64big"}, "tensors": tensors}
    with open(os.path.join(d, "meta.gguf.expect.json"), "w") as f:
        json.dump(exp, f)


def gguf_misc_samples(d):
    # Alignment 64 (general.alignment) and version 2.
    old = gw.ALIGNMENT
    gw.ALIGNMENT = 64
    w = gw.GGUFWriter()
    w.add("general.alignment", gw.T_UINT32, 64)
    w.add_tensor("a", values((3,), 10))
    w.add_tensor("b", values((2, 5), 11))
    w.write(os.path.join(d, "align64.gguf"))
    gw.ALIGNMENT = old
    # No tensors, metadata only (vocab-only files look like this).
    w = gw.GGUFWriter()
    w.add("general.name", gw.T_STRING, "empty")
    w.write(os.path.join(d, "notensors.gguf"))
    # Version 2 header (same layout as v3 for little-endian files).
    p = os.path.join(d, "v2.gguf")
    w = gw.GGUFWriter()
    w.add("general.name", gw.T_STRING, "v2")
    w.add_tensor("a", values((4,), 12))
    w.write(p)
    b = bytearray(open(p, "rb").read())
    b[4:8] = struct.pack("<I", 2)
    open(p, "wb").write(bytes(b))
    # A tensor of an unsupported ggml type (Q4_1: blocks of 32, 20 bytes), raw bytes.
    w = gw.GGUFWriter()
    w.add_tensor("ok", values((32,), 13))
    w.tensors.append(("q41", 3, (2, 32), bytes(range(40))))
    w.tensors.append(("q6k", 14, (256,), bytes(210)))
    w.write(os.path.join(d, "q4_1.gguf"))


# -------------------------------------------------------------------------------------------
def st_samples(d):
    exp = {}
    for dt in ("F32", "F16", "BF16"):
        ts = {"a": values((3, 4), 20), "b.weight": values((7,), 21), "c": values((2, 3, 2), 22),
              "scalar": np.array(np.float32(1.5))}
        path = os.path.join(d, f"st_{dt.lower()}.safetensors")
        sw.write(path, ts, dtype=dt, metadata={"format": "pt"})
        exp[dt] = {n: {"shape": list(a.shape), "hex": sw.encode(a, dt).hex()} for n, a in ts.items()}
    with open(os.path.join(d, "st.expect.json"), "w") as f:
        json.dump(exp, f)
    # An unsupported dtype (I64) and an empty tensor written by hand.
    hdr = {"ok": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
           "ids": {"dtype": "I64", "shape": [2], "data_offsets": [8, 24]},
           "empty": {"dtype": "F32", "shape": [0, 3], "data_offsets": [24, 24]}}
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(os.path.join(d, "st_i64.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + np.arange(2, dtype="<f4").tobytes()
                + np.arange(2, dtype="<i8").tobytes())


def main():
    d = outdir()
    os.makedirs(d, exist_ok=True)
    gguf_meta_sample(d)
    gguf_misc_samples(d)
    st_samples(d)
    print("wrote format samples to", d)


if __name__ == "__main__":
    main()
