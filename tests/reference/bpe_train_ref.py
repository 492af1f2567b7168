"""Slow, straightforward reference of tandem's byte-level BPE training rule (src/train/bpe_train.h),
an independent oracle for test_bpe_train. No regex module: the Llama 3 pre-tokenizer regex is
re-implemented as a hand-written scanner over Unicode categories (valid for text whose whitespace
is ' ', '\\t', '\\n', '\\r'). Pair counts are recomputed from scratch every merge.

usage: /usr/bin/python3 tests/reference/bpe_train_ref.py CORPUS VOCAB_SIZE MIN_FREQ N_SPECIAL OUT.json
OUT.json: {"merges": ["a b", ...]} spelled with GPT-2's bytes_to_unicode characters.
"""
import json
import sys
import unicodedata
from collections import Counter


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def is_l(c):
    return unicodedata.category(c).startswith("L")


def is_n(c):
    return unicodedata.category(c).startswith("N")


def is_s(c):
    return c in " \t\n\r\x0b\x0c" or unicodedata.category(c) == "Zs"


def pretokenize(t):
    """Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|
    ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    out, i, n = [], 0, len(t)
    while i < n:
        c = t[i]
        end = None
        if c == "'":
            for suf in ("s", "t", "re", "ve", "m", "ll", "d"):
                if t[i + 1:i + 1 + len(suf)].lower() == suf:
                    end = i + 1 + len(suf)
                    break
        if end is None:
            j = i
            if not is_l(c) and not is_n(c) and c not in "\r\n" and i + 1 < n and is_l(t[i + 1]):
                j = i + 1
            if is_l(t[j]):
                while j < n and is_l(t[j]):
                    j += 1
                end = j
        if end is None and is_n(c):
            j = i
            while j < n and j < i + 3 and is_n(t[j]):
                j += 1
            end = j
        if end is None:
            j = i + 1 if c == " " else i
            k = j
            while k < n and not is_s(t[k]) and not is_l(t[k]) and not is_n(t[k]):
                k += 1
            if k > j:
                while k < n and t[k] in "\r\n":
                    k += 1
                end = k
        if end is None and is_s(c):
            j = i
            while j < n and is_s(t[j]):
                j += 1
            last_nl = max((k for k in range(i, j) if t[k] in "\r\n"), default=None)
            if last_nl is not None:
                end = last_nl + 1
            elif j == n or j - 1 == i:
                end = j
            else:
                end = j - 1
        if end is None:
            end = i + 1
        out.append(t[i:end])
        i = end
    return out


def train(text, vocab_size, min_freq, n_special):
    b2u = bytes_to_unicode()
    order = sorted(range(256), key=lambda b: ord(b2u[b]))
    sym_bytes = [bytes([b]) for b in order]
    byte_id = {b: i for i, b in enumerate(order)}
    ids_of = {s: i for i, s in enumerate(sym_bytes)}
    counts = Counter(w.encode("utf-8") for w in pretokenize(text))
    words = [([byte_id[b] for b in w], c) for w, c in counts.items()]
    merges = []
    while len(sym_bytes) + n_special < vocab_size:
        pc = Counter()
        for s, c in words:
            for a, b in zip(s, s[1:]):
                pc[(a, b)] += c
        if not pc:
            break
        best = min(pc.items(), key=lambda kv: (-kv[1], kv[0]))
        (a, b), cnt = best
        if cnt < min_freq:
            break
        nb = sym_bytes[a] + sym_bytes[b]
        if nb in ids_of:
            z = ids_of[nb]
        else:
            z = len(sym_bytes)
            sym_bytes.append(nb)
            ids_of[nb] = z
        merges.append((a, b))
        for idx, (s, c) in enumerate(words):
            o, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and s[i] == a and s[i + 1] == b:
                    o.append(z)
                    i += 2
                else:
                    o.append(s[i])
                    i += 1
            words[idx] = (o, c)
    spell = lambda i: "".join(b2u[x] for x in sym_bytes[i])
    return [spell(a) + " " + spell(b) for a, b in merges]


def main():
    corpus, vocab, min_freq, n_special, out = sys.argv[1:6]
    with open(corpus, "rb") as f:
        text = f.read().decode("utf-8")
    merges = train(text, int(vocab), int(min_freq), int(n_special))
    with open(out, "w") as f:
        json.dump({"merges": merges}, f)


if __name__ == "__main__":
    main()
