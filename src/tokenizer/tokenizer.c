// Tokenizer engine: vocab/merge hash maps, added-token matching, normalizers, regex
// pre-tokenization, rank-based BPE (HF) and score-based BPE (llama.cpp SPM), decode, detok.
// Loading lives in tok_json.c / tok_gguf.c; this file never touches JSON or GGUF.
#define _GNU_SOURCE  // memmem
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>
#include <xxhash.h>
#include "tokenizer/tok_impl.h"

const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

char *tok_strndup(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

// ---------------------------------------------------------------------------------------------
// UTF-8

size_t tok_utf8_next(const uint8_t *s, size_t n, int32_t *cp, bool *incomplete) {
    *incomplete = false;
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int need;
    uint32_t c;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
    if (b >= 0xC2 && b <= 0xDF) {
        need = 1, c = b & 0x1F;
    } else if (b >= 0xE0 && b <= 0xEF) {
        need = 2, c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        need = 3, c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        if (b == 0xF4) hi = 0x8F;
    } else {
        *cp = -1;
        return 1;
    }
    size_t i = 1;
    for (int k = 0; k < need; k++, i++) {
        if (i >= n) {
            *cp = -1;
            *incomplete = true;
            return i;
        }
        uint8_t x = s[i];
        uint8_t l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
        if (x < l || x > h) {
            *cp = -1;
            return i;
        }
        c = (c << 6) | (x & 0x3F);
    }
    *cp = (int32_t)c;
    return i;
}

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

// Growable byte buffer used for all scratch text.
typedef struct {
    char *p;
    size_t n, cap;
} tok_buf;

static bool buf_reserve(tok_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return false;
    b->p = p, b->cap = cap;
    return true;
}

static bool buf_put(tok_buf *b, const void *s, size_t n) {
    if (!buf_reserve(b, n)) return false;
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

// Appends s with ill-formed sequences replaced by U+FFFD. With keep_tail, an incomplete but
// valid-so-far tail is not consumed; returns the bytes consumed (== n without keep_tail).
static size_t buf_put_lossy(tok_buf *b, const char *s, size_t n, bool keep_tail, bool *ok) {
    size_t i = 0;
    *ok = true;
    while (i < n) {
        size_t run = i;  // copy valid runs in one go
        while (run < n && (uint8_t)s[run] < 0x80) run++;
        if (run > i) {
            if (!buf_put(b, s + i, run - i)) return *ok = false, i;
            i = run;
            continue;
        }
        int32_t cp;
        bool inc;
        size_t k = tok_utf8_next((const uint8_t *)s + i, n - i, &cp, &inc);
        if (cp >= 0) {
            if (!buf_put(b, s + i, k)) return *ok = false, i;
        } else {
            if (inc && keep_tail) return i;
            if (!buf_put(b, FFFD, 3)) return *ok = false, i;
        }
        i += k;
    }
    return i;
}

static bool utf8_valid(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        if ((uint8_t)s[i] < 0x80) {
            i++;
            continue;
        }
        int32_t cp;
        bool inc;
        i += tok_utf8_next((const uint8_t *)s + i, n - i, &cp, &inc);
        if (cp < 0) return false;
    }
    return true;
}

// ---------------------------------------------------------------------------------------------
// GPT-2 byte-level alphabet: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order.

static bool byte_printable(int b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

// The unprintable bytes are 0..32, 127..160 and 173: 33 + 34 + 1 = 68 of them, in that order.
uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_printable(b)) return b;
    return 256 + (b <= 32 ? b : b <= 160 ? 33 + (b - 127) : 67);
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_printable((int)cp) ? (int)cp : -1;
    if (cp >= 256 + 68) return -1;
    uint32_t k = cp - 256;
    return k < 33 ? (int)k : k < 67 ? (int)(127 + k - 33) : 173;
}

size_t tok_bytelevel_to_raw(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        int32_t cp;
        bool inc;
        i += tok_utf8_next((const uint8_t *)s + i, n - i, &cp, &inc);
        int b = cp >= 0 ? tok_cp_to_byte((uint32_t)cp) : -1;
        if (b < 0) {  // not a byte-level spelling: HF's ByteLevel decoder keeps such tokens verbatim
            memcpy(out, s, n);
            return n;
        }
        out[o++] = (char)b;
    }
    return o;
}

// ---------------------------------------------------------------------------------------------
// Construction helpers

td_tokenizer *tok_alloc(void) {
    td_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->unk_id = t->bos_id = t->eos_id = t->pad_id = -1;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = t->trie_root[0][i] = t->trie_root[1][i] = -1;
    return t;
}

td_status tok_set_n_vocab(td_tokenizer *t, int32_t n, td_err *err) {
    if (n <= t->n_vocab) return TD_OK;
    uint32_t *off = realloc(t->off, (size_t)n * sizeof *off);
    if (off) t->off = off;
    uint32_t *len = realloc(t->len, (size_t)n * sizeof *len);
    if (len) t->len = len;
    uint8_t *fl = realloc(t->flags, (size_t)n);
    if (fl) t->flags = fl;
    if (!off || !len || !fl) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory (%d ids)", n);
    for (int32_t i = t->n_vocab; i < n; i++) off[i] = len[i] = 0, fl[i] = 0;
    t->n_vocab = n;
    return TD_OK;
}

td_status tok_set_piece(td_tokenizer *t, int32_t id, const char *s, size_t n, td_err *err) {
    if (t->blob_len + n > UINT32_MAX) return td_err_set(err, TD_ERR_LIMIT, "tokenizer: vocabulary text too large");
    if (t->blob_len + n + 1 > t->blob_cap) {
        size_t cap = t->blob_cap ? t->blob_cap : 1 << 16;
        while (cap < t->blob_len + n + 1) cap *= 2;
        char *p = realloc(t->blob, cap);
        if (!p) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
        t->blob = p, t->blob_cap = cap;
    }
    memcpy(t->blob + t->blob_len, s, n);
    t->off[id] = (uint32_t)t->blob_len;
    t->len[id] = (uint32_t)n;
    t->blob_len += n;
    t->flags[id] |= TOK_F_PRESENT;
    return TD_OK;
}

static uint64_t hash_bytes(const char *s, size_t n) { return XXH3_64bits(s, n); }

td_status tok_build_vocab_hash(td_tokenizer *t, td_err *err) {
    size_t cap = 16;
    while (cap < (size_t)t->n_vocab * 2) cap *= 2;
    free(t->vh);
    t->vh = malloc(cap * sizeof *t->vh);
    if (!t->vh) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
    t->vh_cap = cap;
    for (size_t i = 0; i < cap; i++) t->vh[i] = -1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOK_F_PRESENT) || (t->flags[id] & TOK_F_ADDED)) continue;
        const char *s = t->blob + t->off[id];
        size_t n = t->len[id];
        size_t h = hash_bytes(s, n) & (cap - 1);
        for (;; h = (h + 1) & (cap - 1)) {
            int32_t o = t->vh[h];
            if (o < 0) {
                t->vh[h] = id;
                break;
            }
            if (t->len[o] == n && !memcmp(t->blob + t->off[o], s, n)) break;  // keep the first id
        }
    }
    return TD_OK;
}

int32_t tok_vocab_get(const td_tokenizer *t, const char *s, size_t n) {
    if (!t->vh) return -1;
    size_t mask = t->vh_cap - 1, h = hash_bytes(s, n) & mask;
    for (;; h = (h + 1) & mask) {
        int32_t o = t->vh[h];
        if (o < 0) return -1;
        if (t->len[o] == n && !memcmp(t->blob + t->off[o], s, n)) return o;
    }
}

td_status tok_merges_reserve(td_tokenizer *t, size_t n, td_err *err) {
    size_t cap = 16;
    while (cap < n * 2) cap *= 2;
    free(t->mh);
    t->mh = calloc(cap, sizeof *t->mh);
    if (!t->mh) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory (merges)");
    t->mh_cap = cap;
    return TD_OK;
}

static inline size_t mix64(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k;
}

void tok_merge_add(td_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id, bool overwrite) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = t->mh_cap - 1, h = mix64(key) & mask;
    for (;; h = (h + 1) & mask) {
        struct tok_merge *m = &t->mh[h];
        if (m->key == key && !overwrite) return;
        if (m->key == key || !m->key) {
            *m = (struct tok_merge){key, rank, new_id};
            return;
        }
    }
}

static inline bool merge_get(const td_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    if (!t->mh_cap) return false;
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t mask = t->mh_cap - 1, h = mix64(key) & mask;
    for (;; h = (h + 1) & mask) {
        const struct tok_merge *m = &t->mh[h];
        if (m->key == key) {
            *rank = m->rank, *new_id = m->new_id;
            return true;
        }
        if (!m->key) return false;
    }
}

void tok_fill_byte_tokens(td_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        if (t->byte_level) {
            char c = (char)b;
            t->byte_tok[b] = tok_vocab_get(t, &c, 1);
        } else {
            char s[8];
            static const char hex[] = "0123456789ABCDEF";
            s[0] = '<', s[1] = '0', s[2] = 'x', s[3] = hex[b >> 4], s[4] = hex[b & 15], s[5] = '>';
            t->byte_tok[b] = tok_vocab_get(t, s, 6);
        }
    }
}

// Rewrites Oniguruma's \s / \S (Unicode White_Space, which includes U+0085) for PCRE2, whose UCP
// \s is Z-category plus \t\n\v\f\r and misses U+0085.
static char *rewrite_onig(const char *p, size_t n, size_t *out_n) {
    char *o = malloc(n * 12 + 1);
    if (!o) return NULL;
    size_t k = 0;
    int depth = 0;  // inside [...]
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\' && i + 1 < n) {
            char c = p[i + 1];
            if (c == 's') {
                const char *r = depth ? "\\s\\x{85}" : "[\\s\\x{85}]";
                memcpy(o + k, r, strlen(r)), k += strlen(r);
            } else if (c == 'S' && !depth) {
                memcpy(o + k, "[^\\s\\x{85}]", 11), k += 11;
            } else {
                o[k++] = p[i], o[k++] = c;
            }
            i++;
            continue;
        }
        if (p[i] == '[') depth++;
        else if (p[i] == ']' && depth) depth--;
        o[k++] = p[i];
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

td_status tok_compile_regex(const char *pat, size_t n, bool literal, pcre2_code **out, td_err *err) {
    int ec;
    PCRE2_SIZE eo;
    size_t rn = n;
    char *rw = literal ? tok_strndup(pat, n) : rewrite_onig(pat, n, &rn);
    if (!rw) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
    uint32_t opts = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL rejects UCP
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)rw, rn, opts, &ec, &eo, NULL);
    free(rw);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        return td_err_set(err, TD_ERR_INVALID, "pre-tokenizer regex: %s at offset %zu", (char *)msg, (size_t)eo);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if JIT is unavailable
    *out = re;
    return TD_OK;
}

// ---------------------------------------------------------------------------------------------
// Accessors

void td_tokens_free(td_tokens *t) {
    if (!t) return;
    free(t->ids);
    t->ids = NULL, t->n = t->cap = 0;
}

void td_tokenizer_free(td_tokenizer *t) {
    if (!t) return;
    free(t->blob), free(t->off), free(t->len), free(t->flags), free(t->srank), free(t->vh);
    free(t->mh);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].s);
    free(t->added), free(t->trie);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].a), free(t->norm[i].b);
    for (int i = 0; i < t->n_pre; i++) pcre2_code_free(t->pre[i].re), free(t->pre[i].pattern);
    pcre2_match_context_free(t->mctx);
    for (int i = 0; i < t->n_dec_replace; i++) free(t->dec_from[i]), free(t->dec_to[i]);
    free(t->bos_token), free(t->eos_token), free(t->chat_template);
    free(t);
}

int td_tokenizer_vocab_size(const td_tokenizer *t) { return t->n_vocab; }
int td_tokenizer_bos_id(const td_tokenizer *t) { return t->bos_id; }
int td_tokenizer_eos_id(const td_tokenizer *t) { return t->eos_id; }
const char *td_tokenizer_bos_token(const td_tokenizer *t) { return t->bos_token; }
const char *td_tokenizer_eos_token(const td_tokenizer *t) { return t->eos_token; }
bool td_tokenizer_add_bos(const td_tokenizer *t) { return t->add_bos; }
const char *td_tokenizer_chat_template(const td_tokenizer *t) { return t->chat_template; }

bool td_tokenizer_is_special(const td_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_vocab && (t->flags[id] & TOK_F_SPECIAL);
}

int32_t td_tokenizer_token_id(const td_tokenizer *t, const char *piece, size_t len) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].n == len && !memcmp(t->added[i].s, piece, len)) return t->added[i].id;
    if (!t->byte_level) return tok_vocab_get(t, piece, len);
    char *raw = malloc(len + 1);
    if (!raw) return -1;
    size_t rn = tok_bytelevel_to_raw(piece, len, raw);
    int32_t id = tok_vocab_get(t, raw, rn);
    free(raw);
    return id;
}

int td_tokenizer_id_to_piece(const td_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TOK_F_PRESENT)) return -1;
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    tok_buf b = {0};
    bool ok = true;
    if (t->flags[id] & TOK_F_ADDED) {
        for (int i = 0; i < t->n_added; i++)
            if (t->added[i].id == id) {
                ok = buf_put(&b, t->added[i].s, t->added[i].n);
                break;
            }
    } else if (t->byte_level) {
        for (size_t i = 0; i < n && ok; i++) {
            uint8_t u[4];
            utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)tok_byte_to_cp((uint8_t)s[i]), u);
            ok = buf_put(&b, u, (size_t)k);
        }
    } else {
        ok = buf_put(&b, s, n);
    }
    if (!ok) {
        free(b.p);
        return -1;
    }
    int full = (int)b.n;
    if (cap) {
        size_t c = b.n < cap - 1 ? b.n : cap - 1;
        if (c) memcpy(buf, b.p, c);
        buf[c] = 0;
    }
    free(b.p);
    return full;
}

// ---------------------------------------------------------------------------------------------
// Encode

typedef struct {
    uint32_t off, len;
} span;

typedef struct {
    int32_t id, prev, next;
    uint32_t start, len;  // bytes of the word
} sym;

typedef struct {
    uint32_t rank, pos;
    int32_t new_id;  // BPE: merged id; SPM_SCORE: merged byte length
} heap_ent;

typedef struct {
    tok_buf norm, tmp, clean;
    span *sp, *sp2;
    size_t nsp, nsp2, capsp, capsp2;
    span *rs;  // split_regex: gap/match ranges of one span
    bool *rm;  // ... and whether each is a match
    size_t nr, cr;
    sym *syms;
    size_t capsyms;
    heap_ent *heap;
    size_t nheap, capheap;
    pcre2_match_data *md;
    bool at_input_start;  // w->norm[0] is at offset 0 of the input (Metaspace prepend "first")
    td_tokens *out;
    bool oom;  // stops every loop: out of memory, or a regex match error (re_err)
    int re_err;  // a pcre2_match error other than no match and the JIT stack limit (0: none)
    pcre2_match_context *mctx;  // the tokenizer's (NULL: PCRE2's defaults)
} work;

static bool push_id(work *w, int32_t id) {
    td_tokens *o = w->out;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *p = realloc(o->ids, cap * sizeof *p);
        if (!p) return w->oom = true, false;
        o->ids = p, o->cap = cap;
    }
    o->ids[o->n++] = id;
    return true;
}

static bool heap_less(const heap_ent *a, const heap_ent *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static bool heap_push(work *w, heap_ent e) {
    if (w->nheap == w->capheap) {
        size_t cap = w->capheap ? w->capheap * 2 : 64;
        heap_ent *p = realloc(w->heap, cap * sizeof *p);
        if (!p) return w->oom = true, false;
        w->heap = p, w->capheap = cap;
    }
    size_t i = w->nheap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&e, &w->heap[parent])) break;
        w->heap[i] = w->heap[parent];
        i = parent;
    }
    w->heap[i] = e;
    return true;
}

static heap_ent heap_pop(work *w) {
    heap_ent top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0, n = w->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(&w->heap[c + 1], &w->heap[c])) c++;
        if (!heap_less(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

// Candidate merge of symbols l and r (adjacent): pushes it if the pair merges.
static void try_pair(const td_tokenizer *t, work *w, const char *word, int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    sym *s = w->syms;
    if (t->model == TOK_MODEL_BPE) {
        uint32_t rank;
        int32_t nid;
        if (merge_get(t, s[l].id, s[r].id, &rank, &nid))
            heap_push(w, (heap_ent){.rank = rank, .pos = (uint32_t)l, .new_id = nid});
    } else {
        uint32_t n = s[l].len + s[r].len;
        int32_t id = tok_vocab_get(t, word + s[l].start, n);
        if (id >= 0) heap_push(w, (heap_ent){.rank = (uint32_t)t->srank[id], .pos = (uint32_t)l, .new_id = (int32_t)n});
    }
}

#define SCAN_MAX 64  // symbols; longer words use the heap

// Rank and merged id of the pair (i, next(i)); UINT32_MAX when it does not merge.
static inline void pair_rank(const td_tokenizer *t, const char *word, const sym *s, int32_t i, uint32_t *rank,
                             int32_t *nid) {
    int32_t r = s[i].next;
    *rank = UINT32_MAX;
    if (r < 0) return;
    if (t->model == TOK_MODEL_BPE) {
        if (!merge_get(t, s[i].id, s[r].id, rank, nid)) *rank = UINT32_MAX;
    } else {
        int32_t id = tok_vocab_get(t, word + s[i].start, s[i].len + s[r].len);
        if (id >= 0) *rank = (uint32_t)t->srank[id], *nid = id;
    }
}

// BPE over one pre-token (model-space bytes). Mirrors HF's BPE::merge_word + Word::merge_all,
// or llama.cpp's llm_tokenizer_spm for TOK_MODEL_SPM_SCORE.
static void bpe_word(const td_tokenizer *t, work *w, const char *word, size_t n) {
    if (n == 0) return;
    if (t->ignore_merges) {
        int32_t id = tok_vocab_get(t, word, n);
        if (id >= 0) {
            push_id(w, id);
            return;
        }
    }
    if (n > w->capsyms) {
        size_t cap = w->capsyms ? w->capsyms : 64;
        while (cap < n) cap *= 2;
        sym *p = realloc(w->syms, cap * sizeof *p);
        if (!p) {
            w->oom = true;
            return;
        }
        w->syms = p, w->capsyms = cap;
    }
    sym *s = w->syms;
    int32_t ns = 0;
    int32_t unk = -1;
    uint32_t unk_start = 0, unk_len = 0;
#define ADD_SYM(ID, ST, LN) (s[ns] = (sym){.id = (ID), .prev = ns - 1, .next = ns + 1, .start = (ST), .len = (LN)}, ns++)
    if (t->byte_level && t->model == TOK_MODEL_BPE) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_tok[(uint8_t)word[i]];
            if (id >= 0) ADD_SYM(id, (uint32_t)i, 1);
        }
    } else {
        for (size_t i = 0; i < n;) {
            int32_t cp;
            bool inc;
            size_t k = tok_utf8_next((const uint8_t *)word + i, n - i, &cp, &inc);
            int32_t id = tok_vocab_get(t, word + i, k);
            if (id >= 0) {
                if (unk >= 0) ADD_SYM(unk, unk_start, unk_len), unk = -1;
                ADD_SYM(id, (uint32_t)i, (uint32_t)k);
            } else {
                bool all = t->byte_fallback;
                for (size_t j = 0; j < k && all; j++) all = t->byte_tok[(uint8_t)word[i + j]] >= 0;
                if (all) {
                    // HF adds the byte tokens before any pending unk (kept for exactness).
                    for (size_t j = 0; j < k; j++) ADD_SYM(t->byte_tok[(uint8_t)word[i + j]], (uint32_t)(i + j), 1);
                } else if (t->unk_id >= 0) {
                    if (unk >= 0 && t->fuse_unk) {
                        unk_len += (uint32_t)k;
                    } else {
                        if (unk >= 0) ADD_SYM(unk, unk_start, unk_len);
                        unk = t->unk_id, unk_start = (uint32_t)i, unk_len = (uint32_t)k;
                    }
                }
            }
            i += k;
        }
        if (unk >= 0) ADD_SYM(unk, unk_start, unk_len);
    }
#undef ADD_SYM
    if (ns == 0) return;
    s[ns - 1].next = -1;
    if (ns <= SCAN_MAX) {
        // Short words (nearly all): keep the rank of each adjacent pair and rescan for the lowest
        // (leftmost on ties), exactly the order HF's heap pops valid entries in, without a heap.
        uint32_t rank[SCAN_MAX];
        int32_t nid[SCAN_MAX];
        for (int32_t i = 0; i < ns; i++) pair_rank(t, word, s, i, &rank[i], &nid[i]);
        for (;;) {
            int32_t best = -1;
            uint32_t br = UINT32_MAX;
            for (int32_t i = 0; i >= 0; i = s[i].next)
                if (rank[i] < br) br = rank[i], best = i;
            if (best < 0) break;
            int32_t r = s[best].next;
            s[best].id = nid[best];
            s[best].len += s[r].len;
            s[r].len = 0;
            s[best].next = s[r].next;
            if (s[r].next >= 0) s[s[r].next].prev = best;
            pair_rank(t, word, s, best, &rank[best], &nid[best]);
            if (s[best].prev >= 0) pair_rank(t, word, s, s[best].prev, &rank[s[best].prev], &nid[s[best].prev]);
        }
    } else {
        w->nheap = 0;
        for (int32_t i = 0; i + 1 < ns; i++) try_pair(t, w, word, i, i + 1);
        while (w->nheap && !w->oom) {
            heap_ent top = heap_pop(w);
            int32_t l = (int32_t)top.pos;
            if (s[l].len == 0 || s[l].next < 0) continue;
            int32_t r = s[l].next;
            int32_t nid;
            if (t->model == TOK_MODEL_BPE) {
                uint32_t rank;
                if (!merge_get(t, s[l].id, s[r].id, &rank, &nid) || nid != top.new_id) continue;
            } else {
                if (s[r].len == 0 || s[l].len + s[r].len != (uint32_t)top.new_id) continue;
                nid = tok_vocab_get(t, word + s[l].start, (size_t)top.new_id);
            }
            s[l].id = nid;
            s[l].len += s[r].len;
            s[r].len = 0;
            s[l].next = s[r].next;
            if (s[r].next >= 0) s[s[r].next].prev = l;
            try_pair(t, w, word, s[l].prev, l);
            try_pair(t, w, word, l, s[l].next);
        }
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        if (t->model == TOK_MODEL_SPM_SCORE && s[i].id < 0) {
            for (uint32_t j = 0; j < s[i].len; j++) {
                int32_t b = t->byte_tok[(uint8_t)word[s[i].start + j]];
                if (b >= 0) push_id(w, b);
                else if (t->unk_id >= 0) push_id(w, t->unk_id);
            }
        } else {
            push_id(w, s[i].id);
        }
    }
}

static const char METASPACE[3] = {(char)0xE2, (char)0x96, (char)0x81};  // U+2581

// BPE over one pre-token, cut first at the "▁" boundaries that spm_split proves no merge crosses.
static void bpe_piece(const td_tokenizer *t, work *w, const char *s, size_t n) {
    if (!t->spm_split) return bpe_word(t, w, s, n);
    size_t start = 0;
    for (size_t j = 1; j + 3 <= n; j++)
        if (!memcmp(s + j, METASPACE, 3) && (j < 3 || memcmp(s + j - 3, METASPACE, 3))) {
            bpe_word(t, w, s + start, j - start);
            start = j;
        }
    bpe_word(t, w, s + start, n - start);
}

void tok_finalize(td_tokenizer *t) {
    t->spm_split = false;
    if (t->byte_level) return;
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re) return;
    if (tok_vocab_get(t, METASPACE, 3) < 0) return;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!(t->flags[id] & TOK_F_PRESENT) || (t->flags[id] & TOK_F_ADDED)) continue;
        const char *p = t->blob + t->off[id];
        for (size_t j = 1; j + 3 <= t->len[id]; j++)
            if (!memcmp(p + j, METASPACE, 3) && (j < 3 || memcmp(p + j - 3, METASPACE, 3))) return;
    }
    t->spm_split = true;
}

static bool sp_push(span **sp, size_t *n, size_t *cap, uint32_t off, uint32_t len, bool *oom) {
    if (len == 0) return true;
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        span *p = realloc(*sp, c * sizeof *p);
        if (!p) return *oom = true, false;
        *sp = p, *cap = c;
    }
    (*sp)[(*n)++] = (span){off, len};
    return true;
}

// Splits one span of w->norm by regex, appending the pieces to sp2 per HF's split behaviours:
// the span becomes alternating gap/match ranges (is_match flipped by invert), which Isolated
// keeps as they are and the other behaviours drop or merge.
static void split_regex(work *w, const tok_pre *p, span in) {
    const char *subj = w->norm.p + in.off;
    size_t n = in.len;
    bool direct = p->behavior == TOK_SPLIT_ISOLATED;  // ranges go straight to sp2
    uint32_t prev_end = 0;
    size_t start = 0;
    w->nr = 0;
    for (;;) {
        int rc = start <= n ? pcre2_match(p->re, (PCRE2_SPTR)subj, n, start, PCRE2_NO_UTF_CHECK, w->md, w->mctx)
                            : PCRE2_ERROR_NOMATCH;
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(p->re, (PCRE2_SPTR)subj, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, w->md, w->mctx);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // a match limit, ...: never "no match" (wrong ids)
            w->re_err = rc;
            w->oom = true;
            return;
        }
        size_t ms = n, me = n;
        bool found = rc >= 0;
        if (found) {
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
            ms = ov[0], me = ov[1];
        }
        // The gap [prev_end, ms), then the match [ms, me).
        for (int part = 0; part < 2; part++) {
            uint32_t a = part == 0 ? prev_end : (uint32_t)ms, b = part == 0 ? (uint32_t)ms : (uint32_t)me;
            if ((part == 0 && a == b) || (part == 1 && !found)) continue;
            if (direct) {
                sp_push(&w->sp2, &w->nsp2, &w->capsp2, in.off + a, b - a, &w->oom);
                continue;
            }
            if (w->nr == w->cr) {
                size_t c = w->cr ? w->cr * 2 : 64;
                span *x = realloc(w->rs, c * sizeof *x);
                if (x) w->rs = x;
                bool *y = realloc(w->rm, c * sizeof *y);
                if (y) w->rm = y;
                if (!x || !y) return (void)(w->oom = true);
                w->cr = c;
            }
            w->rs[w->nr] = (span){a, b - a}, w->rm[w->nr] = (part == 1) != p->invert, w->nr++;
        }
        if (!found || w->oom) break;
        prev_end = (uint32_t)me;
        if (me == ms) {  // empty match: step over one character
            if (me >= n) break;
            size_t k = me + 1;
            while (k < n && ((uint8_t)subj[k] & 0xC0) == 0x80) k++;
            start = k;
        } else {
            start = me;
        }
    }
    if (direct) return;
    const span *rs = w->rs;
    const bool *rm = w->rm;
    size_t nr = w->nr, first = w->nsp2;
    span *o;
    bool prevm = false;
#define LAST (w->sp2[w->nsp2 - 1])
#define PUSH(r) sp_push(&w->sp2, &w->nsp2, &w->capsp2, in.off + (r).off, (r).len, &w->oom)
    switch (p->behavior) {
    case TOK_SPLIT_REMOVED:
        for (size_t i = 0; i < nr; i++)
            if (!rm[i]) PUSH(rs[i]);
        break;
    case TOK_SPLIT_MERGED_PREV:
        for (size_t i = 0; i < nr; i++) {
            if (rm[i] && !prevm && w->nsp2 > first) LAST.len = in.off + rs[i].off + rs[i].len - LAST.off;
            else PUSH(rs[i]);
            prevm = rm[i];
        }
        break;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < nr; i++) {
            if (rm[i] == prevm && w->nsp2 > first) LAST.len = in.off + rs[i].off + rs[i].len - LAST.off;
            else PUSH(rs[i]);
            prevm = rm[i];
        }
        break;
    case TOK_SPLIT_MERGED_NEXT:  // built right to left, then reversed in place
        for (size_t i = nr; i-- > 0;) {
            if (rm[i] && !prevm && w->nsp2 > first) {
                uint32_t end = LAST.off + LAST.len;
                LAST.off = in.off + rs[i].off, LAST.len = end - LAST.off;
            } else {
                PUSH(rs[i]);
            }
            prevm = rm[i];
        }
        o = w->sp2 + first;
        for (size_t i = 0, k = w->nsp2 - first; i < k / 2; i++) {
            span x = o[i];
            o[i] = o[k - 1 - i], o[k - 1 - i] = x;
        }
        break;
    }
#undef LAST
#undef PUSH
}

static bool normalize(const td_tokenizer *t, work *w, const char *s, size_t n) {
    w->norm.n = 0;
    if (!buf_put(&w->norm, s, n)) return false;
    for (int i = 0; i < t->n_norm; i++) {
        const tok_norm *nm = &t->norm[i];
        switch (nm->kind) {
        case TOK_NORM_NFC:
        case TOK_NORM_NFD:
        case TOK_NORM_NFKC:
        case TOK_NORM_NFKD: {
            if (w->norm.n == 0) break;
            bool ascii = true;
            for (size_t k = 0; k < w->norm.n && ascii; k++) ascii = (uint8_t)w->norm.p[k] < 0x80;
            if (ascii) break;  // ASCII is invariant under every normalization form
            int opt = UTF8PROC_STABLE;
            if (nm->kind == TOK_NORM_NFC) opt |= UTF8PROC_COMPOSE;
            if (nm->kind == TOK_NORM_NFD) opt |= UTF8PROC_DECOMPOSE;
            if (nm->kind == TOK_NORM_NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
            if (nm->kind == TOK_NORM_NFKD) opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
            utf8proc_uint8_t *r = NULL;
            utf8proc_ssize_t rn = utf8proc_map((const utf8proc_uint8_t *)w->norm.p, (utf8proc_ssize_t)w->norm.n, &r,
                                               (utf8proc_option_t)opt);
            if (rn < 0) break;  // cannot happen on valid UTF-8; leave the text as is
            w->norm.n = 0;
            bool ok = buf_put(&w->norm, r, (size_t)rn);
            free(r);
            if (!ok) return false;
            break;
        }
        case TOK_NORM_PREPEND:
            if (w->norm.n == 0) break;
            w->tmp.n = 0;
            if (!buf_put(&w->tmp, nm->a, nm->alen) || !buf_put(&w->tmp, w->norm.p, w->norm.n)) return false;
            {
                tok_buf x = w->norm;
                w->norm = w->tmp, w->tmp = x;
            }
            break;
        case TOK_NORM_REPLACE: {
            if (nm->alen == 0) break;
            w->tmp.n = 0;
            const char *p = w->norm.p, *end = w->norm.p + w->norm.n;
            while (p < end) {
                const char *q = (size_t)(end - p) >= nm->alen ? memmem(p, (size_t)(end - p), nm->a, nm->alen) : NULL;
                if (!q) {
                    if (!buf_put(&w->tmp, p, (size_t)(end - p))) return false;
                    break;
                }
                if (!buf_put(&w->tmp, p, (size_t)(q - p)) || !buf_put(&w->tmp, nm->b, nm->blen)) return false;
                p = q + nm->alen;
            }
            tok_buf x = w->norm;
            w->norm = w->tmp, w->tmp = x;
            break;
        }
        }
    }
    return true;
}

static td_status trie_insert(td_tokenizer *t, int which, const char *s, size_t n, int idx, td_err *err);

td_status tok_add_added(td_tokenizer *t, const char *s, size_t n, int32_t id, bool special, bool lstrip,
                        bool rstrip, bool single_word, bool normalized, td_err *err) {
    if (n == 0) return TD_OK;  // HF never matches an empty added token
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].n == n && !memcmp(t->added[i].s, s, n)) return TD_OK;  // duplicate content
    tok_added *a = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *a);
    if (!a) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
    t->added = a;
    tok_added *x = &a[t->n_added];
    x->s = tok_strndup(s, n);
    if (!x->s) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
    x->n = n, x->id = id, x->special = special, x->lstrip = lstrip, x->rstrip = rstrip;
    x->single_word = single_word, x->normalized = normalized && t->n_norm > 0;
    int idx = t->n_added++;
    // The pattern: the content itself, or its normalized form (HF normalizes the pattern too).
    work w = {0};
    int which = 0;
    if (x->normalized) {
        if (!normalize(t, &w, s, n)) {
            free(w.norm.p), free(w.tmp.p);
            return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
        }
        s = w.norm.p, n = w.norm.n, which = 1;
        t->n_norm_added++;
    }
    td_status st = n ? trie_insert(t, which, s, n, idx, err) : TD_OK;
    free(w.norm.p), free(w.tmp.p);
    return st;
}

static td_status trie_insert(td_tokenizer *t, int which, const char *s, size_t n, int idx, td_err *err) {
    // Insert into the byte trie (indices, not pointers: the node array may move).
    int32_t parent = -1;  // -1: the first level, trie_root[]
    for (size_t i = 0;; i++) {
        int32_t node = parent < 0 ? t->trie_root[which][(uint8_t)s[0]] : t->trie[parent].child;
        int32_t prev_sib = -1;
        while (node >= 0 && t->trie[node].c != (uint8_t)s[i]) prev_sib = node, node = t->trie[node].sibling;
        if (node < 0) {
            if (t->n_trie == t->cap_trie) {
                int cap = t->cap_trie ? t->cap_trie * 2 : 256;
                tok_trie *tr = realloc(t->trie, (size_t)cap * sizeof *tr);
                if (!tr) return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
                t->trie = tr, t->cap_trie = cap;
            }
            node = t->n_trie++;
            t->trie[node] = (tok_trie){.child = -1, .sibling = -1, .added = -1, .c = (uint8_t)s[i]};
            if (prev_sib >= 0) t->trie[prev_sib].sibling = node;
            else if (parent < 0) t->trie_root[which][(uint8_t)s[0]] = node;
            else t->trie[parent].child = node;
        }
        if (i + 1 == n) {
            if (t->trie[node].added < 0) t->trie[node].added = idx;
            break;
        }
        parent = node;
    }
    return TD_OK;
}

static bool is_ws_cp(int32_t c) {
    if (c == ' ' || (c >= 9 && c <= 13) || c == 0x85) return true;
    if (c < 0x80) return false;
    utf8proc_category_t k = utf8proc_category(c);
    return k == UTF8PROC_CATEGORY_ZS || k == UTF8PROC_CATEGORY_ZL || k == UTF8PROC_CATEGORY_ZP;
}

// Unicode \w as Rust's regex has it: letters, marks, digits, connector punctuation, ZWNJ/ZWJ.
static bool is_word_cp(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 32) >= 'a' && (c | 32) <= 'z') || c == '_';
    if (c == 0x200C || c == 0x200D) return true;
    utf8proc_category_t k = utf8proc_category(c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_NO) || k == UTF8PROC_CATEGORY_PC;
}

// Code point ending just before s[i] (i > 0), and its start.
static int32_t cp_before(const char *s, size_t i, size_t *start) {
    size_t j = i - 1;
    while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80 && i - j < 4) j--;
    int32_t cp;
    bool inc;
    tok_utf8_next((const uint8_t *)s + j, i - j, &cp, &inc);
    *start = j;
    return cp;
}

// Next added-token match in text[*pos, len) with the trie `which`, as HF's AddedVocabulary
// find_matches does: leftmost-longest non-overlapping matches; a single_word match touching a
// word character is dropped (and its bytes are not searched again); lstrip/rstrip widen the
// match over whitespace, lstrip not past `floor` (the end of the previous match).
static bool next_added(const td_tokenizer *t, int which, const char *text, size_t len, size_t floor, size_t *pos,
                       size_t *ms_out, size_t *me_out, int32_t *id) {
    size_t i = *pos;
    while (i < len) {
        int32_t node = t->trie_root[which][(uint8_t)text[i]];
        int best = -1;
        size_t best_end = 0;
        for (size_t j = i; node >= 0;) {
            if (t->trie[node].added >= 0) best = t->trie[node].added, best_end = j + 1;
            if (++j >= len) break;
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].c != (uint8_t)text[j]) c = t->trie[c].sibling;
            node = c;
        }
        if (best < 0) {
            i++;
            continue;
        }
        const tok_added *a = &t->added[best];
        size_t ms = i, me = best_end;
        if (a->single_word) {
            size_t st;
            int32_t cp = -1;
            bool inc;
            bool left_ok = ms == 0 || !is_word_cp(cp_before(text, ms, &st));
            if (me < len) tok_utf8_next((const uint8_t *)text + me, len - me, &cp, &inc);
            bool right_ok = me == len || !is_word_cp(cp);
            if (!left_ok || !right_ok) {
                i = me;
                continue;
            }
        }
        if (a->lstrip) {
            size_t st;
            while (ms > floor && is_ws_cp(cp_before(text, ms, &st))) ms = st;
        }
        if (a->rstrip) {
            while (me < len) {
                int32_t cp;
                bool inc;
                size_t k = tok_utf8_next((const uint8_t *)text + me, len - me, &cp, &inc);
                if (cp < 0 || !is_ws_cp(cp)) break;
                me += k;
            }
        }
        *ms_out = ms, *me_out = me, *id = a->id;
        *pos = me;
        return true;
    }
    *pos = len;
    return false;
}

// HF's Metaspace pre-tokenizer on every current piece: ' ' -> replacement, the replacement
// prepended (always, or only to the piece at the very start of the input) unless the piece
// already starts with it, then (split) a new piece at every replacement. Rebuilds the text.
static void metaspace(const tok_pre *p, work *w) {
    size_t rl = strlen(p->rep);
    w->tmp.n = 0;
    w->nsp2 = 0;
    for (size_t k = 0; k < w->nsp && !w->oom; k++) {
        span x = w->sp[k];
        const char *s = w->norm.p + x.off;
        size_t at = w->tmp.n;
        bool starts = (x.len >= rl && !memcmp(s, p->rep, rl)) || (x.len && s[0] == ' ');
        bool first = w->at_input_start && x.off == 0;
        if (!starts && (p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && first)))
            if (!buf_put(&w->tmp, p->rep, rl)) return (void)(w->oom = true);
        for (size_t i = 0; i < x.len; i++) {
            bool ok = s[i] == ' ' ? buf_put(&w->tmp, p->rep, rl) : buf_put(&w->tmp, s + i, 1);
            if (!ok) return (void)(w->oom = true);
        }
        // Pieces: cut before every replacement (MergedWithNext on the replacement).
        size_t piece = at;
        for (size_t i = at; p->split && i + rl <= w->tmp.n; i++)
            if (i > piece && !memcmp(w->tmp.p + i, p->rep, rl)) {
                sp_push(&w->sp2, &w->nsp2, &w->capsp2, (uint32_t)piece, (uint32_t)(i - piece), &w->oom);
                piece = i;
            }
        sp_push(&w->sp2, &w->nsp2, &w->capsp2, (uint32_t)piece, (uint32_t)(w->tmp.n - piece), &w->oom);
    }
    tok_buf b = w->norm;
    w->norm = w->tmp, w->tmp = b;
    span *y = w->sp;
    w->sp = w->sp2, w->sp2 = y;
    size_t c = w->capsp;
    w->capsp = w->capsp2, w->capsp2 = c;
    w->nsp = w->nsp2;
}

// Pre-tokenizes w->norm[0, n) and runs BPE on each piece.
static void pretokenize_bpe(const td_tokenizer *t, work *w) {
    w->nsp = 0;
    sp_push(&w->sp, &w->nsp, &w->capsp, 0, (uint32_t)w->norm.n, &w->oom);
    for (int i = 0; i < t->n_pre && !w->oom; i++) {
        const tok_pre *p = &t->pre[i];
        if (p->kind == TOK_PRE_BYTELEVEL && p->add_prefix_space) {
            // Prefix every current piece that does not start with a space (rebuilds the text).
            w->tmp.n = 0;
            for (size_t k = 0; k < w->nsp; k++) {
                span x = w->sp[k];
                uint32_t at = (uint32_t)w->tmp.n;
                if (w->norm.p[x.off] != ' ' && !buf_put(&w->tmp, " ", 1)) return (void)(w->oom = true);
                if (!buf_put(&w->tmp, w->norm.p + x.off, x.len)) return (void)(w->oom = true);
                w->sp[k] = (span){at, (uint32_t)w->tmp.n - at};
            }
            tok_buf x = w->norm;
            w->norm = w->tmp, w->tmp = x;
        }
        if (p->kind == TOK_PRE_METASPACE) {
            metaspace(p, w);
            continue;
        }
        if (!p->re) continue;
        w->md = pcre2_match_data_create_from_pattern(p->re, NULL);
        if (!w->md) return (void)(w->oom = true);
        w->nsp2 = 0;
        for (size_t k = 0; k < w->nsp && !w->oom; k++) split_regex(w, p, w->sp[k]);
        pcre2_match_data_free(w->md);
        w->md = NULL;
        span *x = w->sp;
        w->sp = w->sp2, w->sp2 = x;
        size_t c = w->capsp;
        w->capsp = w->capsp2, w->capsp2 = c;
        w->nsp = w->nsp2;
    }
    for (size_t k = 0; k < w->nsp && !w->oom; k++) bpe_piece(t, w, w->norm.p + w->sp[k].off, w->sp[k].len);
}

// One segment of raw text between added tokens: normalize, split out normalized added tokens,
// then pre-tokenize and BPE what is left.
static void encode_segment(const td_tokenizer *t, work *w, const char *s, size_t n) {
    if (!normalize(t, w, s, n)) {
        w->oom = true;
        return;
    }
    if (!t->n_norm_added) return pretokenize_bpe(t, w);
    tok_buf seg = w->norm;  // keep the normalized segment; pieces are copied into w->norm
    w->norm = (tok_buf){0};
    size_t pos = 0, done = 0, ms, me;
    int32_t id;
    while (!w->oom) {
        bool found = next_added(t, 1, seg.p, seg.n, done, &pos, &ms, &me, &id);
        size_t gap_end = found ? ms : seg.n;
        if (gap_end > done) {
            w->at_input_start = w->at_input_start && done == 0;
            w->norm.n = 0;
            if (!buf_put(&w->norm, seg.p + done, gap_end - done)) w->oom = true;
            else pretokenize_bpe(t, w);
        }
        if (!found) break;
        push_id(w, id);
        done = me;
    }
    free(w->norm.p);
    w->norm = seg;
}

td_status td_tokenizer_encode(const td_tokenizer *t, const char *text, size_t len, bool add_special,
                              td_tokens *out, td_err *err) {
    if (!t || !out || (!text && len)) return td_err_set(err, TD_ERR_INVALID, "tokenize: null argument");
    work w = {0};
    w.out = out;
    w.mctx = t->mctx;
    out->n = 0;
    if (len && !utf8_valid(text, len)) {
        bool ok;
        buf_put_lossy(&w.clean, text, len, false, &ok);
        if (!ok) return td_err_set(err, TD_ERR_NOMEM, "tokenize: out of memory");
        text = w.clean.p, len = w.clean.n;
    }
    if (add_special)
        for (int i = 0; i < t->n_prefix; i++) push_id(&w, t->post_prefix[i]);
    // Raw-text added tokens first; each gap is normalized and searched for normalized ones.
    size_t pos = 0, done = 0, ms, me;
    int32_t id;
    while (!w.oom) {
        bool found = next_added(t, 0, text, len, done, &pos, &ms, &me, &id);
        size_t gap_end = found ? ms : len;
        w.at_input_start = done == 0;
        if (gap_end > done) encode_segment(t, &w, text + done, gap_end - done);
        if (!found) break;
        push_id(&w, id);
        done = me;
    }
    if (add_special)
        for (int k = 0; k < t->n_suffix; k++) push_id(&w, t->post_suffix[k]);
    free(w.norm.p), free(w.tmp.p), free(w.clean.p), free(w.sp), free(w.sp2), free(w.syms), free(w.heap);
    free(w.rs), free(w.rm);
    if (w.re_err) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(w.re_err, msg, sizeof msg) < 0) snprintf((char *)msg, sizeof msg, "error");
        td_status st = w.re_err == PCRE2_ERROR_MATCHLIMIT || w.re_err == PCRE2_ERROR_DEPTHLIMIT ||
                               w.re_err == PCRE2_ERROR_HEAPLIMIT || w.re_err == PCRE2_ERROR_NOMEMORY
                           ? TD_ERR_LIMIT
                           : TD_ERR_INVALID;
        return td_err_set(err, st, "tokenize: pre-tokenizer regex match failed (PCRE2 error %d: %s)", w.re_err,
                          (const char *)msg);
    }
    if (w.oom) return td_err_set(err, TD_ERR_NOMEM, "tokenize: out of memory");
    return TD_OK;
}

td_status tok_set_match_limit(td_tokenizer *t, uint32_t limit, td_err *err) {
    if (!t->mctx && !(t->mctx = pcre2_match_context_create(NULL)))
        return td_err_set(err, TD_ERR_NOMEM, "tokenizer: out of memory");
    pcre2_set_match_limit(t->mctx, limit);
    return TD_OK;
}

// ---------------------------------------------------------------------------------------------
// Decode: a state machine per decoder kind; td_tokenizer_decode is push-all + flush, so the
// streaming and one-shot paths cannot disagree.

struct td_detok {
    const td_tokenizer *t;
    bool skip_special;
    tok_buf out;    // text returned by the last call
    tok_buf pend;   // byte-level: incomplete UTF-8 tail; chain: current run of fallback bytes
    tok_buf tmp;
    int strip_left;  // chain: leading strip chars still to remove (-1 once a non-strip char is out)
    size_t n_tok;    // NONE: tokens emitted so far (joined with " ")
    bool oom;
};

td_detok *td_detok_new(const td_tokenizer *t, bool skip_special) {
    td_detok *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    d->t = t, d->skip_special = skip_special;
    td_detok_reset(d);
    return d;
}

void td_detok_free(td_detok *d) {
    if (!d) return;
    free(d->out.p), free(d->pend.p), free(d->tmp.p);
    free(d);
}

void td_detok_reset(td_detok *d) {
    d->out.n = d->pend.n = 0;
    d->strip_left = d->t->dec_strip_start;
    d->n_tok = 0;
    d->oom = false;
}

// Chain decoder: emits fused text, applying Strip(start) to the very beginning of the output.
static void chain_emit(td_detok *d, const char *s, size_t n) {
    const td_tokenizer *t = d->t;
    while (n && d->strip_left > 0) {
        int32_t cp;
        bool inc;
        size_t k = tok_utf8_next((const uint8_t *)s, n, &cp, &inc);
        if (cp != (int32_t)t->dec_strip_char) {
            d->strip_left = 0;
            break;
        }
        s += k, n -= k, d->strip_left--;
    }
    if (n) d->strip_left = 0;
    if (!buf_put(&d->out, s, n)) d->oom = true;
}

static void chain_flush_bytes(td_detok *d) {
    if (!d->pend.n) return;
    if (utf8_valid(d->pend.p, d->pend.n)) {
        chain_emit(d, d->pend.p, d->pend.n);
    } else {
        for (size_t i = 0; i < d->pend.n; i++) chain_emit(d, FFFD, 3);  // one U+FFFD per byte, as HF
    }
    d->pend.n = 0;
}

static bool parse_byte_token(const char *s, size_t n, uint8_t *b) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int x = c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
        if (x < 0) return false;
        v = v * 16 + x;
    }
    *b = (uint8_t)v;
    return true;
}

static void detok_add(td_detok *d, int32_t id) {
    const td_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TOK_F_PRESENT)) return;
    if (d->skip_special && (t->flags[id] & TOK_F_SPECIAL)) return;
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    if (t->dec == TOK_DEC_BYTELEVEL) {
        if (!buf_put(&d->pend, s, n)) return (void)(d->oom = true);
        bool ok;
        size_t used = buf_put_lossy(&d->out, d->pend.p, d->pend.n, true, &ok);
        if (!ok) d->oom = true;
        memmove(d->pend.p, d->pend.p + used, d->pend.n - used);
        d->pend.n -= used;
        return;
    }
    if (t->dec == TOK_DEC_NONE) {
        if (d->n_tok++ && !buf_put(&d->out, " ", 1)) d->oom = true;
        if (!buf_put(&d->out, s, n)) d->oom = true;
        return;
    }
    // CHAIN: Replace steps, then ByteFallback grouping, then fused output with Strip.
    if (t->n_dec_replace) {
        d->tmp.n = 0;
        if (!buf_put(&d->tmp, s, n)) return (void)(d->oom = true);
        for (int r = 0; r < t->n_dec_replace; r++) {
            const char *from = t->dec_from[r], *to = t->dec_to[r];
            size_t fl = strlen(from), tl = strlen(to);
            if (!fl || !memmem(d->tmp.p, d->tmp.n, from, fl)) continue;
            tok_buf nb = {0};
            const char *p = d->tmp.p, *end = d->tmp.p + d->tmp.n;
            while (p < end) {
                const char *q = memmem(p, (size_t)(end - p), from, fl);
                if (!q) {
                    buf_put(&nb, p, (size_t)(end - p));
                    break;
                }
                buf_put(&nb, p, (size_t)(q - p)), buf_put(&nb, to, tl);
                p = q + fl;
            }
            free(d->tmp.p);
            d->tmp = nb;
            if (!nb.p) return (void)(d->oom = true);
        }
        s = d->tmp.p, n = d->tmp.n;
    }
    uint8_t b;
    if (t->dec_byte_fallback && parse_byte_token(s, n, &b)) {
        if (!buf_put(&d->pend, &b, 1)) d->oom = true;
        return;
    }
    chain_flush_bytes(d);
    chain_emit(d, s, n);
}

const char *td_detok_push(td_detok *d, int32_t id, size_t *len) {
    d->out.n = 0;
    if (!buf_reserve(&d->out, 0)) return NULL;
    d->out.p[0] = 0;
    detok_add(d, id);
    if (d->oom) return NULL;
    *len = d->out.n;
    return d->out.p;
}

const char *td_detok_flush(td_detok *d, size_t *len) {
    d->out.n = 0;
    if (!buf_reserve(&d->out, 0)) return NULL;
    d->out.p[0] = 0;
    if (d->t->dec == TOK_DEC_BYTELEVEL) {
        bool ok;
        buf_put_lossy(&d->out, d->pend.p, d->pend.n, false, &ok);
        if (!ok) d->oom = true;
        d->pend.n = 0;
    } else if (d->t->dec == TOK_DEC_CHAIN) {
        chain_flush_bytes(d);
    }
    if (d->oom) return NULL;
    *len = d->out.n;
    return d->out.p;
}

int td_tokenizer_token_bytes(const td_tokenizer *t, int32_t id, char *buf, size_t cap) {
    if (id < 0 || id >= t->n_vocab || !(t->flags[id] & TOK_F_PRESENT)) return -1;
    const char *s = t->blob + t->off[id];
    size_t n = t->len[id];
    uint8_t b;
    if (t->dec == TOK_DEC_CHAIN && t->dec_byte_fallback && parse_byte_token(s, n, &b)) {
        if (cap) buf[0] = (char)b;
        return 1;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {  // CHAIN: the Replace steps, applied in order at each position
        const char *rep = NULL;
        size_t fl = 0;
        for (int r = 0; t->dec == TOK_DEC_CHAIN && r < t->n_dec_replace && !rep; r++) {
            fl = strlen(t->dec_from[r]);
            if (fl && fl <= n - i && !memcmp(s + i, t->dec_from[r], fl)) rep = t->dec_to[r];
        }
        if (rep) {
            for (size_t k = 0; rep[k]; k++, o++)
                if (o < cap) buf[o] = rep[k];
            i += fl;
        } else {
            if (o < cap) buf[o] = s[i];
            o++, i++;
        }
    }
    return (int)o;
}

td_status td_tokenizer_decode(const td_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, char **out,
                              size_t *len, td_err *err) {
    *out = NULL;
    if (len) *len = 0;
    td_detok *d = td_detok_new(t, skip_special);
    if (!d) return td_err_set(err, TD_ERR_NOMEM, "detokenize: out of memory");
    tok_buf all = {0};
    bool ok = buf_reserve(&all, 0);
    for (size_t i = 0; i < n && ok; i++) {
        detok_add(d, ids[i]);
        ok = !d->oom && buf_put(&all, d->out.p, d->out.n);
        d->out.n = 0;
    }
    size_t fl;
    const char *f = ok ? td_detok_flush(d, &fl) : NULL;
    ok = f && buf_put(&all, f, fl);
    td_detok_free(d);
    if (!ok) {
        free(all.p);
        return td_err_set(err, TD_ERR_NOMEM, "detokenize: out of memory");
    }
    *out = all.p;
    if (len) *len = all.n;
    return TD_OK;
}
