// Internal layout of td_tokenizer, shared by the loaders (tok_json.c, tok_gguf.c) and the engine
// (tokenizer.c). Not a public interface: nothing outside src/tokenizer/ includes it.
#ifndef TD_TOKENIZER_TOK_IMPL_H
#define TD_TOKENIZER_TOK_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tokenizer/tokenizer.h"

enum { TOK_MODEL_BPE = 0, TOK_MODEL_SPM_SCORE = 1 };  // merges by rank (HF) / by score (llama.cpp)
enum { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_PREPEND, TOK_NORM_REPLACE };
enum { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE };
enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER };
enum { TOK_SPLIT_ISOLATED, TOK_SPLIT_REMOVED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT,
       TOK_SPLIT_CONTIGUOUS };
enum { TOK_DEC_NONE, TOK_DEC_BYTELEVEL, TOK_DEC_CHAIN };
enum { TOK_F_PRESENT = 1, TOK_F_SPECIAL = 2, TOK_F_ADDED = 4 };

#define TOK_MAX_STEPS 8  // normalizer / pre-tokenizer / decoder steps; files use at most 4

typedef struct {
    int kind;
    char *a, *b;  // PREPEND: a; REPLACE: a -> b (owned, NUL-terminated)
    size_t alen, blen;
} tok_norm;

typedef struct {
    int kind;
    pcre2_code *re;  // SPLIT, or BYTELEVEL with use_regex (GPT-2 pattern); JIT-compiled
    char *pattern;   // SPLIT: the pattern as written (owned, NUL-terminated), for td_tokenizer_info
    bool literal;    // SPLIT: pattern is a {"String": ...}, matched as is
    int behavior;    // TOK_SPLIT_*
    bool invert;
    bool add_prefix_space;  // BYTELEVEL
    char rep[8];            // METASPACE: replacement for ' ' (UTF-8, NUL-terminated)
    int prepend;            // METASPACE: TOK_PREPEND_*
    bool split;             // METASPACE: split before every replacement char
} tok_pre;

typedef struct {
    char *s;  // content as written (owned, NUL-terminated)
    size_t n;  // bytes
    int32_t id;
    bool lstrip, rstrip, single_word, special;
    bool normalized;  // matched in the normalized text (by its normalized form), not the raw input
} tok_added;

typedef struct {
    int32_t child, sibling;  // node indices, -1 none
    int32_t added;           // index into added[] if a token ends here, else -1
    uint8_t c;
} tok_trie;

struct td_tokenizer {
    int model;               // TOK_MODEL_*
    bool byte_level;         // model-space strings are raw bytes (vocab was GPT-2 byte-mapped)
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;          // -1 if none
    int32_t n_vocab;         // max id + 1

    // Per id: model-space bytes (raw bytes for byte-level, text with "▁" for SentencePiece).
    char *blob;
    size_t blob_len, blob_cap;  // bytes
    uint32_t *off, *len;        // [n_vocab]
    uint8_t *flags;             // [n_vocab] TOK_F_*
    int32_t *srank;             // [n_vocab] SPM_SCORE: rank by descending score (0 best); else NULL

    // Open-addressing hash: model-space bytes -> id, over the model vocabulary only.
    int32_t *vh;
    size_t vh_cap;  // power of two

    // Open-addressing hash: (left id, right id) -> (rank, merged id).
    struct tok_merge {
        uint64_t key;  // (left << 32 | right) + 1; 0 = empty slot
        uint32_t rank;
        int32_t new_id;
    } *mh;             // one 16-byte slot per probe: a lookup touches one cache line
    size_t mh_cap;     // power of two

    // SentencePiece without a pre-tokenizer sees a whole segment as one word. When no vocab token
    // has "▁" right after another character, no merge can cross the start of a "▁" that follows
    // a non-"▁" character, so splitting the word there gives identical ids far faster.
    bool spm_split;

    int32_t byte_tok[256];  // byte-level: id of each single byte; SPM: id of "<0xXX>"; -1 none

    tok_added *added;
    int n_added;
    tok_trie *trie;
    int n_trie, cap_trie;
    int32_t trie_root[2][256];  // first-level node per byte, -1 none: [0] raw text, [1] normalized
    int n_norm_added;           // added tokens matched after normalization

    tok_norm norm[TOK_MAX_STEPS];
    int n_norm;
    tok_pre pre[TOK_MAX_STEPS];
    int n_pre;

    int32_t post_prefix[8], post_suffix[8];  // ids added by the post-processor with add_special
    int n_prefix, n_suffix;

    int dec;                  // TOK_DEC_*
    char *dec_from[TOK_MAX_STEPS], *dec_to[TOK_MAX_STEPS];  // CHAIN: Replace steps, in order
    int n_dec_replace;
    bool dec_byte_fallback;   // CHAIN: ByteFallback step present
    int dec_strip_start;      // CHAIN: Strip(start) after Fuse: leading chars to strip
    uint32_t dec_strip_char;  // code point to strip

    char *bos_token, *eos_token, *chat_template;
    int32_t bos_id, eos_id, pad_id;  // -1 if none
    bool add_bos;
    pcre2_match_context *mctx;  // NULL: PCRE2's default limits; set by tok_set_match_limit; owned
};

// Engine helpers used by the loaders (tokenizer.c).
td_tokenizer *tok_alloc(void);
td_status tok_set_n_vocab(td_tokenizer *t, int32_t n, td_err *err);
// Sets the model-space bytes of id (copied into blob). Fails with NOMEM only.
td_status tok_set_piece(td_tokenizer *t, int32_t id, const char *s, size_t n, td_err *err);
// Builds the vocab hash over the ids flagged PRESENT but not ADDED (added-only tokens are matched
// by the trie, never produced by BPE).
td_status tok_build_vocab_hash(td_tokenizer *t, td_err *err);
int32_t tok_vocab_get(const td_tokenizer *t, const char *s, size_t n);
td_status tok_merges_reserve(td_tokenizer *t, size_t n, td_err *err);
// Adds merge (a, b) -> new with `rank`. On a duplicate pair, overwrite=true keeps the later one
// (HF collects merges into a map) and overwrite=false the earlier one (llama.cpp's emplace).
void tok_merge_add(td_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id, bool overwrite);
// Derives run-time shortcuts once loading is complete (see spm_split).
void tok_finalize(td_tokenizer *t);
// Registers an added token for matching. With normalized=true it is matched, in its normalized
// form, against the normalized text (so the normalizer must be set up before).
td_status tok_add_added(td_tokenizer *t, const char *s, size_t n, int32_t id, bool special,
                        bool lstrip, bool rstrip, bool single_word, bool normalized, td_err *err);
void tok_fill_byte_tokens(td_tokenizer *t);
// GPT-2 byte-level alphabet: code point of byte b, and inverse (-1 for unmapped code points).
uint32_t tok_byte_to_cp(uint8_t b);
int tok_cp_to_byte(uint32_t cp);
// Converts a byte-level spelling (UTF-8 of mapped code points) to raw bytes. A string with any
// code point outside the byte alphabet is copied verbatim, as HF's ByteLevel decoder does (so
// added tokens such as "<think>" or " world" decode to themselves). out must hold n bytes.
size_t tok_bytelevel_to_raw(const char *s, size_t n, char *out);
// Compiles a HF (Oniguruma) pattern with PCRE2 UTF|UCP and JIT; literal=true escapes it.
td_status tok_compile_regex(const char *pat, size_t n, bool literal, pcre2_code **out, td_err *err);
extern const char tok_gpt2_pattern[];
// Caps the pre-tokenizer regex's match work (pcre2_set_match_limit) so that a test can make a
// match fail with PCRE2_ERROR_MATCHLIMIT: encode then fails with PCRE2's message. NOMEM only.
td_status tok_set_match_limit(td_tokenizer *t, uint32_t limit, td_err *err);
// Decodes one UTF-8 sequence at s (n > 0 bytes). Returns the bytes consumed; *cp is the code
// point or -1 for an ill-formed sequence (then the return is the maximal subpart length, >= 1).
// *incomplete is set when the ill-formed part is a valid prefix cut short by the end of input.
size_t tok_utf8_next(const uint8_t *s, size_t n, int32_t *cp, bool *incomplete);
char *tok_strndup(const char *s, size_t n);

#endif
