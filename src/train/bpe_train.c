// Byte-level BPE trainer: word counting with a hash map, incremental pair counts with a lazy
// max-heap, tokenizer.json output. The training rule is documented in bpe_train.h.
#include "train/bpe_train.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <cjson/cJSON.h>
#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <utf8proc.h>
#include <xxhash.h>

#include "base/file.h"
#include "train/afile.h"

const char *const TD_BPE_LLAMA3_PATTERN =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

td_bpe_params td_bpe_default_params(void) {
    td_bpe_params p = {0};
    p.vocab_size = 4096;
    p.min_frequency = 2;
    p.bos = "<|bos|>";
    p.eos = "<|eos|>";
    p.add_bos = true;
    p.model_max_length = 2048;
    return p;
}

// ---- small growable arrays and hash maps ----

typedef struct {
    int32_t *v;
    int32_t n, cap;
} ivec;

static int ivec_push(ivec *a, int32_t x) {
    if (a->n == a->cap) {
        int32_t cap = a->cap ? a->cap * 2 : 4;
        int32_t *nv = realloc(a->v, (size_t)cap * sizeof *nv);
        if (!nv) return 0;
        a->v = nv;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 1;
}

// Open-addressing map from byte strings to an index (words and symbol spellings).
typedef struct {
    uint32_t *slot;  // (cap) index + 1, 0 = empty
    size_t cap, n;
} strmap;

struct td_bpe_trainer {
    td_bpe_params p;
    char *strs;  // owned copies of params strings, NUL-separated
    pcre2_code *re;
    pcre2_match_data *md;
    // Words: distinct pre-tokenized byte strings and counts (during feeding), then symbol arrays.
    char *wbytes;  // arena of word bytes
    size_t wbytes_n, wbytes_cap;
    size_t *woff;    // (nwords + 1 entries while feeding: offset of each word in wbytes)
    uint32_t *wlen;  // bytes, then symbols
    int64_t *wcount;
    size_t nwords, wcap;
    strmap words;
    int32_t *syms;  // symbol arrays, word w at syms + soff[w]
    size_t *soff;
    // Symbols: id -> raw bytes (offset into sbytes), learned merges.
    char *sbytes;
    size_t sbytes_n, sbytes_cap;
    size_t *sym_off;
    uint32_t *sym_len;
    int nsym, sym_cap;
    strmap symmap;
    int32_t (*merges)[2];
    int nmerges, merge_cap;
    bool trained;
};

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

// Finds key in m; get(i) returns the bytes of entry i. Returns the slot position.
typedef const char *(*getkey_fn)(const td_bpe_trainer *t, uint32_t i, size_t *n);

static size_t strmap_find(const strmap *m, const td_bpe_trainer *t, getkey_fn get, const char *k,
                          size_t n, uint64_t h) {
    size_t pos = h & (m->cap - 1);
    for (;;) {
        uint32_t s = m->slot[pos];
        if (!s) return pos;
        size_t l;
        const char *q = get(t, s - 1, &l);
        if (l == n && memcmp(q, k, n) == 0) return pos;
        pos = (pos + 1) & (m->cap - 1);
    }
}

static int strmap_grow(strmap *m, const td_bpe_trainer *t, getkey_fn get) {
    size_t cap = m->cap ? m->cap * 2 : 1024;
    uint32_t *ns = calloc(cap, sizeof *ns);
    if (!ns) return 0;
    for (size_t i = 0; i < m->cap; i++) {
        uint32_t s = m->slot[i];
        if (!s) continue;
        size_t l;
        const char *q = get(t, s - 1, &l);
        size_t pos = hash_bytes(q, l) & (cap - 1);
        while (ns[pos]) pos = (pos + 1) & (cap - 1);
        ns[pos] = s;
    }
    free(m->slot);
    m->slot = ns;
    m->cap = cap;
    return 1;
}

static const char *word_key(const td_bpe_trainer *t, uint32_t i, size_t *n) {
    *n = t->wlen[i];
    return t->wbytes + t->woff[i];
}

static const char *sym_key(const td_bpe_trainer *t, uint32_t i, size_t *n) {
    *n = t->sym_len[i];
    return t->sbytes + t->sym_off[i];
}

// ---- GPT-2 byte <-> unicode mapping ----

static int printable_byte(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

// Code point of byte b under bytes_to_unicode.
static int byte_cp(int b) {
    if (printable_byte(b)) return b;
    int n = 0;
    for (int c = 0; c < b; c++) n += !printable_byte(c);
    return 256 + n;
}

// ---- construction ----

static char *dupstr(char **arena, size_t *used, const char *s) {
    if (!s) return NULL;
    char *d = *arena + *used;
    size_t l = strlen(s) + 1;
    memcpy(d, s, l);
    *used += l;
    return d;
}

static int add_symbol(td_bpe_trainer *t, const char *bytes, size_t n) {
    if (t->nsym == t->sym_cap) {
        int cap = t->sym_cap ? t->sym_cap * 2 : 512;
        size_t *no = realloc(t->sym_off, (size_t)cap * sizeof *no);
        if (!no) return -1;
        t->sym_off = no;
        uint32_t *nl = realloc(t->sym_len, (size_t)cap * sizeof *nl);
        if (!nl) return -1;
        t->sym_len = nl;
        t->sym_cap = cap;
    }
    if (t->sbytes_n + n > t->sbytes_cap) {
        size_t cap = (t->sbytes_cap + n) * 2;
        char *nb = realloc(t->sbytes, cap);
        if (!nb) return -1;
        t->sbytes = nb;
        t->sbytes_cap = cap;
    }
    if ((size_t)(t->nsym + 1) * 2 > t->symmap.cap && !strmap_grow(&t->symmap, t, sym_key))
        return -1;
    memcpy(t->sbytes + t->sbytes_n, bytes, n);
    t->sym_off[t->nsym] = t->sbytes_n;
    t->sym_len[t->nsym] = (uint32_t)n;
    t->sbytes_n += n;
    size_t pos = strmap_find(&t->symmap, t, sym_key, bytes, n, hash_bytes(bytes, n));
    t->symmap.slot[pos] = (uint32_t)t->nsym + 1;
    return t->nsym++;
}

td_status td_bpe_trainer_new(const td_bpe_params *p, td_bpe_trainer **out, td_err *err) {
    *out = NULL;
    int nspecial = (p->bos != NULL) + (p->eos != NULL) + (p->pad != NULL) + p->n_special;
    if (p->n_special < 0 || p->n_special > TD_BPE_MAX_SPECIAL)
        return td_err_set(err, TD_ERR_INVALID, "too many special tokens (%d)", p->n_special);
    if (p->vocab_size < 256 + nspecial || p->vocab_size > (1 << 24))
        return td_err_set(err, TD_ERR_INVALID,
                          "vocab size %d: must hold the 256 bytes and %d special tokens",
                          p->vocab_size, nspecial);
    if (p->add_bos && !p->bos) return td_err_set(err, TD_ERR_INVALID, "add_bos needs a bos token");
    const char *all[TD_BPE_MAX_SPECIAL + 3];
    int na = 0;
    if (p->bos) all[na++] = p->bos;
    if (p->eos) all[na++] = p->eos;
    if (p->pad) all[na++] = p->pad;
    for (int i = 0; i < p->n_special; i++) all[na++] = p->special[i];
    size_t slen = 0;
    for (int i = 0; i < na; i++) {
        if (!all[i] || !*all[i]) return td_err_set(err, TD_ERR_INVALID, "empty special token");
        for (int j = 0; j < i; j++)
            if (!strcmp(all[i], all[j]))
                return td_err_set(err, TD_ERR_INVALID, "special token %s given twice", all[i]);
        slen += strlen(all[i]) + 1;
    }
    const char *pattern = p->pattern ? p->pattern : TD_BPE_LLAMA3_PATTERN;
    slen += strlen(pattern) + 1;
    td_bpe_trainer *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    t->p = *p;
    t->strs = malloc(slen);
    if (!t->strs) {
        free(t);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    size_t used = 0;
    t->p.pattern = dupstr(&t->strs, &used, pattern);
    t->p.bos = dupstr(&t->strs, &used, p->bos);
    t->p.eos = dupstr(&t->strs, &used, p->eos);
    t->p.pad = dupstr(&t->strs, &used, p->pad);
    for (int i = 0; i < p->n_special; i++) t->p.special[i] = dupstr(&t->strs, &used, p->special[i]);
    int ec;
    PCRE2_SIZE eo;
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec,
                          &eo, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        td_bpe_trainer_free(t);
        return td_err_set(err, TD_ERR_INVALID, "pre-tokenizer regex at offset %zu: %s", (size_t)eo,
                          (char *)msg);
    }
    pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE);  // falls back to the interpreter if unavailable
    t->md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!t->md) {
        td_bpe_trainer_free(t);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    *out = t;
    return TD_OK;
}

void td_bpe_trainer_free(td_bpe_trainer *t) {
    if (!t) return;
    if (t->md) pcre2_match_data_free(t->md);
    if (t->re) pcre2_code_free(t->re);
    free(t->strs);
    free(t->wbytes);
    free(t->woff);
    free(t->wlen);
    free(t->wcount);
    free(t->words.slot);
    free(t->syms);
    free(t->soff);
    free(t->sbytes);
    free(t->sym_off);
    free(t->sym_len);
    free(t->symmap.slot);
    free(t->merges);
    free(t);
}

// ---- feeding: pre-tokenize and count ----

static td_status add_word(td_bpe_trainer *t, const char *w, size_t n, td_err *err) {
    if (n == 0) return TD_OK;
    if (n > UINT32_MAX) return td_err_set(err, TD_ERR_LIMIT, "pre-tokenized word of %zu bytes", n);
    if ((t->nwords + 1) * 2 > t->words.cap && !strmap_grow(&t->words, t, word_key))
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    uint64_t h = hash_bytes(w, n);
    size_t pos = strmap_find(&t->words, t, word_key, w, n, h);
    if (t->words.slot[pos]) {
        t->wcount[t->words.slot[pos] - 1]++;
        return TD_OK;
    }
    if (t->nwords == t->wcap) {
        size_t cap = t->wcap ? t->wcap * 2 : 4096;
        size_t *no = realloc(t->woff, (cap + 1) * sizeof *no);
        if (no) t->woff = no;
        uint32_t *nl = realloc(t->wlen, cap * sizeof *nl);
        if (nl) t->wlen = nl;
        int64_t *nc = realloc(t->wcount, cap * sizeof *nc);
        if (nc) t->wcount = nc;
        if (!no || !nl || !nc) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        t->wcap = cap;
    }
    if (t->wbytes_n + n > t->wbytes_cap) {
        size_t cap = (t->wbytes_cap + n) * 2;
        char *nb = realloc(t->wbytes, cap);
        if (!nb) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        t->wbytes = nb;
        t->wbytes_cap = cap;
    }
    memcpy(t->wbytes + t->wbytes_n, w, n);
    t->woff[t->nwords] = t->wbytes_n;
    t->wlen[t->nwords] = (uint32_t)n;
    t->wcount[t->nwords] = 1;
    t->wbytes_n += n;
    t->words.slot[pos] = (uint32_t)++t->nwords;
    return TD_OK;
}

// Copies text with each invalid UTF-8 byte replaced by U+FFFD; NULL if already valid.
static char *sanitize(const char *text, size_t len, size_t *olen) {
    size_t i = 0;
    utf8proc_int32_t cp;
    while (i < len) {
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 0) break;
        i += (size_t)k;
    }
    if (i == len) return NULL;
    char *o = malloc(len * 3 + 1);
    if (!o) return NULL;
    size_t n = 0;
    i = 0;
    while (i < len) {
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)text + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k < 0) {
            memcpy(o + n, "\xEF\xBF\xBD", 3);
            n += 3;
            i++;
        } else {
            memcpy(o + n, text + i, (size_t)k);
            n += (size_t)k;
            i += (size_t)k;
        }
    }
    *olen = n;
    return o;
}

td_status td_bpe_feed(td_bpe_trainer *t, const char *text, size_t len, td_err *err) {
    if (t->trained) return td_err_set(err, TD_ERR_INVALID, "td_bpe_feed after td_bpe_train");
    size_t clen = len;
    char *clean = sanitize(text, len, &clen);
    const char *s = clean ? clean : text;
    size_t at = 0, gap = 0;  // gap: start of text not yet covered by a match (Isolated split)
    td_status st = TD_OK;
    while (at <= clen && !st) {
        int rc =
            pcre2_match(t->re, (PCRE2_SPTR)s, clen, at, at ? PCRE2_NO_UTF_CHECK : 0, t->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            st = td_err_set(err, TD_ERR_INVALID, "pre-tokenizer regex failed (PCRE2 error %d)", rc);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(t->md);
        size_t b = ov[0], e = ov[1];
        if (e == b) {  // empty match: step one character forward
            if (b >= clen) break;
            at = b + 1;
            while (at < clen && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
            continue;
        }
        st = add_word(t, s + gap, b - gap, err);
        if (!st) st = add_word(t, s + b, e - b, err);
        gap = at = e;
    }
    if (!st) st = add_word(t, s + gap, clen - gap, err);
    free(clean);
    return st;
}

// ---- training ----

// Pair table: open addressing on the 64-bit key (left << 32 | right).
typedef struct {
    uint64_t *key;  // (cap) key + 1, 0 = empty
    int32_t *idx;   // (cap) pair index
    size_t cap;
    uint64_t *pkey;  // (n) pair index -> key
    int64_t *count;  // (n) weighted occurrences
    ivec *where;     // (n) words that contained the pair when it appeared
    int32_t *stamp;  // (n) last merge step that touched the pair as a new pair
    int32_t n, ncap;
} pairs;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int pairs_grow(pairs *P) {
    size_t cap = P->cap ? P->cap * 2 : 1 << 16;
    uint64_t *nk = calloc(cap, sizeof *nk);
    int32_t *ni = malloc(cap * sizeof *ni);
    if (!nk || !ni) {
        free(nk);
        free(ni);
        return 0;
    }
    for (size_t i = 0; i < P->cap; i++) {
        if (!P->key[i]) continue;
        size_t pos = mix(P->key[i] - 1) & (cap - 1);
        while (nk[pos]) pos = (pos + 1) & (cap - 1);
        nk[pos] = P->key[i];
        ni[pos] = P->idx[i];
    }
    free(P->key);
    free(P->idx);
    P->key = nk;
    P->idx = ni;
    P->cap = cap;
    return 1;
}

// Index of pair `k`, created with count 0 if absent; -1 on allocation failure.
static int32_t pair_get(pairs *P, uint64_t k) {
    if ((size_t)(P->n + 1) * 2 > P->cap && !pairs_grow(P)) return -1;
    size_t pos = mix(k) & (P->cap - 1);
    while (P->key[pos]) {
        if (P->key[pos] == k + 1) return P->idx[pos];
        pos = (pos + 1) & (P->cap - 1);
    }
    if (P->n == P->ncap) {
        int32_t cap = P->ncap ? P->ncap * 2 : 1 << 15;
        uint64_t *a = realloc(P->pkey, (size_t)cap * sizeof *a);
        if (a) P->pkey = a;
        int64_t *b = realloc(P->count, (size_t)cap * sizeof *b);
        if (b) P->count = b;
        ivec *c = realloc(P->where, (size_t)cap * sizeof *c);
        if (c) P->where = c;
        int32_t *d = realloc(P->stamp, (size_t)cap * sizeof *d);
        if (d) P->stamp = d;
        if (!a || !b || !c || !d) return -1;
        P->ncap = cap;
    }
    int32_t i = P->n++;
    P->key[pos] = k + 1;
    P->idx[pos] = i;
    P->pkey[i] = k;
    P->count[i] = 0;
    P->where[i] = (ivec){0};
    P->stamp[i] = -1;
    return i;
}

static void pairs_free(pairs *P) {
    for (int32_t i = 0; i < P->n; i++) free(P->where[i].v);
    free(P->key);
    free(P->idx);
    free(P->pkey);
    free(P->count);
    free(P->where);
    free(P->stamp);
}

// Max-heap of (count, pair): larger count first, then smaller key (= smaller (left, right)).
typedef struct {
    int64_t count;
    uint64_t key;
} hent;
typedef struct {
    hent *a;
    size_t n, cap;
} heap;

static int hbefore(hent x, hent y) {
    return x.count > y.count || (x.count == y.count && x.key < y.key);
}

static int heap_push(heap *h, hent e) {
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 1 << 16;
        hent *na = realloc(h->a, cap * sizeof *na);
        if (!na) return 0;
        h->a = na;
        h->cap = cap;
    }
    size_t i = h->n++;
    while (i && hbefore(e, h->a[(i - 1) / 2])) {
        h->a[i] = h->a[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->a[i] = e;
    return 1;
}

static hent heap_pop(heap *h) {
    hent top = h->a[0], e = h->a[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && hbefore(h->a[c + 1], h->a[c])) c++;
        if (!hbefore(h->a[c], e)) break;
        h->a[i] = h->a[c];
        i = c;
    }
    if (h->n) h->a[i] = e;
    return top;
}

#define KEY(a, b) ((uint64_t)(uint32_t)(a) << 32 | (uint32_t)(b))

// Adds `delta` weighted occurrences of every adjacent pair of word w; with new_sym >= 0, records w
// in the where-list of pairs containing new_sym and collects them into `touched` (once per step).
static int word_pairs(pairs *P, const int32_t *s, uint32_t n, int32_t w, int64_t delta,
                      int32_t new_sym, int32_t step, ivec *touched) {
    for (uint32_t i = 0; i + 1 < n; i++) {
        int32_t pi = pair_get(P, KEY(s[i], s[i + 1]));
        if (pi < 0) return 0;
        P->count[pi] += delta;
        if (new_sym >= 0 && (s[i] == new_sym || s[i + 1] == new_sym)) {
            ivec *wl = &P->where[pi];
            if ((!wl->n || wl->v[wl->n - 1] != w) && !ivec_push(wl, w)) return 0;
            if (P->stamp[pi] != step) {
                P->stamp[pi] = step;
                if (!ivec_push(touched, pi)) return 0;
            }
        }
    }
    return 1;
}

td_status td_bpe_train(td_bpe_trainer *t, td_err *err) {
    if (t->trained) return td_err_set(err, TD_ERR_INVALID, "td_bpe_train called twice");
    t->trained = true;
    // Base symbols in code-point order of their bytes_to_unicode characters.
    int order[256], n = 0;
    for (int b = 0; b < 256; b++)
        if (printable_byte(b)) order[n++] = b;
    for (int b = 0; b < 256; b++)
        if (!printable_byte(b)) order[n++] = b;
    int32_t byte_id[256];
    for (int i = 0; i < 256; i++) {
        char c = (char)order[i];
        byte_id[order[i]] = add_symbol(t, &c, 1);
        if (byte_id[order[i]] < 0) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    // Words as symbol arrays.
    size_t total = 0;
    for (size_t w = 0; w < t->nwords; w++) total += t->wlen[w];
    t->syms = malloc((total ? total : 1) * sizeof *t->syms);
    t->soff = malloc((t->nwords + 1) * sizeof *t->soff);
    if (!t->syms || !t->soff) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    size_t at = 0;
    for (size_t w = 0; w < t->nwords; w++) {
        t->soff[w] = at;
        const unsigned char *b = (const unsigned char *)t->wbytes + t->woff[w];
        for (uint32_t i = 0; i < t->wlen[w]; i++) t->syms[at++] = byte_id[b[i]];
    }
    int nspecial = (t->p.bos != NULL) + (t->p.eos != NULL) + (t->p.pad != NULL) + t->p.n_special;
    int target = t->p.vocab_size - nspecial;  // symbols

    pairs P = {0};
    heap H = {0};
    ivec touched = {0};
    td_status st = TD_OK;
    for (size_t w = 0; w < t->nwords && !st; w++) {
        const int32_t *s = t->syms + t->soff[w];
        for (uint32_t i = 0; i + 1 < t->wlen[w]; i++) {
            int32_t pi = pair_get(&P, KEY(s[i], s[i + 1]));
            if (pi < 0 || ((!P.where[pi].n || P.where[pi].v[P.where[pi].n - 1] != (int32_t)w) &&
                           !ivec_push(&P.where[pi], (int32_t)w))) {
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
                break;
            }
            P.count[pi] += t->wcount[w];
        }
    }
    for (int32_t i = 0; i < P.n && !st; i++)
        if (P.count[i] > 0 && !heap_push(&H, (hent){P.count[i], P.pkey[i]}))
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
    int64_t min_freq = t->p.min_frequency > 0 ? t->p.min_frequency : 1;
    int32_t step = 0;
    while (!st && t->nsym < target && H.n) {
        hent e = heap_pop(&H);
        int32_t pi = pair_get(&P, e.key);
        if (pi < 0) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            break;
        }
        if (P.count[pi] != e.count) {  // stale entry: re-queue with the current count
            if (P.count[pi] > 0 && P.count[pi] < e.count &&
                !heap_push(&H, (hent){P.count[pi], e.key}))
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            continue;
        }
        if (e.count < min_freq) break;
        int32_t A = (int32_t)(e.key >> 32), B = (int32_t)(uint32_t)e.key;
        // The new symbol's bytes; reuse an existing symbol with the same bytes.
        size_t la = t->sym_len[A], lb = t->sym_len[B];
        char *buf = malloc(la + lb);
        if (!buf) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            break;
        }
        memcpy(buf, t->sbytes + t->sym_off[A], la);
        memcpy(buf + la, t->sbytes + t->sym_off[B], lb);
        size_t pos = strmap_find(&t->symmap, t, sym_key, buf, la + lb, hash_bytes(buf, la + lb));
        int32_t Z =
            t->symmap.slot[pos] ? (int32_t)t->symmap.slot[pos] - 1 : add_symbol(t, buf, la + lb);
        free(buf);
        if (Z >= 0 && t->nmerges == t->merge_cap) {
            int cap = t->merge_cap ? t->merge_cap * 2 : 1024;
            int32_t(*nm)[2] = realloc(t->merges, (size_t)cap * sizeof *nm);
            if (nm) {
                t->merges = nm;
                t->merge_cap = cap;
            }
        }
        if (Z < 0 || t->nmerges == t->merge_cap) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            break;
        }
        t->merges[t->nmerges][0] = A;
        t->merges[t->nmerges][1] = B;
        t->nmerges++;
        step++;
        touched.n = 0;
        // Apply to every word that had the pair; the where-list is detached since it is done.
        ivec wl = P.where[pi];
        P.where[pi] = (ivec){0};
        for (int32_t k = 0; k < wl.n && !st; k++) {
            int32_t w = wl.v[k];
            int32_t *s = t->syms + t->soff[w];
            uint32_t len = t->wlen[w], i = 0;
            while (i + 1 < len && !(s[i] == A && s[i + 1] == B)) i++;
            if (i + 1 >= len) continue;  // no longer holds the pair (or a duplicate entry)
            if (!word_pairs(&P, s, len, w, -t->wcount[w], -1, step, &touched)) {
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
                break;
            }
            uint32_t o = 0;
            for (i = 0; i < len;) {
                if (i + 1 < len && s[i] == A && s[i + 1] == B) {
                    s[o++] = Z;
                    i += 2;
                } else {
                    s[o++] = s[i++];
                }
            }
            t->wlen[w] = o;
            if (!word_pairs(&P, s, o, w, t->wcount[w], Z, step, &touched))
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        }
        free(wl.v);
        for (int32_t k = 0; k < touched.n && !st; k++) {
            int32_t q = touched.v[k];
            if (P.count[q] > 0 && !heap_push(&H, (hent){P.count[q], P.pkey[q]}))
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        }
    }
    pairs_free(&P);
    free(H.a);
    free(touched.v);
    return st;
}

int td_bpe_vocab_size(const td_bpe_trainer *t) {
    return t->nsym + (t->p.bos != NULL) + (t->p.eos != NULL) + (t->p.pad != NULL) + t->p.n_special;
}
int td_bpe_merge_count(const td_bpe_trainer *t) { return t->nmerges; }
size_t td_bpe_word_count(const td_bpe_trainer *t) { return t->nwords; }

// ---- output ----

// Symbol id -> its bytes_to_unicode spelling (UTF-8, NUL-terminated) in out (cap >= 2*len+1).
static void spell(const td_bpe_trainer *t, int32_t id, char *out) {
    const unsigned char *b = (const unsigned char *)t->sbytes + t->sym_off[id];
    size_t o = 0;
    for (uint32_t i = 0; i < t->sym_len[id]; i++) {
        int cp = byte_cp(b[i]);
        if (cp < 0x80) {
            out[o++] = (char)cp;
        } else {
            out[o++] = (char)(0xC0 | cp >> 6);
            out[o++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    out[o] = 0;
}

static td_status write_text(const char *dir, const char *name, const char *text, td_err *err) {
    char p[TD_AFILE_PATH_MAX];
    if (!td_path_join(p, sizeof p, dir, name))
        return td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
    td_afile f;
    td_status st = td_afile_open(&f, p, err);
    if (st) return st;
    st = td_afile_write(&f, text, strlen(text), err);
    if (!st) st = td_afile_write(&f, "\n", 1, err);
    if (st) {
        td_afile_abort(&f);
        return st;
    }
    return td_afile_commit(&f, err);
}

static cJSON *special_ref(const char *tok) {
    cJSON *o = cJSON_CreateObject(), *in = cJSON_CreateObject();
    cJSON_AddStringToObject(in, "id", tok);
    cJSON_AddNumberToObject(in, "type_id", 0);
    cJSON_AddItemToObject(o, "SpecialToken", in);
    return o;
}

static cJSON *seq_ref(const char *which, int type_id) {
    cJSON *o = cJSON_CreateObject(), *in = cJSON_CreateObject();
    cJSON_AddStringToObject(in, "id", which);
    cJSON_AddNumberToObject(in, "type_id", type_id);
    cJSON_AddItemToObject(o, "Sequence", in);
    return o;
}

// A minimal chat template: "role: content<eos>\n" per message, bos first if defined.
static const char *CHAT_TEMPLATE =
    "{% if bos_token %}{{ bos_token }}{% endif %}{% for message in messages %}"
    "{{ message['role'] + ': ' + message['content'] }}{% if eos_token %}{{ eos_token }}{% endif "
    "%}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}";

td_status td_bpe_write(const td_bpe_trainer *t, const char *dir, td_err *err) {
    if (!t->trained) return td_err_set(err, TD_ERR_INVALID, "td_bpe_write before td_bpe_train");
    if (!td_is_dir(dir) && mkdir(dir, 0755) != 0 && errno != EEXIST)
        return td_err_set(err, TD_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    const char *specials[TD_BPE_MAX_SPECIAL + 3];
    int ns = 0;
    if (t->p.bos) specials[ns++] = t->p.bos;
    if (t->p.eos) specials[ns++] = t->p.eos;
    if (t->p.pad) specials[ns++] = t->p.pad;
    for (int i = 0; i < t->p.n_special; i++) specials[ns++] = t->p.special[i];
    uint32_t maxlen = 1;
    for (int i = 0; i < t->nsym; i++)
        if (t->sym_len[i] > maxlen) maxlen = t->sym_len[i];
    char *sa = malloc(4 * (size_t)maxlen + 4), *sb = malloc(2 * (size_t)maxlen + 1);
    cJSON *root = cJSON_CreateObject();
    if (!sa || !sb || !root) {
        free(sa);
        free(sb);
        cJSON_Delete(root);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    for (int i = 0; i < ns; i++) {
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "id", t->nsym + i);
        cJSON_AddStringToObject(a, "content", specials[i]);
        cJSON_AddFalseToObject(a, "single_word");
        cJSON_AddFalseToObject(a, "lstrip");
        cJSON_AddFalseToObject(a, "rstrip");
        cJSON_AddFalseToObject(a, "normalized");
        cJSON_AddTrueToObject(a, "special");
        cJSON_AddItemToArray(added, a);
    }
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *pres = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON *split = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", t->p.pattern);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddFalseToObject(split, "invert");
    cJSON_AddItemToArray(pres, split);
    cJSON *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "add_prefix_space");
    cJSON_AddTrueToObject(bl, "trim_offsets");
    cJSON_AddFalseToObject(bl, "use_regex");
    cJSON_AddItemToArray(pres, bl);
    cJSON *post = cJSON_AddObjectToObject(root, "post_processor");
    if (t->p.add_bos) {
        cJSON_AddStringToObject(post, "type", "TemplateProcessing");
        cJSON *single = cJSON_AddArrayToObject(post, "single");
        cJSON_AddItemToArray(single, special_ref(t->p.bos));
        cJSON_AddItemToArray(single, seq_ref("A", 0));
        cJSON *pair = cJSON_AddArrayToObject(post, "pair");
        cJSON_AddItemToArray(pair, special_ref(t->p.bos));
        cJSON_AddItemToArray(pair, seq_ref("A", 0));
        cJSON_AddItemToArray(pair, special_ref(t->p.bos));
        cJSON_AddItemToArray(pair, seq_ref("B", 1));
        cJSON *sp = cJSON_AddObjectToObject(post, "special_tokens");
        cJSON *b = cJSON_AddObjectToObject(sp, t->p.bos);
        cJSON_AddStringToObject(b, "id", t->p.bos);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "ids"), cJSON_CreateNumber(t->nsym));
        cJSON_AddItemToArray(cJSON_AddArrayToObject(b, "tokens"), cJSON_CreateString(t->p.bos));
    } else {
        cJSON_AddStringToObject(post, "type", "ByteLevel");
        cJSON_AddTrueToObject(post, "add_prefix_space");
        cJSON_AddFalseToObject(post, "trim_offsets");
        cJSON_AddTrueToObject(post, "use_regex");
    }
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddTrueToObject(dec, "add_prefix_space");
    cJSON_AddTrueToObject(dec, "trim_offsets");
    cJSON_AddTrueToObject(dec, "use_regex");
    cJSON *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddFalseToObject(model, "fuse_unk");
    cJSON_AddFalseToObject(model, "byte_fallback");
    cJSON_AddFalseToObject(model, "ignore_merges");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    // Appending through cJSON_AddItemToObject walks the list; keep a tail pointer instead.
    cJSON *tail = NULL;
    for (int i = 0; i < t->nsym; i++) {
        spell(t, i, sa);
        cJSON *num = cJSON_CreateNumber(i);
        num->string = strdup(sa);
        if (!tail) {
            vocab->child = num;
        } else {
            tail->next = num;
            num->prev = tail;
        }
        vocab->child->prev = num;
        tail = num;
    }
    cJSON *merges = cJSON_AddArrayToObject(model, "merges");
    tail = NULL;
    for (int i = 0; i < t->nmerges; i++) {
        spell(t, t->merges[i][0], sa);
        spell(t, t->merges[i][1], sb);
        strcat(sa, " ");
        strcat(sa, sb);
        cJSON *s = cJSON_CreateString(sa);
        if (!tail) {
            merges->child = s;
        } else {
            tail->next = s;
            s->prev = tail;
        }
        merges->child->prev = s;
        tail = s;
    }
    free(sa);
    free(sb);
    char *json = cJSON_Print(root);
    cJSON_Delete(root);
    if (!json) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_status st = write_text(dir, "tokenizer.json", json, err);
    free(json);
    if (st) return st;

    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    if (t->p.bos) cJSON_AddStringToObject(cfg, "bos_token", t->p.bos);
    if (t->p.eos) cJSON_AddStringToObject(cfg, "eos_token", t->p.eos);
    if (t->p.pad) cJSON_AddStringToObject(cfg, "pad_token", t->p.pad);
    cJSON_AddBoolToObject(cfg, "add_bos_token", t->p.add_bos);
    cJSON_AddFalseToObject(cfg, "add_eos_token");
    cJSON_AddFalseToObject(cfg, "clean_up_tokenization_spaces");
    cJSON_AddNumberToObject(cfg, "model_max_length", t->p.model_max_length);
    cJSON_AddStringToObject(cfg, "chat_template", CHAT_TEMPLATE);
    json = cJSON_Print(cfg);
    cJSON_Delete(cfg);
    if (!json) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    st = write_text(dir, "tokenizer_config.json", json, err);
    free(json);
    return st;
}
