// Jinja values' foundations: the arena, and the JavaScript semantics that @huggingface/jinja
// inherits and that show up in rendered text: Number#toString, JSON.stringify, UTF-16 string
// length/indexing, String#trim, toUpperCase/toLowerCase (full case mapping: utf8proc plus
// SpecialCasing), parseInt/parseFloat. No evaluation here; see eval.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "jinja/value.h"

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

// ---- Number#toString (ECMA-262 Number::toString, radix 10) ----
size_t td_jinja_num_str(double x, char *out) {
    if (isnan(x)) return (size_t)sprintf(out, "NaN");
    if (isinf(x)) return (size_t)sprintf(out, x < 0 ? "-Infinity" : "Infinity");
    if (x == 0) return (size_t)sprintf(out, "0");
    char *o = out;
    if (x < 0) {
        *o++ = '-';
        x = -x;
    }
    // shortest digits that round-trip
    char buf[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
        if (strtod(buf, NULL) == x) break;
    }
    if (prec > 17) snprintf(buf, sizeof buf, "%.16e", x);
    char digits[24];
    int k = 0;
    const char *p = buf;
    for (; *p && *p != 'e'; p++)
        if (*p >= '0' && *p <= '9') digits[k++] = *p;
    int e10 = atoi(p + 1);
    while (k > 1 && digits[k - 1] == '0') k--;
    digits[k] = 0;
    int n = e10 + 1;  // value = 0.d1d2..dk * 10^n
    if (k <= n && n <= 21) {
        memcpy(o, digits, (size_t)k);
        o += k;
        for (int i = 0; i < n - k; i++) *o++ = '0';
    } else if (0 < n && n <= 21) {
        memcpy(o, digits, (size_t)n);
        o += n;
        *o++ = '.';
        memcpy(o, digits + n, (size_t)(k - n));
        o += k - n;
    } else if (-6 < n && n <= 0) {
        *o++ = '0';
        *o++ = '.';
        for (int i = 0; i < -n; i++) *o++ = '0';
        memcpy(o, digits, (size_t)k);
        o += k;
    } else {
        *o++ = digits[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)(k - 1));
            o += k - 1;
        }
        o += sprintf(o, "e%c%d", n - 1 >= 0 ? '+' : '-', abs(n - 1));
    }
    *o = 0;
    return (size_t)(o - out);
}

// FloatValue#toString: integral values print with ".0" (toFixed(1)), -0 as "-0.0"
size_t td_jinja_float_str(double x, char *out) {
    if (x == 0 && signbit(x)) return (size_t)sprintf(out, "-0.0");
    if (isfinite(x) && fmod(x, 1.0) == 0) {
        if (fabs(x) >= 1e21) return td_jinja_num_str(x, out);
        return (size_t)sprintf(out, "%.1f", x);
    }
    return td_jinja_num_str(x, out);
}

// ---- UTF-16 view of UTF-8 strings ----
size_t td_jinja_utf16_len(const char *s, size_t n) {
    size_t units = 0, i = 0, adv;
    while (i < n) {
        uint32_t cp = td_jinja_utf8_decode(s + i, n - i, &adv);
        units += cp >= 0x10000 ? 2 : 1;
        i += adv;
    }
    return units;
}

// the code unit at UTF-16 index idx, as UTF-8 (a surrogate half encodes as 3 bytes); 0 if out of range
size_t td_jinja_utf16_at(const char *s, size_t n, size_t idx, char *out) {
    size_t units = 0, i = 0, adv;
    while (i < n) {
        uint32_t cp = td_jinja_utf8_decode(s + i, n - i, &adv);
        if (cp >= 0x10000) {
            if (idx == units) return td_jinja_utf8_encode(0xD800 + ((cp - 0x10000) >> 10), out);
            if (idx == units + 1) return td_jinja_utf8_encode(0xDC00 + ((cp - 0x10000) & 0x3FF), out);
            units += 2;
        } else {
            if (idx == units) {
                if (adv == 1 && cp >= 0x80) {  // an invalid byte passes through
                    out[0] = s[i];
                    return 1;
                }
                return td_jinja_utf8_encode(cp, out);
            }
            units++;
        }
        i += adv;
    }
    return 0;
}

// compares in UTF-16 code-unit order (JS string <), returns <0, 0, >0
int td_jinja_utf16_cmp(const char *a, size_t na, const char *b, size_t nb) {
    size_t i = 0, j = 0, adv;
    uint32_t pa = 0, pb = 0;  // pending low surrogates
    while (1) {
        uint32_t ua, ub;
        int ea = !pa && i >= na, eb = !pb && j >= nb;
        if (ea || eb) return ea && eb ? 0 : ea ? -1 : 1;
        if (pa) ua = pa, pa = 0;
        else {
            uint32_t cp = td_jinja_utf8_decode(a + i, na - i, &adv);
            i += adv;
            if (cp >= 0x10000) ua = 0xD800 + ((cp - 0x10000) >> 10), pa = 0xDC00 + ((cp - 0x10000) & 0x3FF);
            else ua = cp;
        }
        if (pb) ub = pb, pb = 0;
        else {
            uint32_t cp = td_jinja_utf8_decode(b + j, nb - j, &adv);
            j += adv;
            if (cp >= 0x10000) ub = 0xD800 + ((cp - 0x10000) >> 10), pb = 0xDC00 + ((cp - 0x10000) & 0x3FF);
            else ub = cp;
        }
        if (ua != ub) return ua < ub ? -1 : 1;
    }
}

// ---- case mapping ----
// Unicode SpecialCasing.txt unconditional upper-case mappings that expand to several code points
// (what String#toUpperCase applies on top of the simple mapping); sorted by code point.
static const uint32_t SPECIAL_UPPER[][4] = {
    {0xDF, 0x53, 0x53, 0}, {0x149, 0x2BC, 0x4E, 0}, {0x1F0, 0x4A, 0x30C, 0}, {0x390, 0x399, 0x308, 0x301},
    {0x3B0, 0x3A5, 0x308, 0x301}, {0x587, 0x535, 0x552, 0}, {0x1E96, 0x48, 0x331, 0},
    {0x1E97, 0x54, 0x308, 0}, {0x1E98, 0x57, 0x30A, 0}, {0x1E99, 0x59, 0x30A, 0}, {0x1E9A, 0x41, 0x2BE, 0},
    {0x1F50, 0x3A5, 0x313, 0}, {0x1F52, 0x3A5, 0x313, 0x300}, {0x1F54, 0x3A5, 0x313, 0x301},
    {0x1F56, 0x3A5, 0x313, 0x342}, {0x1F80, 0x1F08, 0x399, 0}, {0x1F81, 0x1F09, 0x399, 0},
    {0x1F82, 0x1F0A, 0x399, 0}, {0x1F83, 0x1F0B, 0x399, 0}, {0x1F84, 0x1F0C, 0x399, 0},
    {0x1F85, 0x1F0D, 0x399, 0}, {0x1F86, 0x1F0E, 0x399, 0}, {0x1F87, 0x1F0F, 0x399, 0},
    {0x1F88, 0x1F08, 0x399, 0}, {0x1F89, 0x1F09, 0x399, 0}, {0x1F8A, 0x1F0A, 0x399, 0},
    {0x1F8B, 0x1F0B, 0x399, 0}, {0x1F8C, 0x1F0C, 0x399, 0}, {0x1F8D, 0x1F0D, 0x399, 0},
    {0x1F8E, 0x1F0E, 0x399, 0}, {0x1F8F, 0x1F0F, 0x399, 0}, {0x1F90, 0x1F28, 0x399, 0},
    {0x1F91, 0x1F29, 0x399, 0}, {0x1F92, 0x1F2A, 0x399, 0}, {0x1F93, 0x1F2B, 0x399, 0},
    {0x1F94, 0x1F2C, 0x399, 0}, {0x1F95, 0x1F2D, 0x399, 0}, {0x1F96, 0x1F2E, 0x399, 0},
    {0x1F97, 0x1F2F, 0x399, 0}, {0x1F98, 0x1F28, 0x399, 0}, {0x1F99, 0x1F29, 0x399, 0},
    {0x1F9A, 0x1F2A, 0x399, 0}, {0x1F9B, 0x1F2B, 0x399, 0}, {0x1F9C, 0x1F2C, 0x399, 0},
    {0x1F9D, 0x1F2D, 0x399, 0}, {0x1F9E, 0x1F2E, 0x399, 0}, {0x1F9F, 0x1F2F, 0x399, 0},
    {0x1FA0, 0x1F68, 0x399, 0}, {0x1FA1, 0x1F69, 0x399, 0}, {0x1FA2, 0x1F6A, 0x399, 0},
    {0x1FA3, 0x1F6B, 0x399, 0}, {0x1FA4, 0x1F6C, 0x399, 0}, {0x1FA5, 0x1F6D, 0x399, 0},
    {0x1FA6, 0x1F6E, 0x399, 0}, {0x1FA7, 0x1F6F, 0x399, 0}, {0x1FA8, 0x1F68, 0x399, 0},
    {0x1FA9, 0x1F69, 0x399, 0}, {0x1FAA, 0x1F6A, 0x399, 0}, {0x1FAB, 0x1F6B, 0x399, 0},
    {0x1FAC, 0x1F6C, 0x399, 0}, {0x1FAD, 0x1F6D, 0x399, 0}, {0x1FAE, 0x1F6E, 0x399, 0},
    {0x1FAF, 0x1F6F, 0x399, 0}, {0x1FB2, 0x1FBA, 0x399, 0}, {0x1FB3, 0x391, 0x399, 0},
    {0x1FB4, 0x386, 0x399, 0}, {0x1FB6, 0x391, 0x342, 0}, {0x1FB7, 0x391, 0x342, 0x399},
    {0x1FBC, 0x391, 0x399, 0}, {0x1FC2, 0x1FCA, 0x399, 0}, {0x1FC3, 0x397, 0x399, 0},
    {0x1FC4, 0x389, 0x399, 0}, {0x1FC6, 0x397, 0x342, 0}, {0x1FC7, 0x397, 0x342, 0x399},
    {0x1FCC, 0x397, 0x399, 0}, {0x1FD2, 0x399, 0x308, 0x300}, {0x1FD3, 0x399, 0x308, 0x301},
    {0x1FD6, 0x399, 0x342, 0}, {0x1FD7, 0x399, 0x308, 0x342}, {0x1FE2, 0x3A5, 0x308, 0x300},
    {0x1FE3, 0x3A5, 0x308, 0x301}, {0x1FE4, 0x3A1, 0x313, 0}, {0x1FE6, 0x3A5, 0x342, 0},
    {0x1FE7, 0x3A5, 0x308, 0x342}, {0x1FF2, 0x1FFA, 0x399, 0}, {0x1FF3, 0x3A9, 0x399, 0},
    {0x1FF4, 0x38F, 0x399, 0}, {0x1FF6, 0x3A9, 0x342, 0}, {0x1FF7, 0x3A9, 0x342, 0x399},
    {0x1FFC, 0x3A9, 0x399, 0}, {0xFB00, 0x46, 0x46, 0}, {0xFB01, 0x46, 0x49, 0}, {0xFB02, 0x46, 0x4C, 0},
    {0xFB03, 0x46, 0x46, 0x49}, {0xFB04, 0x46, 0x46, 0x4C}, {0xFB05, 0x53, 0x54, 0}, {0xFB06, 0x53, 0x54, 0},
    {0xFB13, 0x544, 0x546, 0}, {0xFB14, 0x544, 0x535, 0}, {0xFB15, 0x544, 0x53B, 0},
    {0xFB16, 0x54E, 0x546, 0}, {0xFB17, 0x544, 0x53D, 0},
};

static const uint32_t *special_upper(uint32_t cp) {
    size_t lo = 0, hi = sizeof SPECIAL_UPPER / sizeof SPECIAL_UPPER[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (SPECIAL_UPPER[mid][0] == cp) return SPECIAL_UPPER[mid] + 1;
        if (SPECIAL_UPPER[mid][0] < cp) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

static int is_cased(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((int32_t)cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}
static int is_case_ignorable(uint32_t cp) {
    utf8proc_category_t c = utf8proc_category((int32_t)cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK || cp == '\'' || cp == '.' || cp == ':' ||
           cp == 0xB7 || cp == 0x2019;
}

// Final_Sigma: a capital sigma after a cased letter and not before one lowers to final sigma
static int final_sigma(const char *s, size_t n, size_t at, size_t adv) {
    int before = 0;
    size_t i = at;
    while (i > 0) {
        size_t k = i - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80 && i - k < 4) k--;
        size_t a;
        uint32_t cp = td_jinja_utf8_decode(s + k, n - k, &a);
        i = k;
        if (is_case_ignorable(cp)) continue;
        before = is_cased(cp);
        break;
    }
    if (!before) return 0;
    for (i = at + adv; i < n;) {
        size_t a;
        uint32_t cp = td_jinja_utf8_decode(s + i, n - i, &a);
        i += a;
        if (is_case_ignorable(cp)) continue;
        return !is_cased(cp);
    }
    return 1;
}

// writes the mapped string into a malloc'd buffer (caller frees); upper=1 for toUpperCase.
// Full case mapping: simple mappings from utf8proc plus the unconditional special cases and
// Final_Sigma, as String#toUpperCase / #toLowerCase apply them (no locale).
char *td_jinja_case_map(const char *s, size_t n, int upper, size_t *outlen) {
    char *o = malloc(n * 6 + 4);  // one code point maps to at most 3, each at most 4 bytes
    if (!o) return NULL;
    size_t i = 0, k = 0, adv;
    while (i < n) {
        uint32_t cp = td_jinja_utf8_decode(s + i, n - i, &adv);
        if (adv == 1 && cp >= 0x80) {
            o[k++] = s[i++];
            continue;
        }
        const uint32_t *sp = upper ? special_upper(cp) : NULL;
        if (sp) {
            for (int j = 0; j < 3 && sp[j]; j++) k += td_jinja_utf8_encode(sp[j], o + k);
        } else if (!upper && cp == 0x130) {
            k += td_jinja_utf8_encode('i', o + k);
            k += td_jinja_utf8_encode(0x307, o + k);
        } else if (!upper && cp == 0x3A3) {
            k += td_jinja_utf8_encode(final_sigma(s, n, i, adv) ? 0x3C2 : 0x3C3, o + k);
        } else {
            int32_t m = upper ? utf8proc_toupper((int32_t)cp) : utf8proc_tolower((int32_t)cp);
            k += td_jinja_utf8_encode((uint32_t)m, o + k);
        }
        i += adv;
    }
    o[k] = 0;
    *outlen = k;
    return o;
}

// ---- trim (JS whitespace) ----
void td_jinja_trim(const char *s, size_t n, int left, int right, size_t *start, size_t *end) {
    size_t a = 0, b = n, w;
    if (left)
        while (a < b && (w = td_jinja_ws_len(s + a, b - a)) > 0) a += w;
    if (right)
        while (b > a) {
            size_t k = b - 1;
            while (k > a && ((unsigned char)s[k] & 0xC0) == 0x80 && b - k < 4) k--;
            w = td_jinja_ws_len(s + k, b - k);
            if (w && k + w == b) b = k;
            else break;
        }
    *start = a;
    *end = b;
}

// ---- parseInt(s, 10) / parseFloat(s): NAN when no number ----
double td_jinja_parse_int(const char *s, size_t n) {
    size_t a, b;
    td_jinja_trim(s, n, 1, 0, &a, &b);
    int neg = 0;
    if (a < b && (s[a] == '+' || s[a] == '-')) neg = s[a++] == '-';
    double v = 0;
    size_t d0 = a;
    while (a < b && s[a] >= '0' && s[a] <= '9') v = v * 10 + (s[a++] - '0');
    if (a == d0) return NAN;
    if (a - d0 > 15) {  // exact decimal conversion for long digit strings
        char *tmp = malloc(a - d0 + 1);
        if (tmp) {
            memcpy(tmp, s + d0, a - d0);
            tmp[a - d0] = 0;
            v = strtod(tmp, NULL);
            free(tmp);
        }
    }
    return neg ? -v : v;
}

double td_jinja_parse_float(const char *s, size_t n) {
    size_t a, b;
    td_jinja_trim(s, n, 1, 0, &a, &b);
    size_t st = a;
    int neg = 0;
    if (a < b && (s[a] == '+' || s[a] == '-')) neg = s[a++] == '-';
    if (b - a >= 8 && memcmp(s + a, "Infinity", 8) == 0) return neg ? -INFINITY : INFINITY;
    size_t q = a, nd = 0;
    while (q < b && s[q] >= '0' && s[q] <= '9') q++, nd++;
    if (q < b && s[q] == '.') {
        size_t r = q + 1, fd = 0;
        while (r < b && s[r] >= '0' && s[r] <= '9') r++, fd++;
        if (nd + fd > 0) q = r, nd += fd;
    }
    if (nd == 0) return NAN;
    if (q < b && (s[q] == 'e' || s[q] == 'E')) {
        size_t r = q + 1;
        if (r < b && (s[r] == '+' || s[r] == '-')) r++;
        size_t e0 = r;
        while (r < b && s[r] >= '0' && s[r] <= '9') r++;
        if (r > e0) q = r;
    }
    char *tmp = malloc(q - st + 1);
    if (!tmp) return NAN;
    memcpy(tmp, s + st, q - st);
    tmp[q - st] = 0;
    double v = strtod(tmp, NULL);
    free(tmp);
    return v;
}
