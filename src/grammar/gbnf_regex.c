// Regular expression -> GBNF expression: a recursive descent over the pattern writing GBNF text as
// it goes. Classes become code point ranges (negated over all of Unicode), emitted as positive
// GBNF classes. Refused: backreferences, lookaround, inline flags, \b, \p, anchors inside.
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gbnf_impl.h"
#include "grammar/grammar.h"

void gb_put(gb_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (b->n + n + 1 > nc) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) {
            b->oom = true;
            return;
        }
        b->p = np, b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void gb_puts(gb_buf *b, const char *s) { gb_put(b, s, strlen(s)); }

void gb_printf(gb_buf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        gb_put(b, tmp, (size_t)k);
        return;
    }
    char *big = malloc((size_t)k + 1);
    if (!big) {
        b->oom = true;
        return;
    }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)k + 1, fmt, ap);
    va_end(ap);
    gb_put(b, big, (size_t)k);
    free(big);
}

void gb_literal(gb_buf *b, const char *s, size_t n) {
    gb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            gb_put(b, e, 2);
        } else if (c < 0x20 || c == 0x7F) {
            gb_printf(b, "\\x%02X", c);
        } else {
            gb_put(b, (const char *)&c, 1);
        }
    }
    gb_put(b, "\"", 1);
}

bool gb_prefix_ok(const char *prefix, td_err *err) {
    for (const char *p = prefix ? prefix : ""; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-' ||
              *p == '_')) {
            td_err_set(err, TD_ERR_INVALID, "grammar: rule prefix '%s' may hold only [A-Za-z0-9_-]", prefix);
            return false;
        }
    return true;
}

typedef struct { uint32_t lo, hi; } rrange;

typedef struct rx {
    const char *s, *p;
    gb_buf *o;
    bool json;
    td_err *err;
    bool failed;
} rx;

__attribute__((format(printf, 2, 3))) static bool rfail(rx *x, const char *fmt, ...) {
    if (x->failed) return false;
    x->failed = true;
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td_err_set(x->err, TD_ERR_UNSUPPORTED, "regex: offset %d: %s", (int)(x->p - x->s), msg);
    return false;
}

static int cmpr(const void *a, const void *b) {
    const rrange *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

// Normalises ranges (sort, merge; negate; in json mode drop ", \ and controls) and emits a class.
static bool emit_ranges(rx *x, rrange *r, int n, bool neg) {
    qsort(r, (size_t)n, sizeof *r, cmpr);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m && r[i].lo <= r[m - 1].hi + 1) {
            if (r[i].hi > r[m - 1].hi) r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    rrange t[520];
    int k = 0;
    if (neg) {
        uint32_t next = 0;
        for (int i = 0; i < m; i++) {
            if (r[i].lo > next) t[k++] = (rrange){next, r[i].lo - 1};
            next = r[i].hi + 1;
        }
        if (next <= 0x10FFFF) t[k++] = (rrange){next, 0x10FFFF};
    } else {
        memcpy(t, r, (size_t)m * sizeof *r), k = m;
    }
    if (x->json) {  // subtract [0, 0x1F], '"', '\\'
        rrange u[540];
        int q = 0;
        static const rrange bad[] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}};
        for (int i = 0; i < k; i++) {
            uint32_t lo = t[i].lo, hi = t[i].hi;
            for (int b = 0; b < 3 && lo <= hi; b++) {
                if (bad[b].hi < lo || bad[b].lo > hi) continue;
                if (bad[b].lo > lo) u[q++] = (rrange){lo, bad[b].lo - 1};
                lo = bad[b].hi + 1;
            }
            if (lo <= hi) u[q++] = (rrange){lo, hi};
        }
        memcpy(t, u, (size_t)q * sizeof *u), k = q;
    }
    if (k == 0) return rfail(x, "character class matches no character%s", x->json ? " allowed in a JSON string" : "");
    gb_put(x->o, "[", 1);
    for (int i = 0; i < k; i++) {
        gb_printf(x->o, "\\U%08X", t[i].lo);
        if (t[i].hi != t[i].lo) gb_printf(x->o, "-\\U%08X", t[i].hi);
    }
    gb_put(x->o, "]", 1);
    return true;
}

static bool emit_char(rx *x, uint32_t c) {
    if (x->json && (c == '"' || c == '\\')) {
        gb_puts(x->o, c == '"' ? "\"\\\\\\\"\"" : "\"\\\\\\\\\"");
        return true;
    }
    if (x->json && c < 0x20) {
        gb_printf(x->o, "\"\\\\u%04X\"", c);
        return true;
    }
    gb_printf(x->o, "[\\U%08X]", c);
    return true;
}

static int hexv(char c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 32) >= 'a' && (c | 32) <= 'f' ? (c | 32) - 'a' + 10 : -1;
}

static int64_t utf8_cp(rx *x) {
    const unsigned char *s = (const unsigned char *)x->p;
    int n = s[0] < 0x80 ? 1 : (s[0] >> 5) == 6 ? 2 : (s[0] >> 4) == 14 ? 3 : (s[0] >> 3) == 30 ? 4 : 0;
    if (!n) return rfail(x, "invalid UTF-8"), -1;
    uint32_t v = n == 1 ? s[0] : n == 2 ? s[0] & 31u : n == 3 ? s[0] & 15u : s[0] & 7u;
    for (int i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return rfail(x, "invalid UTF-8"), -1;
        v = v << 6 | (s[i] & 63u);
    }
    x->p += n;
    return v;
}

// An escape after '\\' (x->p at the letter). Class escapes fill r (returns the count, with *neg);
// a single character returns 1 with r[0] = {c, c}. -1 on error.
static int parse_escape(rx *x, rrange *r, bool *neg) {
    char e = *x->p;
    *neg = false;
    if (!e) return rfail(x, "pattern ends with '\\'"), -1;
    x->p++;
    switch (e) {
    case 'd': case 'D': r[0] = (rrange){'0', '9'}, *neg = e == 'D'; return 1;
    case 'w': case 'W':
        r[0] = (rrange){'0', '9'}, r[1] = (rrange){'A', 'Z'}, r[2] = (rrange){'_', '_'}, r[3] = (rrange){'a', 'z'};
        *neg = e == 'W';
        return 4;
    case 's': case 'S': r[0] = (rrange){'\t', '\r'}, r[1] = (rrange){' ', ' '}, *neg = e == 'S'; return 2;
    case 'n': r[0] = (rrange){'\n', '\n'}; return 1;
    case 't': r[0] = (rrange){'\t', '\t'}; return 1;
    case 'r': r[0] = (rrange){'\r', '\r'}; return 1;
    case 'f': r[0] = (rrange){'\f', '\f'}; return 1;
    case 'v': r[0] = (rrange){'\v', '\v'}; return 1;
    case '0': r[0] = (rrange){0, 0}; return 1;
    case 'x': case 'u': {
        int nh = e == 'x' ? 2 : 4;
        uint32_t v = 0;
        for (int i = 0; i < nh; i++) {
            int h = hexv(x->p[0]);
            if (h < 0) return rfail(x, "\\%c needs %d hex digits", e, nh), -1;
            v = v * 16 + (uint32_t)h, x->p++;
        }
        r[0] = (rrange){v, v};
        return 1;
    }
    case 'b': case 'B': x->p--; return rfail(x, "word boundaries (\\%c) are not supported", e), -1;
    case 'p': case 'P': x->p--; return rfail(x, "Unicode properties (\\%c) are not supported", e), -1;
    case 'k': x->p--; return rfail(x, "backreferences are not supported"), -1;
    default:
        if (e >= '1' && e <= '9') {
            x->p--;
            return rfail(x, "backreferences (\\%c) are not supported", e), -1;
        }
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
            x->p--;
            return rfail(x, "unknown escape \\%c", e), -1;
        }
        r[0] = (rrange){(unsigned char)e, (unsigned char)e};
        return 1;
    }
}

static bool parse_alt(rx *x, int depth);

static bool parse_class(rx *x) {
    x->p++;  // '['
    bool neg = *x->p == '^';
    if (neg) x->p++;
    rrange r[512];
    int n = 0;
    bool first = true;
    while (*x->p && (*x->p != ']' || first)) {
        first = false;
        if (n > 500) return rfail(x, "character class too large");
        int64_t lo;
        if (*x->p == '\\') {
            x->p++;
            bool en;
            rrange er[4];
            int k = parse_escape(x, er, &en);
            if (k < 0) return false;
            if (k > 1 || en || er[0].lo != er[0].hi) {  // a class escape inside a class
                if (en) {
                    // complement of er, added as ranges
                    uint32_t next = 0;
                    for (int i = 0; i < k; i++) {
                        if (er[i].lo > next) r[n++] = (rrange){next, er[i].lo - 1};
                        next = er[i].hi + 1;
                    }
                    r[n++] = (rrange){next, 0x10FFFF};
                } else {
                    for (int i = 0; i < k; i++) r[n++] = er[i];
                }
                continue;
            }
            lo = er[0].lo;
        } else {
            lo = utf8_cp(x);
            if (lo < 0) return false;
        }
        int64_t hi = lo;
        if (x->p[0] == '-' && x->p[1] && x->p[1] != ']') {
            x->p++;
            if (*x->p == '\\') {
                x->p++;
                bool en;
                rrange er[4];
                int k = parse_escape(x, er, &en);
                if (k != 1 || en) return rfail(x, "a class escape cannot end a range");
                hi = er[0].lo;
            } else {
                hi = utf8_cp(x);
                if (hi < 0) return false;
            }
            if (hi < lo) return rfail(x, "character range out of order");
        }
        r[n++] = (rrange){(uint32_t)lo, (uint32_t)hi};
    }
    if (*x->p != ']') return rfail(x, "unterminated character class");
    x->p++;
    return emit_ranges(x, r, n, neg);
}

static bool parse_atom(rx *x, int depth) {
    char c = *x->p;
    if (c == '(') {
        x->p++;
        if (*x->p == '?') {
            if (x->p[1] == ':') {
                x->p += 2;
            } else if ((x->p[1] == '<' || (x->p[1] == 'P' && x->p[2] == '<')) && x->p[2 + (x->p[1] == 'P')] != '=' &&
                       x->p[2 + (x->p[1] == 'P')] != '!') {
                const char *q = strchr(x->p, '>');
                if (!q) return rfail(x, "unterminated group name");
                x->p = q + 1;
            } else if (x->p[1] == '=' || x->p[1] == '!' || x->p[1] == '<') {
                return rfail(x, "lookaround assertions are not supported");
            } else {
                return rfail(x, "inline flags and other (?...) groups are not supported");
            }
        }
        if (depth > 64) return rfail(x, "groups nested too deeply");
        gb_put(x->o, "(", 1);
        if (!parse_alt(x, depth + 1)) return false;
        if (*x->p != ')') return rfail(x, "missing ')'");
        x->p++;
        gb_put(x->o, ")", 1);
        return true;
    }
    if (c == '[') return parse_class(x);
    if (c == '.') {
        x->p++;
        rrange r[1] = {{'\n', '\n'}};
        return emit_ranges(x, r, 1, true);
    }
    if (c == '\\') {
        x->p++;
        rrange r[4];
        bool neg;
        int k = parse_escape(x, r, &neg);
        if (k < 0) return false;
        if (k == 1 && !neg && r[0].lo == r[0].hi) return emit_char(x, r[0].lo);
        return emit_ranges(x, r, k, neg);
    }
    if (c == '^' || c == '$') return rfail(x, "anchor '%c' inside the pattern is not supported", c);
    if (c == '*' || c == '+' || c == '?') return rfail(x, "'%c' has nothing to repeat", c);
    int64_t cp = utf8_cp(x);
    if (cp < 0) return false;
    return emit_char(x, (uint32_t)cp);
}

// {m}, {m,}, {m,n} at x->p ('{'); false (x->p unchanged) when it is not a quantifier (a literal).
static bool brace_quant(rx *x, int *lo, int *hi) {
    const char *q = x->p + 1;
    if (*q < '0' || *q > '9') return false;
    long a = 0, b = -1;
    while (*q >= '0' && *q <= '9') a = a * 10 + (*q++ - '0'), a = a > 100000 ? 100000 : a;
    if (*q == ',') {
        q++;
        if (*q >= '0' && *q <= '9') {
            b = 0;
            while (*q >= '0' && *q <= '9') b = b * 10 + (*q++ - '0'), b = b > 100000 ? 100000 : b;
        }
    } else {
        b = a;
    }
    if (*q != '}') return false;
    x->p = q + 1;
    *lo = (int)a, *hi = (int)b;
    return true;
}

static bool parse_seq(rx *x, int depth) {
    bool any = false;
    while (*x->p && *x->p != '|' && *x->p != ')') {
        if (x->p[0] == '$' && x->p[1] == 0 && depth == 0) return true;  // the final anchor
        if (any) gb_put(x->o, " ", 1);
        any = true;
        if (!parse_atom(x, depth)) return false;
        int lo, hi;
        char c = *x->p;
        if (c == '*' || c == '+' || c == '?') {
            x->p++;
            gb_put(x->o, &c, 1);
        } else if (c == '{' && brace_quant(x, &lo, &hi)) {
            if (hi >= 0 && hi < lo) return rfail(x, "repetition {%d,%d} has max < min", lo, hi);
            if (lo > 4096 || hi > 4096) return rfail(x, "repetition bound above 4096");
            if (hi == lo) gb_printf(x->o, "{%d}", lo);
            else if (hi < 0) gb_printf(x->o, "{%d,}", lo);
            else gb_printf(x->o, "{%d,%d}", lo, hi);
        } else {
            continue;
        }
        if (*x->p == '?') x->p++;  // lazy: the same set of strings
        else if (*x->p == '+') return rfail(x, "possessive quantifiers are not supported");
        if (*x->p == '*' || *x->p == '+' || (*x->p == '{' && x->p[1] >= '0' && x->p[1] <= '9'))
            return rfail(x, "a quantifier cannot follow a quantifier");
    }
    if (!any) gb_puts(x->o, "\"\"");
    return true;
}

static bool parse_alt(rx *x, int depth) {
    for (;;) {
        if (!parse_seq(x, depth)) return false;
        if (*x->p != '|') return true;
        x->p++;
        gb_puts(x->o, " | ");
    }
}

bool gb_regex_expr(gb_buf *out, const char *re, bool json, bool search, const char *prefix, td_err *err) {
    (void)prefix;
    size_t n = strlen(re);
    bool a0 = n && re[0] == '^';
    bool a1 = n > (size_t)a0 && re[n - 1] == '$' && (n < 2 || re[n - 2] != '\\');
    rx x = {.s = re, .p = re + a0, .o = out, .json = json, .err = err};
    if (search && (!a0 || !a1)) {
        // a match anywhere: top-level alternation would bind the padding to one branch only
        int d = 0;
        for (const char *p = re; *p; p++) {
            if (*p == '\\' && p[1]) p++;
            else if (*p == '(') d++;
            else if (*p == ')') d--;
            else if (*p == '|' && d == 0 && (a0 || a1))
                return td_err_set(err, TD_ERR_UNSUPPORTED,
                                  "regex: a partly anchored pattern with top-level '|' is not supported"),
                       false;
        }
    }
    gb_buf body = {0};
    x.o = &body;
    bool ok = parse_alt(&x, 0);
    if (ok && *x.p == ')') ok = rfail(&x, "unbalanced ')'");
    if (ok && *x.p == '$' && x.p[1] == 0) x.p++;
    if (ok && *x.p) ok = rfail(&x, "unexpected '%c'", *x.p);
    if (ok && body.oom) ok = (td_err_set(err, TD_ERR_NOMEM, "regex: out of memory"), false);
    if (ok) {
        rrange any[1] = {{'\n', '\n'}};
        rx pad = {.s = re, .p = re, .o = out, .json = json, .err = err};
        gb_put(out, "(", 1);
        if (search && !a0) emit_ranges(&pad, any, 1, true), gb_puts(out, "* ");
        gb_puts(out, "(");
        gb_put(out, body.p, body.n);
        gb_puts(out, ")");
        if (search && !a1) gb_puts(out, " "), emit_ranges(&pad, any, 1, true), gb_puts(out, "*");
        gb_put(out, ")", 1);
    }
    free(body.p);
    return ok;
}

char *td_gbnf_from_regex(const char *re, const char *prefix, td_err *err) {
    if (!re) return td_err_set(err, TD_ERR_INVALID, "regex: none given"), NULL;
    if (!gb_prefix_ok(prefix, err)) return NULL;
    gb_buf b = {0};
    gb_printf(&b, "%sroot ::= ", prefix ? prefix : "");
    if (!gb_regex_expr(&b, re, false, false, prefix, err)) {
        free(b.p);
        return NULL;
    }
    gb_puts(&b, "\n");
    if (b.oom) {
        free(b.p);
        return td_err_set(err, TD_ERR_NOMEM, "regex: out of memory"), NULL;
    }
    return b.p;
}
