"""Embeddings oracle for POST /v1/embeddings (test_server_embed): for reference models written by
make_models.py, the final hidden state (after the final RMSNorm, before the LM head) of a few inputs,
pooled by the last token and by the mean over all tokens, raw and L2-normalised, in float64 by
model_ref.RefModel (its head replaced by the identity, so forward() returns that hidden state).

Inputs are strings tokenized by the reference BPE (bpe_tokenizer.py, BOS first, as the server's
default add_special_tokens) and token-id lists; one is longer than the test server's
max_batched_tokens so that it runs in chunks. Weights are read from the served model.safetensors.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe_tokenizer import BPETokenizer  # noqa: E402
from model_ref import RefConfig, RefModel  # noqa: E402

VOCAB = 384  # make_models.py: 256 byte symbols + 126 merges + <|bos|> + <|eos|>
MODELS = ["llama2", "qwen3"]
TEXTS = ["Once upon a time there was a little",
         "hello world",
         "The quick brown fox jumps over the lazy dog. " * 4,
         "a",
         "Embeddings pool the final hidden state of every token"]
ID_INPUTS = [[5, 17, 200, 33], list(range(1, 161))]  # the second: 160 tokens, > 64 per forward
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in head.items():
        if name == "__metadata__":
            continue
        a, b = meta["data_offsets"]
        raw = data[a:b]
        if meta["dtype"] == "BF16":
            u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=DTYPES[meta["dtype"]]).astype(np.float32)
        out[name] = arr.reshape(meta["shape"])
    return out


def ref_config(cfg):
    heads = cfg["num_attention_heads"]
    return RefConfig(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                     n_layers=cfg["num_hidden_layers"], n_heads=heads,
                     n_kv_heads=cfg.get("num_key_value_heads", heads),
                     head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
                     ffn_dim=cfg["intermediate_size"], rms_eps=cfg["rms_norm_eps"],
                     rope_theta=cfg.get("rope_theta", 10000.0), rope_scaling=cfg.get("rope_scaling"),
                     qkv_bias=cfg["model_type"] == "qwen2", qk_norm=cfg["model_type"] == "qwen3",
                     tie_embeddings=False, max_pos=cfg["max_position_embeddings"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    td = os.environ.get("TANDEM_TEST_DATA") or ".cache"
    ap.add_argument("--ref", default=os.path.join(td, "ref"))
    ap.add_argument("--out", default=os.path.join(td, "embed_oracle.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    tok = BPETokenizer(VOCAB - 256 - 2)
    inputs = [{"text": t, "ids": tok.encode(t)} for t in TEXTS] + [{"ids": ids} for ids in ID_INPUTS]
    models = []
    for name in MODELS:
        d = os.path.join(args.ref, name)
        with open(os.path.join(d, "config.json")) as f:
            cfg = json.load(f)
        c = ref_config(cfg)
        w = read_safetensors(os.path.join(d, "model.safetensors"))
        w["lm_head.weight"] = np.eye(c.hidden_size)  # the head becomes the identity: logits = hidden
        m = RefModel(c, w)
        pooled = {"last": [], "mean": [], "last_raw": [], "mean_raw": []}
        for it in inputs:
            h = m.forward(it["ids"])  # (T, dim) float64: the final normed hidden states
            for kind, v in (("last", h[-1]), ("mean", h.mean(dim=0))):
                pooled[kind + "_raw"].append([float(x) for x in v])
                pooled[kind].append([float(x) for x in torch.nn.functional.normalize(v, dim=0)])
        models.append({"name": name, "dim": c.hidden_size, **pooled})
    out = {"generator": "tests/reference/embed_oracle.py",
           "hidden_state": "after the final RMSNorm (model.norm), before the LM head; float64",
           "pooling": {"last": "the last token's", "mean": "the mean over every token (BOS included)"},
           "normalised": "x / max(||x||_2, 1e-12); *_raw: not normalised",
           "inputs": inputs, "models": models}
    with open(args.out + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(args.out + ".tmp", args.out)
    print(f"embed_oracle: {len(inputs)} inputs x {len(models)} models -> {args.out}")


if __name__ == "__main__":
    main()
