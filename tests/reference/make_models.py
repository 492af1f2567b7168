"""Makes tandem's reference models and their PyTorch oracle outputs.

For each architecture variant (llama2, llama3, mistral, qwen2, qwen3) it draws small random
weights, writes a Hugging Face model directory and GGUF files (F32, F16, BF16, Q8_0, Q4_0), then
runs model_ref.py on exactly the weights each file stores (after rounding or quantize->dequantize)
and saves the log-softmax of every position for a few prompts plus a greedy continuation.
Files whose matmul weights are Q8_0, Q4_0 or BF16 also get an "act" oracle: the same weights with
the activations in front of those matmuls rounded as tandem's avx512-int8 kernels (and llama.cpp)
round them (int8 per 32-block for Q8_0/Q4_0, bf16 for BF16; model_ref.act_q8 / act_bf16).
Two more variants with inner dimensions that are multiples of 256 (llamak, qwen3k; KQ_VARIANTS) get
an F32 GGUF and a Q4_K_M GGUF (llama.cpp's mix of Q4_K and Q6_K, with its fallbacks for rows that
are not a multiple of 256), whose "act" oracle rounds activations per 256 as ggml's Q8_K (act_q8k).
It is not a converter: the GGUF layout is written here by hand following llama.cpp's conventions.

Usage: /usr/bin/python3 tests/reference/make_models.py [--out DIR]
       (DIR defaults to $TANDEM_TEST_DATA/ref or .cache/ref). Output index: DIR/oracle.json.
"""
import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_writer as G  # noqa: E402
import safetensors_writer as S  # noqa: E402
from bpe_tokenizer import BPETokenizer  # noqa: E402
from model_ref import RefConfig, RefModel, llama3_rope_factors  # noqa: E402

VOCAB = 384  # 256 byte symbols + 126 merges + <|bos|> + <|eos|>
MAX_POS = 512
PROMPT_LENS = [1, 7, 33, 300]  # 300 > any internal chunk (the forward's batch, attention tiles)
N_GREEDY = 16
GREEDY_TEXT = "Once upon a time there was a little"
SEED_BASE = 1234
# Bumped whenever the output changes meaning, so stale caches are regenerated.
FORMAT_VERSION = 1

# hidden, layers, heads, kv heads, head_dim (None: hidden/heads, not written to config.json).
# Inner dimensions are multiples of 32 (Q8_0/Q4_0 blocks); mistral's ffn (352) is longer than
# a 256-element matmul chunk and not a multiple of it, so chunked dot products are exercised.
VARIANTS = {
    "llama2": dict(seed=1534, model_type="llama", arch="LlamaForCausalLM", gguf_arch="llama", hidden=64,
                   layers=2, heads=4, kv=4, head_dim=None, ffn=160, eps=1e-5, theta=10000.0,
                   tie=False, bias=False, qk_norm=False, rope_scaling=None),
    "llama3": dict(seed=1535, model_type="llama", arch="LlamaForCausalLM", gguf_arch="llama", hidden=96,
                   layers=2, heads=6, kv=2, head_dim=16, ffn=256, eps=1e-5, theta=500000.0,
                   tie=True, bias=False, qk_norm=False,
                   rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64, "rope_type": "llama3"}),
    "mistral": dict(seed=2202, model_type="mistral", arch="MistralForCausalLM", gguf_arch="llama", hidden=128,
                    layers=2, heads=4, kv=2, head_dim=48, ffn=352, eps=1e-5, theta=1000000.0,
                    tie=False, bias=False, qk_norm=False, rope_scaling=None),
    "qwen2": dict(seed=1937, model_type="qwen2", arch="Qwen2ForCausalLM", gguf_arch="qwen2", hidden=64,
                  layers=3, heads=4, kv=2, head_dim=None, ffn=192, eps=1e-6, theta=1000000.0,
                  tie=True, bias=True, qk_norm=False,
                  rope_scaling={"factor": 2.0, "rope_type": "linear", "type": "linear"}),
    "qwen3": dict(seed=2038, model_type="qwen3", arch="Qwen3ForCausalLM", gguf_arch="qwen3", hidden=64,
                  layers=2, heads=4, kv=2, head_dim=32, ffn=192, eps=1e-6, theta=1000000.0,
                  tie=True, bias=False, qk_norm=True, rope_scaling=None),
}

GGUF_TYPES = {"f32": G.GGML_F32, "f16": G.GGML_F16, "bf16": G.GGML_BF16, "q8_0": G.GGML_Q8_0,
              "q4_0": G.GGML_Q4_0}
GGUF_TYPE_NAMES = {v: k.upper() for k, v in GGUF_TYPES.items()}
GGUF_TYPE_NAMES.update({G.GGML_Q4_K: "Q4_K", G.GGML_Q6_K: "Q6_K", G.GGML_Q5_0: "Q5_0"})
# Activation rounding that tandem's avx512-int8 kernels apply in front of a matmul, by weight type.
ACT_BY_TYPE = {"Q8_0": "q8", "Q4_0": "q8", "Q5_0": "q8", "BF16": "bf16", "Q4_K": "q8k", "Q6_K": "q8k"}

# k-quant variants: every inner dimension a multiple of 256 except llamak's ffn (544), so that its
# ffn_down rows exercise the Q4_K -> Q5_0 and Q6_K -> Q8_0 fallbacks. llamak has an output.weight
# (Q6_K), qwen3k ties it to token_embd (then Q6_K). Layers: use_more_bits picks layer 1 of 2 and
# layer 2 of 3.
KQ_VARIANTS = {
    "llamak": dict(seed=3141, model_type="llama", arch="LlamaForCausalLM", gguf_arch="llama", hidden=256,
                   layers=2, heads=4, kv=2, head_dim=64, ffn=544, eps=1e-5, theta=10000.0,
                   tie=False, bias=False, qk_norm=False, rope_scaling=None),
    "qwen3k": dict(seed=2718, model_type="qwen3", arch="Qwen3ForCausalLM", gguf_arch="qwen3", hidden=256,
                   layers=3, heads=4, kv=2, head_dim=64, ffn=768, eps=1e-6, theta=1000000.0,
                   tie=True, bias=False, qk_norm=True, rope_scaling=None),
}


def use_more_bits(i_layer, n_layers):
    """llama.cpp's choice of the attn_v / ffn_down layers that get Q6_K in a Q4_K_M file."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


def q4_k_m_type(gname, ndim, cols, n_layers, has_output):
    """The ggml type llama.cpp's Q4_K_M recipe gives GGUF tensor gname (dense models): 1-D F32;
    output.weight (or token_embd.weight when the head is tied) Q6_K; attn_v and ffn_down Q6_K in
    the use_more_bits layers; every other matrix Q4_K. Rows that are not a multiple of 256 fall
    back as in llama.cpp: Q6_K -> Q8_0, Q4_K -> Q5_0."""
    if ndim != 2:
        return G.GGML_F32
    t = G.GGML_Q4_K
    if gname == "output.weight" or (not has_output and gname == "token_embd.weight"):
        t = G.GGML_Q6_K
    elif "attn_v.weight" in gname or "ffn_down" in gname:
        if use_more_bits(int(gname.split(".")[1]), n_layers):
            t = G.GGML_Q6_K
    if cols % G.QK_K:
        t = G.GGML_Q8_0 if t == G.GGML_Q6_K else G.GGML_Q5_0
    return t
# The matmul weights of a model (HF names; a tied head multiplies by the embedding table).
MATMUL_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                   "gate_proj.weight", "up_proj.weight", "down_proj.weight")
# llama.cpp's LLAMA_FTYPE values for general.file_type
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "bf16": 32, "q4_k_m": 15}


def ref_config(v):
    hd = v["head_dim"] or v["hidden"] // v["heads"]
    return RefConfig(vocab_size=VOCAB, hidden_size=v["hidden"], n_layers=v["layers"],
                     n_heads=v["heads"], n_kv_heads=v["kv"], head_dim=hd, ffn_dim=v["ffn"],
                     rms_eps=v["eps"], rope_theta=v["theta"], rope_scaling=v["rope_scaling"],
                     qkv_bias=v["bias"], qk_norm=v["qk_norm"], tie_embeddings=v["tie"],
                     max_pos=MAX_POS)


def random_weights(c: RefConfig, seed):
    """HF-named float32 weights. Norm weights and biases are far from 1/0 so that a forward that
    forgets one of them fails; matrices are scaled so activations and logits are O(1), with the
    residual branches (o_proj, down_proj) strong against the embedding so that greedy text does not
    just repeat the last token. Seeds were picked (once, offline) for varied greedy continuations
    whose top1-top2 margins are all above 0.02."""
    rng = np.random.default_rng(seed)

    def mat(o, i, gain=1.0):
        return (gain * rng.standard_normal((o, i)) / np.sqrt(i)).astype(np.float32)

    def norm(n):
        return rng.uniform(0.5, 1.5, n).astype(np.float32)

    def bias(n):
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    d, hd = c.hidden_size, c.head_dim
    w = {"model.embed_tokens.weight": (0.2 * rng.standard_normal((c.vocab_size, d))).astype(np.float32)}
    for i in range(c.n_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(d)
        w[p + "self_attn.q_proj.weight"] = mat(c.n_heads * hd, d)
        w[p + "self_attn.k_proj.weight"] = mat(c.n_kv_heads * hd, d)
        w[p + "self_attn.v_proj.weight"] = mat(c.n_kv_heads * hd, d)
        if c.qkv_bias:
            w[p + "self_attn.q_proj.bias"] = bias(c.n_heads * hd)
            w[p + "self_attn.k_proj.bias"] = bias(c.n_kv_heads * hd)
            w[p + "self_attn.v_proj.bias"] = bias(c.n_kv_heads * hd)
        w[p + "self_attn.o_proj.weight"] = mat(d, c.n_heads * hd, 2.0)
        if c.qk_norm:
            w[p + "self_attn.q_norm.weight"] = norm(hd)
            w[p + "self_attn.k_norm.weight"] = norm(hd)
        w[p + "post_attention_layernorm.weight"] = norm(d)
        w[p + "mlp.gate_proj.weight"] = mat(c.ffn_dim, d)
        w[p + "mlp.up_proj.weight"] = mat(c.ffn_dim, d)
        w[p + "mlp.down_proj.weight"] = mat(d, c.ffn_dim, 2.0)
    w["model.norm.weight"] = norm(d)
    if not c.tie_embeddings:
        w["lm_head.weight"] = (2.0 * rng.standard_normal((c.vocab_size, d)) / np.sqrt(d)).astype(np.float32)
    return w


# ---------------------------------------------------------------- Hugging Face directories

def hf_config(name, v, c: RefConfig, tok, torch_dtype):
    cfg = {
        "architectures": [v["arch"]],
        "attention_dropout": 0.0,
        "bos_token_id": tok.bos_id,
        "eos_token_id": [tok.eos_id] if name == "llama3" else tok.eos_id,
        "hidden_act": "silu",
        "hidden_size": c.hidden_size,
        "initializer_range": 0.02,
        "intermediate_size": c.ffn_dim,
        "max_position_embeddings": MAX_POS,
        "model_type": v["model_type"],
        "num_attention_heads": c.n_heads,
        "num_hidden_layers": c.n_layers,
        "num_key_value_heads": c.n_kv_heads,
        "rms_norm_eps": c.rms_eps,
        "rope_scaling": c.rope_scaling,
        "rope_theta": c.rope_theta,
        "tie_word_embeddings": c.tie_embeddings,
        "torch_dtype": torch_dtype,
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": c.vocab_size,
    }
    if v["head_dim"] is not None:
        cfg["head_dim"] = v["head_dim"]
    if v["model_type"] in ("llama", "qwen3"):
        cfg["attention_bias"] = False
    if v["model_type"] == "llama":
        cfg["mlp_bias"] = False
        cfg["pretraining_tp"] = 1
    if v["model_type"] == "mistral":
        cfg["sliding_window"] = None
    if v["model_type"] in ("qwen2", "qwen3"):
        cfg["use_sliding_window"] = False
        cfg["sliding_window"] = None
        cfg["max_window_layers"] = c.n_layers
    return cfg


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def write_hf_dir(path, name, v, c, tok, weights, dtype="F32", shards=1, types=None):
    """Returns the weights as stored (float32 after rounding to dtype). types, if given, receives
    HF name -> stored dtype name ("F32", "F16", "BF16") of every tensor."""
    if types is not None:
        types.update({n: dtype for n in weights})
    os.makedirs(path, exist_ok=True)
    torch_dtype = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
    write_json(os.path.join(path, "config.json"), hf_config(name, v, c, tok, torch_dtype))
    write_json(os.path.join(path, "generation_config.json"),
               {"_from_model_config": True, "bos_token_id": tok.bos_id,
                "eos_token_id": hf_config(name, v, c, tok, torch_dtype)["eos_token_id"],
                "transformers_version": "4.51.0"})
    write_json(os.path.join(path, "tokenizer.json"), tok.tokenizer_json())
    write_json(os.path.join(path, "tokenizer_config.json"), tok.tokenizer_config(MAX_POS))
    write_json(os.path.join(path, "special_tokens_map.json"),
               {"bos_token": "<|bos|>", "eos_token": "<|eos|>"})
    meta = {"format": "pt"}
    if shards == 1:
        return S.write(os.path.join(path, "model.safetensors"), weights, dtype, meta)
    names = list(weights)
    per = (len(names) + shards - 1) // shards
    stored, wmap, total = {}, {}, 0
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: weights[n] for n in names[s * per:(s + 1) * per]}
        stored.update(S.write(os.path.join(path, fn), part, dtype, meta))
        for n, a in part.items():
            wmap[n] = fn
            total += a.size * (4 if dtype == "F32" else 2)
    write_json(os.path.join(path, "model.safetensors.index.json"),
               {"metadata": {"total_size": total}, "weight_map": wmap})
    return stored


# ---------------------------------------------------------------- GGUF

def permute(w, n_head):
    """llama.cpp's converter permutation of Q/K rows: HF rotate_half pairs (i, i+hd/2) become
    adjacent pairs (2i, 2i+1) within each head."""
    w = np.asarray(w)
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, n_head):
    w = np.asarray(w)
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(v, c: RefConfig, w):
    """(gguf name, HF name, array in GGUF layout, permuted n_head or 0) in llama.cpp's order."""
    perm = v["gguf_arch"] == "llama"
    out = [("token_embd.weight", "model.embed_tokens.weight", w["model.embed_tokens.weight"], 0)]
    for i in range(c.n_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        nq = c.n_heads if perm else 0
        nk = c.n_kv_heads if perm else 0
        rows = [
            ("attn_norm.weight", "input_layernorm.weight", 0),
            ("attn_q.weight", "self_attn.q_proj.weight", nq),
            ("attn_k.weight", "self_attn.k_proj.weight", nk),
            ("attn_v.weight", "self_attn.v_proj.weight", 0),
        ]
        if c.qkv_bias:
            rows += [("attn_q.bias", "self_attn.q_proj.bias", 0),
                     ("attn_k.bias", "self_attn.k_proj.bias", 0),
                     ("attn_v.bias", "self_attn.v_proj.bias", 0)]
        if c.qk_norm:
            rows += [("attn_q_norm.weight", "self_attn.q_norm.weight", 0),
                     ("attn_k_norm.weight", "self_attn.k_norm.weight", 0)]
        rows += [
            ("attn_output.weight", "self_attn.o_proj.weight", 0),
            ("ffn_norm.weight", "post_attention_layernorm.weight", 0),
            ("ffn_gate.weight", "mlp.gate_proj.weight", 0),
            ("ffn_up.weight", "mlp.up_proj.weight", 0),
            ("ffn_down.weight", "mlp.down_proj.weight", 0),
        ]
        for gn, hn, nh in rows:
            a = w[p + hn]
            out.append((b + gn, p + hn, permute(a, nh) if nh else a, nh))
    out.append(("output_norm.weight", "model.norm.weight", w["model.norm.weight"], 0))
    if not c.tie_embeddings:
        out.append(("output.weight", "lm_head.weight", w["lm_head.weight"], 0))
    return out


def write_gguf(path, name, v, c: RefConfig, tok, w, ftype, types=None):
    """Returns the HF-named, HF-layout float32 weights as tandem will see them. types, if given,
    receives HF name -> GGUF tensor type name ("F32", "Q8_0", ...) of every tensor written."""
    arch = v["gguf_arch"]
    g = G.GGUFWriter()
    g.add("general.architecture", G.T_STRING, arch)
    g.add("general.name", G.T_STRING, f"tandem-ref-{name}")
    g.add("general.file_type", G.T_UINT32, FILE_TYPE[ftype])
    g.add("general.alignment", G.T_UINT32, G.ALIGNMENT)
    g.add(f"{arch}.vocab_size", G.T_UINT32, c.vocab_size)
    g.add(f"{arch}.context_length", G.T_UINT32, MAX_POS)
    g.add(f"{arch}.embedding_length", G.T_UINT32, c.hidden_size)
    g.add(f"{arch}.block_count", G.T_UINT32, c.n_layers)
    g.add(f"{arch}.feed_forward_length", G.T_UINT32, c.ffn_dim)
    g.add(f"{arch}.attention.head_count", G.T_UINT32, c.n_heads)
    g.add(f"{arch}.attention.head_count_kv", G.T_UINT32, c.n_kv_heads)
    g.add(f"{arch}.attention.layer_norm_rms_epsilon", G.T_FLOAT32, c.rms_eps)
    g.add(f"{arch}.rope.freq_base", G.T_FLOAT32, c.rope_theta)
    g.add(f"{arch}.rope.dimension_count", G.T_UINT32, c.head_dim)
    g.add(f"{arch}.attention.key_length", G.T_UINT32, c.head_dim)
    g.add(f"{arch}.attention.value_length", G.T_UINT32, c.head_dim)
    rs = c.rope_scaling
    if rs and rs.get("rope_type") == "linear":  # llama3 scaling travels as rope_freqs instead
        g.add(f"{arch}.rope.scaling.type", G.T_STRING, "linear")
        g.add(f"{arch}.rope.scaling.factor", G.T_FLOAT32, float(rs["factor"]))
    g.add("tokenizer.ggml.model", G.T_STRING, "gpt2")
    g.add("tokenizer.ggml.pre", G.T_STRING, "gpt-2")
    g.add("tokenizer.ggml.tokens", G.T_ARRAY, tok.tokens, G.T_STRING)
    g.add("tokenizer.ggml.token_type", G.T_ARRAY,
          [3 if i >= tok.bos_id else 1 for i in range(len(tok.tokens))], G.T_INT32)
    g.add("tokenizer.ggml.merges", G.T_ARRAY, [a + " " + b for a, b in tok.merges], G.T_STRING)
    g.add("tokenizer.ggml.bos_token_id", G.T_UINT32, tok.bos_id)
    g.add("tokenizer.ggml.eos_token_id", G.T_UINT32, tok.eos_id)
    g.add("tokenizer.ggml.add_bos_token", G.T_BOOL, True)
    g.add("tokenizer.chat_template", G.T_STRING, tok.CHAT_TEMPLATE)

    qtype = GGUF_TYPES.get(ftype)
    stored = {}
    tensors = gguf_tensors(v, c, w)
    has_output = any(t[0] == "output.weight" for t in tensors)
    for gname, hname, a, nh in tensors:
        if ftype == "q4_k_m":
            t = q4_k_m_type(gname, a.ndim, a.shape[-1], c.n_layers, has_output)
        else:
            t = qtype if a.ndim == 2 else G.GGML_F32  # 1-D tensors stay F32, as llama.cpp writes them
        raw = g.add_tensor(gname, a, t)
        if types is not None:
            types[hname] = GGUF_TYPE_NAMES[t]
        back = G.dequantize(t, raw, a.shape)
        stored[hname] = unpermute(back, nh) if nh else back
    if rs and rs.get("rope_type") == "llama3":
        # llama.cpp's generate_extra_tensors: per-frequency divisors. (Its converter reads
        # original_max_position_embeddings from the top-level config, defaulting to 8192; we use
        # the rope_scaling value, which is what HF applies, so both files mean the same model.)
        g.add_tensor("rope_freqs.weight", llama3_rope_factors(c).numpy().astype(np.float32), G.GGML_F32)
    g.write(path)
    return stored


# ---------------------------------------------------------------- oracle

def weights_key(stored):
    h = hashlib.sha256()
    for k in sorted(stored):
        h.update(k.encode())
        h.update(np.ascontiguousarray(stored[k], dtype=np.float32).tobytes())
    return h.hexdigest()[:16]


def act_map(c: RefConfig, types):
    """HF weight name -> activation rounding ("q8"/"bf16") for every matmul whose stored weight
    type the avx512-int8 kernels multiply in low precision; {} when there is none."""
    head = "model.embed_tokens.weight" if c.tie_embeddings else "lm_head.weight"
    act = {}
    for n, t in types.items():
        if (n.endswith(MATMUL_SUFFIXES) or n == head) and t in ACT_BY_TYPE:
            act[n] = ACT_BY_TYPE[t]
    return act


def run_oracle(out, tag, c, stored, prompts, greedy_prompt, tok, act=None):
    """Writes DIR/oracle/<tag>.<prompt>.f32 files; returns the JSON record. act: RefModel's."""
    m = RefModel(c, stored, act)
    files = {}
    for pname, toks in prompts.items():
        lp = m.logprobs(toks).to(torch.float32).numpy()  # (T, vocab)
        rel = f"oracle/{tag}.{pname}.f32"
        lp.astype("<f4").tofile(os.path.join(out, rel))
        files[pname] = rel
    gt, glp, margins = m.greedy(greedy_prompt, N_GREEDY)
    plp = m.logprobs(greedy_prompt + gt)
    n = len(greedy_prompt)
    # logprob of each prompt token given its prefix (the first token has none)
    prompt_lp = [None] + [float(plp[i - 1, greedy_prompt[i]]) for i in range(1, n)]
    top5 = []
    for i in range(N_GREEDY):
        vals, idx = torch.topk(plp[n - 1 + i], 5)
        top5.append([[int(j), float(x)] for j, x in zip(idx, vals)])
    return {"logprobs": files,
            "greedy": {"tokens": gt, "text": tok.decode(gt), "token_logprobs": glp,
                       "top5": top5, "min_margin": min(margins),
                       "eos_at": gt.index(tok.eos_id) if tok.eos_id in gt else -1},
            "prompt_logprobs": prompt_lp}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    td = os.environ.get("TANDEM_TEST_DATA")
    ap.add_argument("--out", default=os.path.join(td, "ref") if td else ".cache/ref")
    ap.add_argument("--force", action="store_true", help="regenerate even if up to date")
    args = ap.parse_args()
    out = args.out
    index_path = os.path.join(out, "oracle.json")

    # Skip when the index was made by this exact generator (hash of the reference scripts).
    here = os.path.dirname(os.path.abspath(__file__))
    src_hash = hashlib.sha256()
    for fn in ("make_models.py", "model_ref.py", "bpe_tokenizer.py", "gguf_writer.py",
               "safetensors_writer.py"):
        with open(os.path.join(here, fn), "rb") as f:
            src_hash.update(f.read())
    src_hash = src_hash.hexdigest()[:16]
    if not args.force and os.path.exists(index_path):
        try:
            with open(index_path) as f:
                old = json.load(f)
            paths = [m["path"] for m in old["models"]] + \
                [f for m in old["models"] for f in m["logprobs"].values()] + \
                [f for m in old["models"] if "act" in m for f in m["act"]["logprobs"].values()]
            if old.get("generator_hash") == src_hash and \
                    all(os.path.exists(os.path.join(out, p)) for p in paths):
                print(f"make_models: {index_path} is up to date")
                return
        except (OSError, ValueError, KeyError, TypeError):
            pass

    t0 = time.time()
    torch.set_num_threads(2)
    os.makedirs(os.path.join(out, "oracle"), exist_ok=True)
    tok = BPETokenizer(VOCAB - 256 - 2)
    assert len(tok.tokens) == VOCAB
    rng = np.random.default_rng(SEED_BASE)
    prompts = {f"len{n}": [int(x) for x in rng.integers(0, tok.bos_id, n)] for n in PROMPT_LENS}
    greedy_prompt = tok.encode(GREEDY_TEXT)

    models, oracles, by_key = [], {}, {}

    def add(model_name, variant, rel_path, fmt, dtype, c, stored, types):
        key = weights_key(stored)
        if key not in by_key:  # files with identical weights share one oracle
            tag = f"{variant}-{dtype.lower()}" + ("" if f"{variant}-{dtype.lower()}" not in oracles
                                                  else f"-{fmt}")
            by_key[key] = tag
            oracles[tag] = run_oracle(out, tag, c, stored, prompts, greedy_prompt, tok)
        tag = by_key[key]
        entry = {"name": model_name, "variant": variant, "path": rel_path, "format": fmt,
                 "dtype": dtype, "oracle": tag, **oracles[tag]}
        act = act_map(c, types)
        if act:  # the avx512-int8 semantics, keyed by weights and roundings
            akey = key + json.dumps(act, sort_keys=True)
            if akey not in by_key:
                atag = f"{tag}.act"
                by_key[akey] = atag
                oracles[atag] = {"rounding": sorted(set(act.values())), "matmuls": len(act),
                                 **run_oracle(out, atag, c, stored, prompts, greedy_prompt, tok, act)}
            entry["act"] = {"oracle": by_key[akey], **oracles[by_key[akey]]}
        models.append(entry)

    for name, v in VARIANTS.items():
        c = ref_config(v)
        w = random_weights(c, v["seed"])
        ty = {}
        st = write_hf_dir(os.path.join(out, name), name, v, c, tok, w, types=ty)
        add(name, name, name, "hf", "F32", c, st, ty)
        if name == "llama2":
            for dt in ("F16", "BF16"):
                d, ty = f"{name}-hf-{dt.lower()}", {}
                add(d, name, d, "hf", dt, c,
                    write_hf_dir(os.path.join(out, d), name, v, c, tok, w, dt, types=ty), ty)
            d, ty = f"{name}-hf-sharded", {}
            add(d, name, d, "hf", "F32", c,
                write_hf_dir(os.path.join(out, d), name, v, c, tok, w, "F32", shards=2, types=ty), ty)
        for ft in GGUF_TYPES:
            fn, ty = f"{name}-{ft}.gguf", {}
            add(fn, name, fn, "gguf", ft.upper(), c,
                write_gguf(os.path.join(out, fn), name, v, c, tok, w, ft, types=ty), ty)
    for name, v in KQ_VARIANTS.items():
        c = ref_config(v)
        w = random_weights(c, v["seed"])
        for ft in ("f32", "q4_k_m"):
            fn, ty = f"{name}-{ft}.gguf", {}
            add(fn, name, fn, "gguf", ft.upper(), c,
                write_gguf(os.path.join(out, fn), name, v, c, tok, w, ft, types=ty), ty)

    index = {
        "version": FORMAT_VERSION,
        "generator": "tests/reference/make_models.py",
        "generator_hash": src_hash,
        "vocab_size": VOCAB,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "logprobs_layout": "raw little-endian float32 [n_tokens, vocab_size], row per position, "
                           "log_softmax of the logits at that position",
        "act_semantics": "models[].act (Q8_0/Q4_0/Q5_0/Q4_K/Q6_K/BF16 matmul weights only): the same outputs "
                         "with the input of every such matmul rounded as tandem's avx512-int8 kernels "
                         "do: q8 = int8 per 32-element block with an f32 scale (Q8_0/Q4_0/Q5_0), q8k = "
                         "int8 per 256-element block as ggml's Q8_K (Q4_K/Q6_K), bf16 = RNE to "
                         "bfloat16 (tests/reference/model_ref.py act_q8, act_q8k, act_bf16)",
        "prompts": prompts,
        "greedy_prompt_text": GREEDY_TEXT,
        "greedy_prompt": greedy_prompt,
        "n_greedy": N_GREEDY,
        "models": models,
    }
    write_json(index_path, index)
    small = min(m["greedy"]["min_margin"] for m in models)
    small_act = min((m["act"]["greedy"]["min_margin"] for m in models if "act" in m), default=0)
    print(f"make_models: {len(models)} model files, {len(oracles)} oracles in {out} "
          f"({time.time() - t0:.1f} s); smallest greedy top1-top2 margin {small:.3g} "
          f"(activation-rounded oracles: {small_act:.3g})")


if __name__ == "__main__":
    main()
