"""Expected NLLs for tests/unit/test_eval.c, from the PyTorch oracle's saved log-softmax rows.

make_models.py stores, per reference model, log_softmax(logits) at every position of each prompt
as raw float32 [n_tokens, vocab] (oracle/<tag>.<prompt>.f32), computed in float64 by model_ref.py.
A window equal to prompt[0..T] has NLL sum = -sum_{i<T} row[i][prompt[i+1]]; this prints those
sums as JSON for the requested models and window lengths. Standard library only.

usage: eval_oracle.py REF_DIR PROMPT NAME[,NAME...] T[,T...]
  -> {"prompt": [...], "models": {NAME: {"path": ..., "sum": {"T": nll_sum, ...}}}}

Windows that are not prefixes have no saved rows; for them the PyTorch reference itself
(model_ref.py, float64) runs on an f32 Hugging Face model directory:
usage: eval_oracle.py windows REF_DIR MODEL_DIR PROMPT T
  -> {"T": T, "sums": [NLL sum of window k = prompt[k*T .. k*T+T], for every whole window]}
"""
import array
import json
import os
import struct
import sys


def read_safetensors_f32(path):
    """name -> torch float32 tensor, for files whose tensors are all F32 (no other dtypes)."""
    import torch
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", "%s: %s (only F32 models)" % (name, t["dtype"])
        a, b = t["data_offsets"]
        buf = bytearray(data[8 + n + a:8 + n + b])
        out[name] = torch.frombuffer(buf, dtype=torch.float32).reshape(t["shape"]).clone()
    return out


def windows_main(ref, model_dir, prompt_name, T):
    import torch
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from model_ref import RefConfig, RefModel
    with open(os.path.join(ref, "oracle.json")) as f:
        prompt = json.load(f)["prompts"][prompt_name]
    with open(os.path.join(model_dir, "config.json")) as f:
        c = json.load(f)
    cfg = RefConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                    n_layers=c["num_hidden_layers"], n_heads=c["num_attention_heads"],
                    n_kv_heads=c["num_key_value_heads"],
                    head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                    ffn_dim=c["intermediate_size"], rms_eps=c["rms_norm_eps"],
                    rope_theta=c["rope_theta"], rope_scaling=c.get("rope_scaling"),
                    qkv_bias=c["model_type"] == "qwen2", qk_norm=c["model_type"] == "qwen3",
                    tie_embeddings=c.get("tie_word_embeddings", False),
                    max_pos=c["max_position_embeddings"])
    m = RefModel(cfg, read_safetensors_f32(os.path.join(model_dir, "model.safetensors")))
    sums = []
    for k in range((len(prompt) - 1) // T):
        w = prompt[k * T:k * T + T + 1]
        lp = m.logprobs(w[:T])  # (T, vocab) float64
        sums.append(-float(sum(lp[t, w[t + 1]] for t in range(T))))
    json.dump({"T": T, "sums": sums}, sys.stdout)


def main():
    if sys.argv[1] == "windows":
        windows_main(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
    ref, prompt_name, names, ts = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4].split(",")
    with open(os.path.join(ref, "oracle.json")) as f:
        idx = json.load(f)
    vocab = idx["vocab_size"]
    prompt = idx["prompts"][prompt_name]
    out = {"prompt": prompt, "vocab_size": vocab, "models": {}}
    for m in idx["models"]:
        if m["name"] not in names:
            continue
        rows = array.array("f")
        with open(os.path.join(ref, m["logprobs"][prompt_name]), "rb") as f:
            rows.frombytes(f.read())
        if sys.byteorder != "little":
            rows.byteswap()
        assert len(rows) == len(prompt) * vocab, "oracle rows have the wrong size"
        sums = {}
        for t in ts:
            T = int(t)
            assert 0 < T < len(prompt)
            sums[t] = -sum(float(rows[i * vocab + prompt[i + 1]]) for i in range(T))
        out["models"][m["name"]] = {"path": m["path"], "sum": sums}
    missing = [n for n in names if n not in out["models"]]
    if missing:
        sys.exit("eval_oracle.py: no such models in oracle.json: " + ",".join(missing))
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
