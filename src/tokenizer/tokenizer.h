// Tokenizers: byte-level BPE (GPT-2, Llama 3, Qwen2/3) and SentencePiece-style BPE with byte
// fallback (Llama 2, Mistral), loaded from Hugging Face tokenizer.json or GGUF metadata, with
// encode/decode matching HF `tokenizers` and an incremental detokenizer for streaming.
// Not here: chat templates (chat_template.h renders them), BPE training, WordPiece/Unigram models.
//
// Supported tokenizer.json parts: model BPE (merges as "a b" or [a, b]; byte_fallback, unk_token,
// fuse_unk, ignore_merges); normalizers NFC/NFD/NFKC/NFKD, Prepend, Replace (string), Sequence;
// pre-tokenizers Split (regex or string; Isolated/Removed/MergedWithPrevious/MergedWithNext/
// Contiguous; invert), ByteLevel (add_prefix_space, use_regex), Metaspace, Sequence; post-
// processors TemplateProcessing (single), ByteLevel, Roberta/Bert, Sequence; decoders ByteLevel,
// or Replace/ByteFallback/Fuse/Strip(start)/Metaspace chains; added tokens with lstrip, rstrip,
// single_word, normalized, special. Anything else fails to load with TD_ERR_UNSUPPORTED naming it
// (WordPiece/Unigram, regex Replace, BPE dropout, subword prefixes, Strip stop > 0, ...).
// Regexes are Oniguruma patterns run by PCRE2 (UTF|UCP, JIT); \s/\S are widened to Oniguruma's
// White_Space (adds U+0085).
//
// Thread safety: a loaded td_tokenizer is immutable; encode/decode on a const tokenizer may run
// from many threads at once (all scratch state is per call). No globals, no caches.
#ifndef TD_TOKENIZER_TOKENIZER_H
#define TD_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef struct td_tokenizer td_tokenizer;
typedef struct td_gguf td_gguf;

// A growable id list. Zero-initialise ({0}) before first use; encode appends after clearing n.
// The caller owns ids and frees them with td_tokens_free (safe on a zeroed struct).
typedef struct td_tokens {
    int32_t *ids;
    size_t n, cap;  // tokens
} td_tokens;

void td_tokens_free(td_tokens *t);

// Loads from `path`: a directory holding tokenizer.json (and optionally tokenizer_config.json),
// a tokenizer.json file (tokenizer_config.json beside it is read if present), or a .gguf file
// (vocab from tokenizer.ggml.*). On failure *out is NULL and err names the file and the problem.
td_status td_tokenizer_load(const char *path, td_tokenizer **out, td_err *err);

// Builds from in-memory tokenizer.json text (`json`, len bytes, need not be NUL-terminated) and an
// optional tokenizer_config.json (config_json may be NULL). `what` names the source in errors.
// Nothing of the buffers is kept.
td_status td_tokenizer_from_json(const char *json, size_t len, const char *config_json,
                                 size_t config_len, const char *what, td_tokenizer **out,
                                 td_err *err);

// Builds from GGUF metadata: tokenizer.ggml.model "gpt2" (byte-level BPE: tokens, merges, and
// tokenizer.ggml.pre = default/gpt-2, llama-bpe/llama3 (with ignore_merges) or qwen2 (with NFC, as
// HF's Qwen files ask); any other pre is TD_ERR_UNSUPPORTED naming it) or "llama" (SentencePiece:
// tokens, scores, token_type; merges by score as llama.cpp does, <0xXX> byte fallback, "▁" prefix
// unless add_space_prefix is false). Tokens of type control/user-defined/unknown are matched in
// the input like HF added tokens (control and unknown are special). With add_special, BOS is
// added when tokenizer.ggml.add_bos_token (default: true for llama, false for gpt2), EOS when
// add_eos_token. Copies everything it needs; g may be closed afterwards.
td_status td_tokenizer_from_gguf(const td_gguf *g, td_tokenizer **out, td_err *err);

void td_tokenizer_free(td_tokenizer *t);

int td_tokenizer_vocab_size(const td_tokenizer *t);  // max id + 1 (model vocab + added tokens)
int td_tokenizer_bos_id(const td_tokenizer *t);      // -1 if none
int td_tokenizer_eos_id(const td_tokenizer *t);      // -1 if none
const char *td_tokenizer_bos_token(const td_tokenizer *t);  // NULL if none; owned by t
const char *td_tokenizer_eos_token(const td_tokenizer *t);  // NULL if none; owned by t
// Whether add_bos_token was set (tokenizer_config.json or GGUF); informational for templates.
bool td_tokenizer_add_bos(const td_tokenizer *t);
bool td_tokenizer_is_special(const td_tokenizer *t, int32_t id);  // false for out-of-range ids
// The chat template string (tokenizer_config.json "chat_template" or tokenizer.chat_template),
// NULL if none; owned by t.
const char *td_tokenizer_chat_template(const td_tokenizer *t);
// Looks up a token by its exact vocabulary spelling (as in tokenizer.json, e.g. "Ġthe", "▁the",
// "<|im_end|>"); -1 if absent.
int32_t td_tokenizer_token_id(const td_tokenizer *t, const char *piece, size_t len);
// Writes the vocabulary spelling of `id` (NUL-terminated, truncated to cap) into buf and returns
// its full length in bytes, or -1 for an unknown id.
int td_tokenizer_id_to_piece(const td_tokenizer *t, int32_t id, char *buf, size_t cap);

// The bytes token `id` adds to decoded text (byte-level: its raw bytes; SentencePiece: the decoder's
// Replace steps applied, "<0xXX>" as that byte; no Strip(start), which depends on the position).
// Writes min(len, cap) bytes into buf and returns the full length, or -1 for an unknown id.
// For grammar matching (src/grammar/).
int td_tokenizer_token_bytes(const td_tokenizer *t, int32_t id, char *buf, size_t cap);

// What a converter needs to write a loaded tokenizer in another format (model/export.c writes
// GGUF tokenizer.ggml.* from it). The tokenizer file is parsed once, by the loader: a converter
// asks here instead of searching the file's text. Pointers are owned by t.
typedef struct td_tokenizer_info {
    bool byte_level;        // byte-level BPE: a ByteLevel pre-tokenizer (vocab strings GPT-2 byte-mapped)
    bool sentencepiece;     // SentencePiece-style BPE: not byte-level, and byte_fallback, a Metaspace
                            // pre-tokenizer or a normalizer that writes "▁"
    bool bytelevel_regex;   // a ByteLevel pre-tokenizer splits with the GPT-2 pattern (use_regex)
    int n_split;            // Split pre-tokenizers (GGUF: the regex tokenizer.ggml.pre names)
    const char *split_pattern;  // the first Split's pattern as written; NULL if n_split == 0
    bool split_literal;     // that pattern is a {"String": ...}, matched as is, not a regex
    int n_prefix, n_suffix;  // ids the post-processor adds before / after the text (add_special)
    bool add_space_prefix;  // "▁" is prepended to the text (a Prepend normalizer, or a Metaspace
                            // pre-tokenizer with prepend_scheme always/first)
    int32_t unk_id, pad_id;  // -1 if none (pad: tokenizer_config.json pad_token, GGUF padding_token_id)
} td_tokenizer_info;
void td_tokenizer_get_info(const td_tokenizer *t, td_tokenizer_info *info);

// Whether id is one of the added tokens (tokenizer.json added_tokens; GGUF control, user-defined
// and unknown tokens), special or not. False for out-of-range ids.
bool td_tokenizer_is_added(const td_tokenizer *t, int32_t id);

// One BPE merge: left + right -> merged (ids).
typedef struct td_tokenizer_merge {
    int32_t left, right, merged;
} td_tokenizer_merge;
// The BPE merge table in rank order (the first merge applies first). *out is malloc'd and the
// caller frees it; *n is the count. A pair listed twice appears once, at the rank the loader kept
// (tokenizer.json: the later, as HF; GGUF: the earlier, as llama.cpp). A GGUF SentencePiece
// vocabulary merges by score and has no table (*out NULL, *n 0). TD_ERR_NOMEM only.
td_status td_tokenizer_merges(const td_tokenizer *t, td_tokenizer_merge **out, size_t *n, td_err *err);

// Encodes UTF-8 text like HF `tokenizer.encode(text, add_special_tokens=add_special).ids`:
// added/special tokens are split out first, then normalizer, pre-tokenizer, BPE, and (with
// add_special) the post-processor's BOS/EOS. Invalid UTF-8 in the input is replaced by U+FFFD per
// maximal ill-formed subsequence (the WHATWG/Unicode practice that JS and Rust use) before
// anything else. out->n is reset; ids are appended. TD_ERR_NOMEM on allocation failure;
// TD_ERR_LIMIT (a PCRE2 match, depth or heap limit) or TD_ERR_INVALID (any other PCRE2 error)
// when the pre-tokenizer regex fails, with PCRE2's message: never ids of an unsplit text.
td_status td_tokenizer_encode(const td_tokenizer *t, const char *text, size_t len, bool add_special,
                              td_tokens *out, td_err *err);

// Decodes like HF `tokenizer.decode(ids, skip_special_tokens=skip_special)`. Ids outside the
// vocabulary are skipped, as HF does. *out is malloc'd and NUL-terminated (len excludes the NUL);
// the caller frees it.
td_status td_tokenizer_decode(const td_tokenizer *t, const int32_t *ids, size_t n, bool skip_special,
                              char **out, size_t *len, td_err *err);

// Incremental detokenizer for streaming. Push ids one at a time; each push returns the text that
// became final (never a partial UTF-8 character; possibly empty). td_detok_flush returns the rest.
// The concatenation of all pushes and the flush equals td_tokenizer_decode of the same ids.
// Held back: an incomplete UTF-8 tail (byte-level) or a run of byte-fallback tokens (SentencePiece,
// since HF turns the whole run into U+FFFDs if any byte of it is invalid).
typedef struct td_detok td_detok;
// t must outlive the detok. Returns NULL on allocation failure.
td_detok *td_detok_new(const td_tokenizer *t, bool skip_special);
void td_detok_free(td_detok *d);
void td_detok_reset(td_detok *d);
// Returned text is owned by d and valid until the next call on d; *len is set (bytes) and the
// text is NUL-terminated. Returns NULL only on allocation failure.
const char *td_detok_push(td_detok *d, int32_t id, size_t *len);
const char *td_detok_flush(td_detok *d, size_t *len);

#endif
