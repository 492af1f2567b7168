"""Writes the small hand-made tokenizer.json files used as fuzz seeds (tests/fuzz/corpus/tokenizer_json/)
and, for the valid ones, as extra HF-oracle tokenizers (split behaviours, added-token lstrip/rstrip/
single_word, GPT-2 ByteLevel regex + prefix space, SentencePiece unk/fuse_unk, Metaspace decoder).
Run once with /usr/bin/python3 from the repo root; the outputs are committed."""
import json

D = "tests/fuzz/corpus/tokenizer_json/"


def bl(b):
    if 33 <= b <= 126 or 161 <= b <= 172 or b >= 174:
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if not (33 <= x <= 126 or 161 <= x <= 172 or x >= 174)))


def dump(name, obj):
    with open(D + name, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False)


def template(tok, tid):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": tok, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {tok: {"id": tok, "ids": [tid], "tokens": [tok]}}}


def added(i, c, special, single_word=False, lstrip=False, rstrip=False, normalized=False):
    return {"id": i, "content": c, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": normalized, "special": special}


v = {bl(b): b for b in range(256)}
merges = [("H", "e"), ("l", "l"), ("He", "ll"), ("Hell", "o"), (bl(32), "w"), ("o", "r"), (bl(32) + "w", "or"),
          ("l", "d"), (bl(32) + "wor", "ld"), (bl(32), "x"), ("x", "x")]
for a, b in merges:
    v.setdefault(a + b, len(v))
n = len(v)
adds = [added(n, "<|im_start|>", True), added(n + 1, "<s>", False, single_word=True),
        added(n + 2, "<L>", True, lstrip=True), added(n + 3, "<R>", True, rstrip=True),
        added(n + 4, "e\u0301", False, normalized=True)]  # NFD content, matched as NFC "é"
bpe = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
       "fuse_unk": False, "byte_fallback": False, "ignore_merges": True, "vocab": v,
       "merges": [a + " " + b for a, b in merges]}
bytelevel_pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
bytelevel_dec = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": adds, "normalizer": {"type": "NFC"},
      "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"},
           "behavior": "Isolated", "invert": False}, bytelevel_pre]},
      "post_processor": template("<|im_start|>", n), "decoder": bytelevel_dec, "model": bpe}
dump("bytelevel.json", tj)
dump("gpt2.json", dict(tj, normalizer=None, post_processor={"type": "ByteLevel", "add_prefix_space": True,
                                                             "trim_offsets": False, "use_regex": True},
                       pre_tokenizer={"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}))
for beh in ["Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"]:
    pat = {"String": " "} if beh != "Contiguous" else {"Regex": "\\p{L}"}
    dump(f"split_{beh}.json", dict(tj, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": pat, "behavior": beh, "invert": beh == "MergedWithNext"}, bytelevel_pre]}))

sv = {"<unk>": 0, "<s>": 1, "</s>": 2}
for b in range(256):
    sv["<0x%02X>" % b] = len(sv)
for c in ["▁", "H", "e", "l", "o", "w", "r", "d", "▁H", "ll", "▁w", "or", "▁He", "llo", "▁Hello", "▁wor", "▁world"]:
    sv[c] = len(sv)
sm = [m for m in ["▁ H", "l l", "▁ w", "o r", "▁H e", "ll o", "▁He llo", "▁w or", "▁wor l"]
      if all(p in sv for p in m.split(" ")) and m.replace(" ", "") in sv]
spm = {"version": "1.0", "truncation": None, "padding": None,
       "added_tokens": [added(i, c, True) for c, i in [("<unk>", 0), ("<s>", 1), ("</s>", 2)]] +
                       [added(len(sv), "lo", False, normalized=True),  # pattern "▁lo" after Prepend
                        added(len(sv) + 1, " world", False, rstrip=True, normalized=True)],
       "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "▁"},
                                                          {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
       "pre_tokenizer": None, "post_processor": template("<s>", 1),
       "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
                                                    {"type": "ByteFallback"}, {"type": "Fuse"},
                                                    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
       "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "vocab": sv, "merges": sm}}
dump("spm.json", spm)
spm2 = json.loads(json.dumps(spm))
spm2["model"]["byte_fallback"] = False
spm2["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": False}
dump("spm_unk_metaspace.json", spm2)

with open(D + "bad_truncated.json", "w") as f:
    f.write(json.dumps(spm)[:300])
with open(D + "bad_merge.json", "w") as f:
    f.write('{"model":{"type":"BPE","vocab":{"a":0,"b":1},"merges":["a c"]}}')
with open(D + "bad_types.json", "w") as f:
    f.write('{"model":{"type":"BPE","vocab":{"a":"0"},"merges":{}},"normalizer":{"type":"Sequence","normalizers":[{"type":"Prepend"}]}}')
with open(D + "tiny_text.json", "wb") as f:
    f.write(b'{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},'
            b'"added_tokens":[{"id":3,"content":"<x>","lstrip":true}]}\x00ab  <x>ba\xff')

# Metaspace pre-tokenizer variants (newer Llama/Mistral files): no normalizer.
for name, scheme, split in (("spm_metaspace_first", "first", True), ("spm_metaspace_always", "always", False)):
    m = json.loads(json.dumps(spm))
    m["normalizer"] = None
    m["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}
    m["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": split}
    dump(name + ".json", m)

# Small vocab-only GGUF seeds for tests/fuzz/fuzz_tokenizer_gguf.c.
import os  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from gguf_writer import GGUFWriter, T_ARRAY, T_BOOL, T_FLOAT32, T_INT32, T_STRING, T_UINT32  # noqa: E402

G = "tests/fuzz/corpus/tokenizer_gguf/"
os.makedirs(G, exist_ok=True)
toks = sorted(v, key=v.get)
for pre in ("llama-bpe", "qwen2", "gpt-2"):
    w = GGUFWriter()
    w.add("tokenizer.ggml.model", T_STRING, "gpt2")
    w.add("tokenizer.ggml.pre", T_STRING, pre)
    w.add("tokenizer.ggml.tokens", T_ARRAY, toks + ["<|im_start|>"], T_STRING)
    w.add("tokenizer.ggml.token_type", T_ARRAY, [1] * len(toks) + [3], T_INT32)
    w.add("tokenizer.ggml.merges", T_ARRAY, [a + " " + b for a, b in merges], T_STRING)
    w.add("tokenizer.ggml.bos_token_id", T_UINT32, len(toks))
    w.add("tokenizer.ggml.add_bos_token", T_BOOL, True)
    w.write(G + f"gpt2_{pre}.gguf")
stoks = sorted(sv, key=sv.get)
w = GGUFWriter()
w.add("tokenizer.ggml.model", T_STRING, "llama")
w.add("tokenizer.ggml.tokens", T_ARRAY, stoks, T_STRING)
w.add("tokenizer.ggml.scores", T_ARRAY, [-float(i) for i in range(len(stoks))], T_FLOAT32)
w.add("tokenizer.ggml.token_type", T_ARRAY, [2, 3, 3] + [6] * 256 + [1] * (len(stoks) - 259), T_INT32)
w.add("tokenizer.ggml.bos_token_id", T_UINT32, 1)
w.add("tokenizer.ggml.eos_token_id", T_UINT32, 2)
w.write(G + "llama_spm.gguf")
