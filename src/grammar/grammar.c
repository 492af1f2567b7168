// GBNF parser and compiler, the byte-level pushdown matcher, the per-position token tables and
// the per-state mask cache, the vocabulary walk that computes both, and the LRU of compiled
// grammars. Not here: the GBNF writers
// (gbnf_json.c, gbnf_regex.c).
//
// Compiled form (as llama.cpp's): every rule is a list of alternatives, each a run of elements in
// one flat array ended by END; an element is END, REF(rule) or BYTES(set of 256 bytes). Characters
// are lowered to UTF-8 at compile time (a non-ASCII class becomes a rule whose alternatives are byte
// sequences), so the matcher and the vocabulary walk see bytes only. A parse stack holds element
// positions: the top is the BYTES element to match next, the rest are return positions; a state is
// the deduplicated set of stacks. A REF whose return position is END pushes nothing (tail call), so
// repetitions, written as right recursion, do not grow the stacks.
#define _GNU_SOURCE
#include "grammar/grammar.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tokenizer/tokenizer.h"

enum { GE_END = 0, GE_REF = 1, GE_BYTES = 2 };
#define EL(t, a) ((uint32_t)(a) << 2 | (uint32_t)(t))
#define EL_T(e) ((e) & 3u)
#define EL_A(e) ((e) >> 2)

#define GM_MAX_STACKS 256   // stacks in one state
#define GM_MAX_DEPTH 128    // frames in one stack
#define GM_LEVEL_WORDS 8192 // frames in one state, all stacks together
#define GM_MASK_CAP 256     // masks cached per grammar
#define GM_MAX_REPEAT 4096  // the largest {m,n} bound
#define GM_MAX_ELEMS (1 << 22)
#define GM_POS_BUDGET (64u << 20)  // bytes of position tables per grammar; past it, the full walk

// ---------------------------------------------------------------------------------------------
// Grammar

typedef struct mentry {
    uint64_t key, tick;
    const td_gvocab *v;
    uint32_t *state;  // [n_state] the canonical state, to confirm a hash match
    int n_state, cap_state;
    uint32_t *mask;   // [mask words]
} mentry;

// The tokens of one grammar position decided by the top frames of a stack alone (XGrammar's
// adaptive token mask cache, with the context taken deeper where one frame decides too little):
// a table is keyed by the top k frames (k <= GM_KEY_MAX; the top is the BYTES element to match).
// `acc` are accepted whatever lies below (they never leave those frames, or leave them on their
// last byte); `unc` (context-dependent) leave them with bytes to go and must be walked from the
// real stacks (or are rejected where the k frames are the whole stack); every other token is
// rejected whatever lies below. Built once per key and vocabulary, on the first mask needing it.
#define GM_KEY_MAX 8      // frames in a table's key
#define GM_UNC_DEEPEN 2048  // a table with more context-dependent tokens than this: key one frame deeper
typedef struct gpos {
    int state;        // 1: built; -1: not tabulated (overflow, budget): use the full walk
    uint32_t *acc;    // [words] bitmap when n_acc > words, else NULL
    int32_t *acc_id;  // [n_acc] ids when acc is NULL
    int n_acc;
    int32_t *unc;     // [n_unc] indices into the vocabulary's sorted order, ascending
    uint16_t *unc_lcp;  // [n_unc] common prefix with the previous entry (bytes)
    int n_unc;
} gpos;

typedef struct gkey {
    uint64_t h;  // 0: empty slot
    int k;
    uint32_t fr[GM_KEY_MAX];  // the top k frames, bottom first
    gpos *P;
} gkey;

struct td_grammar {
    int refs;  // atomic
    uint32_t *el;  // [n_el] flat alternatives, each ended by END
    int n_el;
    int32_t *alt;  // [n_alt] start of each alternative
    int32_t *rule_alt0, *rule_nalt;  // [n_rules]
    int n_rules, n_alt;
    uint32_t (*sets)[8];  // [n_sets] 256-bit byte sets
    int n_sets;
    int root;
    bool *nullable;  // [n_rules] can match nothing
    // mask cache: used by the matcher thread only
    mentry *mc;  // [GM_MASK_CAP]
    int n_mc;
    uint64_t tick;
    // position tables: used by the matcher thread only, for one vocabulary at a time
    gkey *pos;  // [cap_pos] open-addressed tables by key, or NULL
    int n_pos, cap_pos;
    const td_gvocab *pos_v;
    size_t pos_bytes;
    td_grammar_stats st;
};

static void pos_drop(td_grammar *g) {
    for (int i = 0; i < g->cap_pos; i++) {
        gpos *P = g->pos[i].P;
        if (P) free(P->acc), free(P->acc_id), free(P->unc), free(P->unc_lcp), free(P);
    }
    free(g->pos);
    g->pos = NULL, g->n_pos = g->cap_pos = 0, g->pos_v = NULL, g->pos_bytes = 0;
}

void td_grammar_ref(td_grammar *g) { __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED); }

void td_grammar_unref(td_grammar *g) {
    if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
    for (int i = 0; i < g->n_mc; i++) free(g->mc[i].state), free(g->mc[i].mask);
    free(g->mc);
    pos_drop(g);
    free(g->el), free(g->alt), free(g->rule_alt0), free(g->rule_nalt), free(g->sets), free(g->nullable);
    free(g);
}

void td_grammar_stats_get(const td_grammar *g, td_grammar_stats *out) {
    *out = g->st;
    out->n_cached = g->n_mc;
    out->n_rules = g->n_rules;
    out->n_elems = g->n_el;
}

// ---------------------------------------------------------------------------------------------
// Parser

typedef struct u32v {
    uint32_t *v;
    int n, cap;
} u32v;

static bool u32v_push(u32v *a, uint32_t x) {
    if (a->n == a->cap) {
        int nc = a->cap ? a->cap * 2 : 16;
        uint32_t *nv = realloc(a->v, (size_t)nc * sizeof *nv);
        if (!nv) return false;
        a->v = nv, a->cap = nc;
    }
    a->v[a->n++] = x;
    return true;
}

typedef struct brule {
    char *name;  // NULL for generated rules
    u32v body;   // alternatives, each ended by END
    bool defined;
    int line, col;  // definition, or first reference while undefined
} brule;

typedef struct parser {
    const char *s, *p, *end;
    td_err *err;
    bool failed;
    brule *r;
    int n_r, cap_r;
    uint32_t (*sets)[8];
    int n_sets, cap_sets;
    int total;  // elements emitted, for the cap
} parser;

typedef struct cprange {
    uint32_t lo, hi;
} cprange;

static void pos_of(const parser *ps, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *q = ps->s; q < at && q < ps->end; q++) {
        if (*q == '\n')
            (*line)++, *col = 1;
        else
            (*col)++;
    }
}

__attribute__((format(printf, 3, 4))) static bool perr(parser *ps, const char *at, const char *fmt, ...) {
    if (ps->failed) return false;
    ps->failed = true;
    int line, col;
    pos_of(ps, at, &line, &col);
    char msg[TD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td_err_set(ps->err, TD_ERR_INVALID, "grammar: %d:%d: %s", line, col, msg);
    return false;
}

static bool oom(parser *ps) {
    if (!ps->failed) td_err_set(ps->err, TD_ERR_NOMEM, "grammar: out of memory");
    ps->failed = true;
    return false;
}

static int new_rule(parser *ps, const char *name, size_t nlen) {
    if (ps->n_r == ps->cap_r) {
        int nc = ps->cap_r ? ps->cap_r * 2 : 32;
        brule *nr = realloc(ps->r, (size_t)nc * sizeof *nr);
        if (!nr) return oom(ps), -1;
        ps->r = nr, ps->cap_r = nc;
    }
    brule *r = &ps->r[ps->n_r];
    memset(r, 0, sizeof *r);
    if (name) {
        r->name = strndup(name, nlen);
        if (!r->name) return oom(ps), -1;
    }
    return ps->n_r++;
}

static int rule_by_name(parser *ps, const char *name, size_t nlen, const char *at) {
    for (int i = 0; i < ps->n_r; i++)
        if (ps->r[i].name && strlen(ps->r[i].name) == nlen && !memcmp(ps->r[i].name, name, nlen)) return i;
    int id = new_rule(ps, name, nlen);
    if (id >= 0) pos_of(ps, at, &ps->r[id].line, &ps->r[id].col);
    return id;
}

static bool emit(parser *ps, int rule, uint32_t e) {
    if (++ps->total > GM_MAX_ELEMS) return perr(ps, ps->p, "grammar too large (more than %d elements)", GM_MAX_ELEMS);
    return u32v_push(&ps->r[rule].body, e) || oom(ps);
}

static int set_id(parser *ps, const uint32_t bits[8]) {
    for (int i = 0; i < ps->n_sets; i++)
        if (!memcmp(ps->sets[i], bits, 32)) return i;
    if (ps->n_sets == ps->cap_sets) {
        int nc = ps->cap_sets ? ps->cap_sets * 2 : 64;
        void *ns = realloc(ps->sets, (size_t)nc * 32);
        if (!ns) return oom(ps), -1;
        ps->sets = ns, ps->cap_sets = nc;
    }
    memcpy(ps->sets[ps->n_sets], bits, 32);
    return ps->n_sets++;
}

static bool emit_byte_range(parser *ps, int rule, uint32_t lo, uint32_t hi) {
    uint32_t bits[8] = {0};
    for (uint32_t b = lo; b <= hi; b++) bits[b >> 5] |= 1u << (b & 31);
    int id = set_id(ps, bits);
    return id >= 0 && emit(ps, rule, EL(GE_BYTES, id));
}

static int utf8_enc(uint32_t cp, uint8_t *o) {
    if (cp < 0x80) return o[0] = (uint8_t)cp, 1;
    if (cp < 0x800) return o[0] = (uint8_t)(0xC0 | cp >> 6), o[1] = (uint8_t)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000)
        return o[0] = (uint8_t)(0xE0 | cp >> 12), o[1] = (uint8_t)(0x80 | (cp >> 6 & 63)),
               o[2] = (uint8_t)(0x80 | (cp & 63)), 3;
    o[0] = (uint8_t)(0xF0 | cp >> 18), o[1] = (uint8_t)(0x80 | (cp >> 12 & 63));
    o[2] = (uint8_t)(0x80 | (cp >> 6 & 63)), o[3] = (uint8_t)(0x80 | (cp & 63));
    return 4;
}

// Emits into `rule` one alternative per UTF-8 byte-range sequence covering [lo, hi] (same encoded
// length; no surrogates), each ended by END: the split of RE2 / Rust's utf8-ranges.
static bool utf8_seqs(parser *ps, int rule, uint32_t lo, uint32_t hi) {
    static const uint32_t lens[] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo > hi) return true;
    if (lo <= 0xDFFF && hi >= 0xD800)  // surrogates are not characters
        return (lo >= 0xD800 || utf8_seqs(ps, rule, lo, 0xD7FF)) && (hi <= 0xDFFF || utf8_seqs(ps, rule, 0xE000, hi));
    for (int i = 0; i < 3; i++)
        if (lo <= lens[i] && hi > lens[i]) return utf8_seqs(ps, rule, lo, lens[i]) && utf8_seqs(ps, rule, lens[i] + 1, hi);
    if (hi < 0x80) return emit_byte_range(ps, rule, lo, hi) && emit(ps, rule, EL(GE_END, 0));
    for (int i = 1; i < 4; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) return utf8_seqs(ps, rule, lo, lo | m) && utf8_seqs(ps, rule, (lo | m) + 1, hi);
            if ((hi & m) != m) return utf8_seqs(ps, rule, lo, (hi & ~m) - 1) && utf8_seqs(ps, rule, hi & ~m, hi);
        }
    }
    uint8_t a[4], b[4];
    int n = utf8_enc(lo, a);
    utf8_enc(hi, b);
    for (int k = 0; k < n; k++)
        if (!emit_byte_range(ps, rule, a[k], b[k])) return false;
    return emit(ps, rule, EL(GE_END, 0));
}

static int cmp_range(const void *a, const void *b) {
    const cprange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

// Emits into `rule` (current alternative) one element matching one character of the ranges
// (sorted, merged here; negated over all of Unicode first when neg).
static bool emit_class(parser *ps, int rule, cprange *rg, int n, bool neg, const char *at) {
    qsort(rg, (size_t)n, sizeof *rg, cmp_range);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && rg[i].lo <= rg[m - 1].hi + 1) {
            if (rg[i].hi > rg[m - 1].hi) rg[m - 1].hi = rg[i].hi;
        } else {
            rg[m++] = rg[i];
        }
    }
    cprange tmp[258];
    if (neg) {
        int k = 0;
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (rg[i].lo > next) tmp[k++] = (cprange){next, rg[i].lo - 1};
            next = rg[i].hi + 1;
        }
        if (next <= 0x10FFFF) tmp[k++] = (cprange){next, 0x10FFFF};
        memcpy(rg, tmp, (size_t)k * sizeof *rg);
        m = k;
    }
    if (m == 0) return perr(ps, at, "character class matches no character");
    if (rg[m - 1].hi < 0x80) {  // ASCII only: one byte set
        uint32_t bits[8] = {0};
        for (int i = 0; i < m; i++)
            for (uint32_t b = rg[i].lo; b <= rg[i].hi; b++) bits[b >> 5] |= 1u << (b & 31);
        int id = set_id(ps, bits);
        return id >= 0 && emit(ps, rule, EL(GE_BYTES, id));
    }
    int sub = new_rule(ps, NULL, 0);
    if (sub < 0) return false;
    ps->r[sub].defined = true;
    uint32_t ascii[8] = {0};
    bool any_ascii = false;
    for (int i = 0; i < m; i++) {
        uint32_t lo = rg[i].lo, hi = rg[i].hi;
        for (; lo <= hi && lo < 0x80; lo++) ascii[lo >> 5] |= 1u << (lo & 31), any_ascii = true;
        if (lo <= hi && !utf8_seqs(ps, sub, lo, hi)) return false;
    }
    if (any_ascii) {
        int id = set_id(ps, ascii);
        if (id < 0 || !emit(ps, sub, EL(GE_BYTES, id)) || !emit(ps, sub, EL(GE_END, 0))) return false;
    }
    return emit(ps, rule, EL(GE_REF, sub));
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

// Skips blanks and comments; newlines too when `nl`.
static void skip_ws(parser *ps, bool nl) {
    while (ps->p < ps->end) {
        char c = *ps->p;
        if (c == ' ' || c == '\t' || c == '\r' || (nl && c == '\n')) {
            ps->p++;
        } else if (c == '#') {
            while (ps->p < ps->end && *ps->p != '\n') ps->p++;
        } else {
            break;
        }
    }
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

// One (possibly escaped) character of a literal or class, as a code point; -1 on error.
static int64_t parse_char(parser *ps) {
    const char *at = ps->p;
    if (ps->p >= ps->end) return perr(ps, at, "unexpected end of grammar"), -1;
    unsigned char c = (unsigned char)*ps->p;
    if (c == '\\') {
        ps->p++;
        if (ps->p >= ps->end) return perr(ps, at, "unexpected end after '\\'"), -1;
        char e = *ps->p++;
        int nh = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
        if (nh) {
            uint32_t v = 0;
            for (int i = 0; i < nh; i++) {
                int h = ps->p < ps->end ? hexval(*ps->p) : -1;
                if (h < 0) return perr(ps, at, "escape \\%c needs %d hex digits", e, nh), -1;
                v = v * 16 + (uint32_t)h, ps->p++;
            }
            if (v > 0x10FFFF) return perr(ps, at, "code point U+%X is out of range", v), -1;
            return v;
        }
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '[': case ']': case '-': case '^': case '\'': return (unsigned char)e;
        default: return perr(ps, at, "unknown escape '\\%c'", e), -1;
        }
    }
    // UTF-8 decode (the grammar text itself is UTF-8)
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!n || ps->p + n > ps->end) return perr(ps, at, "invalid UTF-8 in grammar"), -1;
    uint32_t v = n == 1 ? c : n == 2 ? c & 31 : n == 3 ? c & 15 : c & 7;
    for (int i = 1; i < n; i++) {
        unsigned char k = (unsigned char)ps->p[i];
        if ((k & 0xC0) != 0x80) return perr(ps, at, "invalid UTF-8 in grammar"), -1;
        v = v << 6 | (k & 63);
    }
    ps->p += n;
    return v;
}

static bool parse_alts(parser *ps, int rule, bool nested, int depth);

// Applies a repetition operator to the item at body[start, n) of `rule`.
static bool repeat(parser *ps, int rule, int start, int lo, int hi /* -1: unbounded */) {
    int n = ps->r[rule].body.n, len = n - start;
    uint32_t *item = malloc((size_t)(len ? len : 1) * sizeof *item);
    if (!item) return oom(ps);
    memcpy(item, ps->r[rule].body.v + start, (size_t)len * sizeof *item);
    ps->r[rule].body.n = start;
    bool ok = true;
    for (int k = 0; k < lo && ok; k++)
        for (int i = 0; i < len && ok; i++) ok = emit(ps, rule, item[i]);
    if (ok && hi < 0) {  // R ::= item R | ""
        int r = new_rule(ps, NULL, 0);
        ok = r >= 0;
        if (ok) {
            ps->r[r].defined = true;
            for (int i = 0; i < len && ok; i++) ok = emit(ps, r, item[i]);
            ok = ok && emit(ps, r, EL(GE_REF, r)) && emit(ps, r, EL(GE_END, 0)) && emit(ps, r, EL(GE_END, 0)) &&
                 emit(ps, rule, EL(GE_REF, r));
        }
    } else if (ok && hi > lo) {  // O_k ::= item O_{k+1} | "", innermost first
        int next = -1;
        for (int k = hi - lo; k > 0 && ok; k--) {
            int r = new_rule(ps, NULL, 0);
            ok = r >= 0;
            if (!ok) break;
            ps->r[r].defined = true;
            for (int i = 0; i < len && ok; i++) ok = emit(ps, r, item[i]);
            if (ok && next >= 0) ok = emit(ps, r, EL(GE_REF, next));
            ok = ok && emit(ps, r, EL(GE_END, 0)) && emit(ps, r, EL(GE_END, 0));
            next = r;
        }
        if (ok) ok = emit(ps, rule, EL(GE_REF, next));
    }
    free(item);
    return ok;
}

static bool parse_int(parser *ps, int *v) {
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return false;
    long x = 0;
    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        x = x * 10 + (*ps->p++ - '0');
        if (x > GM_MAX_REPEAT) x = GM_MAX_REPEAT + 1;
    }
    *v = (int)x;
    return true;
}

// One sequence of items into the current alternative of `rule`.
static bool parse_seq(parser *ps, int rule, bool nested, int depth) {
    int last = -1;  // start of the last item in the body
    for (;;) {
        skip_ws(ps, nested);
        if (ps->p >= ps->end) return true;
        const char *at = ps->p;
        char c = *ps->p;
        int start = ps->r[rule].body.n;
        if (c == '"') {
            ps->p++;
            while (ps->p < ps->end && *ps->p != '"') {
                if (*ps->p == '\n') return perr(ps, at, "unterminated string literal");
                int64_t cp = parse_char(ps);
                if (cp < 0) return false;
                uint8_t u[4];
                int k = utf8_enc((uint32_t)cp, u);
                for (int i = 0; i < k; i++)
                    if (!emit_byte_range(ps, rule, u[i], u[i])) return false;
            }
            if (ps->p >= ps->end) return perr(ps, at, "unterminated string literal");
            ps->p++;
            last = start;
        } else if (c == '[') {
            ps->p++;
            bool neg = ps->p < ps->end && *ps->p == '^';
            if (neg) ps->p++;
            cprange rg[256];
            int n = 0;
            while (ps->p < ps->end && *ps->p != ']') {
                if (*ps->p == '\n') return perr(ps, at, "unterminated character class");
                int64_t lo = parse_char(ps), hi = lo;
                if (lo < 0) return false;
                if (ps->p + 1 < ps->end && *ps->p == '-' && ps->p[1] != ']') {
                    ps->p++;
                    hi = parse_char(ps);
                    if (hi < 0) return false;
                    if (hi < lo) return perr(ps, at, "character range is out of order");
                }
                if (n == 256) return perr(ps, at, "character class has more than 256 ranges");
                rg[n++] = (cprange){(uint32_t)lo, (uint32_t)hi};
            }
            if (ps->p >= ps->end) return perr(ps, at, "unterminated character class");
            ps->p++;
            if (!emit_class(ps, rule, rg, n, neg, at)) return false;
            last = start;
        } else if (c == '.') {
            ps->p++;
            cprange rg[1] = {{0, 0x10FFFF}};
            if (!emit_class(ps, rule, rg, 1, false, at)) return false;
            last = start;
        } else if (c == '(') {
            ps->p++;
            if (depth > 64) return perr(ps, at, "groups nested too deeply");
            int sub = new_rule(ps, NULL, 0);
            if (sub < 0) return false;
            ps->r[sub].defined = true;
            if (!parse_alts(ps, sub, true, depth + 1)) return false;
            skip_ws(ps, true);
            if (ps->p >= ps->end || *ps->p != ')') return perr(ps, at, "expected ')' to close this group");
            ps->p++;
            if (!emit(ps, rule, EL(GE_REF, sub))) return false;
            last = start;
        } else if (is_word(c)) {
            const char *nm = ps->p;
            while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
            size_t nl = (size_t)(ps->p - nm);
            // A name followed by ::= starts the next rule: the sequence ends before it.
            const char *q = ps->p;
            while (q < ps->end && (*q == ' ' || *q == '\t')) q++;
            if (q + 3 <= ps->end && !memcmp(q, "::=", 3)) {
                if (nested) return perr(ps, nm, "rule definition inside a group (missing ')'?)");
                ps->p = nm;
                return true;
            }
            int id = rule_by_name(ps, nm, nl, nm);
            if (id < 0 || !emit(ps, rule, EL(GE_REF, id))) return false;
            last = start;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (last < 0) return perr(ps, at, "'%c' has nothing to repeat", c);
            ps->p++;
            int lo = 0, hi = -1;
            if (c == '+') lo = 1;
            if (c == '?') hi = 1;
            if (c == '{') {
                skip_ws(ps, false);
                if (!parse_int(ps, &lo)) return perr(ps, at, "expected a number after '{'");
                hi = lo;
                skip_ws(ps, false);
                if (ps->p < ps->end && *ps->p == ',') {
                    ps->p++;
                    skip_ws(ps, false);
                    hi = -1;
                    if (ps->p < ps->end && *ps->p != '}' && !parse_int(ps, &hi))
                        return perr(ps, at, "expected a number or '}' in the repetition");
                }
                skip_ws(ps, false);
                if (ps->p >= ps->end || *ps->p != '}') return perr(ps, at, "expected '}' to close the repetition");
                ps->p++;
                if (lo > GM_MAX_REPEAT || hi > GM_MAX_REPEAT)
                    return perr(ps, at, "repetition bound above %d", GM_MAX_REPEAT);
                if (hi >= 0 && hi < lo) return perr(ps, at, "repetition {%d,%d} has max < min", lo, hi);
            }
            if (!repeat(ps, rule, last, lo, hi)) return false;
            last = -1;
        } else {
            return true;  // '|', ')', newline or an unexpected character: the caller decides
        }
    }
}

static bool parse_alts(parser *ps, int rule, bool nested, int depth) {
    for (;;) {
        if (!parse_seq(ps, rule, nested, depth) || !emit(ps, rule, EL(GE_END, 0))) return false;
        skip_ws(ps, nested);
        if (ps->p < ps->end && *ps->p == '|') {
            ps->p++;
            skip_ws(ps, true);
            continue;
        }
        return true;
    }
}

static bool parse_grammar(parser *ps) {
    for (;;) {
        skip_ws(ps, true);
        if (ps->p >= ps->end) return true;
        const char *at = ps->p;
        if (!is_word(*ps->p)) return perr(ps, at, "expected a rule name, found '%c'", *ps->p);
        const char *nm = ps->p;
        while (ps->p < ps->end && is_word(*ps->p)) ps->p++;
        size_t nl = (size_t)(ps->p - nm);
        skip_ws(ps, false);
        if (ps->p + 3 > ps->end || memcmp(ps->p, "::=", 3)) return perr(ps, ps->p, "expected '::=' after rule name");
        ps->p += 3;
        int id = rule_by_name(ps, nm, nl, nm);
        if (id < 0) return false;
        if (ps->r[id].defined) return perr(ps, at, "rule '%.*s' is defined twice", (int)nl, nm);
        ps->r[id].defined = true;
        pos_of(ps, nm, &ps->r[id].line, &ps->r[id].col);  // from now on: where it is defined
        if (!parse_alts(ps, id, false, 0)) return false;
        skip_ws(ps, false);
        if (ps->p < ps->end && *ps->p != '\n') {
            if (*ps->p == ')') return perr(ps, ps->p, "unbalanced ')'");
            return perr(ps, ps->p, "unexpected '%c'", *ps->p);
        }
    }
}

// Nullable rules (fixed point), then a depth-first search over "can start with" edges: a cycle is
// left recursion, which a top-down matcher cannot run (it would push forever).
static bool check_rules(parser *ps) {
    int n = ps->n_r;
    bool *nullable = calloc((size_t)n, 1);
    uint8_t *mark = calloc((size_t)n, 1);
    int *stk = malloc((size_t)n * 2 * sizeof *stk);
    if (!nullable || !mark || !stk) {
        free(nullable), free(mark), free(stk);
        return oom(ps);
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (int r = 0; r < n; r++) {
            if (nullable[r]) continue;
            const u32v *b = &ps->r[r].body;
            bool alt_null = true;
            for (int i = 0; i < b->n; i++) {
                uint32_t e = b->v[i];
                if (EL_T(e) == GE_END) {
                    if (alt_null) {
                        nullable[r] = changed = true;
                        break;
                    }
                    alt_null = true;
                } else if (EL_T(e) == GE_BYTES || !nullable[EL_A(e)]) {
                    alt_null = false;
                }
            }
        }
    }
    bool ok = true;
    // iterative DFS: mark 1 = on the path, 2 = done
    for (int s = 0; s < n && ok; s++) {
        if (mark[s]) continue;
        int sp = 0;
        stk[sp++] = s, stk[sp++] = 0;
        mark[s] = 1;
        while (sp && ok) {
            int r = stk[sp - 2], i = stk[sp - 1];
            const u32v *b = &ps->r[r].body;
            // advance i to the next left-edge REF of rule r
            bool at_start = true;
            int found = -1;
            for (int k = 0; k < b->n; k++) {
                uint32_t e = b->v[k];
                if (EL_T(e) == GE_END) {
                    at_start = true;
                    continue;
                }
                if (!at_start) continue;
                if (EL_T(e) == GE_REF && k >= i) {
                    found = k;
                    break;
                }
                if (EL_T(e) == GE_BYTES || !nullable[EL_A(e)]) at_start = false;
            }
            if (found < 0) {
                mark[r] = 2;
                sp -= 2;
                continue;
            }
            stk[sp - 1] = found + 1;
            int t = (int)EL_A(b->v[found]);
            if (mark[t] == 1) {
                // name the first named rule on the cycle (generated ones stand for groups and repetitions)
                int q0 = 0;
                while (q0 < sp && stk[q0] != t) q0 += 2;
                const char *nm = NULL;
                int line = 1, col = 1;
                for (int q = q0; q < sp && !nm; q += 2)
                    if (ps->r[stk[q]].name) nm = ps->r[stk[q]].name, line = ps->r[stk[q]].line, col = ps->r[stk[q]].col;
                char msg[200];
                snprintf(msg, sizeof msg, "rule '%s' is left-recursive or repeats something that can be empty",
                         nm ? nm : "?");
                td_err_set(ps->err, TD_ERR_INVALID, "grammar: %d:%d: %s", line, col, msg);
                ps->failed = true;
                ok = false;
            } else if (!mark[t]) {
                mark[t] = 1;
                stk[sp++] = t, stk[sp++] = 0;
            }
        }
    }
    free(nullable), free(mark), free(stk);
    return ok;
}

static void parser_free(parser *ps) {
    for (int i = 0; i < ps->n_r; i++) free(ps->r[i].name), free(ps->r[i].body.v);
    free(ps->r);
    free(ps->sets);
}

// Whether the elements from p to the end of their alternative can match nothing.
static bool seq_nullable(const td_grammar *g, uint32_t p) {
    for (;; p++) {
        uint32_t e = g->el[p];
        if (EL_T(e) == GE_END) return true;
        if (EL_T(e) == GE_BYTES || !g->nullable[EL_A(e)]) return false;
    }
}

td_grammar *td_grammar_compile(const char *text, size_t len, td_err *err) {
    if (!text) return td_err_set(err, TD_ERR_INVALID, "grammar: no text"), NULL;
    parser ps = {.s = text, .p = text, .end = text + len, .err = err};
    td_grammar *g = NULL;
    if (!parse_grammar(&ps)) goto out;
    int root = -1;
    for (int i = 0; i < ps.n_r; i++) {
        if (ps.r[i].name && !ps.r[i].defined) {
            td_err_set(err, TD_ERR_INVALID, "grammar: %d:%d: undefined rule '%s'", ps.r[i].line, ps.r[i].col,
                       ps.r[i].name);
            goto out;
        }
        if (ps.r[i].name && !strcmp(ps.r[i].name, "root")) root = i;
    }
    if (root < 0) {
        td_err_set(err, TD_ERR_INVALID, "grammar: no rule named 'root' (the start rule)");
        goto out;
    }
    if (!check_rules(&ps)) goto out;
    g = calloc(1, sizeof *g);
    if (!g) goto nomem;
    g->refs = 1;
    g->root = root;
    g->n_rules = ps.n_r;
    int n_el = 0, n_alt = 0;
    for (int i = 0; i < ps.n_r; i++) {
        n_el += ps.r[i].body.n;
        for (int k = 0; k < ps.r[i].body.n; k++) n_alt += EL_T(ps.r[i].body.v[k]) == GE_END;
    }
    g->el = malloc((size_t)(n_el + 1) * sizeof *g->el);
    g->alt = malloc((size_t)(n_alt + 1) * sizeof *g->alt);
    g->rule_alt0 = malloc((size_t)ps.n_r * sizeof *g->rule_alt0);
    g->rule_nalt = malloc((size_t)ps.n_r * sizeof *g->rule_nalt);
    g->sets = malloc((size_t)(ps.n_sets + 1) * 32);
    g->mc = calloc(GM_MASK_CAP, sizeof *g->mc);
    if (!g->el || !g->alt || !g->rule_alt0 || !g->rule_nalt || !g->sets || !g->mc) goto nomem;
    if (ps.n_sets) memcpy(g->sets, ps.sets, (size_t)ps.n_sets * 32);
    g->n_sets = ps.n_sets;
    for (int i = 0; i < ps.n_r; i++) {
        g->rule_alt0[i] = g->n_alt;
        int start = g->n_el;
        for (int k = 0; k < ps.r[i].body.n; k++) {
            uint32_t e = ps.r[i].body.v[k];
            g->el[g->n_el++] = e;
            if (EL_T(e) == GE_END) g->alt[g->n_alt++] = start, start = g->n_el;
        }
        g->rule_nalt[i] = g->n_alt - g->rule_alt0[i];
    }
    g->el[g->n_el] = EL(GE_END, 0);  // sentinel: a return position never runs off the array
    g->nullable = calloc((size_t)g->n_rules, 1);
    if (!g->nullable) goto nomem;
    for (bool changed = true; changed;) {  // fixed point: a rule is nullable if an alternative is
        changed = false;
        for (int r = 0; r < g->n_rules; r++)
            for (int a = 0; a < g->rule_nalt[r] && !g->nullable[r]; a++)
                if (seq_nullable(g, (uint32_t)g->alt[g->rule_alt0[r] + a])) g->nullable[r] = true, changed = true;
    }
    parser_free(&ps);
    return g;
nomem:
    td_err_set(err, TD_ERR_NOMEM, "grammar: out of memory");
out:
    if (g) g->refs = 1, td_grammar_unref(g);
    parser_free(&ps);
    return NULL;
}

// ---------------------------------------------------------------------------------------------
// States: sets of parse stacks

typedef struct level {
    uint32_t *w;    // [GM_LEVEL_WORDS] frames, stack after stack (bottom first)
    uint32_t *off;  // [GM_MAX_STACKS + 1]
    uint64_t *h;    // [GM_MAX_STACKS]
    int n, nw;
    bool overflow;
} level;

static bool level_init(level *L) {
    L->w = malloc(GM_LEVEL_WORDS * sizeof *L->w);
    L->off = malloc((GM_MAX_STACKS + 1) * sizeof *L->off);
    L->h = malloc(GM_MAX_STACKS * sizeof *L->h);
    L->n = L->nw = 0;
    L->overflow = false;
    if (L->off) L->off[0] = 0;
    return L->w && L->off && L->h;
}

static void level_free(level *L) { free(L->w), free(L->off), free(L->h); }

static void level_clear(level *L) { L->n = L->nw = 0, L->off[0] = 0, L->overflow = false; }

static uint64_t hash_words(const uint32_t *w, int n) {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    for (int i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xFF51AFD7ED558CCDull;
        h ^= h >> 29;
    }
    return h;
}

static void level_add(level *L, const uint32_t *st, int d) {
    uint64_t h = hash_words(st, d);
    for (int i = 0; i < L->n; i++)
        if (L->h[i] == h && (int)(L->off[i + 1] - L->off[i]) == d && !memcmp(L->w + L->off[i], st, (size_t)d * 4))
            return;
    if (L->n == GM_MAX_STACKS || L->nw + d > GM_LEVEL_WORDS) {
        L->overflow = true;
        return;
    }
    memcpy(L->w + L->nw, st, (size_t)d * 4);
    L->nw += d;
    L->h[L->n] = h;
    L->off[++L->n] = (uint32_t)L->nw;
}

// Adds stack st[0, d) to L after expanding its top until it is a BYTES element (or the stack is
// empty: a complete match). st is scratch of GM_MAX_DEPTH words that this call may overwrite.
static void expand(const td_grammar *g, uint32_t *st, int d, level *L) {
    while (d > 0 && EL_T(g->el[st[d - 1]]) == GE_END) d--;  // finished alternatives return
    if (d == 0 || EL_T(g->el[st[d - 1]]) == GE_BYTES) {
        level_add(L, st, d);
        return;
    }
    uint32_t p = st[d - 1];
    int r = (int)EL_A(g->el[p]);
    int nd = d - 1;
    if (EL_T(g->el[p + 1]) != GE_END) st[nd++] = p + 1;  // return position (a tail call pushes none)
    if (nd >= GM_MAX_DEPTH) {
        L->overflow = true;
        return;
    }
    const int na = g->rule_nalt[r], a0 = g->rule_alt0[r];
    if (na == 1) {
        st[nd] = (uint32_t)g->alt[a0];
        expand(g, st, nd + 1, L);
        return;
    }
    uint32_t copy[GM_MAX_DEPTH];
    memcpy(copy, st, (size_t)nd * 4);
    for (int a = 0; a < na; a++) {
        if (a) memcpy(st, copy, (size_t)nd * 4);
        st[nd] = (uint32_t)g->alt[a0 + a];
        expand(g, st, nd + 1, L);
    }
}

static void level_start(const td_grammar *g, level *L) {
    level_clear(L);
    uint32_t st[GM_MAX_DEPTH];
    for (int a = 0; a < g->rule_nalt[g->root]; a++) {
        st[0] = (uint32_t)g->alt[g->rule_alt0[g->root] + a];
        expand(g, st, 1, L);
    }
}

// B = A advanced by byte c. Returns whether any stack survived.
static inline bool level_step(const td_grammar *g, const level *A, uint8_t c, level *B) {
    level_clear(B);
    uint32_t st[GM_MAX_DEPTH];
    for (int i = 0; i < A->n; i++) {
        int d = (int)(A->off[i + 1] - A->off[i]);
        if (d == 0) continue;
        const uint32_t *s = A->w + A->off[i];
        uint32_t top = s[d - 1];
        const uint32_t *set = g->sets[EL_A(g->el[top])];
        if (!(set[c >> 5] >> (c & 31) & 1)) continue;
        memcpy(st, s, (size_t)d * 4);
        st[d - 1] = top + 1;
        expand(g, st, d, B);
    }
    return B->n > 0;
}

static bool level_complete(const level *L) {
    for (int i = 0; i < L->n; i++)
        if (L->off[i + 1] == L->off[i]) return true;
    return false;
}

static void level_copy(level *dst, const level *src) {
    dst->n = src->n, dst->nw = src->nw, dst->overflow = src->overflow;
    memcpy(dst->w, src->w, (size_t)src->nw * 4);
    memcpy(dst->off, src->off, (size_t)(src->n + 1) * 4);
    memcpy(dst->h, src->h, (size_t)src->n * 8);
}

// Sorts the stacks (by hash, then length, then frames) into tmp's buffers and back, so equal sets
// have equal words; returns the set's hash.
static uint64_t level_canon(level *L, level *tmp) {
    int idx[GM_MAX_STACKS];
    for (int i = 0; i < L->n; i++) idx[i] = i;
    for (int i = 1; i < L->n; i++) {  // insertion sort: a handful of stacks
        int x = idx[i], j = i - 1;
        while (j >= 0) {
            int y = idx[j];
            bool gt = L->h[y] > L->h[x];
            if (L->h[y] == L->h[x]) {
                int dy = (int)(L->off[y + 1] - L->off[y]), dx = (int)(L->off[x + 1] - L->off[x]);
                gt = dy != dx ? dy > dx : memcmp(L->w + L->off[y], L->w + L->off[x], (size_t)dx * 4) > 0;
            }
            if (!gt) break;
            idx[j + 1] = y, j--;
        }
        idx[j + 1] = x;
    }
    level_clear(tmp);
    for (int i = 0; i < L->n; i++) {
        int k = idx[i], d = (int)(L->off[k + 1] - L->off[k]);
        memcpy(tmp->w + tmp->nw, L->w + L->off[k], (size_t)d * 4);
        tmp->nw += d;
        tmp->h[tmp->n] = L->h[k];
        tmp->off[++tmp->n] = (uint32_t)tmp->nw;
    }
    level_copy(L, tmp);
    uint64_t h = hash_words(L->w, L->nw);
    for (int i = 0; i <= L->n; i++) h = (h ^ L->off[i]) * 0x100000001B3ull;
    return h;
}

// ---------------------------------------------------------------------------------------------
// Vocabulary

typedef struct gmemo gmemo;
static gmemo *memo_new(void);
static void memo_free(gmemo *mm);

struct td_gvocab {
    int n;          // token ids
    int n_sorted;   // ids that can ever be allowed by bytes
    int32_t *order; // [n_sorted] ids sorted by their bytes
    uint16_t *lcp;  // [n_sorted] common prefix with the previous sorted token (bytes)
    int32_t *nsv;   // [n_sorted] the next k' > k with lcp[k'] < lcp[k] (n_sorted if none): the
                    // tokens between share more than lcp[k] bytes, so a rejected prefix skips them
    uint32_t *off, *len;  // [n] into blob
    char *blob;
    int32_t end[16];
    int n_end;
    int max_len;    // bytes of the longest token
    level *lv;      // [n_lv] walk scratch (max_len + 1, at least 2); used by one thread at a time
    uint8_t *pop;   // [n_lv] walk scratch of the position tables
    const level **lp;  // [n_lv] the walk's current levels (scratch lv[d] or a memo's state)
    int32_t *ls;       // [n_lv] their memo ids (-1: not interned)
    gmemo *mm;         // transitions seen in the current walk, or NULL (out of memory)
    int n_lv;
};

static int cmp_tok(const void *a, const void *b, void *ctx) {
    const td_gvocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->len[x], ly = v->len[y];
    int c = memcmp(v->blob + v->off[x], v->blob + v->off[y], lx < ly ? lx : ly);
    if (c) return c;
    return lx != ly ? (lx < ly ? -1 : 1) : (x < y ? -1 : 1);
}

static td_gvocab *vocab_finish(td_gvocab *v, const bool *never, const int32_t *end_ids, int n_end, td_err *err) {
    if (n_end > 16) n_end = 16;
    for (int i = 0; i < n_end; i++) v->end[v->n_end++] = end_ids[i];
    v->order = malloc((size_t)(v->n ? v->n : 1) * sizeof *v->order);
    v->lcp = malloc((size_t)(v->n ? v->n : 1) * sizeof *v->lcp);
    if (!v->order || !v->lcp) goto nomem;
    for (int i = 0; i < v->n; i++) {
        bool is_end = false;
        for (int k = 0; k < v->n_end; k++) is_end |= v->end[k] == i;
        if (v->len[i] == 0 || never[i] || is_end || v->len[i] > 0xFFFF) continue;
        v->order[v->n_sorted++] = i;
        if ((int)v->len[i] > v->max_len) v->max_len = (int)v->len[i];
    }
    qsort_r(v->order, (size_t)v->n_sorted, sizeof *v->order, cmp_tok, v);
    for (int i = 0; i < v->n_sorted; i++) {
        int l = 0;
        if (i) {
            const char *a = v->blob + v->off[v->order[i - 1]], *b = v->blob + v->off[v->order[i]];
            int m = (int)(v->len[v->order[i - 1]] < v->len[v->order[i]] ? v->len[v->order[i - 1]] : v->len[v->order[i]]);
            while (l < m && a[l] == b[l]) l++;
        }
        v->lcp[i] = (uint16_t)l;
    }
    v->nsv = malloc((size_t)(v->n_sorted ? v->n_sorted : 1) * sizeof *v->nsv);
    int32_t *stk = malloc((size_t)(v->n_sorted ? v->n_sorted : 1) * sizeof *stk);
    if (!v->nsv || !stk) {
        free(stk);
        goto nomem;
    }
    int sp = 0;
    for (int i = 0; i < v->n_sorted; i++) {  // next smaller value, with a stack
        while (sp && v->lcp[stk[sp - 1]] > v->lcp[i]) v->nsv[stk[--sp]] = i;
        stk[sp++] = i;
    }
    while (sp) v->nsv[stk[--sp]] = v->n_sorted;
    free(stk);
    v->n_lv = v->max_len + 1 < 2 ? 2 : v->max_len + 1;
    v->lv = calloc((size_t)v->n_lv, sizeof *v->lv);
    v->pop = calloc((size_t)v->n_lv, 1);
    v->lp = calloc((size_t)v->n_lv, sizeof *v->lp);
    v->ls = calloc((size_t)v->n_lv, sizeof *v->ls);
    v->mm = memo_new();  // optional: without it walks step every byte
    if (!v->lv || !v->pop || !v->lp || !v->ls) goto nomem;
    for (int i = 0; i < v->n_lv; i++)
        if (!level_init(&v->lv[i])) goto nomem;
    return v;
nomem:
    td_gvocab_free(v);
    td_err_set(err, TD_ERR_NOMEM, "grammar: out of memory (vocabulary)");
    return NULL;
}

td_gvocab *td_gvocab_from_bytes(const char *const *tokens, const size_t *lens, int n, const int32_t *end_ids,
                                int n_end, td_err *err) {
    td_gvocab *v = calloc(1, sizeof *v);
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i];
    bool *never = calloc((size_t)(n ? n : 1), 1);
    if (v) {
        v->n = n;
        v->off = malloc((size_t)(n ? n : 1) * sizeof *v->off);
        v->len = malloc((size_t)(n ? n : 1) * sizeof *v->len);
        v->blob = malloc(total ? total : 1);
    }
    if (!v || !never || !v->off || !v->len || !v->blob) {
        free(never);
        td_gvocab_free(v);
        return td_err_set(err, TD_ERR_NOMEM, "grammar: out of memory (vocabulary)"), NULL;
    }
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        v->off[i] = (uint32_t)o, v->len[i] = (uint32_t)lens[i];
        memcpy(v->blob + o, tokens[i], lens[i]);
        o += lens[i];
    }
    v = vocab_finish(v, never, end_ids, n_end, err);
    free(never);
    return v;
}

td_gvocab *td_gvocab_from_tokenizer(const td_tokenizer *t, int n_ids, const int32_t *end_ids, int n_end, td_err *err) {
    int n = td_tokenizer_vocab_size(t);
    if (n_ids > n) n = n_ids;
    td_gvocab *v = calloc(1, sizeof *v);
    bool *never = calloc((size_t)(n ? n : 1), 1);
    size_t cap = 1 << 20, o = 0;
    if (v) {
        v->n = n;
        v->off = malloc((size_t)(n ? n : 1) * sizeof *v->off);
        v->len = malloc((size_t)(n ? n : 1) * sizeof *v->len);
        v->blob = malloc(cap);
    }
    if (!v || !never || !v->off || !v->len || !v->blob) goto nomem;
    for (int i = 0; i < n; i++) {
        int k = td_tokenizer_token_bytes(t, i, NULL, 0);
        never[i] = k <= 0 || td_tokenizer_is_special(t, i);
        if (k < 0) k = 0;
        if (o + (size_t)k > cap) {
            while (o + (size_t)k > cap) cap *= 2;
            char *nb = realloc(v->blob, cap);
            if (!nb) goto nomem;
            v->blob = nb;
        }
        td_tokenizer_token_bytes(t, i, v->blob + o, (size_t)k);
        v->off[i] = (uint32_t)o, v->len[i] = (uint32_t)k;
        o += (size_t)k;
    }
    v = vocab_finish(v, never, end_ids, n_end, err);
    free(never);
    return v;
nomem:
    free(never);
    td_gvocab_free(v);
    return td_err_set(err, TD_ERR_NOMEM, "grammar: out of memory (vocabulary)"), NULL;
}

void td_gvocab_free(td_gvocab *v) {
    if (!v) return;
    if (v->lv)
        for (int i = 0; i < v->n_lv; i++) level_free(&v->lv[i]);
    memo_free(v->mm);
    free(v->lv), free(v->pop), free(v->lp), free(v->ls), free(v->order), free(v->lcp), free(v->nsv), free(v->off), free(v->len), free(v->blob);
    free(v);
}

int td_gvocab_size(const td_gvocab *v) { return v->n; }

// ---------------------------------------------------------------------------------------------
// Matcher

struct td_gmatch {
    td_grammar *g;
    const td_gvocab *v;
    level cur, tmp;
    uint64_t key;    // canonical hash of cur
    uint32_t *mask;  // [words] mask with end tokens, or a miss's result when the cache is full
    int words;
    bool failed;
};

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

td_gmatch *td_gmatch_create(td_grammar *g, const td_gvocab *v, td_err *err) {
    td_gmatch *m = calloc(1, sizeof *m);
    if (!m) return td_err_set(err, TD_ERR_NOMEM, "grammar: out of memory"), NULL;
    m->words = (v->n + 31) / 32;
    m->mask = malloc((size_t)(m->words ? m->words : 1) * 4);
    if (!m->mask || !level_init(&m->cur) || !level_init(&m->tmp)) {
        level_free(&m->cur), level_free(&m->tmp), free(m->mask), free(m);
        return td_err_set(err, TD_ERR_NOMEM, "grammar: out of memory"), NULL;
    }
    td_grammar_ref(g);
    m->g = g, m->v = v;
    td_gmatch_reset(m);
    return m;
}

void td_gmatch_free(td_gmatch *m) {
    if (!m) return;
    level_free(&m->cur), level_free(&m->tmp);
    free(m->mask);
    td_grammar_unref(m->g);
    free(m);
}

void td_gmatch_reset(td_gmatch *m) {
    level_start(m->g, &m->cur);
    m->failed = m->cur.overflow;
    m->key = level_canon(&m->cur, &m->tmp);
}

void td_gmatch_copy(td_gmatch *dst, const td_gmatch *src) {
    level_copy(&dst->cur, &src->cur);
    dst->key = src->key, dst->failed = src->failed;
}

bool td_gmatch_complete(const td_gmatch *m) { return level_complete(&m->cur); }
bool td_gmatch_done(const td_gmatch *m) { return m->cur.n == 1 && m->cur.off[1] == 0; }
bool td_gmatch_failed(const td_gmatch *m) { return m->failed; }

// Advances m->cur by bytes using the vocabulary's first two walk levels as ping-pong buffers (free
// between mask calls); cur is unchanged on failure.
static bool advance(td_gmatch *m, const uint8_t *b, size_t n) {
    if (n == 0) return true;
    const level *src = &m->cur;
    level *dst = NULL;
    for (size_t i = 0; i < n; i++) {
        dst = &m->v->lv[i & 1];
        if (!level_step(m->g, src, b[i], dst) || dst->overflow) {
            if (dst->overflow) m->failed = true;
            return false;
        }
        src = dst;
    }
    level_copy(&m->cur, dst);
    m->key = level_canon(&m->cur, &m->tmp);
    return true;
}

bool td_gmatch_accept_bytes(td_gmatch *m, const char *s, size_t n) { return advance(m, (const uint8_t *)s, n); }

static bool is_end(const td_gvocab *v, int32_t t) {
    for (int i = 0; i < v->n_end; i++)
        if (v->end[i] == t) return true;
    return false;
}

bool td_gmatch_accept(td_gmatch *m, int32_t tok) {
    const td_gvocab *v = m->v;
    if (tok < 0 || tok >= v->n) return false;
    if (is_end(v, tok)) return td_gmatch_complete(m);
    if (v->len[tok] == 0) return false;
    return advance(m, (const uint8_t *)v->blob + v->off[tok], v->len[tok]);
}

// The first sorted index after k that does not start with the first `r` bytes of token k.
static inline int skip_prefix(const td_gvocab *v, int k, int r) {
    int nk = k + 1;
    while (nk < v->n_sorted && v->lcp[nk] >= r) nk = v->nsv[nk];
    return nk;
}

// ---- A walk's transition memo: within one walk the same states recur at many token prefixes
// (inside a string, every string character leads to the same next state), so each distinct state
// gets an id and (state, byte) -> state is remembered; a hit replaces level_step (expansion and
// deduplication) by a lookup. States are compared in full, so a hit is exact. Reset per walk by a
// generation count; when full it stops remembering and the walk steps as without it.
#define MM_STATES 4096
#define MM_WORDS (1 << 20)  // frames and offsets of all states (4 MB)
#define MM_TRANS (1 << 16)  // transition slots (power of 2)
#define MM_INTERN (1 << 13) // intern slots (power of 2), > 2 * MM_STATES

struct gmemo {
    uint32_t gen;
    level st[MM_STATES];
    uint64_t st_h[MM_STATES];
    int n_st, n_words, n_trans;
    uint32_t *arena;     // [MM_WORDS]
    uint64_t *tkey;      // [MM_TRANS] id << 8 | byte
    int32_t *tval;       // [MM_TRANS] next id, or -1: the byte is rejected
    uint32_t *tgen;      // [MM_TRANS]
    int32_t *iid;        // [MM_INTERN] state ids by hash
    uint32_t *igen;      // [MM_INTERN]
};

static gmemo *memo_new(void) {
    gmemo *mm = calloc(1, sizeof *mm);
    if (!mm) return NULL;
    mm->arena = malloc(MM_WORDS * sizeof *mm->arena);
    mm->tkey = malloc(MM_TRANS * sizeof *mm->tkey);
    mm->tval = malloc(MM_TRANS * sizeof *mm->tval);
    mm->tgen = calloc(MM_TRANS, sizeof *mm->tgen);
    mm->iid = malloc(MM_INTERN * sizeof *mm->iid);
    mm->igen = calloc(MM_INTERN, sizeof *mm->igen);
    if (!mm->arena || !mm->tkey || !mm->tval || !mm->tgen || !mm->iid || !mm->igen) {
        free(mm->arena), free(mm->tkey), free(mm->tval), free(mm->tgen), free(mm->iid), free(mm->igen), free(mm);
        return NULL;
    }
    return mm;
}

static void memo_free(gmemo *mm) {
    if (!mm) return;
    free(mm->arena), free(mm->tkey), free(mm->tval), free(mm->tgen), free(mm->iid), free(mm->igen), free(mm);
}

static void memo_begin(gmemo *mm) {
    if (!mm) return;
    mm->n_st = mm->n_words = mm->n_trans = 0;
    if (++mm->gen == 0) {  // wrapped: clear the slots once
        memset(mm->tgen, 0, MM_TRANS * sizeof *mm->tgen);
        memset(mm->igen, 0, MM_INTERN * sizeof *mm->igen);
        mm->gen = 1;
    }
}

static uint64_t level_hash(const level *L) {
    return hash_words(L->w, L->nw) ^ (hash_words(L->off, L->n + 1) * 0x9E3779B97F4A7C15ull) ^ (uint64_t)L->overflow;
}

// The id of a state equal to L, interning a copy; -1 when the memo is full.
static int memo_intern(gmemo *mm, const level *L) {
    uint64_t h = level_hash(L);
    uint32_t j = (uint32_t)h & (MM_INTERN - 1);
    for (; mm->igen[j] == mm->gen; j = (j + 1) & (MM_INTERN - 1)) {
        const level *S = &mm->st[mm->iid[j]];
        if (mm->st_h[mm->iid[j]] == h && S->n == L->n && S->nw == L->nw && S->overflow == L->overflow &&
            !memcmp(S->off, L->off, (size_t)(L->n + 1) * 4) && !memcmp(S->w, L->w, (size_t)L->nw * 4))
            return mm->iid[j];
    }
    int need = L->nw + L->n + 1;
    if (mm->n_st == MM_STATES || mm->n_words + need > MM_WORDS) return -1;
    int id = mm->n_st++;
    level *S = &mm->st[id];
    S->w = mm->arena + mm->n_words;
    S->off = S->w + L->nw;
    S->h = NULL;  // not read by level_step or level_complete
    S->n = L->n, S->nw = L->nw, S->overflow = L->overflow;
    memcpy(S->w, L->w, (size_t)L->nw * 4);
    memcpy(S->off, L->off, (size_t)(L->n + 1) * 4);
    mm->n_words += need;
    mm->st_h[id] = h;
    mm->igen[j] = mm->gen, mm->iid[j] = id;
    return id;
}

// Sets the walk's level d + 1 to level d advanced by byte c (a memo state, or scratch lv[d + 1]).
// Returns whether any stack survived.
static inline bool walk_step(const td_grammar *g, const td_gvocab *v, int d, uint8_t c) {
    gmemo *mm = v->mm;
    const int32_t sid = v->ls[d];
    uint32_t j = 0;
    if (sid >= 0) {
        uint64_t key = (uint64_t)sid << 8 | c;
        j = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 48) & (MM_TRANS - 1);
        for (; mm->tgen[j] == mm->gen; j = (j + 1) & (MM_TRANS - 1))
            if (mm->tkey[j] == key) {
                int32_t t = mm->tval[j];
                if (t < 0) return false;
                v->lp[d + 1] = &mm->st[t], v->ls[d + 1] = t;
                return true;
            }
    }
    level *B = &v->lv[d + 1];
    bool ok = level_step(g, v->lp[d], c, B);
    v->lp[d + 1] = B, v->ls[d + 1] = -1;
    int32_t t = -1;
    if (ok && sid >= 0) {  // a walk without the memo (the reference) never interns
        t = memo_intern(mm, B);
        if (t >= 0) v->lp[d + 1] = &mm->st[t], v->ls[d + 1] = t;
    }
    if (sid >= 0 && (!ok || t >= 0) && 2 * (mm->n_trans + 1) <= MM_TRANS) {
        mm->tgen[j] = mm->gen, mm->tkey[j] = (uint64_t)sid << 8 | c, mm->tval[j] = ok ? t : -1;
        mm->n_trans++;
    }
    return ok;
}

// Starts a walk from the state in lv[0], with the memo or (the reference) without.
static void walk_begin(const td_gvocab *v, bool memo) {
    memo = memo && v->mm;
    if (memo) memo_begin(v->mm);
    v->lp[0] = &v->lv[0];
    v->ls[0] = memo ? memo_intern(v->mm, &v->lv[0]) : -1;
}

// Walks n tokens of the sorted vocabulary from the state in lv[0]: entry k is the sorted index
// idx[k] (k itself when idx is NULL), sharing lcp[k] bytes with entry k - 1. Sets the accepted
// ones in out (not cleared here). memo: use the transition memo (false: level_step every byte, the
// plain reference). Returns false when a cap overflowed.
static bool walk_tokens(const td_grammar *g, const td_gvocab *v, const int32_t *idx, const uint16_t *lcp, int n,
                        uint32_t *out, bool memo) {
    walk_begin(v, memo);
    int valid = 0;      // levels 0..valid hold the states after the current token's first bytes
    int rej = 1 << 30;  // the previous token's prefix of this length was rejected
    bool overflow = false;
    for (int k = 0; k < n; k++) {
        const int32_t id = v->order[idx ? idx[k] : k];
        const int l = lcp[k];
        if (rej <= l) continue;
        rej = 1 << 30;
        const uint8_t *b = (const uint8_t *)v->blob + v->off[id];
        const int len = (int)v->len[id];
        int d = l < valid ? l : valid;
        for (; d < len; d++) {
            if (!walk_step(g, v, d, b[d])) {
                rej = d + 1;
                break;
            }
            if (v->lp[d + 1]->overflow) overflow = true;
        }
        valid = d;
        if (d == len) out[id >> 5] |= 1u << (id & 31);
        else if (!idx) k = skip_prefix(v, k, rej) - 1;
    }
    return !overflow;
}

// The mask of state L (no end tokens) by walking the whole sorted vocabulary (memo false: the
// plain reference).
static bool compute_mask(const td_grammar *g, const td_gvocab *v, const level *L, uint32_t *out, int words, bool memo) {
    memset(out, 0, (size_t)words * 4);
    level_copy(&v->lv[0], L);
    return walk_tokens(g, v, NULL, v->lcp, v->n_sorted, out, memo);
}

static int common_prefix(const td_gvocab *v, int32_t a, int32_t b) {
    const char *x = v->blob + v->off[a], *y = v->blob + v->off[b];
    int m = (int)(v->len[a] < v->len[b] ? v->len[a] : v->len[b]), l = 0;
    while (l < m && x[l] == y[l]) l++;
    return l;
}

// Builds the table of key fr[0, k): the vocabulary walked from the stack fr alone, noting at each
// prefix whether a stack has returned out of it (an empty stack: the rest of the token would be
// matched by whatever lies below). Marks P untabulated on overflow or past the budget.
static void pos_build(td_grammar *g, const td_gvocab *v, const uint32_t *fr, int k_fr, gpos *P, int words) {
    level *lv = v->lv;
    uint8_t *pop = v->pop;  // pop[d]: some level j, 1 <= j <= d, holds an empty stack
    uint32_t *acc = calloc((size_t)words, 4);
    int cap_unc = 256, n_unc = 0, n_acc = 0;
    int32_t *unc = malloc((size_t)cap_unc * sizeof *unc);
    P->state = -1;
    if (!acc || !unc) goto out;
    level_clear(&lv[0]);
    level_add(&lv[0], fr, k_fr);
    walk_begin(v, true);
    pop[0] = 0;
    int valid = 0, rej = 1 << 30;
    bool rej_unc = false;
    for (int k = 0; k < v->n_sorted; k++) {
        const int32_t id = v->order[k];
        const int l = v->lcp[k];
        bool is_unc = false;
        if (rej <= l) {
            is_unc = rej_unc;
        } else {
            rej = 1 << 30;
            const uint8_t *b = (const uint8_t *)v->blob + v->off[id];
            const int len = (int)v->len[id];
            int d = l < valid ? l : valid;
            for (; d < len; d++) {
                if (!walk_step(g, v, d, b[d])) {
                    rej = d + 1, rej_unc = pop[d];
                    break;
                }
                if (v->lp[d + 1]->overflow) goto out;
                pop[d + 1] = pop[d] || level_complete(v->lp[d + 1]);
            }
            valid = d;
            if (d == len) acc[id >> 5] |= 1u << (id & 31), n_acc++;
            else is_unc = pop[d];
        }
        // a rejected prefix: the tokens that share it are decided with this one
        int k_end = rej < (1 << 30) ? skip_prefix(v, k, rej) : k + 1;
        if (is_unc) {
            while (n_unc + (k_end - k) > cap_unc) {
                int32_t *nu = realloc(unc, (size_t)cap_unc * 2 * sizeof *nu);
                if (!nu) goto out;
                unc = nu, cap_unc *= 2;
            }
            for (int q = k; q < k_end; q++) unc[n_unc++] = q;
        }
        k = k_end - 1;
    }
    size_t bytes = sizeof *P + (size_t)n_unc * 6 + (n_acc > words ? (size_t)words * 4 : (size_t)n_acc * 4);
    if (g->pos_bytes + bytes > GM_POS_BUDGET) goto out;
    P->unc_lcp = malloc((size_t)(n_unc ? n_unc : 1) * sizeof *P->unc_lcp);
    if (!P->unc_lcp) goto out;
    for (int i = 0; i < n_unc; i++)
        P->unc_lcp[i] = (uint16_t)(i ? common_prefix(v, v->order[unc[i - 1]], v->order[unc[i]]) : 0);
    if (n_acc > words) {
        P->acc = acc, acc = NULL;
    } else {
        P->acc_id = malloc((size_t)(n_acc ? n_acc : 1) * sizeof *P->acc_id);
        if (!P->acc_id) goto out;
        int j = 0;
        for (int w = 0; w < words; w++)
            for (uint32_t x = acc[w]; x; x &= x - 1) P->acc_id[j++] = w * 32 + __builtin_ctz(x);
    }
    P->n_acc = n_acc;
    P->unc = unc, unc = NULL;
    P->n_unc = n_unc;
    P->state = 1;
    g->pos_bytes += bytes;
out:
    if (P->state != 1) {
        free(P->acc), free(P->acc_id), free(P->unc_lcp);
        P->acc = NULL, P->acc_id = NULL, P->unc_lcp = NULL;
    }
    free(acc), free(unc);
}

// The table of key fr[0, k) for vocabulary v, built on first use; NULL when it is not tabulated.
static const gpos *pos_get(td_grammar *g, const td_gvocab *v, const uint32_t *fr, int k, int words) {
    if (g->pos_v != v) pos_drop(g), g->pos_v = v;  // tables are for one vocabulary at a time
    if (2 * (g->n_pos + 1) > g->cap_pos) {  // grow (rehash) at half full
        int nc = g->cap_pos ? 2 * g->cap_pos : 64;
        gkey *nt = calloc((size_t)nc, sizeof *nt);
        if (!nt) return NULL;
        for (int i = 0; i < g->cap_pos; i++) {
            if (!g->pos[i].h) continue;
            int j = (int)(g->pos[i].h & (uint64_t)(nc - 1));
            while (nt[j].h) j = (j + 1) & (nc - 1);
            nt[j] = g->pos[i];
        }
        free(g->pos);
        g->pos = nt, g->cap_pos = nc;
    }
    uint64_t h = hash_words(fr, k) | 1;
    int j = (int)(h & (uint64_t)(g->cap_pos - 1));
    for (; g->pos[j].h; j = (j + 1) & (g->cap_pos - 1)) {
        gkey *e = &g->pos[j];
        if (e->h == h && e->k == k && !memcmp(e->fr, fr, (size_t)k * 4)) return e->P->state == 1 ? e->P : NULL;
    }
    gpos *P = calloc(1, sizeof *P);
    if (!P) return NULL;
    uint64_t t0 = now_ns();
    pos_build(g, v, fr, k, P, words);
    g->st.pos_built++;
    g->st.pos_ns += now_ns() - t0;
    gkey *e = &g->pos[j];
    e->h = h, e->k = k, e->P = P;
    memcpy(e->fr, fr, (size_t)k * 4);
    g->n_pos++;
    return P->state == 1 ? P : NULL;
}

// The table for stack s[0, d) (d >= 1): keyed by its top frames, deeper while that leaves many
// tokens to the context. *k gets the frames in the key.
static const gpos *pos_for_stack(td_grammar *g, const td_gvocab *v, const uint32_t *s, int d, int words, int *k) {
    // Start with the frames a token can leave without a byte (what remains of them can be empty)
    // and the first one it cannot: a string's character rule and its repetition return at once,
    // so one frame would leave almost every token to the context.
    int k0 = 1;
    for (uint32_t rest = s[d - 1] + 1; k0 < d && k0 < GM_KEY_MAX && seq_nullable(g, rest); k0++) rest = s[d - 1 - k0];
    const gpos *P = NULL;
    for (*k = k0;; (*k)++) {
        P = pos_get(g, v, s + d - *k, *k, words);
        if (!P || P->n_unc <= GM_UNC_DEEPEN || *k == d || *k == GM_KEY_MAX) return P;
    }
}

// The mask of state L (no end tokens) from the tables: for each distinct key, its accepted tokens,
// plus its context-dependent ones that a walk from the stacks with that key accepts (none where
// the key is the whole stack). Falls back to the full walk when a key is not tabulated.
static bool fast_mask(td_grammar *g, const td_gvocab *v, const level *L, uint32_t *out, int words) {
    const gpos *P[GM_MAX_STACKS];
    int kk[GM_MAX_STACKS], first[GM_MAX_STACKS], n_key = 0;
    for (int i = 0; i < L->n; i++) {
        int d = (int)(L->off[i + 1] - L->off[i]);
        if (d == 0) continue;
        const uint32_t *s = L->w + L->off[i];
        int k;
        const gpos *q = pos_for_stack(g, v, s, d, words, &k);
        if (!q) {
            g->st.full_walks++;
            return compute_mask(g, v, L, out, words, true);
        }
        bool seen = false;
        for (int j = 0; j < n_key && !seen; j++) seen = P[j] == q;
        if (seen) continue;
        P[n_key] = q, kk[n_key] = k, first[n_key++] = i;
    }
    memset(out, 0, (size_t)words * 4);
    for (int j = 0; j < n_key; j++) {
        const gpos *q = P[j];
        if (q->acc) {
            for (int w = 0; w < words; w++) out[w] |= q->acc[w];
        } else {
            for (int a = 0; a < q->n_acc; a++) out[q->acc_id[a] >> 5] |= 1u << (q->acc_id[a] & 31);
        }
        if (!q->n_unc) continue;
        // the stacks under this key that have frames below it
        const int k = kk[j];
        const uint32_t *key = L->w + L->off[first[j]] + (L->off[first[j] + 1] - L->off[first[j]]) - k;
        level *g0 = &v->lv[0];
        level_clear(g0);
        for (int i = first[j]; i < L->n; i++) {
            int d = (int)(L->off[i + 1] - L->off[i]);
            const uint32_t *s = L->w + L->off[i];
            if (d > k && !memcmp(s + d - k, key, (size_t)k * 4)) level_add(g0, s, d);
        }
        if (g0->n && !walk_tokens(g, v, q->unc, q->unc_lcp, q->n_unc, out, true)) return false;
    }
    return true;
}

bool td_gmatch_mask_reference(td_gmatch *m, uint32_t *out, td_err *err) {
    if (m->failed || !compute_mask(m->g, m->v, &m->cur, out, m->words, false)) {
        m->failed = true;
        td_err_set(err, TD_ERR_LIMIT, "grammar: too ambiguous: more than %d parse stacks or %d nested rules",
                   GM_MAX_STACKS, GM_MAX_DEPTH);
        return false;
    }
    return true;
}

const uint32_t *td_gmatch_mask(td_gmatch *m, bool allow_end, td_err *err) {
    td_grammar *g = m->g;
    const td_gvocab *v = m->v;
    uint64_t t0 = now_ns();
    if (m->failed) {
        td_err_set(err, TD_ERR_LIMIT, "grammar: too ambiguous: more than %d parse stacks or %d nested rules",
                   GM_MAX_STACKS, GM_MAX_DEPTH);
        return NULL;
    }
    const uint32_t *base = NULL;
    mentry *hit = NULL;
    for (int i = 0; i < g->n_mc; i++) {
        mentry *e = &g->mc[i];
        if (e->key == m->key && e->v == v && e->n_state == m->cur.nw + m->cur.n + 1 &&
            !memcmp(e->state, m->cur.off, (size_t)(m->cur.n + 1) * 4) &&
            !memcmp(e->state + m->cur.n + 1, m->cur.w, (size_t)m->cur.nw * 4)) {
            hit = e;
            break;
        }
    }
    if (hit) {
        hit->tick = ++g->tick;
        g->st.mask_hits++;
        base = hit->mask;
    } else {
        uint64_t t1 = now_ns();
        g->st.mask_misses++;
        mentry *e = NULL;
        if (g->n_mc < GM_MASK_CAP) {
            e = &g->mc[g->n_mc];
            memset(e, 0, sizeof *e);
            e->mask = malloc((size_t)(m->words ? m->words : 1) * 4);
            if (e->mask) g->n_mc++;
            else e = NULL;
        } else {  // evict the least recently used
            e = &g->mc[0];
            for (int i = 1; i < g->n_mc; i++)
                if (g->mc[i].tick < e->tick) e = &g->mc[i];
            if (e->v != v) {  // another vocabulary's mask size
                free(e->mask);
                e->mask = malloc((size_t)(m->words ? m->words : 1) * 4);
                if (!e->mask) {
                    *e = g->mc[--g->n_mc];
                    e = NULL;
                }
            }
        }
        int need = m->cur.nw + m->cur.n + 1;
        if (e && e->cap_state < need) {
            uint32_t *ns = realloc(e->state, (size_t)need * 4);
            if (ns) e->state = ns, e->cap_state = need;
            else e->n_state = -1;
        }
        uint32_t *out = e && e->cap_state >= need ? e->mask : m->mask;
        if (!fast_mask(g, v, &m->cur, out, m->words)) {
            if (out != m->mask) e->n_state = -1, e->key = 0;
            td_err_set(err, TD_ERR_LIMIT, "grammar: too ambiguous: more than %d parse stacks or %d nested rules",
                       GM_MAX_STACKS, GM_MAX_DEPTH);
            m->failed = true;
            return NULL;
        }
        if (out != m->mask) {
            e->key = m->key, e->v = v, e->tick = ++g->tick, e->n_state = need;
            memcpy(e->state, m->cur.off, (size_t)(m->cur.n + 1) * 4);
            memcpy(e->state + m->cur.n + 1, m->cur.w, (size_t)m->cur.nw * 4);
        }
        base = out;
        g->st.miss_ns += now_ns() - t1;
    }
    const uint32_t *res = base;
    if (allow_end && v->n_end && level_complete(&m->cur)) {
        if (base != m->mask) memcpy(m->mask, base, (size_t)m->words * 4);
        for (int i = 0; i < v->n_end; i++)
            if (v->end[i] >= 0 && v->end[i] < v->n) m->mask[v->end[i] >> 5] |= 1u << (v->end[i] & 31);
        res = m->mask;
    }
    g->st.mask_ns += now_ns() - t0;
    return res;
}

// ---------------------------------------------------------------------------------------------
// LRU of compiled grammars by text

typedef struct gc_ent {
    char *text;
    td_grammar *g;
    uint64_t tick;
} gc_ent;

struct td_grammar_cache {
    pthread_mutex_t mu;
    gc_ent *e;
    int n, cap;
    uint64_t tick;
};

td_grammar_cache *td_grammar_cache_create(int cap) {
    if (cap < 1) cap = 1;
    td_grammar_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->e = calloc((size_t)cap, sizeof *c->e);
    if (!c->e) return free(c), NULL;
    c->cap = cap;
    pthread_mutex_init(&c->mu, NULL);
    return c;
}

void td_grammar_cache_free(td_grammar_cache *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) free(c->e[i].text), td_grammar_unref(c->e[i].g);
    pthread_mutex_destroy(&c->mu);
    free(c->e);
    free(c);
}

td_grammar *td_grammar_cache_get(td_grammar_cache *c, const char *text, td_err *err) {
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].text, text)) {
            c->e[i].tick = ++c->tick;
            td_grammar *g = c->e[i].g;
            td_grammar_ref(g);
            pthread_mutex_unlock(&c->mu);
            return g;
        }
    pthread_mutex_unlock(&c->mu);
    td_grammar *g = td_grammar_compile(text, strlen(text), err);  // outside the lock: may be slow
    if (!g) return NULL;
    char *copy = strdup(text);
    if (!copy) return g;  // served uncached
    pthread_mutex_lock(&c->mu);
    gc_ent *slot;
    if (c->n < c->cap) {
        slot = &c->e[c->n++];
    } else {
        slot = &c->e[0];
        for (int i = 1; i < c->n; i++)
            if (c->e[i].tick < slot->tick) slot = &c->e[i];
        free(slot->text);
        td_grammar_unref(slot->g);
    }
    slot->text = copy, slot->g = g, slot->tick = ++c->tick;
    td_grammar_ref(g);
    pthread_mutex_unlock(&c->mu);
    return g;
}
