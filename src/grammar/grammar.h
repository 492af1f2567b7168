// Structured output: grammars in llama.cpp's GBNF, converters that write GBNF (JSON schema, regex,
// a choice of strings, any JSON value), and a matcher that runs a compiled grammar as a pushdown
// automaton over bytes and turns its state into an allowed-token mask over a tokenizer's vocabulary.
// Not here: sampling (engine/sampler.h applies the mask), request parsing (server/openai.c).
//
// Pipeline: text -> td_grammar_compile (parse, lower characters to UTF-8 byte sets, check rules) ->
// td_gmatch (per output: the set of parse stacks) -> td_gmatch_mask (bitmask over token ids, cached
// per state in the grammar, computed from per-position tables of the tokens that do not depend on
// the stack below) -> td_gmatch_accept (advance by the chosen token's bytes).
// Threading: a compiled td_grammar is immutable except for its mask cache, which only the thread that
// runs matchers touches (the engine thread); compile and the td_grammar_cache are thread-safe.
#ifndef TD_GRAMMAR_GRAMMAR_H
#define TD_GRAMMAR_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"

typedef struct td_tokenizer td_tokenizer;

// ---- GBNF writers. Each returns malloc'd GBNF text (caller frees) whose top rule is `<prefix>root`
// and whose every other rule name also starts with prefix, so the text can be appended to a caller's
// own grammar (prefix "" gives a complete grammar with rule `root`). NULL with err on bad input;
// prefix may be NULL (""), and must hold only [A-Za-z0-9_-].

// A JSON schema (the subset in docs/structured-output.md). A keyword outside it is refused with
// TD_ERR_UNSUPPORTED and a message naming the keyword and its JSON path ("$.properties.a: keyword
// 'format' is not supported"); title, description, examples, default, $schema, $id, $comment are
// ignored. Objects allow no properties beyond `properties` unless additionalProperties says so.
char *td_gbnf_from_json_schema(const cJSON *schema, const char *prefix, td_err *err);
// A regular expression (Python/JS syntax subset), matched in full: literals, escapes, classes,
// \d \w \s and negations, `.`, groups ((?:...), (?<name>...)), alternation, * + ? {m} {m,} {m,n} and
// their lazy forms, ^ at the start and $ at the end. Backreferences, lookaround, inline flags and
// \b are refused with TD_ERR_UNSUPPORTED naming them and their offset.
char *td_gbnf_from_regex(const char *re, const char *prefix, td_err *err);
// Any JSON value (compact whitespace: at most one space or newline between tokens). The text also
// defines `<prefix>object` (any JSON object), for OpenAI's json_object mode.
char *td_gbnf_json_value(const char *prefix);
// Exactly one of the n strings (n >= 1; vLLM's guided_choice).
char *td_gbnf_from_choices(const char *const *choices, int n, const char *prefix, td_err *err);

// ---- Compiled grammars

typedef struct td_grammar td_grammar;

// Parses and compiles GBNF text (len bytes; need not be NUL-terminated) whose start rule is `root`.
// Errors (TD_ERR_INVALID) name the line:column and the problem: syntax, an undefined rule, a rule
// that is left-recursive or repeats something that can match nothing. The result holds one reference.
td_grammar *td_grammar_compile(const char *text, size_t len, td_err *err);
void td_grammar_ref(td_grammar *g);
void td_grammar_unref(td_grammar *g);  // frees on the last reference (with its mask cache)

typedef struct td_grammar_stats {
    uint64_t mask_hits, mask_misses;  // td_gmatch_mask calls answered from the cache / computed
    uint64_t mask_ns;                 // total time inside td_gmatch_mask (ns)
    uint64_t miss_ns;                 // of which computing missed masks (ns)
    int n_cached;                     // masks held now
    int n_rules, n_elems;             // size of the compiled grammar
    uint64_t pos_built;               // position tables built (once per position reached)
    uint64_t pos_ns;                  // of miss_ns, time building them (ns)
    uint64_t full_walks;              // misses computed by the full vocabulary walk (a position
                                      // that could not be tabulated)
} td_grammar_stats;
void td_grammar_stats_get(const td_grammar *g, td_grammar_stats *out);

// A bounded LRU of compiled grammars keyed by their text, so that a repeated schema compiles (and
// warms its mask cache) once. Thread-safe. `cap` grammars at most (>= 1).
typedef struct td_grammar_cache td_grammar_cache;
td_grammar_cache *td_grammar_cache_create(int cap);
void td_grammar_cache_free(td_grammar_cache *c);  // drops the cache's references
// Returns a grammar holding one reference for the caller (td_grammar_unref when done), compiling
// on a miss; NULL with err as td_grammar_compile.
td_grammar *td_grammar_cache_get(td_grammar_cache *c, const char *text, td_err *err);

// ---- The vocabulary as the matcher sees it: each token's bytes (what it adds to the decoded text),
// sorted for a prefix-sharing walk. Special tokens are never allowed, except the end tokens given
// here, which are allowed exactly where the grammar is complete. It also holds the scratch (with a
// transition memo of about 6 MB) that td_gmatch_mask and td_gmatch_accept use: matchers over one
// vocabulary run on one thread at a time.

typedef struct td_gvocab td_gvocab;
// From a tokenizer. end_ids [n_end]: the EOS ids (may be 0 of them). The mask covers
// max(n_ids, the tokenizer's vocabulary size) ids (a model's vocabulary may be padded past the
// tokenizer's); ids without bytes are never allowed.
td_gvocab *td_gvocab_from_tokenizer(const td_tokenizer *t, int n_ids, const int32_t *end_ids, int n_end, td_err *err);
// From explicit byte strings (tests): tokens[i] (lens[i] bytes) is id i; an id with lens[i] == 0 is
// never allowed unless it is an end id.
td_gvocab *td_gvocab_from_bytes(const char *const *tokens, const size_t *lens, int n, const int32_t *end_ids,
                                int n_end, td_err *err);
void td_gvocab_free(td_gvocab *v);
int td_gvocab_size(const td_gvocab *v);  // token ids: the mask has (size + 31) / 32 words

// ---- A matcher: one output being generated under a grammar. Holds a reference on g; v must
// outlive it. All memory is allocated here (the parse-stack buffers have fixed caps); mask, accept
// and the queries allocate nothing except the first time a state's mask enters the cache (the
// cache holds at most a fixed number of masks per grammar, then evicts the least recently used) and
// the first time a grammar position is reached (its table, kept until the grammar is freed, within
// a 64 MB budget per grammar; past it, masks of states at new positions walk the whole vocabulary).

typedef struct td_gmatch td_gmatch;
td_gmatch *td_gmatch_create(td_grammar *g, const td_gvocab *v, td_err *err);
void td_gmatch_free(td_gmatch *m);
void td_gmatch_reset(td_gmatch *m);  // back to the start of the grammar
// Copies src's state into dst (same grammar and vocabulary); for forks and tests.
void td_gmatch_copy(td_gmatch *dst, const td_gmatch *src);

// The allowed tokens in the current state: bit (id & 31) of word (id >> 5) set = allowed. The
// pointer is valid until the next call on any matcher of the same grammar. NULL with err
// (TD_ERR_LIMIT) when the grammar is too ambiguous for the matcher's caps. allow_end: whether the
// end tokens may be set (where the grammar is complete).
const uint32_t *td_gmatch_mask(td_gmatch *m, bool allow_end, td_err *err);
// The reference for the mask (tests, benchmarks): the allowed tokens of the current state without
// end tokens, by walking the whole sorted vocabulary from the full parse stacks, written to out
// [(size + 31) / 32 words]; no cache is read or written. False with err as td_gmatch_mask.
bool td_gmatch_mask_reference(td_gmatch *m, uint32_t *out, td_err *err);
// Advances by a token. Returns false (state unchanged) when the token is not allowed; an end token
// is allowed only where the grammar is complete (the state is then unchanged).
bool td_gmatch_accept(td_gmatch *m, int32_t token);
// Advances by raw bytes (tests, and converters' self-checks). Returns false (state unchanged) when
// the bytes cannot continue a match.
bool td_gmatch_accept_bytes(td_gmatch *m, const char *s, size_t n);
bool td_gmatch_complete(const td_gmatch *m);  // the output so far is a full match
bool td_gmatch_done(const td_gmatch *m);      // complete and no byte can follow
bool td_gmatch_failed(const td_gmatch *m);    // a cap overflowed in accept (the output must end)

#endif
