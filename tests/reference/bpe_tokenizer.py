"""A tiny GPT-2-style byte-level BPE tokenizer for the reference models: training, encoding, and
export as Hugging Face tokenizer.json / tokenizer_config.json.

Training is the textbook greedy loop (merge the most frequent adjacent pair, ties broken by the
pair's strings). Only ASCII training text and prompts are supported by `encode` (the pre-tokenizer
below is GPT-2's regex restricted to ASCII, where it is equivalent); the exported tokenizer.json is
a complete HF ByteLevel BPE that handles any text.
"""
import re

# GPT-2's pre-tokenizer regex, with \p{L} -> [A-Za-z] and \p{N} -> [0-9] (exact for ASCII input).
_PRETOK = re.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+""")

BOS = "<|bos|>"
EOS = "<|eos|>"

TRAIN_TEXT = """
Once upon a time there was a little town by the sea. The people of the town were fishers, and every
morning they went out on their boats before the sun came up. In the evening they came back with their
nets full of fish, and the children ran down to the water to meet them. There was a small girl who
lived in the last house on the hill. She liked to watch the boats from her window, and she counted
them as they came in: one, two, three, four, five. When all of them were home she went to sleep.
One day a storm came over the sea. The sky turned dark, the wind was very strong, and the waves were
higher than the houses. The girl counted the boats, but only four came back. She ran to the harbour
and asked the old man who kept the light where the fifth boat was. He said that he did not know, but
that he would keep the light burning all through the night so that the boat could find its way home.
The girl stayed with him. They talked about the stars, the tides and the long history of the town,
and in the first grey light of the morning they saw a sail on the water. The fifth boat was coming in.
The quick brown fox jumps over the lazy dog. It is a truth that the best way to learn something is to
try it, to fail, and then to try it again with what you have learned. Models of language are trained
in the same way: they read a great deal of text, they guess the next word, and they change a little
every time that they are wrong. In the end they write stories about towns by the sea.
"""


def bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {u: b for b, u in B2U.items()}


def _words(text):
    return ["".join(B2U[b] for b in w.encode("utf-8")) for w in _PRETOK.findall(text)]


class BPETokenizer:
    def __init__(self, n_merges, text=TRAIN_TEXT):
        # ids 0..255: the byte symbols in byte order; then one token per merge; then BOS, EOS.
        self.tokens = [B2U[b] for b in range(256)]
        self.merges = []
        counts = {}
        for w in _words(text):
            counts[w] = counts.get(w, 0) + 1
        words = {w: list(w) for w in counts}
        known = set(self.tokens)
        banned = set()
        while len(self.merges) < n_merges:
            pairs = {}
            for w, syms in words.items():
                for a, b in zip(syms, syms[1:]):
                    if (a, b) not in banned:
                        pairs[(a, b)] = pairs.get((a, b), 0) + counts[w]
            if not pairs:
                raise ValueError("training text too short for the requested number of merges")
            best = min(pairs, key=lambda p: (-pairs[p], p))
            if best[0] + best[1] in known:  # would duplicate a token: never merge this pair
                banned.add(best)
                continue
            self.merges.append(best)
            self.tokens.append(best[0] + best[1])
            known.add(best[0] + best[1])
            for w, syms in words.items():
                words[w] = self._merge(syms, best)
        self.bos_id = len(self.tokens)
        self.eos_id = self.bos_id + 1
        self.tokens += [BOS, EOS]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.rank = {m: r for r, m in enumerate(self.merges)}

    @staticmethod
    def _merge(syms, pair):
        out, i = [], 0
        while i < len(syms):
            if i + 1 < len(syms) and (syms[i], syms[i + 1]) == pair:
                out.append(syms[i] + syms[i + 1])
                i += 2
            else:
                out.append(syms[i])
                i += 1
        return out

    def encode(self, text, add_bos=True):
        assert text.isascii()
        ids = [self.bos_id] if add_bos else []
        for w in _words(text):
            syms = list(w)
            while len(syms) > 1:
                cand = [(self.rank.get(p, 1 << 30), p) for p in zip(syms, syms[1:])]
                r, p = min(cand)
                if r == 1 << 30:
                    break
                syms = self._merge(syms, p)
            ids += [self.ids[s] for s in syms]
        return ids

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            t = self.tokens[i]
            if t in (BOS, EOS):
                continue
            out += bytes(U2B[c] for c in t)
        return out.decode("utf-8", errors="replace")

    # ---- Hugging Face files ----

    def tokenizer_json(self):
        def added(i, s):
            return {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                    "normalized": False, "special": True}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [added(self.bos_id, BOS), added(self.eos_id, EOS)],
            "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                              "use_regex": True},
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                           {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [{"SpecialToken": {"id": BOS, "type_id": 0}},
                         {"Sequence": {"id": "A", "type_id": 0}},
                         {"SpecialToken": {"id": BOS, "type_id": 1}},
                         {"Sequence": {"id": "B", "type_id": 1}}],
                "special_tokens": {BOS: {"id": BOS, "ids": [self.bos_id], "tokens": [BOS]}},
            },
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                        "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": None, "end_of_word_suffix": None,
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(self.tokens[:self.bos_id])},
                      "merges": [a + " " + b for a, b in self.merges]},
        }

    CHAT_TEMPLATE = (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<' + message['role'] + '> ' + message['content'] + '\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<assistant> ' }}{% endif %}")

    def tokenizer_config(self, max_len):
        def dec(s):
            return {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                    "single_word": False, "special": True}
        return {
            "add_bos_token": True,
            "add_eos_token": False,
            "added_tokens_decoder": {str(self.bos_id): dec(BOS), str(self.eos_id): dec(EOS)},
            "bos_token": BOS,
            "eos_token": EOS,
            "chat_template": self.CHAT_TEMPLATE,
            "clean_up_tokenization_spaces": False,
            "model_max_length": max_len,
            "tokenizer_class": "PreTrainedTokenizerFast",
        }
