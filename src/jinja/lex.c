// Jinja front half: the UTF-8 and JS-whitespace helpers (here, beside their hottest user; the
// interpreter shares them), @huggingface/jinja's source preprocessing (trailing newline,
// lstrip_blocks, trim_blocks, {% generation %}) and its lexer, ported rule for rule so that odd
// inputs lex the same way. The parser is parse.c.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/lex.h"

typedef td_jinja_compiler jstate;
typedef td_jinja_token token;

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

void td_jinja_fail_at(jstate *st, size_t orig_pos, const char *fmt, ...) {
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

static void lex_fail(jstate *st, const char *msg) { td_jinja_fail_at(st, st->map[st->cur < st->n ? st->cur : st->n], "%s", msg); }

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

static int last_type(jstate *st) { return st->ntok ? st->toks[st->ntok - 1].type : JT_NONE; }

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
    if (!st->ntok || st->toks[st->ntok - 1].type != JT_TEXT) return;
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
    {"{%", JT_OPEN_STMT}, {"%}", JT_CLOSE_STMT}, {"{{", JT_OPEN_EXPR}, {"}}", JT_CLOSE_EXPR},
    {"(", JT_LPAREN},     {")", JT_RPAREN},      {"{", JT_LBRACE},     {"}", JT_RBRACE},
    {"[", JT_LBRACKET},   {"]", JT_RBRACKET},    {",", JT_COMMA},      {".", JT_DOT},
    {":", JT_COLON},      {"|", JT_PIPE},        {"<=", JT_CMP},       {">=", JT_CMP},
    {"==", JT_CMP},       {"!=", JT_CMP},        {"<", JT_CMP},        {">", JT_CMP},
    {"+", JT_ADD},        {"-", JT_ADD},         {"~", JT_ADD},        {"**", JT_POW},
    {"*", JT_MUL},        {"//", JT_MUL},        {"/", JT_MUL},        {"%", JT_MUL},
    {"=", JT_EQUALS},
};

static int lex(jstate *st) {
    const char *s = st->s;
    size_t n = st->n;
    int curly = 0;
    while (st->cur < n && !st->failed) {
        int lt = last_type(st);
        if (lt == JT_NONE || lt == JT_CLOSE_STMT || lt == JT_CLOSE_EXPR || lt == JT_COMMENT) {
            size_t start = st->cur;
            while (st->cur < n && !(s[st->cur] == '{' && st->cur + 1 < n &&
                                    (s[st->cur + 1] == '%' || s[st->cur + 1] == '{' || s[st->cur + 1] == '#')))
                st->cur++;
            if (st->cur > start) {
                if (!push_tok(st, JT_TEXT, start, s + start, st->cur - start)) return 0;
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
            if (!push_tok(st, JT_COMMENT, c0, s + cs, clen)) return 0;
            st->cur += 2;
            if (strip_after) st->cur = skip_ws(s, n, st->cur);
            continue;
        }
        if (c0 + 2 < n && s[c0] == '{' && s[c0 + 1] == '%' && s[c0 + 2] == '-') {
            strip_trailing_ws(st);
            if (!push_tok(st, JT_OPEN_STMT, c0, "{%", 2)) return 0;
            st->cur += 3;
            continue;
        }
        if (c0 + 2 < n && s[c0] == '{' && s[c0 + 1] == '{' && s[c0 + 2] == '-') {
            strip_trailing_ws(st);
            if (!push_tok(st, JT_OPEN_EXPR, c0, "{{", 2)) return 0;
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
            if (!push_tok(st, JT_CLOSE_STMT, c, "%}", 2)) return 0;
            st->cur = skip_ws(s, n, c + 3);
            continue;
        }
        if (c + 2 < n && s[c] == '-' && s[c + 1] == '}' && s[c + 2] == '}') {
            if (!push_tok(st, JT_CLOSE_EXPR, c, "}}", 2)) return 0;
            st->cur = skip_ws(s, n, c + 3);
            continue;
        }
        char ch = s[c];
        if (ch == '-' || ch == '+') {
            int l2 = last_type(st);
            if (l2 == JT_TEXT || l2 == JT_NONE) {
                lex_fail(st, "Unexpected character");
                return 0;
            }
            if (!(l2 == JT_IDENT || l2 == JT_NUM || l2 == JT_STR || l2 == JT_RPAREN || l2 == JT_RBRACKET)) {
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
                if (!push_tok(st, nd > 0 ? JT_NUM : JT_UNARY, c, s + c, st->cur - c)) return 0;
                continue;
            }
        }
        int matched = 0;
        for (size_t m = 0; m < sizeof MAPPING / sizeof MAPPING[0]; m++) {
            size_t l = strlen(MAPPING[m].seq);
            if (MAPPING[m].type == JT_CLOSE_EXPR && curly > 0) continue;
            if (c + l <= n && memcmp(s + c, MAPPING[m].seq, l) == 0) {
                int ty = MAPPING[m].type;
                if (!push_tok(st, ty, c, s + c, l)) return 0;
                if (ty == JT_OPEN_EXPR) curly = 0;
                else if (ty == JT_LBRACE) curly++;
                else if (ty == JT_RBRACE) curly--;
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
            if (!push_tok(st, JT_STR, c, v, vl)) return 0;
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
            if (last_type(st) != JT_DOT && s[st->cur] == '.' && st->cur + 1 < n && is_digit(s[st->cur + 1])) {
                st->cur++;
                while (st->cur < n && is_digit(s[st->cur])) {
                    st->cur++;
                    if (st->cur >= n) {
                        lex_fail(st, "Unexpected end of input");
                        return 0;
                    }
                }
            }
            if (!push_tok(st, JT_NUM, c, s + c, st->cur - c)) return 0;
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
            if (!push_tok(st, JT_IDENT, c, s + c, st->cur - c)) return 0;
            continue;
        }
        lex_fail(st, "Unexpected character");
        return 0;
    }
    return !st->failed;
}

int td_jinja_lex(jstate *st, const char *src, size_t len) {
    // preprocessing passes (each only deletes bytes)
    pp_buf a = {0}, b = {0};
    if (!pp_init(&a, len) || !pp_init(&b, len)) {
        pp_free(&a);
        pp_free(&b);
        st->failed = 1;
        td_err_set(st->err, TD_ERR_NOMEM, "chat template: out of memory");
        return 0;
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

    st->s = td_jinja_strdup(st->arena, b.s, b.n);  // text tokens point into this copy
    st->map = b.map;
    st->n = b.n;
    int ok = 0;
    if (!st->s) {
        st->failed = 1;
        td_err_set(st->err, TD_ERR_NOMEM, "chat template: out of memory");
    } else
        ok = lex(st);
    st->map = NULL;  // freed here: tokens carry their original offsets
    pp_free(&a);
    pp_free(&b);
    return ok && !st->failed;
}
