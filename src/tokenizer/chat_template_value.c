// Chat templates, values: the JavaScript semantics that @huggingface/jinja inherits and that show up in
// rendered text: Number#toString, JSON.stringify, UTF-16 string length/indexing, String#trim,
// toUpperCase/toLowerCase (simple case mapping via utf8proc, plus ß), parseInt/parseFloat.
// No evaluation here; see chat_template_eval.c.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/chat_template_value.h"

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
// writes the mapped string into a malloc'd buffer (caller frees); upper=1 for toUpperCase
char *td_jinja_case_map(const char *s, size_t n, int upper, size_t *outlen) {
    char *o = malloc(n * 3 + 4);  // ß -> SS grows 2 bytes to 2; 1-byte chars never grow past 3
    if (!o) return NULL;
    size_t i = 0, k = 0, adv;
    while (i < n) {
        uint32_t cp = td_jinja_utf8_decode(s + i, n - i, &adv);
        if (adv == 1 && cp >= 0x80) {
            o[k++] = s[i++];
            continue;
        }
        if (upper && cp == 0xDF) {
            o[k++] = 'S';
            o[k++] = 'S';
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
