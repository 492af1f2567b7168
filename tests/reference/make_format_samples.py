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


# -------------------------------------------------------------------------------------------
# Tiny models for test_model_load.c. Sizes: vocab 48, dim 64, 2 layers, 4 heads, 2 kv heads.
TINY = dict(vocab=48, dim=64, layers=2, heads=4, kv=2, head_dim=16, ffn=96, max_pos=128)


def tiny_weights(seed, c, tie, bias, qk_norm):
    """HF-named float32 weights."""
    rng = np.random.default_rng(seed)
    d, hd, q, kv, f = c["dim"], c["head_dim"], c["heads"] * c["head_dim"], c["kv"] * c["head_dim"], c["ffn"]

    def m(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w = {"model.embed_tokens.weight": m(c["vocab"], d), "model.norm.weight": 1 + m(d)}
    if not tie:
        w["lm_head.weight"] = m(c["vocab"], d)
    for i in range(c["layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + m(d)
        w[p + "self_attn.q_proj.weight"] = m(q, d)
        w[p + "self_attn.k_proj.weight"] = m(kv, d)
        w[p + "self_attn.v_proj.weight"] = m(kv, d)
        w[p + "self_attn.o_proj.weight"] = m(d, q)
        if bias:
            w[p + "self_attn.q_proj.bias"] = m(q)
            w[p + "self_attn.k_proj.bias"] = m(kv)
            w[p + "self_attn.v_proj.bias"] = m(kv)
        if qk_norm:
            w[p + "self_attn.q_norm.weight"] = 1 + m(hd)
            w[p + "self_attn.k_norm.weight"] = 1 + m(hd)
        w[p + "post_attention_layernorm.weight"] = 1 + m(d)
        w[p + "mlp.gate_proj.weight"] = m(f, d)
        w[p + "mlp.up_proj.weight"] = m(f, d)
        w[p + "mlp.down_proj.weight"] = m(d, f)
    return w


def hf_config(model_type, c, tie, extra=None):
    cls = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
           "qwen3": "Qwen3ForCausalLM"}.get(model_type, "XForCausalLM")
    cfg = {"architectures": [cls], "model_type": model_type, "vocab_size": c["vocab"], "hidden_size": c["dim"],
           "num_hidden_layers": c["layers"], "num_attention_heads": c["heads"],
           "num_key_value_heads": c["kv"], "intermediate_size": c["ffn"],
           "max_position_embeddings": c["max_pos"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": tie, "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    if c["head_dim"] != c["dim"] // c["heads"]:
        cfg["head_dim"] = c["head_dim"]
    cfg.update(extra or {})
    return cfg


def checks_for(stored, names):
    """A few (name, flat index, value) probes per tensor, values as stored (after rounding)."""
    out = []
    for n in names:
        a = np.asarray(stored[n], dtype=np.float32).reshape(-1)
        for k in (0, 1, a.size // 2 + 3, a.size - 1):
            out.append([n, int(k), float(a[k])])
    return out


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)


def write_st_raw(path, entries):
    """entries: list of (name, dtype, shape, raw bytes). A hand-rolled writer for odd dtypes."""
    hdr, off, blobs = {}, 0, []
    for n, dt, shape, raw in entries:
        hdr[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def hf_dir(d, name, model_type, c, w, dtype="F32", tie=False, extra=None, shards=0, gen=None):
    path = os.path.join(d, name)
    os.makedirs(path, exist_ok=True)
    write_json(os.path.join(path, "config.json"), hf_config(model_type, c, tie, extra))
    if gen is not None:
        write_json(os.path.join(path, "generation_config.json"), gen)
    if shards:
        names = list(w)
        per = (len(names) + shards - 1) // shards
        stored, wmap = {}, {}
        for s in range(shards):
            fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: w[n] for n in names[s * per:(s + 1) * per]}
            stored.update(sw.write(os.path.join(path, fn), part, dtype, {"format": "pt"}))
            wmap.update({n: fn for n in part})
        write_json(os.path.join(path, "model.safetensors.index.json"), {"metadata": {}, "weight_map": wmap})
        return stored
    return sw.write(os.path.join(path, "model.safetensors"), w, dtype, {"format": "pt"})


def permute(a, n_head):
    """llama.cpp's converter permutation of Q/K rows (HF rotate-half -> adjacent pairs)."""
    return a.reshape(n_head, 2, a.shape[0] // n_head // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)


GG_NAMES = [("input_layernorm.weight", "attn_norm.weight"), ("self_attn.q_proj.weight", "attn_q.weight"),
            ("self_attn.k_proj.weight", "attn_k.weight"), ("self_attn.v_proj.weight", "attn_v.weight"),
            ("self_attn.o_proj.weight", "attn_output.weight"), ("self_attn.q_proj.bias", "attn_q.bias"),
            ("self_attn.k_proj.bias", "attn_k.bias"), ("self_attn.v_proj.bias", "attn_v.bias"),
            ("self_attn.q_norm.weight", "attn_q_norm.weight"), ("self_attn.k_norm.weight", "attn_k_norm.weight"),
            ("post_attention_layernorm.weight", "ffn_norm.weight"), ("mlp.gate_proj.weight", "ffn_gate.weight"),
            ("mlp.up_proj.weight", "ffn_up.weight"), ("mlp.down_proj.weight", "ffn_down.weight")]


def gguf_model(d, name, arch, c, w, mat_type, tie, rope_freqs=None, drop=(), odd_type=None, kv_extra=(),
               drop_kv=()):
    """Writes a GGUF of the HF-named weights w. Returns GGUF-named values as stored."""
    g = gw.GGUFWriter()
    g.add("general.architecture", gw.T_STRING, arch)
    g.add(f"{arch}.context_length", gw.T_UINT32, c["max_pos"])
    g.add(f"{arch}.embedding_length", gw.T_UINT32, c["dim"])
    g.add(f"{arch}.block_count", gw.T_UINT32, c["layers"])
    g.add(f"{arch}.feed_forward_length", gw.T_UINT32, c["ffn"])
    g.add(f"{arch}.attention.head_count", gw.T_UINT32, c["heads"])
    g.add(f"{arch}.attention.head_count_kv", gw.T_UINT32, c["kv"])
    g.add(f"{arch}.attention.layer_norm_rms_epsilon", gw.T_FLOAT32, 1e-5)
    g.add(f"{arch}.rope.freq_base", gw.T_FLOAT32, 500000.0)
    if c["head_dim"] != c["dim"] // c["heads"]:
        g.add(f"{arch}.attention.key_length", gw.T_UINT32, c["head_dim"])
        g.add(f"{arch}.attention.value_length", gw.T_UINT32, c["head_dim"])
    g.add("tokenizer.ggml.model", gw.T_STRING, "gpt2")
    g.add("tokenizer.ggml.tokens", gw.T_ARRAY, [f"t{i}" for i in range(c["vocab"])], gw.T_STRING)
    g.add("tokenizer.ggml.bos_token_id", gw.T_UINT32, 1)
    g.add("tokenizer.ggml.eos_token_id", gw.T_UINT32, 2)
    g.add("tokenizer.ggml.eot_token_id", gw.T_UINT32, 5)
    perm = arch == "llama"
    items = [("token_embd.weight", w["model.embed_tokens.weight"])]
    for i in range(c["layers"]):
        for hn, gn in GG_NAMES:
            key = f"model.layers.{i}.{hn}"
            if key not in w:
                continue
            a = w[key]
            if perm and hn == "self_attn.q_proj.weight":
                a = permute(a, c["heads"])
            if perm and hn == "self_attn.k_proj.weight":
                a = permute(a, c["kv"])
            items.append((f"blk.{i}.{gn}", a))
    items.append(("output_norm.weight", w["model.norm.weight"]))
    if not tie:
        items.append(("output.weight", w["lm_head.weight"]))
    if rope_freqs is not None:
        items.append(("rope_freqs.weight", rope_freqs))
    stored = {}
    for gname, a in items:
        if gname in drop:
            continue
        if odd_type and gname == odd_type[0]:
            nb = a.size // 32 * odd_type[2]
            g.tensors.append((gname, odd_type[1], tuple(a.shape), bytes(nb)))
            continue
        t = mat_type if a.ndim == 2 else gw.GGML_F32
        raw = g.add_tensor(gname, a, t)
        stored[gname] = gw.dequantize(t, raw, a.shape)
    g.kv = [x for x in g.kv if x[0] not in drop_kv]
    for k, t, v in kv_extra:
        g.add(k, t, v)
    g.write(os.path.join(d, name))
    return stored


def model_samples(d):
    c = dict(TINY)
    exp = {}
    # llama, untied, generation_config with an eos list; F32 / F16 / BF16 / sharded.
    w = tiny_weights(100, c, tie=False, bias=False, qk_norm=False)
    gen = {"bos_token_id": 1, "eos_token_id": [2, 7], "temperature": 0.6, "top_p": 0.9}
    probe = ["model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.up_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.1.post_attention_layernorm.weight"]
    for dt in ("F32", "F16", "BF16"):
        st = hf_dir(d, f"hf_llama_{dt.lower()}", "llama", c, w, dt, gen=gen)
        exp[f"hf_llama_{dt.lower()}"] = {"checks": checks_for(st, probe)}
    st = hf_dir(d, "hf_llama_sharded", "llama", c, w, "BF16", shards=3, gen=gen)
    exp["hf_llama_sharded"] = {"checks": checks_for(st, probe)}
    # llama3-style rope scaling in config.json, tied (lm_head absent).
    w3 = tiny_weights(101, c, tie=True, bias=False, qk_norm=False)
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    st = hf_dir(d, "hf_llama3_tied", "llama", c, w3, "F32", tie=True,
                extra={"rope_scaling": rs, "rope_theta": 500000.0, "eos_token_id": [2, 3]})
    exp["hf_llama3_tied"] = {"checks": checks_for(st, ["model.embed_tokens.weight"])}
    # mistral with sliding window.
    st = hf_dir(d, "hf_mistral", "mistral", c, w, "F16", extra={"sliding_window": 32})
    exp["hf_mistral"] = {"checks": checks_for(st, ["model.layers.0.mlp.down_proj.weight"])}
    # qwen2: biases, tied.
    wq2 = tiny_weights(102, c, tie=True, bias=True, qk_norm=False)
    st = hf_dir(d, "hf_qwen2", "qwen2", c, wq2, "BF16", tie=True,
                extra={"use_sliding_window": False, "sliding_window": 4096, "rope_theta": 1000000.0})
    exp["hf_qwen2"] = {"checks": checks_for(st, ["model.layers.1.self_attn.v_proj.bias",
                                                 "model.layers.0.self_attn.q_proj.bias"])}
    # qwen3: q/k norm, head_dim 32 != 64 / 4.
    c3 = dict(c, head_dim=32)
    wq3 = tiny_weights(103, c3, tie=True, bias=False, qk_norm=True)
    st = hf_dir(d, "hf_qwen3", "qwen3", c3, wq3, "F32", tie=True, extra={"attention_bias": False})
    exp["hf_qwen3"] = {"checks": checks_for(st, ["model.layers.1.self_attn.k_norm.weight",
                                                 "model.layers.0.self_attn.o_proj.weight"])}

    # GGUF: llama (permuted Q/K, rope_freqs, untied, Q8_0), qwen2 (bias, tied, F16),
    # qwen3 (q/k norm, head_dim 32, Q4_0), llama F32 with linear scaling.
    rf = (1.0 + np.arange(c["head_dim"] // 2, dtype=np.float32) / 4)
    gp = ["token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.1.attn_k.weight",
          "blk.1.ffn_down.weight", "rope_freqs.weight", "blk.0.attn_norm.weight"]
    st = gguf_model(d, "llama_q8_0.gguf", "llama", c, w, gw.GGML_Q8_0, tie=False, rope_freqs=rf)
    exp["llama_q8_0.gguf"] = {"checks": checks_for(st, gp)}
    st = gguf_model(d, "llama_f32.gguf", "llama", c, w, gw.GGML_F32, tie=False,
                    kv_extra=[("llama.rope.scaling.type", gw.T_STRING, "linear"),
                              ("llama.rope.scaling.factor", gw.T_FLOAT32, 4.0)])
    exp["llama_f32.gguf"] = {"checks": checks_for(st, ["blk.0.attn_q.weight", "blk.0.attn_k.weight"])}
    st = gguf_model(d, "qwen2_f16.gguf", "qwen2", c, wq2, gw.GGML_F16, tie=True)
    exp["qwen2_f16.gguf"] = {"checks": checks_for(st, ["blk.1.attn_v.bias", "blk.0.attn_q.weight"])}
    st = gguf_model(d, "qwen3_q4_0.gguf", "qwen3", c3, wq3, gw.GGML_Q4_0, tie=True)
    exp["qwen3_q4_0.gguf"] = {"checks": checks_for(st, ["blk.1.attn_k_norm.weight", "blk.0.ffn_up.weight"])}
    st = gguf_model(d, "qwen2_bf16.gguf", "qwen2", c, wq2, gw.GGML_BF16, tie=True)
    exp["qwen2_bf16.gguf"] = {"checks": checks_for(st, ["token_embd.weight"])}
    write_json(os.path.join(d, "models.expect.json"), exp)

    # Broken variants.
    bad = os.path.join(d, "bad")
    os.makedirs(bad, exist_ok=True)
    os.makedirs(os.path.join(bad, "no_config"), exist_ok=True)
    sw.write(os.path.join(bad, "no_config", "model.safetensors"), w)
    p = os.path.join(bad, "bad_json")
    os.makedirs(p, exist_ok=True)
    with open(os.path.join(p, "config.json"), "w") as f:
        f.write('{"model_type": "llama", "hidden_size": 64,')
    sw.write(os.path.join(p, "model.safetensors"), w)
    wb = dict(w)
    wb["model.layers.1.mlp.up_proj.weight"] = np.zeros((64, 32), np.float32)
    hf_dir(bad, "bad_shape", "llama", c, wb)
    wb = dict(w)
    del wb["model.layers.1.post_attention_layernorm.weight"]
    hf_dir(bad, "missing_tensor", "llama", c, wb)
    wb = dict(w)
    del wb["lm_head.weight"]
    hf_dir(bad, "no_lm_head", "llama", c, wb)
    hf_dir(bad, "gemma", "gemma", c, w)
    p = os.path.join(bad, "no_weights")
    os.makedirs(p, exist_ok=True)
    write_json(os.path.join(p, "config.json"), hf_config("llama", c, False))
    hf_dir(bad, "missing_shard", "llama", c, w, shards=2)
    os.remove(os.path.join(bad, "missing_shard", "model-00002-of-00002.safetensors"))
    hf_dir(bad, "bad_index", "llama", c, w, shards=2)
    write_json(os.path.join(bad, "bad_index", "model.safetensors.index.json"),
               {"weight_map": {"model.norm.weight": "../../etc/passwd"}})
    hf_dir(bad, "heads", "llama", dict(c, kv=3), w)
    # A tensor stored as I64 (unsupported dtype) in an otherwise valid model.
    p = os.path.join(bad, "i64")
    os.makedirs(p, exist_ok=True)
    write_json(os.path.join(p, "config.json"), hf_config("llama", c, False))
    ents = []
    for n, a in w.items():
        if n == "model.layers.0.mlp.gate_proj.weight":
            ents.append((n, "I64", a.shape, np.zeros(a.shape, "<i8").tobytes()))
        else:
            ents.append((n, "F32", a.shape, a.astype("<f4").tobytes()))
    write_st_raw(os.path.join(p, "model.safetensors"), ents)
    # Misaligned data (header length not a multiple of 8): must still load, values intact.
    p = os.path.join(d, "hf_unaligned")
    os.makedirs(p, exist_ok=True)
    write_json(os.path.join(p, "config.json"), hf_config("llama", c, False))
    hdr, off, blobs = {}, 0, []
    for n, a in w.items():
        raw = a.astype("<f4").tobytes()
        hdr[n] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr).encode()
    h += b" " * (1 + (-len(h)) % 8)  # total length = 1 mod 8
    with open(os.path.join(p, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
    exp2 = {"checks": checks_for(w, probe)}
    write_json(os.path.join(d, "hf_unaligned.expect.json"), exp2)
    gguf_model(bad, "gemma.gguf", "gemma", c, w, gw.GGML_F32, tie=False)
    gguf_model(bad, "q4_1.gguf", "llama", c, w, gw.GGML_F32, tie=False,
               odd_type=("blk.1.ffn_up.weight", 3, 20))
    gguf_model(bad, "missing.gguf", "llama", c, w, gw.GGML_F32, tie=False, drop=("blk.1.attn_v.weight",))
    gguf_model(bad, "noembd.gguf", "llama", c, w, gw.GGML_F32, tie=False, drop=("token_embd.weight",))
    gguf_model(bad, "no_dim.gguf", "llama", c, w, gw.GGML_F32, tie=False, drop_kv=("llama.embedding_length",))
    gguf_model(bad, "partial_rope.gguf", "llama", c, w, gw.GGML_F32, tie=False,
               kv_extra=[("llama.rope.dimension_count", gw.T_UINT32, 8)])
    gguf_model(bad, "yarn.gguf", "llama", c, w, gw.GGML_F32, tie=False,
               kv_extra=[("llama.rope.scaling.type", gw.T_STRING, "yarn")])
    gguf_model(bad, "heads_str.gguf", "llama", c, w, gw.GGML_F32, tie=False,
               drop_kv=("llama.attention.head_count",),
               kv_extra=[("llama.attention.head_count", gw.T_STRING, "4")])
    gguf_model(bad, "blocks.gguf", "llama", c, w, gw.GGML_F32, tie=False, drop_kv=("llama.block_count",),
               kv_extra=[("llama.block_count", gw.T_UINT32, 3)])
    # Valid: vocabulary size from token_embd rows (no vocab_size key, no token list).
    gguf_model(d, "novocab.gguf", "qwen2", c, wq2, gw.GGML_F32, tie=True, drop_kv=("tokenizer.ggml.tokens",))


def main():
    d = outdir()
    os.makedirs(d, exist_ok=True)
    gguf_meta_sample(d)
    gguf_misc_samples(d)
    st_samples(d)
    model_samples(d)
    print("wrote format samples to", d)


if __name__ == "__main__":
    main()
