// Chat templates, front half: arena, UTF-8 helpers, @huggingface/jinja's source preprocessing
// (trailing newline, lstrip_blocks, trim_blocks, {% generation %}), its lexer and its parser, ported
// rule for rule so that odd inputs lex and parse the same way. Evaluation is in chat_template_eval.c.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/chat_template_impl.h"

#define MAX_SOURCE (16u << 20)  // bytes of template source
#define MAX_PARSE_NEST 100      // nested parentheses / blocks / unary operators while parsing
#define MAX_AST_DEPTH 256       // depth of the tree (left-nested operator chains count)

// ---------------------------------------------------------------------------------------------
// arena

void *td_jinja_alloc(td_jinja_arena *a, size_t n) {
    if (a->failed) return NULL;
    n = (n + 15) & ~(size_t)15;
    td_jinja_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        // fixed 64 KiB chunks stay below malloc's mmap threshold (no page faults per render);
        // bigger requests get a chunk of their own size
        size_t cap = n > (64u << 10) - sizeof(td_jinja_chunk) ? n : (64u << 10) - sizeof(td_jinja_chunk);
        if (a->budget && a->total + cap + sizeof(td_jinja_chunk) > a->budget) {
            a->failed = 2;
            return NULL;
        }
        td_jinja_chunk *nc = malloc(sizeof(td_jinja_chunk) + cap);
        if (!nc) {
            a->failed = 1;
            return NULL;
        }
        nc->cap = cap;
        nc->used = 0;
        nc->next = a->head;
        a->head = nc;
        a->total += cap + sizeof(td_jinja_chunk);
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += n;
    a->last_end = NULL;
    return p;
}

char *td_jinja_strdup(td_jinja_arena *a, const char *s, size_t n) {
    char *p = td_jinja_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

char *td_jinja_concat(td_jinja_arena *a, const char *s1, size_t n1, const char *s2, size_t n2) {
    if (a->failed) return NULL;
    td_jinja_chunk *c = a->head;
    int growing = n1 && a->last_end && s1 + n1 == a->last_end;
    if (growing && c) {  // s1 is the string most recently built at the top of the current chunk
        size_t end = (size_t)(s1 + n1 - c->data);
        size_t used = (end + n2 + 1 + 15) & ~(size_t)15;
        if (used <= c->cap) {
            memcpy((char *)s1 + n1, s2, n2);
            ((char *)s1)[n1 + n2] = 0;
            c->used = used;
            a->last_end = (char *)s1 + n1 + n2;
            return (char *)s1;
        }
    }
    size_t want = n1 + n2 + 1;
    size_t ask = growing ? want * 2 : want;  // leave room to keep growing in place
    char *p = td_jinja_alloc(a, ask);
    if (!p) return NULL;
    a->head->used -= ((ask + 15) & ~(size_t)15) - ((want + 15) & ~(size_t)15);
    if (n1) memcpy(p, s1, n1);
    if (n2) memcpy(p + n1, s2, n2);
    p[n1 + n2] = 0;
    a->last_end = p + n1 + n2;
    return p;
}

void td_jinja_arena_free(td_jinja_arena *a) {
    td_jinja_chunk *c = a->head;
    while (c) {
        td_jinja_chunk *n = c->next;
        free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

// ---------------------------------------------------------------------------------------------
// UTF-8 and JS whitespace

uint32_t td_jinja_utf8_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0) {
        *adv = 0;
        return 0;
    }
    unsigned c = u[0];
    if (c < 0x80) {
        *adv = 1;
        return c;
    }
    int need;
    uint32_t cp;
    if ((c & 0xE0) == 0xC0) need = 1, cp = c & 0x1F;
    else if ((c & 0xF0) == 0xE0) need = 2, cp = c & 0x0F;
    else if ((c & 0xF8) == 0xF0) need = 3, cp = c & 0x07;
    else {
        *adv = 1;
        return c;
    }
    if ((size_t)need >= n) {
        *adv = 1;
        return c;
    }
    for (int i = 1; i <= need; i++) {
        if ((u[i] & 0xC0) != 0x80) {
            *adv = 1;
            return c;
        }
        cp = (cp << 6) | (u[i] & 0x3F);
    }
    *adv = (size_t)need + 1;
    return cp;
}

size_t td_jinja_utf8_encode(uint32_t cp, char *out) {
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

static int js_is_ws_cp(uint32_t c) {
    return c == 9 || c == 10 || c == 11 || c == 12 || c == 13 || c == 32 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000 || c == 0xFEFF;
}

size_t td_jinja_ws_len(const char *s, size_t n) {
    if (n == 0) return 0;
    unsigned char c = (unsigned char)s[0];
    if (c < 0x80) return js_is_ws_cp(c) ? 1 : 0;
    size_t adv;
    uint32_t cp = td_jinja_utf8_decode(s, n, &adv);
    return adv > 1 && js_is_ws_cp(cp) ? adv : 0;
}

void td_jinja_line_col(const char *src, size_t len, size_t pos, int *line, int *col) {
    int l = 1, c = 1;
    if (pos > len) pos = len;
    for (size_t i = 0; i < pos; i++) {
        if (src[i] == '\n') l++, c = 1;
        else if (((unsigned char)src[i] & 0xC0) != 0x80) c++;
    }
    *line = l;
    *col = c;
}

// ---------------------------------------------------------------------------------------------
// preprocessing: each pass deletes bytes; map[i] keeps the original offset of output byte i

typedef struct {
    char *s;
    uint32_t *map;
    size_t n;
} pp_buf;

static int pp_init(pp_buf *b, size_t cap) {
    b->s = malloc(cap + 1);
    b->map = malloc((cap + 1) * sizeof(uint32_t));
    b->n = 0;
    return b->s && b->map;
}
static void pp_free(pp_buf *b) {
    free(b->s);
    free(b->map);
}
static inline void pp_put(pp_buf *o, const pp_buf *in, size_t i) {
    o->s[o->n] = in->s[i];
    o->map[o->n++] = in->map[i];
}
static void pp_finish(pp_buf *o, const pp_buf *in) {  // sentinel map entry = end of source
    o->s[o->n] = 0;
    o->map[o->n] = in->map[in->n];
}

static int is_line_term_at(const char *s, size_t n, size_t i, size_t *adv) {
    if (s[i] == '\n' || s[i] == '\r') {
        *adv = 1;
        return 1;
    }
    if (i + 2 < n + 0 && (unsigned char)s[i] == 0xE2 && (unsigned char)s[i + 1] == 0x80 &&
        ((unsigned char)s[i + 2] == 0xA8 || (unsigned char)s[i + 2] == 0xA9)) {
        *adv = 3;
        return 1;
    }
    return 0;
}

// /^[ \t]*({[#%-])/gm -> "$1"
static void pp_lstrip_blocks(const pp_buf *in, pp_buf *o) {
    size_t i = 0, n = in->n;
    int line_start = 1;
    while (i < n) {
        if (line_start) {
            size_t q = i;
            while (q < n && (in->s[q] == ' ' || in->s[q] == '\t')) q++;
            if (q + 1 < n && in->s[q] == '{' && (in->s[q + 1] == '#' || in->s[q + 1] == '%' || in->s[q + 1] == '-')) {
                pp_put(o, in, q);
                pp_put(o, in, q + 1);
                i = q + 2;
                line_start = 0;
                continue;
            }
            line_start = 0;
        }
        size_t adv;
        if (is_line_term_at(in->s, n, i, &adv)) {
            for (size_t k = 0; k < adv; k++) pp_put(o, in, i + k);
            i += adv;
            line_start = 1;
            continue;
        }
        pp_put(o, in, i++);
    }
    pp_finish(o, in);
}

// /([#%-]})\n/g -> "$1"
static void pp_trim_blocks(const pp_buf *in, pp_buf *o) {
    size_t i = 0, n = in->n;
    while (i < n) {
        char c = in->s[i];
        if ((c == '#' || c == '%' || c == '-') && i + 2 < n && in->s[i + 1] == '}' && in->s[i + 2] == '\n') {
            pp_put(o, in, i);
            pp_put(o, in, i + 1);
            i += 3;
            continue;
        }
        pp_put(o, in, i++);
    }
    pp_finish(o, in);
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t w;
    while (i < n && (w = td_jinja_ws_len(s + i, n - i)) > 0) i += w;
    return i;
}

// /(\s*){%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs -> (lstrip ? "" : before) + (rstrip ? "" : after)
static void pp_generation(const pp_buf *in, pp_buf *o) {
    size_t i = 0, n = in->n;
    const char *s = in->s;
    while (i < n) {
        size_t k = skip_ws(s, n, i);
        if (k + 1 < n && s[k] == '{' && s[k + 1] == '%') {
            size_t j = k + 2;
            int lstrip = 0, rstrip = 0;
            if (j < n && s[j] == '-') lstrip = 1, j++;
            j = skip_ws(s, n, j);
            if (j + 3 <= n && memcmp(s + j, "end", 3) == 0 && j + 13 <= n && memcmp(s + j + 3, "generation", 10) == 0)
                j += 3;
            if (j + 10 <= n && memcmp(s + j, "generation", 10) == 0) {
                j = skip_ws(s, n, j + 10);
                if (j < n && s[j] == '-') rstrip = 1, j++;
                if (j + 1 < n && s[j] == '%' && s[j + 1] == '}') {
                    j += 2;
                    size_t e = skip_ws(s, n, j);
                    if (!lstrip)
                        for (size_t q = i; q < k; q++) pp_put(o, in, q);
                    if (!rstrip)
                        for (size_t q = j; q < e; q++) pp_put(o, in, q);
                    i = e;
                    continue;
                }
            }
        }
        pp_put(o, in, i++);
    }
    pp_finish(o, in);
}

// ---------------------------------------------------------------------------------------------
// lexer

typedef enum {
    T_TEXT, T_NUM, T_STR, T_IDENT, T_EQUALS, T_LPAREN, T_RPAREN, T_OPEN_STMT, T_CLOSE_STMT,
    T_OPEN_EXPR, T_CLOSE_EXPR, T_LBRACKET, T_RBRACKET, T_LBRACE, T_RBRACE, T_COMMA, T_DOT, T_COLON,
    T_PIPE, T_ADD, T_MUL, T_POW, T_CMP, T_UNARY, T_COMMENT, T_NONE,
} tok_type;

typedef struct {
    int type;
    uint32_t pos;  // original source offset
    const char *s;
    size_t len;
} token;

typedef struct {
    const char *orig;
    size_t orig_len;
    td_jinja_arena *arena;
    td_err *err;
    int failed;
    // lexer
    const char *s;
    const uint32_t *map;
    size_t n, cur;
    token *toks;
    size_t ntok, captok;
    // parser
    size_t p;
    int nest;
} jstate;

static void fail_at(jstate *st, size_t orig_pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail_at(jstate *st, size_t orig_pos, const char *fmt, ...) {
    if (st->failed) return;
    st->failed = 1;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    td_jinja_line_col(st->orig, st->orig_len, orig_pos, &line, &col);
    td_err_set(st->err, TD_ERR_INVALID, "chat template syntax error at line %d, column %d: %s", line, col, msg);
}

static void lex_fail(jstate *st, const char *msg) { fail_at(st, st->map[st->cur < st->n ? st->cur : st->n], "%s", msg); }

static int push_tok(jstate *st, int type, size_t at, const char *s, size_t len) {
    if (st->ntok == st->captok) {
        size_t nc = st->captok ? st->captok * 2 : 256;
        token *nt = realloc(st->toks, nc * sizeof(token));
        if (!nt) {
            st->failed = 1;
            td_err_set(st->err, TD_ERR_NOMEM, "chat template: out of memory");
            return 0;
        }
        st->toks = nt;
        st->captok = nc;
    }
    st->toks[st->ntok++] = (token){type, st->map[at], s, len};
    return 1;
}

static int last_type(jstate *st) { return st->ntok ? st->toks[st->ntok - 1].type : T_NONE; }

static int is_digit(char c) { return c >= '0' && c <= '9'; }
static int is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

// consumeWhile for string literals: decodes escapes; the value goes to the arena
static int lex_string(jstate *st, char quote, const char **out, size_t *outlen) {
    size_t cap = 64, n = 0;
    char *buf = malloc(cap);
    if (!buf) return 0;
    unsigned pending_hi = 0;  // a lone high surrogate waiting for its low half
    for (;;) {
        if (st->cur >= st->n) {
            lex_fail(st, "Unexpected end of input");
            goto bad;
        }
        char c = st->s[st->cur];
        if (c == quote) break;
        if (cap - n < 16) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) goto bad;
            buf = nb;
        }
        uint32_t unit = 0;
        int is_unit = 0;
        if (c == '\\') {
            st->cur++;
            if (st->cur >= st->n) {
                lex_fail(st, "Unexpected end of input");
                goto bad;
            }
            char e = st->s[st->cur++];
            if (e == 'x' || e == 'u') {
                size_t l = e == 'x' ? 2 : 4;
                if (st->cur + l > st->n) {
                    lex_fail(st, "Invalid hexadecimal escape sequence");
                    goto bad;
                }
                for (size_t k = 0; k < l; k++) {
                    char h = st->s[st->cur + k];
                    int d = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                    if (d < 0) {
                        lex_fail(st, "Invalid hexadecimal escape sequence");
                        goto bad;
                    }
                    unit = unit * 16 + (uint32_t)d;
                }
                st->cur += l;
                is_unit = 1;
            } else {
                char r;
                switch (e) {
                case 'n': r = '\n'; break;
                case 't': r = '\t'; break;
                case 'r': r = '\r'; break;
                case 'b': r = '\b'; break;
                case 'f': r = '\f'; break;
                case 'v': r = '\v'; break;
                case '\'': r = '\''; break;
                case '"': r = '"'; break;
                case '\\': r = '\\'; break;
                default: lex_fail(st, "Unexpected escaped character"); goto bad;
                }
                unit = (unsigned char)r;
                is_unit = 1;
            }
        }
        if (pending_hi) {  // flush or pair a pending high surrogate
            if (is_unit && unit >= 0xDC00 && unit <= 0xDFFF) {
                n += td_jinja_utf8_encode(0x10000 + ((pending_hi - 0xD800) << 10) + (unit - 0xDC00), buf + n);
                pending_hi = 0;
                continue;
            }
            n += td_jinja_utf8_encode(pending_hi, buf + n);
            pending_hi = 0;
        }
        if (is_unit) {
            if (unit >= 0xD800 && unit <= 0xDBFF) pending_hi = unit;
            else n += td_jinja_utf8_encode(unit, buf + n);
            continue;
        }
        buf[n++] = c;
        st->cur++;
        if (st->cur >= st->n) {
            lex_fail(st, "Unexpected end of input");
            goto bad;
        }
    }
    if (pending_hi) n += td_jinja_utf8_encode(pending_hi, buf + n);
    *out = td_jinja_strdup(st->arena, buf, n);
    *outlen = n;
    free(buf);
    return *out != NULL;
bad:
    free(buf);
    if (!st->failed) {
        st->failed = 1;
        td_err_set(st->err, TD_ERR_NOMEM, "chat template: out of memory");
    }
    return 0;
}

static void strip_trailing_ws(jstate *st) {
    if (!st->ntok || st->toks[st->ntok - 1].type != T_TEXT) return;
    token *t = &st->toks[st->ntok - 1];
    // trimEnd: drop whitespace code points from the end
    while (t->len > 0) {
        size_t k = t->len - 1;
        while (k > 0 && ((unsigned char)t->s[k] & 0xC0) == 0x80 && t->len - k < 4) k--;
        size_t w = td_jinja_ws_len(t->s + k, t->len - k);
        if (w && k + w == t->len) t->len = k;
        else break;
    }
    if (t->len == 0) st->ntok--;
}

static const struct {
    const char *seq;
    int type;
} MAPPING[] = {
    {"{%", T_OPEN_STMT}, {"%}", T_CLOSE_STMT}, {"{{", T_OPEN_EXPR}, {"}}", T_CLOSE_EXPR},
    {"(", T_LPAREN},     {")", T_RPAREN},      {"{", T_LBRACE},     {"}", T_RBRACE},
    {"[", T_LBRACKET},   {"]", T_RBRACKET},    {",", T_COMMA},      {".", T_DOT},
    {":", T_COLON},      {"|", T_PIPE},        {"<=", T_CMP},       {">=", T_CMP},
    {"==", T_CMP},       {"!=", T_CMP},        {"<", T_CMP},        {">", T_CMP},
    {"+", T_ADD},        {"-", T_ADD},         {"~", T_ADD},        {"**", T_POW},
    {"*", T_MUL},        {"//", T_MUL},        {"/", T_MUL},        {"%", T_MUL},
    {"=", T_EQUALS},
};

static int lex(jstate *st) {
    const char *s = st->s;
    size_t n = st->n;
    int curly = 0;
    while (st->cur < n && !st->failed) {
        int lt = last_type(st);
        if (lt == T_NONE || lt == T_CLOSE_STMT || lt == T_CLOSE_EXPR || lt == T_COMMENT) {
            size_t start = st->cur;
            while (st->cur < n && !(s[st->cur] == '{' && st->cur + 1 < n &&
                                    (s[st->cur + 1] == '%' || s[st->cur + 1] == '{' || s[st->cur + 1] == '#')))
                st->cur++;
            if (st->cur > start) {
                if (!push_tok(st, T_TEXT, start, s + start, st->cur - start)) return 0;
                continue;
            }
        }
        size_t c0 = st->cur;
        if (s[c0] == '{' && c0 + 1 < n && s[c0 + 1] == '#') {
            st->cur += 2;
            int strip_before = st->cur < n && s[st->cur] == '-';
            if (strip_before) st->cur++;
            size_t cs = st->cur;
            while (!(st->cur + 1 < n && s[st->cur] == '#' && s[st->cur + 1] == '}')) {
                if (st->cur + 2 >= n) {
                    lex_fail(st, "Missing end of comment tag");
                    return 0;
                }
                st->cur++;
            }
            size_t clen = st->cur - cs;
            int strip_after = clen > 0 && s[cs + clen - 1] == '-';
            if (strip_after) clen--;
            if (strip_before) strip_trailing_ws(st);
            if (!push_tok(st, T_COMMENT, c0, s + cs, clen)) return 0;
            st->cur += 2;
            if (strip_after) st->cur = skip_ws(s, n, st->cur);
            continue;
        }
        if (c0 + 2 < n && s[c0] == '{' && s[c0 + 1] == '%' && s[c0 + 2] == '-') {
            strip_trailing_ws(st);
            if (!push_tok(st, T_OPEN_STMT, c0, "{%", 2)) return 0;
            st->cur += 3;
            continue;
        }
        if (c0 + 2 < n && s[c0] == '{' && s[c0 + 1] == '{' && s[c0 + 2] == '-') {
            strip_trailing_ws(st);
            if (!push_tok(st, T_OPEN_EXPR, c0, "{{", 2)) return 0;
            curly = 0;
            st->cur += 3;
            continue;
        }
        // consumeWhile(isWhitespace): throws when it consumes the last character
        {
            size_t w;
            while (st->cur < n && (w = td_jinja_ws_len(s + st->cur, n - st->cur)) > 0) {
                st->cur += w;
                if (st->cur >= n) {
                    lex_fail(st, "Unexpected end of input");
                    return 0;
                }
            }
        }
        size_t c = st->cur;
        if (c + 2 < n && s[c] == '-' && s[c + 1] == '%' && s[c + 2] == '}') {
            if (!push_tok(st, T_CLOSE_STMT, c, "%}", 2)) return 0;
            st->cur = skip_ws(s, n, c + 3);
            continue;
        }
        if (c + 2 < n && s[c] == '-' && s[c + 1] == '}' && s[c + 2] == '}') {
            if (!push_tok(st, T_CLOSE_EXPR, c, "}}", 2)) return 0;
            st->cur = skip_ws(s, n, c + 3);
            continue;
        }
        char ch = s[c];
        if (ch == '-' || ch == '+') {
            int l2 = last_type(st);
            if (l2 == T_TEXT || l2 == T_NONE) {
                lex_fail(st, "Unexpected character");
                return 0;
            }
            if (!(l2 == T_IDENT || l2 == T_NUM || l2 == T_STR || l2 == T_RPAREN || l2 == T_RBRACKET)) {
                st->cur++;
                size_t ds = st->cur;
                while (st->cur < n && is_digit(s[st->cur])) {
                    st->cur++;
                    if (st->cur >= n) {
                        lex_fail(st, "Unexpected end of input");
                        return 0;
                    }
                }
                size_t nd = st->cur - ds;
                if (nd > 0 && s[st->cur] == '.' && st->cur + 1 < n && is_digit(s[st->cur + 1])) {
                    st->cur++;
                    while (st->cur < n && is_digit(s[st->cur])) {
                        st->cur++;
                        if (st->cur >= n) {
                            lex_fail(st, "Unexpected end of input");
                            return 0;
                        }
                    }
                }
                if (!push_tok(st, nd > 0 ? T_NUM : T_UNARY, c, s + c, st->cur - c)) return 0;
                continue;
            }
        }
        int matched = 0;
        for (size_t m = 0; m < sizeof MAPPING / sizeof MAPPING[0]; m++) {
            size_t l = strlen(MAPPING[m].seq);
            if (MAPPING[m].type == T_CLOSE_EXPR && curly > 0) continue;
            if (c + l <= n && memcmp(s + c, MAPPING[m].seq, l) == 0) {
                int ty = MAPPING[m].type;
                if (!push_tok(st, ty, c, s + c, l)) return 0;
                if (ty == T_OPEN_EXPR) curly = 0;
                else if (ty == T_LBRACE) curly++;
                else if (ty == T_RBRACE) curly--;
                st->cur += l;
                matched = 1;
                break;
            }
        }
        if (matched) continue;
        if (ch == '\'' || ch == '"') {
            st->cur++;
            const char *v;
            size_t vl;
            if (!lex_string(st, ch, &v, &vl)) return 0;
            if (!push_tok(st, T_STR, c, v, vl)) return 0;
            st->cur++;
            continue;
        }
        if (is_digit(ch)) {
            while (st->cur < n && is_digit(s[st->cur])) {
                st->cur++;
                if (st->cur >= n) {
                    lex_fail(st, "Unexpected end of input");
                    return 0;
                }
            }
            if (last_type(st) != T_DOT && s[st->cur] == '.' && st->cur + 1 < n && is_digit(s[st->cur + 1])) {
                st->cur++;
                while (st->cur < n && is_digit(s[st->cur])) {
                    st->cur++;
                    if (st->cur >= n) {
                        lex_fail(st, "Unexpected end of input");
                        return 0;
                    }
                }
            }
            if (!push_tok(st, T_NUM, c, s + c, st->cur - c)) return 0;
            continue;
        }
        if (is_word(ch)) {
            while (st->cur < n && is_word(s[st->cur])) {
                st->cur++;
                if (st->cur >= n) {
                    lex_fail(st, "Unexpected end of input");
                    return 0;
                }
            }
            if (!push_tok(st, T_IDENT, c, s + c, st->cur - c)) return 0;
            continue;
        }
        lex_fail(st, "Unexpected character");
        return 0;
    }
    return !st->failed;
}

// ---------------------------------------------------------------------------------------------
// parser (recursive descent, same grammar and precedence as @huggingface/jinja)

typedef td_jinja_node node;

static token *tk(jstate *st, size_t off) { return st->p + off < st->ntok ? &st->toks[st->p + off] : NULL; }
static int is_t(jstate *st, int type) {
    token *t = tk(st, 0);
    return t && t->type == type;
}
static int tok_is(token *t, const char *word) {
    size_t l = strlen(word);
    return t && t->type == T_IDENT && t->len == l && memcmp(t->s, word, l) == 0;
}
static int is_ident(jstate *st, const char *w) { return tok_is(tk(st, 0), w); }
static int is_ident2(jstate *st, const char *w1, const char *w2) { return tok_is(tk(st, 0), w1) && tok_is(tk(st, 1), w2); }
// {% name ... with name one of the given words
static int is_stmt(jstate *st, const char *w1, const char *w2, const char *w3) {
    token *t0 = tk(st, 0), *t1 = tk(st, 1);
    if (!t0 || t0->type != T_OPEN_STMT || !t1) return 0;
    return tok_is(t1, w1) || (w2 && tok_is(t1, w2)) || (w3 && tok_is(t1, w3));
}
static size_t cur_pos(jstate *st) {
    token *t = tk(st, 0);
    return t ? t->pos : st->orig_len;
}

static node *mk(jstate *st, int kind, size_t pos) {
    node *x = td_jinja_alloc(st->arena, sizeof(node));
    if (!x) {
        if (!st->failed) {
            st->failed = 1;
            td_err_set(st->err, TD_ERR_NOMEM, "chat template: out of memory");
        }
        return NULL;
    }
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->pos = (uint32_t)pos;
    x->depth = 1;
    return x;
}

// computes depth from the children; fails when the tree gets too deep to walk safely
static node *fin(jstate *st, node *x) {
    if (!x) return NULL;
    int d = 0;
    node *ch[3] = {x->a, x->b, x->c};
    for (int i = 0; i < 3; i++)
        if (ch[i] && ch[i]->depth > d) d = ch[i]->depth;
    for (size_t i = 0; i < x->n; i++)
        if (x->list[i] && x->list[i]->depth > d) d = x->list[i]->depth;
    for (size_t i = 0; i < x->n2; i++)
        if (x->list2[i] && x->list2[i]->depth > d) d = x->list2[i]->depth;
    x->depth = d + 1;
    if (x->depth > MAX_AST_DEPTH) {
        fail_at(st, x->pos, "template nested too deeply (more than %d levels)", MAX_AST_DEPTH);
        return NULL;
    }
    return x;
}

typedef struct {
    node **v;
    size_t n, cap;
} nvec;

static int nv_push(jstate *st, nvec *v, node *x) {
    if (!x) return 0;
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        node **nv = td_jinja_alloc(st->arena, nc * sizeof(node *));
        if (!nv) return 0;
        if (v->n) memcpy(nv, v->v, v->n * sizeof(node *));
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return 1;
}

static int expect(jstate *st, int type, const char *what) {
    token *t = tk(st, 0);
    if (!t || t->type != type) {
        fail_at(st, cur_pos(st), "%s", what);
        return 0;
    }
    st->p++;
    return 1;
}
static int expect_ident(jstate *st, const char *w) {
    if (!is_ident(st, w)) {
        fail_at(st, cur_pos(st), "expected '%s'", w);
        return 0;
    }
    st->p++;
    return 1;
}

static int enter(jstate *st) {
    if (++st->nest > MAX_PARSE_NEST) {
        fail_at(st, cur_pos(st), "template nested too deeply (more than %d levels)", MAX_PARSE_NEST);
        return 0;
    }
    return 1;
}
#define LEAVE(st, x) (st->nest--, (x))

static node *parse_any(jstate *st);
static node *parse_expression(jstate *st);
static node *parse_primary(jstate *st);
static node *parse_member(jstate *st, node *obj);
static node *parse_call(jstate *st, node *callee);

static int parse_body_until(jstate *st, nvec *body, const char *w1, const char *w2, const char *w3) {
    while (!is_stmt(st, w1, w2, w3)) {
        if (st->failed) return 0;
        if (!tk(st, 0)) {
            fail_at(st, st->orig_len, "unexpected end of template: missing {%% %s %%}", w1);
            return 0;
        }
        if (!nv_push(st, body, parse_any(st))) return 0;
    }
    return !st->failed;
}

static node *parse_expr_seq(jstate *st, int primary) {
    size_t pos = cur_pos(st);
    node *first = primary ? parse_primary(st) : parse_expression(st);
    if (!first) return NULL;
    if (!is_t(st, T_COMMA)) return first;
    nvec v = {0};
    if (!nv_push(st, &v, first)) return NULL;
    while (1) {
        st->p++;
        if (!nv_push(st, &v, primary ? parse_primary(st) : parse_expression(st))) return NULL;
        if (!is_t(st, T_COMMA)) break;
    }
    node *t = mk(st, JN_TUPLE, pos);
    if (!t) return NULL;
    t->list = v.v;
    t->n = v.n;
    return fin(st, t);
}

// parseArgumentsList; parameters = 1 for macro/caller parameter declarations
static int parse_args(jstate *st, int parameters, node ***out, size_t *nout) {
    if (!expect(st, T_LPAREN, "expected '(' for the argument list")) return 0;
    nvec v = {0};
    int saw_kw = 0, saw_spread = 0;
    while (!is_t(st, T_RPAREN)) {
        if (st->failed) return 0;
        if (!tk(st, 0)) {
            fail_at(st, st->orig_len, "unexpected end of template in argument list");
            return 0;
        }
        size_t pos = cur_pos(st);
        int kw_spread = is_t(st, T_POW);
        int pos_spread = is_t(st, T_MUL) && tk(st, 0)->len == 1 && tk(st, 0)->s[0] == '*';
        if (parameters && (kw_spread || pos_spread)) {
            fail_at(st, pos, "argument unpacking is not allowed in parameter declarations");
            return 0;
        }
        if (kw_spread) {
            st->p++;
            node *x = mk(st, JN_KWSPREAD, pos);
            if (!x || !(x->a = parse_expression(st)) || !nv_push(st, &v, fin(st, x))) return 0;
            if (is_t(st, T_COMMA)) st->p++;
            if (!is_t(st, T_RPAREN)) {
                fail_at(st, cur_pos(st), "expected ')': ** must be applied to the final argument");
                return 0;
            }
            break;
        }
        node *arg;
        if (pos_spread) {
            if (saw_spread) {
                fail_at(st, pos, "only one * argument unpacking is allowed");
                return 0;
            }
            saw_spread = 1;
            st->p++;
            arg = mk(st, JN_SPREAD, pos);
            if (!arg || !(arg->a = parse_expression(st)) || !fin(st, arg)) return 0;
        } else {
            arg = parse_expression(st);
            if (!arg) return 0;
            if (is_t(st, T_EQUALS)) {
                st->p++;
                if (arg->kind != JN_IDENT) {
                    fail_at(st, pos, "expected identifier for keyword argument");
                    return 0;
                }
                node *kw = mk(st, JN_KWARG, pos);
                if (!kw) return 0;
                kw->s = arg->s;
                kw->slen = arg->slen;
                if (!(kw->a = parse_expression(st)) || !fin(st, kw)) return 0;
                arg = kw;
            }
            if (parameters) {
                if (arg->kind != JN_IDENT && arg->kind != JN_KWARG) {
                    fail_at(st, pos, "expected identifier for parameter declaration");
                    return 0;
                }
                for (size_t i = 0; i < v.n; i++)
                    if (v.v[i]->slen == arg->slen && memcmp(v.v[i]->s, arg->s, arg->slen) == 0) {
                        fail_at(st, pos, "duplicate parameter name");
                        return 0;
                    }
            }
            if (arg->kind == JN_KWARG) saw_kw = 1;
            else if (saw_kw) {
                fail_at(st, pos, parameters ? "non-default argument follows default argument"
                                            : "positional arguments must come before keyword arguments");
                return 0;
            } else if (saw_spread) {
                fail_at(st, pos, "positional arguments must not follow * argument unpacking");
                return 0;
            }
        }
        if (!nv_push(st, &v, arg)) return 0;
        if (is_t(st, T_COMMA)) st->p++;
    }
    if (!expect(st, T_RPAREN, "expected ')' after the argument list")) return 0;
    *out = v.v;
    *nout = v.n;
    return 1;
}

static node *parse_if_expr(jstate *st);

static node *parse_primary(jstate *st) {
    token *t = tk(st, 0);
    if (!t) {
        fail_at(st, st->orig_len, "unexpected end of template in expression");
        return NULL;
    }
    st->p++;
    size_t pos = t->pos;
    switch (t->type) {
    case T_NUM: {
        int is_float = memchr(t->s, '.', t->len) != NULL;
        node *x = mk(st, is_float ? JN_FLOAT : JN_INT, pos);
        if (!x) return NULL;
        char buf[64];
        if (t->len < sizeof buf) {
            memcpy(buf, t->s, t->len);
            buf[t->len] = 0;
            x->num = strtod(buf, NULL);
        } else {
            char *tmp = td_jinja_strdup(st->arena, t->s, t->len);
            if (!tmp) return NULL;
            x->num = strtod(tmp, NULL);
        }
        return x;
    }
    case T_STR: {
        node *x = mk(st, JN_STR, pos);
        if (!x) return NULL;
        x->s = t->s;
        x->slen = t->len;
        if (is_t(st, T_STR)) {  // adjacent literals concatenate
            char *acc = td_jinja_strdup(st->arena, t->s, t->len);
            size_t n = t->len;
            while (acc && is_t(st, T_STR)) {
                token *u = tk(st, 0);
                acc = td_jinja_concat(st->arena, acc, n, u->s, u->len);
                n += u->len;
                st->p++;
            }
            if (!acc) {
                fail_at(st, pos, "out of memory");
                return NULL;
            }
            x->s = acc;
            x->slen = n;
        }
        return x;
    }
    case T_IDENT: {
        node *x = mk(st, JN_IDENT, pos);
        if (!x) return NULL;
        x->s = t->s;
        x->slen = t->len;
        return x;
    }
    case T_LPAREN: {
        if (!enter(st)) return NULL;
        node *x = parse_expr_seq(st, 0);
        if (!x || !expect(st, T_RPAREN, "expected ')'")) return LEAVE(st, NULL);
        return LEAVE(st, x);
    }
    case T_LBRACKET: {
        if (!enter(st)) return NULL;
        nvec v = {0};
        while (!is_t(st, T_RBRACKET)) {
            if (!tk(st, 0)) {
                fail_at(st, st->orig_len, "unexpected end of template in list");
                return LEAVE(st, NULL);
            }
            if (!nv_push(st, &v, parse_expression(st))) return LEAVE(st, NULL);
            if (is_t(st, T_COMMA)) st->p++;
        }
        st->p++;
        node *x = mk(st, JN_ARRAY, pos);
        if (!x) return LEAVE(st, NULL);
        x->list = v.v;
        x->n = v.n;
        return LEAVE(st, fin(st, x));
    }
    case T_LBRACE: {
        if (!enter(st)) return NULL;
        nvec k = {0}, v = {0};
        while (!is_t(st, T_RBRACE)) {
            if (!tk(st, 0)) {
                fail_at(st, st->orig_len, "unexpected end of template in dict");
                return LEAVE(st, NULL);
            }
            if (!nv_push(st, &k, parse_expression(st))) return LEAVE(st, NULL);
            if (!expect(st, T_COLON, "expected ':' between key and value in dict literal")) return LEAVE(st, NULL);
            if (!nv_push(st, &v, parse_expression(st))) return LEAVE(st, NULL);
            if (is_t(st, T_COMMA)) st->p++;
        }
        st->p++;
        node *x = mk(st, JN_OBJECT, pos);
        if (!x) return LEAVE(st, NULL);
        x->list = k.v;
        x->n = k.n;
        x->list2 = v.v;
        x->n2 = v.n;
        return LEAVE(st, fin(st, x));
    }
    default:
        fail_at(st, pos, "unexpected token '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
        return NULL;
    }
}

// inside [ ]: an index or a slice a:b:c
static node *parse_subscript(jstate *st) {
    node *sl[3] = {0};
    int count = 0, is_slice = 0;
    size_t pos = cur_pos(st);
    while (!is_t(st, T_RBRACKET)) {
        if (!tk(st, 0)) {
            fail_at(st, st->orig_len, "unexpected end of template in subscript");
            return NULL;
        }
        if (count >= 3) {
            fail_at(st, cur_pos(st), "expected 0-3 arguments for slice expression");
            return NULL;
        }
        if (is_t(st, T_COLON)) {
            sl[count++] = NULL;
            st->p++;
            is_slice = 1;
        } else {
            node *e = parse_expression(st);
            if (!e) return NULL;
            sl[count++] = e;
            if (is_t(st, T_COLON)) {
                st->p++;
                is_slice = 1;
            }
        }
    }
    if (count == 0) {
        fail_at(st, pos, "expected at least one argument for member/slice expression");
        return NULL;
    }
    if (!is_slice) return sl[0];
    node *x = mk(st, JN_SLICE, pos);
    if (!x) return NULL;
    x->a = sl[0];
    x->b = sl[1];
    x->c = sl[2];
    return fin(st, x);
}

static node *parse_member(jstate *st, node *obj) {
    while (obj && (is_t(st, T_DOT) || is_t(st, T_LBRACKET))) {
        size_t pos = cur_pos(st);
        int computed = is_t(st, T_LBRACKET);
        st->p++;
        node *prop;
        if (computed) {
            prop = parse_subscript(st);
            if (!prop || !expect(st, T_RBRACKET, "expected ']'")) return NULL;
        } else {
            prop = parse_primary(st);
            if (!prop) return NULL;
            if (prop->kind != JN_IDENT && prop->kind != JN_INT) {
                fail_at(st, pos, "expected identifier or integer following dot operator");
                return NULL;
            }
        }
        node *m = mk(st, JN_MEMBER, pos);
        if (!m) return NULL;
        m->a = obj;
        m->b = prop;
        m->op = computed;
        obj = fin(st, m);
    }
    return obj;
}

static node *parse_call(jstate *st, node *callee) {
    if (!enter(st)) return NULL;
    node *x = mk(st, JN_CALL, callee->pos);
    if (!x) return LEAVE(st, NULL);
    x->a = callee;
    if (!parse_args(st, 0, &x->list, &x->n)) return LEAVE(st, NULL);
    x = parse_member(st, fin(st, x));
    if (x && is_t(st, T_LPAREN)) x = parse_call(st, x);
    return LEAVE(st, x);
}

static node *parse_call_member(jstate *st) {
    node *m = parse_member(st, parse_primary(st));
    if (m && is_t(st, T_LPAREN)) return parse_call(st, m);
    return m;
}

static node *parse_unary_sign(jstate *st) {
    token *t = tk(st, 0);
    if (t && (t->type == T_UNARY || t->type == T_ADD) && t->len == 1 && (t->s[0] == '-' || t->s[0] == '+')) {
        if (!enter(st)) return NULL;
        st->p++;
        node *x = mk(st, JN_UNARY, t->pos);
        if (!x) return LEAVE(st, NULL);
        x->op = t->s[0] == '-' ? JOP_NEG : JOP_POS;
        if (!(x->a = parse_unary_sign(st))) return LEAVE(st, NULL);
        return LEAVE(st, fin(st, x));
    }
    return parse_call_member(st);
}

static node *parse_filter_expr(jstate *st) {
    node *operand = parse_unary_sign(st);
    while (operand && is_t(st, T_PIPE)) {
        size_t pos = cur_pos(st);
        st->p++;
        node *f = parse_primary(st);
        if (!f) return NULL;
        if (f->kind != JN_IDENT) {
            fail_at(st, pos, "expected identifier for the filter");
            return NULL;
        }
        if (is_t(st, T_LPAREN)) f = parse_call(st, f);
        if (!f) return NULL;
        node *x = mk(st, JN_FILTER, pos);
        if (!x) return NULL;
        x->a = operand;
        x->b = f;
        operand = fin(st, x);
    }
    return operand;
}

static node *parse_test_expr(jstate *st) {
    node *operand = parse_filter_expr(st);
    while (operand && is_ident(st, "is")) {
        size_t pos = cur_pos(st);
        st->p++;
        int negate = is_ident(st, "not");
        if (negate) st->p++;
        node *f = parse_primary(st);
        if (!f) return NULL;
        if (f->kind != JN_IDENT) {
            fail_at(st, pos, "expected identifier for the test");
            return NULL;
        }
        node *x = mk(st, JN_TEST, pos);
        if (!x) return NULL;
        x->a = operand;
        x->op = negate;
        x->s = f->s;
        x->slen = f->slen;
        operand = fin(st, x);
    }
    return operand;
}

static int binop_of(token *t) {
    const char *s = t->s;
    size_t l = t->len;
#define IS(str) (l == sizeof(str) - 1 && memcmp(s, str, l) == 0)
    if (IS("+")) return JOP_ADD;
    if (IS("-")) return JOP_SUB;
    if (IS("~")) return JOP_CONCAT;
    if (IS("*")) return JOP_MUL;
    if (IS("/")) return JOP_DIV;
    if (IS("//")) return JOP_FLOORDIV;
    if (IS("%")) return JOP_MOD;
    if (IS("**")) return JOP_POW;
    if (IS("==")) return JOP_EQ;
    if (IS("!=")) return JOP_NE;
    if (IS("<")) return JOP_LT;
    if (IS(">")) return JOP_GT;
    if (IS("<=")) return JOP_LE;
    if (IS(">=")) return JOP_GE;
#undef IS
    return -1;
}

static node *mk_bin(jstate *st, int op, size_t pos, node *l, node *r) {
    if (!l || !r) return NULL;
    node *x = mk(st, JN_BINARY, pos);
    if (!x) return NULL;
    x->op = op;
    x->a = l;
    x->b = r;
    return fin(st, x);
}

static node *parse_power(jstate *st) {
    node *l = parse_test_expr(st);
    while (l && is_t(st, T_POW)) {
        size_t pos = cur_pos(st);
        st->p++;
        l = mk_bin(st, JOP_POW, pos, l, parse_test_expr(st));
    }
    return l;
}

static node *parse_mul(jstate *st) {
    node *l = parse_power(st);
    while (l && is_t(st, T_MUL)) {
        token *t = tk(st, 0);
        st->p++;
        l = mk_bin(st, binop_of(t), t->pos, l, parse_power(st));
    }
    return l;
}

static node *parse_add(jstate *st) {
    node *l = parse_mul(st);
    while (l && is_t(st, T_ADD)) {
        token *t = tk(st, 0);
        st->p++;
        l = mk_bin(st, binop_of(t), t->pos, l, parse_mul(st));
    }
    return l;
}

static node *parse_comparison(jstate *st) {
    node *l = parse_add(st);
    while (l) {
        int op;
        size_t pos = cur_pos(st);
        if (is_ident2(st, "not", "in")) {
            op = JOP_NOTIN;
            st->p += 2;
        } else if (is_ident(st, "in")) {
            op = JOP_IN;
            st->p++;
        } else if (is_t(st, T_CMP)) {
            op = binop_of(tk(st, 0));
            st->p++;
        } else
            break;
        l = mk_bin(st, op, pos, l, parse_add(st));
    }
    return l;
}

static node *parse_not(jstate *st) {
    node *right = NULL;  // like the original, `not a not b` keeps only the last operand
    while (is_ident(st, "not")) {
        size_t pos = cur_pos(st);
        if (!enter(st)) return NULL;
        st->p++;
        node *x = mk(st, JN_UNARY, pos);
        if (!x) return LEAVE(st, NULL);
        x->op = JOP_NOT;
        if (!(x->a = parse_not(st))) return LEAVE(st, NULL);
        right = LEAVE(st, fin(st, x));
        if (!right) return NULL;
    }
    return right ? right : parse_comparison(st);
}

static node *parse_and(jstate *st) {
    node *l = parse_not(st);
    while (l && is_ident(st, "and")) {
        size_t pos = cur_pos(st);
        st->p++;
        l = mk_bin(st, JOP_AND, pos, l, parse_not(st));
    }
    return l;
}

static node *parse_or(jstate *st) {
    node *l = parse_and(st);
    while (l && is_ident(st, "or")) {
        size_t pos = cur_pos(st);
        st->p++;
        l = mk_bin(st, JOP_OR, pos, l, parse_and(st));
    }
    return l;
}

static node *parse_if_expr(jstate *st) {
    node *a = parse_or(st);
    if (a && is_ident(st, "if")) {
        size_t pos = cur_pos(st);
        st->p++;
        node *test = parse_or(st);
        if (!test) return NULL;
        if (is_ident(st, "else")) {
            st->p++;
            if (!enter(st)) return NULL;
            node *f = parse_if_expr(st);
            st->nest--;
            if (!f) return NULL;
            node *x = mk(st, JN_TERNARY, pos);
            if (!x) return NULL;
            x->a = test;
            x->b = a;
            x->c = f;
            return fin(st, x);
        }
        node *x = mk(st, JN_SELECT, pos);
        if (!x) return NULL;
        x->a = a;
        x->b = test;
        return fin(st, x);
    }
    return a;
}

static node *parse_expression(jstate *st) {
    if (!enter(st)) return NULL;
    node *x = parse_if_expr(st);
    return LEAVE(st, x);
}

static node *parse_if_stmt(jstate *st, size_t pos) {
    if (!enter(st)) return NULL;
    node *x = mk(st, JN_IF, pos);
    if (!x || !(x->a = parse_expression(st)) || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    nvec body = {0}, alt = {0};
    if (!parse_body_until(st, &body, "elif", "else", "endif")) return LEAVE(st, NULL);
    if (is_stmt(st, "elif", NULL, NULL)) {
        size_t epos = tk(st, 1)->pos;
        st->p += 2;
        if (!nv_push(st, &alt, parse_if_stmt(st, epos))) return LEAVE(st, NULL);
    } else if (is_stmt(st, "else", NULL, NULL)) {
        st->p += 2;
        if (!expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        if (!parse_body_until(st, &alt, "endif", NULL, NULL)) return LEAVE(st, NULL);
    }
    x->list = body.v;
    x->n = body.n;
    x->list2 = alt.v;
    x->n2 = alt.n;
    return LEAVE(st, fin(st, x));
}

// does the subtree read an identifier named kwargs / varargs?
static void find_special(node *x, int *kw, int *va) {
    if (!x) return;
    if (x->kind == JN_IDENT) {
        if (x->slen == 6 && memcmp(x->s, "kwargs", 6) == 0) *kw = 1;
        if (x->slen == 7 && memcmp(x->s, "varargs", 7) == 0) *va = 1;
        return;
    }
    if (x->kind == JN_MEMBER && !x->op) {  // .name is not a variable read
        find_special(x->a, kw, va);
        return;
    }
    find_special(x->a, kw, va);
    find_special(x->b, kw, va);
    find_special(x->c, kw, va);
    for (size_t i = 0; i < x->n; i++) find_special(x->list[i], kw, va);
    for (size_t i = 0; i < x->n2; i++) find_special(x->list2[i], kw, va);
}

static void mark_special(node *x, node **params, size_t np, node **body, size_t nb) {
    int kw = 0, va = 0;
    for (size_t i = 0; i < np; i++)
        if (params[i]->kind == JN_KWARG) find_special(params[i]->a, &kw, &va);
    for (size_t i = 0; i < nb; i++) find_special(body[i], &kw, &va);
    for (size_t i = 0; i < np; i++) {  // a parameter of that name shadows the special
        if (params[i]->slen == 6 && memcmp(params[i]->s, "kwargs", 6) == 0) kw = 0;
        if (params[i]->slen == 7 && memcmp(params[i]->s, "varargs", 7) == 0) va = 0;
    }
    x->uses_kwargs = kw;
    x->uses_varargs = va;
}

static node *parse_statement(jstate *st) {
    size_t pos = cur_pos(st);
    if (!expect(st, T_OPEN_STMT, "expected '{%'")) return NULL;
    token *t = tk(st, 0);
    if (!t || t->type != T_IDENT) {
        fail_at(st, cur_pos(st), "expected a statement name after '{%%'");
        return NULL;
    }
    if (!enter(st)) return NULL;
    node *x = NULL;
    if (tok_is(t, "set")) {
        st->p++;
        x = mk(st, JN_SET, pos);
        if (!x || !(x->a = parse_expr_seq(st, 0))) return LEAVE(st, NULL);
        if (is_t(st, T_EQUALS)) {
            st->p++;
            if (!(x->b = parse_expr_seq(st, 0))) return LEAVE(st, NULL);
        } else {
            nvec body = {0};
            if (!expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
            if (!parse_body_until(st, &body, "endset", NULL, NULL)) return LEAVE(st, NULL);
            st->p += 2;
            x->list = body.v;
            x->n = body.n;
        }
        if (!expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    } else if (tok_is(t, "if")) {
        st->p++;
        x = parse_if_stmt(st, pos);
        if (!x || !expect(st, T_OPEN_STMT, "expected {% endif %}") || !expect_ident(st, "endif") ||
            !expect(st, T_CLOSE_STMT, "expected '%}'"))
            return LEAVE(st, NULL);
    } else if (tok_is(t, "macro")) {
        st->p++;
        x = mk(st, JN_MACRO, pos);
        if (!x) return LEAVE(st, NULL);
        node *name = parse_primary(st);
        if (!name) return LEAVE(st, NULL);
        if (name->kind != JN_IDENT) {
            fail_at(st, name->pos, "expected identifier following macro statement");
            return LEAVE(st, NULL);
        }
        x->s = name->s;
        x->slen = name->slen;
        if (!parse_args(st, 1, &x->list, &x->n) || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        nvec body = {0};
        if (!parse_body_until(st, &body, "endmacro", NULL, NULL)) return LEAVE(st, NULL);
        x->list2 = body.v;
        x->n2 = body.n;
        st->p++;
        if (!expect_ident(st, "endmacro") || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        mark_special(x, x->list, x->n, x->list2, x->n2);
    } else if (tok_is(t, "for")) {
        st->p++;
        x = mk(st, JN_FOR, pos);
        if (!x || !(x->a = parse_expr_seq(st, 1))) return LEAVE(st, NULL);
        if (x->a->kind != JN_IDENT && x->a->kind != JN_TUPLE) {
            fail_at(st, x->a->pos, "expected identifier/tuple for the loop variable");
            return LEAVE(st, NULL);
        }
        if (!is_ident(st, "in")) {
            fail_at(st, cur_pos(st), "expected 'in' keyword following loop variable");
            return LEAVE(st, NULL);
        }
        st->p++;
        if (!(x->b = parse_expression(st)) || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        nvec body = {0}, alt = {0};
        if (!parse_body_until(st, &body, "endfor", "else", NULL)) return LEAVE(st, NULL);
        if (is_stmt(st, "else", NULL, NULL)) {
            st->p += 2;
            if (!expect(st, T_CLOSE_STMT, "expected '%}'") || !parse_body_until(st, &alt, "endfor", NULL, NULL))
                return LEAVE(st, NULL);
        }
        x->list = body.v;
        x->n = body.n;
        x->list2 = alt.v;
        x->n2 = alt.n;
        st->p++;
        if (!expect_ident(st, "endfor") || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    } else if (tok_is(t, "call")) {
        st->p++;
        x = mk(st, JN_CALLSTMT, pos);
        if (!x) return LEAVE(st, NULL);
        node **params = NULL;
        size_t np = 0;
        if (is_t(st, T_LPAREN)) {
            if (!parse_args(st, 1, &params, &np)) return LEAVE(st, NULL);
            x->op = 1;
        }
        node *callee = parse_primary(st);
        if (!callee) return LEAVE(st, NULL);
        if (callee->kind != JN_IDENT) {
            fail_at(st, callee->pos, "expected identifier following call statement");
            return LEAVE(st, NULL);
        }
        node *call = mk(st, JN_CALL, callee->pos);
        if (!call) return LEAVE(st, NULL);
        call->a = callee;
        if (!parse_args(st, 0, &call->list, &call->n) || !expect(st, T_CLOSE_STMT, "expected '%}'"))
            return LEAVE(st, NULL);
        x->a = fin(st, call);
        nvec body = {0};
        if (!x->a || !parse_body_until(st, &body, "endcall", NULL, NULL)) return LEAVE(st, NULL);
        st->p++;
        if (!expect_ident(st, "endcall") || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        // params in list (caller parameters), body in list2
        x->list = params;
        x->n = np;
        x->list2 = body.v;
        x->n2 = body.n;
        mark_special(x, params, np, body.v, body.n);
    } else if (tok_is(t, "break") || tok_is(t, "continue")) {
        x = mk(st, tok_is(t, "break") ? JN_BREAK : JN_CONTINUE, pos);
        st->p++;
        if (!x || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    } else if (tok_is(t, "filter")) {
        st->p++;
        x = mk(st, JN_FILTERSTMT, pos);
        if (!x) return LEAVE(st, NULL);
        node *f = parse_primary(st);
        if (f && f->kind == JN_IDENT && is_t(st, T_LPAREN)) f = parse_call(st, f);
        if (!f || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        x->a = f;
        nvec body = {0};
        if (!parse_body_until(st, &body, "endfilter", NULL, NULL)) return LEAVE(st, NULL);
        st->p++;
        if (!expect_ident(st, "endfilter") || !expect(st, T_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        x->list = body.v;
        x->n = body.n;
    } else {
        fail_at(st, t->pos, "unknown statement '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
        return LEAVE(st, NULL);
    }
    return LEAVE(st, fin(st, x));
}

static node *parse_any(jstate *st) {
    token *t = tk(st, 0);
    if (!t) {
        fail_at(st, st->orig_len, "unexpected end of template");
        return NULL;
    }
    switch (t->type) {
    case T_COMMENT: {
        node *x = mk(st, JN_COMMENT, t->pos);
        st->p++;
        return x;
    }
    case T_TEXT: {
        node *x = mk(st, JN_TEXT, t->pos);
        if (!x) return NULL;
        x->s = t->s;
        x->slen = t->len;
        st->p++;
        return x;
    }
    case T_OPEN_STMT:
        return parse_statement(st);
    case T_OPEN_EXPR: {
        st->p++;
        node *x = parse_expression(st);
        if (!x || !expect(st, T_CLOSE_EXPR, "expected '}}'")) return NULL;
        return x;
    }
    default:
        fail_at(st, t->pos, "unexpected token '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
        return NULL;
    }
}

// ---------------------------------------------------------------------------------------------
// public: compile / free

td_status td_chat_template_compile(const char *src, size_t len, td_chat_template **out, td_err *err) {
    if (!out) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL output");
    *out = NULL;
    if (!src && len) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL source");
    if (len > MAX_SOURCE) return td_err_set(err, TD_ERR_LIMIT, "chat template: source of %zu bytes exceeds %u", len, MAX_SOURCE);
    td_chat_template *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    t->src = malloc(len + 1);
    if (!t->src) {
        free(t);
        return td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    }
    if (len) memcpy(t->src, src, len);
    t->src[len] = 0;
    t->src_len = len;

    // preprocessing passes (each only deletes bytes)
    pp_buf a = {0}, b = {0};
    td_status st_code = TD_OK;
    int ok_a = pp_init(&a, len), ok_b = pp_init(&b, len);
    if (!ok_a || !ok_b) {
        pp_free(&a);
        pp_free(&b);
        td_chat_template_free(t);
        return td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    }
    for (size_t i = 0; i < len; i++) a.s[i] = src[i], a.map[i] = (uint32_t)i;
    a.n = len;
    a.map[len] = (uint32_t)len;
    if (a.n && a.s[a.n - 1] == '\n') a.n--;
    a.map[a.n] = (uint32_t)a.n;
    a.s[a.n] = 0;
    pp_lstrip_blocks(&a, &b);
    a.n = 0;
    pp_trim_blocks(&b, &a);
    b.n = 0;
    pp_generation(&a, &b);

    jstate st = {0};
    st.orig = t->src;
    st.orig_len = len;
    st.arena = &t->arena;
    st.err = err;
    st.s = td_jinja_strdup(&t->arena, b.s, b.n);  // text tokens point into this copy
    st.map = b.map;
    st.n = b.n;
    if (!st.s) {
        st.failed = 1;
        td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    }
    if (!st.failed && lex(&st)) {
        nvec body = {0};
        while (st.p < st.ntok && !st.failed) {
            if (!nv_push(&st, &body, parse_any(&st))) {
                if (!st.failed) {
                    st.failed = 1;
                    td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
                }
                break;
            }
        }
        t->body = body.v;
        t->n_body = body.n;
    }
    if (!st.failed && t->arena.failed) {
        st.failed = 1;
        td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    }
    if (st.failed) st_code = err ? err->status : TD_ERR_INVALID;
    if (st_code == TD_OK && st.failed) st_code = TD_ERR_INVALID;
    free(st.toks);
    pp_free(&a);
    pp_free(&b);
    if (st.failed) {
        td_chat_template_free(t);
        return st_code;
    }
    *out = t;
    return TD_OK;
}

void td_chat_template_free(td_chat_template *t) {
    if (!t) return;
    td_jinja_arena_free(&t->arena);
    free(t->src);
    free(t);
}

td_status td_chat_template_pick(const cJSON *cfg, const char *name, int want_tools, const char **src, td_err *err) {
    if (!src) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL output");
    *src = NULL;
    const cJSON *ct = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    if (!ct || cJSON_IsNull(ct))
        return td_err_set(err, TD_ERR_NOT_FOUND,
                          "the tokenizer config has no chat_template; pass a template explicitly (--chat-template FILE)");
    if (cJSON_IsString(ct)) {
        if (name && strcmp(name, "default") != 0)
            return td_err_set(err, TD_ERR_NOT_FOUND, "the tokenizer config has a single chat_template, not one named '%s'", name);
        *src = ct->valuestring;
        return TD_OK;
    }
    if (!cJSON_IsArray(ct)) return td_err_set(err, TD_ERR_FORMAT, "chat_template is neither a string nor a list");
    const char *want = name ? name : NULL;
    const cJSON *item, *found = NULL, *dflt = NULL, *tool = NULL;
    cJSON_ArrayForEach(item, ct) {
        const char *n = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "name"));
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(item, "template"));
        if (!n || !t) return td_err_set(err, TD_ERR_FORMAT, "chat_template list entries need string name and template");
        if (want && strcmp(n, want) == 0) found = item;
        if (strcmp(n, "default") == 0) dflt = item;
        if (strcmp(n, "tool_use") == 0) tool = item;
    }
    if (want && !found) return td_err_set(err, TD_ERR_NOT_FOUND, "the tokenizer config has no chat template named '%s'", want);
    if (!found) found = want_tools && tool ? tool : dflt;
    if (!found)
        return td_err_set(err, TD_ERR_NOT_FOUND,
                          "the tokenizer config has several chat templates and no 'default'; name one or pass --chat-template FILE");
    *src = cJSON_GetObjectItemCaseSensitive(found, "template")->valuestring;
    return TD_OK;
}
