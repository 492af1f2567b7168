// JSON schema -> GBNF, any JSON value, and a choice of strings. Each schema node becomes one rule
// (identical bodies share a rule); $ref targets get a rule named before their body is written, so
// recursive schemas work. Whitespace between tokens is llama.cpp's: nothing, a space, or a newline
// and up to 20 blanks. Numbers have at most 16 integer and 16 fraction digits (a model cannot
// ramble forever); strings, arrays and objects are bounded only by the schema's own limits.
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gbnf_impl.h"
#include "grammar/grammar.h"

#define MAX_RULES 4096

typedef struct jc {
    const char *px;  // prefix
    gb_buf out;      // rules written so far
    td_err *err;
    bool failed;
    const cJSON *root;
    int n;           // rules named
    char **bodies, **names;  // [n_b] dedup of anonymous bodies
    int n_b;
    char **refs, **ref_names;  // [n_refs]
    int n_refs;
    int depth;
    char p_string[160], p_value[160], p_number[160], p_int[160], p_nat[160], p_pos[160], p_bool[160], p_null[160];
} jc;

__attribute__((format(printf, 3, 4))) static char *jfail(jc *c, td_status st, const char *fmt, ...) {
    if (c->failed) return NULL;
    c->failed = true;
    char msg[TD_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td_err_set(c->err, st, "json schema: %s", msg);
    return NULL;
}

static const char *ws(jc *c) {
    static __thread char b[160];
    snprintf(b, sizeof b, "%sws", c->px);
    return b;
}

// Names a rule for body (dedup by body text). Returns the name (owned by c).
static const char *rule(jc *c, const char *body) {
    if (!body || c->failed) return NULL;
    for (int i = 0; i < c->n_b; i++)
        if (!strcmp(c->bodies[i], body)) return c->names[i];
    if (c->n_b >= MAX_RULES) return jfail(c, TD_ERR_LIMIT, "schema too large (more than %d rules)", MAX_RULES);
    if (c->n_b % 64 == 0) {
        char **nb = realloc(c->bodies, (size_t)(c->n_b + 64) * sizeof *nb);
        char **nn = nb ? realloc(c->names, (size_t)(c->n_b + 64) * sizeof *nn) : NULL;
        if (nb) c->bodies = nb;
        if (!nb || !nn) return jfail(c, TD_ERR_NOMEM, "out of memory");
        c->names = nn;
    }
    char *name = NULL;
    if (asprintf(&name, "%sn%d", c->px, ++c->n) < 0) return jfail(c, TD_ERR_NOMEM, "out of memory");
    c->bodies[c->n_b] = strdup(body);
    c->names[c->n_b++] = name;
    gb_printf(&c->out, "%s ::= %s\n", name, body);
    return name;
}

static void lit(gb_buf *b, const char *s) { gb_literal(b, s, strlen(s)); }

static const char *json_literal_rule(jc *c, const cJSON *const *vals, int n) {
    gb_buf b = {0};
    for (int i = 0; i < n; i++) {
        char *t = cJSON_PrintUnformatted(vals[i]);
        if (!t) return free(b.p), jfail(c, TD_ERR_NOMEM, "out of memory");
        if (i) gb_puts(&b, " | ");
        lit(&b, t);
        free(t);
    }
    const char *r = rule(c, b.p);
    free(b.p);
    return r;
}

static const char *gen(jc *c, const cJSON *s, const char *path);

static bool is_descriptive(const char *k) {
    static const char *const d[] = {"title", "description", "examples", "default", "$schema", "$id", "$comment",
                                    "$defs", "definitions", NULL};
    for (int i = 0; d[i]; i++)
        if (!strcmp(k, d[i])) return true;
    return false;
}

static bool known(const char *k) {
    static const char *const kw[] = {"type", "properties", "required", "additionalProperties", "enum", "const",
                                     "anyOf", "oneOf", "allOf", "$ref", "items", "prefixItems", "minItems",
                                     "maxItems", "minLength", "maxLength", "pattern", "minimum",
                                     "exclusiveMinimum", "maximum", "exclusiveMaximum", NULL};
    for (int i = 0; kw[i]; i++)
        if (!strcmp(k, kw[i])) return true;
    return is_descriptive(k);
}

static bool get_count(jc *c, const cJSON *s, const char *key, const char *path, int *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, key);
    if (!v) return true;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != (double)(int)v->valuedouble ||
        v->valuedouble > 4096) {
        jfail(c, TD_ERR_UNSUPPORTED, "%s.%s: must be an integer in [0, 4096]", path, key);
        return false;
    }
    *out = v->valueint;
    return true;
}

static const char *gen_string(jc *c, const cJSON *s, const char *path) {
    int lo = 0, hi = -1;
    if (!get_count(c, s, "minLength", path, &lo) || !get_count(c, s, "maxLength", path, &hi)) return NULL;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    gb_buf b = {0};
    if (pat) {
        if (!cJSON_IsString(pat)) return jfail(c, TD_ERR_INVALID, "%s.pattern: must be a string", path);
        if (lo > 0 || hi >= 0)
            return jfail(c, TD_ERR_UNSUPPORTED, "%s: pattern together with minLength/maxLength is not supported", path);
        gb_puts(&b, "\"\\\"\" ");
        if (!gb_regex_expr(&b, pat->valuestring, true, true, c->px, c->err)) {
            free(b.p);
            c->failed = true;
            td_err_prefix(c->err, "json schema: %s.pattern: ", path);
            return NULL;
        }
        gb_puts(&b, " \"\\\"\"");
    } else if (lo == 0 && hi < 0) {
        return c->p_string;
    } else {
        if (hi >= 0 && hi < lo) return jfail(c, TD_ERR_INVALID, "%s: maxLength < minLength", path);
        if (hi < 0) gb_printf(&b, "\"\\\"\" %schar{%d,} \"\\\"\"", c->px, lo);
        else gb_printf(&b, "\"\\\"\" %schar{%d,%d} \"\\\"\"", c->px, lo, hi);
    }
    const char *r = rule(c, b.p);
    free(b.p);
    return r;
}

// GBNF for the decimal forms (no sign, no leading zeros) of the integers [a, b] that have the same
// number of digits: the digit-by-digit split of regex range generators, as one group.
static void range_same_len(gb_buf *o, const char *a, const char *b, int n) {
    if (n == 0) return;
    int k = 0;
    while (k < n && a[k] == b[k]) k++;
    if (k) {  // common prefix
        gb_printf(o, "\"%.*s\" ", k, a);
        a += k, b += k, n -= k;
        if (n == 0) return;
    }
    bool lo0 = true, hi9 = true;  // a's rest all 0, b's rest all 9
    for (int i = 1; i < n; i++) lo0 &= a[i] == '0', hi9 &= b[i] == '9';
    if (lo0 && hi9) {
        gb_printf(o, "[%c-%c]", a[0], b[0]);
        if (n > 1) gb_printf(o, " [0-9]{%d}", n - 1);
        return;
    }
    char nines[20], zeros[20];
    memset(nines, '9', sizeof nines), memset(zeros, '0', sizeof zeros);
    gb_puts(o, "(");
    int lo_first = lo0 ? a[0] : a[0] + 1, hi_last = hi9 ? b[0] : b[0] - 1;
    bool alt = false;
    if (!lo0) {  // a[0] followed by [a's rest, 9...9]
        gb_printf(o, "\"%c\" ", a[0]);
        range_same_len(o, a + 1, nines, n - 1);
        alt = true;
    }
    if (lo_first <= hi_last) {
        gb_printf(o, "%s[%c-%c] [0-9]{%d}", alt ? " | " : "", lo_first, hi_last, n - 1);
        alt = true;
    }
    if (!hi9) {  // b[0] followed by [0...0, b's rest]
        gb_printf(o, "%s\"%c\" ", alt ? " | " : "", b[0]);
        range_same_len(o, zeros, b + 1, n - 1);
    }
    gb_puts(o, ")");
}

#define INT_DIGITS 16  // as the int rule: at most 16 digits

// The integers [a, b] (0 <= a <= b; b < 0 for "any number of digits up to INT_DIGITS"), unsigned.
static void range_nonneg(gb_buf *o, long long a, long long b) {
    char sa[24], sb[24];
    int na = snprintf(sa, sizeof sa, "%lld", a);
    int nb = b < 0 ? INT_DIGITS : snprintf(sb, sizeof sb, "%lld", b);
    gb_puts(o, "(");
    for (int n = na; n <= nb; n++) {
        char lo[24], hi[24];
        if (n == na) memcpy(lo, sa, (size_t)n + 1);
        else lo[0] = '1', memset(lo + 1, '0', (size_t)n - 1), lo[n] = 0;
        if (b >= 0 && n == nb) memcpy(hi, sb, (size_t)n + 1);
        else memset(hi, '9', (size_t)n), hi[n] = 0;
        if (n > na) gb_puts(o, " | ");
        if (b < 0 && n > na) {  // every number of this many digits, and more: one repetition
            gb_printf(o, "[1-9] [0-9]{%d,%d}", n - 1, INT_DIGITS - 1);
            break;
        }
        range_same_len(o, lo, hi, n);
    }
    gb_puts(o, ")");
}

// Integers with minimum / exclusiveMinimum / maximum / exclusiveMaximum (the tighter of each pair),
// compiled into digit grammars; bounds beyond +-10^15 are refused.
static const char *gen_integer(jc *c, const cJSON *s, const char *path) {
    static const char *const keys[4] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    bool has_lo = false, has_hi = false;
    long long lo = 0, hi = 0;
    for (int i = 0; i < 4; i++) {
        const cJSON *b = cJSON_GetObjectItemCaseSensitive(s, keys[i]);
        if (!b) continue;
        if (!cJSON_IsNumber(b)) return jfail(c, TD_ERR_INVALID, "%s.%s: must be a number", path, keys[i]);
        double x = b->valuedouble;
        if (!(x > -1e15 && x < 1e15))
            return jfail(c, TD_ERR_UNSUPPORTED, "%s.%s: integer bounds beyond +-1e15 are not supported", path, keys[i]);
        // the least / greatest integer allowed by this bound
        long long v = i == 0 ? (long long)ceil(x) : i == 1 ? (long long)floor(x) + 1 : i == 2 ? (long long)floor(x)
                                                                                             : (long long)ceil(x) - 1;
        if (i < 2) lo = has_lo && lo > v ? lo : v, has_lo = true;
        else hi = has_hi && hi < v ? hi : v, has_hi = true;
    }
    if (!has_lo && !has_hi) return c->p_int;
    if (has_lo && has_hi && lo > hi) return jfail(c, TD_ERR_INVALID, "%s: no integer lies within the bounds", path);
    if (has_lo && !has_hi && lo == 0) return c->p_nat;
    if (has_lo && !has_hi && lo == 1) return c->p_pos;
    gb_buf b = {0};
    bool any = false;
    // negative part: "-" then the magnitudes [max(1, -hi), -lo] (unbounded when no minimum)
    if (!has_lo || lo < 0) {
        long long mlo = has_hi && hi < 0 ? -hi : 1, mhi = has_lo ? -lo : -1;
        gb_puts(&b, "\"-\" ");
        range_nonneg(&b, mlo, mhi);
        any = true;
    }
    // non-negative part: [max(0, lo), hi] (unbounded when no maximum)
    if (!has_hi || hi >= 0) {
        if (any) gb_puts(&b, " | ");
        range_nonneg(&b, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    }
    const char *r = rule(c, b.p);
    free(b.p);
    return r;
}

static const char *gen_object(jc *c, const cJSON *s, const char *path) {
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return jfail(c, TD_ERR_INVALID, "%s.properties: must be an object", path);
    if (req && !cJSON_IsArray(req)) return jfail(c, TD_ERR_INVALID, "%s.required: must be an array", path);
    int k = props ? cJSON_GetArraySize(props) : 0;
    bool add_on = add && !cJSON_IsFalse(add);
    const char *W = ws(c);
    char wsn[160];
    snprintf(wsn, sizeof wsn, "%s", W);
    if (add_on) {
        if (k > 0)
            return jfail(c, TD_ERR_UNSUPPORTED, "%s: additionalProperties together with properties is not supported", path);
        if (req && cJSON_GetArraySize(req) > 0)
            return jfail(c, TD_ERR_UNSUPPORTED, "%s: required without properties is not supported", path);
        char sub[512];
        snprintf(sub, sizeof sub, "%s.additionalProperties", path);
        const char *val = cJSON_IsTrue(add) ? c->p_value : gen(c, add, sub);
        if (!val) return NULL;
        gb_buf b = {0};
        gb_printf(&b, "%s %s \":\" %s %s %s", c->p_string, wsn, wsn, val, wsn);
        const char *kv = rule(c, b.p);
        b.n = 0;
        if (kv) gb_printf(&b, "\"{\" %s (%s (\",\" %s %s)*)? \"}\"", wsn, kv, wsn, kv);
        const char *r = kv ? rule(c, b.p) : NULL;
        free(b.p);
        return r;
    }
    // required names must be properties (no others may appear)
    for (int i = 0; req && i < cJSON_GetArraySize(req); i++) {
        const cJSON *q = cJSON_GetArrayItem(req, i);
        if (!cJSON_IsString(q)) return jfail(c, TD_ERR_INVALID, "%s.required[%d]: must be a string", path, i);
        if (!props || !cJSON_GetObjectItemCaseSensitive(props, q->valuestring))
            return jfail(c, TD_ERR_UNSUPPORTED, "%s.required: '%s' is not in properties (no other properties are generated)",
                         path, q->valuestring);
    }
    const char **kv = calloc((size_t)(k ? k : 1), sizeof *kv);
    bool *rq = calloc((size_t)(k ? k : 1), 1);
    if (!kv || !rq) return free(kv), free(rq), jfail(c, TD_ERR_NOMEM, "out of memory");
    gb_buf b = {0};
    int i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        char *sub = NULL;
        if (asprintf(&sub, "%s.properties.%s", path, p->string) < 0) break;
        const char *val = gen(c, p, sub);
        free(sub);
        if (!val) break;
        cJSON *key = cJSON_CreateString(p->string);
        char *kt = key ? cJSON_PrintUnformatted(key) : NULL;
        cJSON_Delete(key);
        if (!kt) {
            jfail(c, TD_ERR_NOMEM, "out of memory");
            break;
        }
        b.n = 0;
        lit(&b, kt);
        free(kt);
        gb_printf(&b, " %s \":\" %s %s %s", wsn, wsn, val, wsn);
        kv[i] = rule(c, b.p);
        if (!kv[i]) break;
        for (int r = 0; req && r < cJSON_GetArraySize(req); r++)
            if (!strcmp(cJSON_GetArrayItem(req, r)->valuestring, p->string)) rq[i] = true;
    }
    const char *res = NULL;
    if (!c->failed) {
        // R(i, nc): properties i.. given whether one was written before (nc); built from the end
        const char **R = calloc((size_t)(k + 1) * 2, sizeof *R);
        if (!R) {
            jfail(c, TD_ERR_NOMEM, "out of memory");
        } else {
            R[k * 2 + 0] = R[k * 2 + 1] = NULL;  // empty
            for (int j = k - 1; j >= 0 && !c->failed; j--) {
                for (int nc = 0; nc < 2 && !c->failed; nc++) {
                    b.n = 0;
                    const char *rest = R[(j + 1) * 2 + 1];
                    if (nc) gb_printf(&b, "\",\" %s ", wsn);
                    gb_printf(&b, "%s%s%s", kv[j], rest ? " " : "", rest ? rest : "");
                    if (!rq[j]) {
                        const char *skip = R[(j + 1) * 2 + nc];
                        gb_printf(&b, " | %s", skip ? skip : "\"\"");
                    }
                    R[j * 2 + nc] = rule(c, b.p);
                }
            }
            if (!c->failed) {
                b.n = 0;
                gb_printf(&b, "\"{\" %s %s \"}\"", wsn, R[0] ? R[0] : "");
                res = rule(c, b.p);
            }
            free(R);
        }
    }
    free(b.p), free(kv), free(rq);
    return res;
}

static const char *gen_array(jc *c, const cJSON *s, const char *path) {
    int lo = 0, hi = -1;
    if (!get_count(c, s, "minItems", path, &lo) || !get_count(c, s, "maxItems", path, &hi)) return NULL;
    if (hi >= 0 && hi < lo) return jfail(c, TD_ERR_INVALID, "%s: maxItems < minItems", path);
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    if (pre && !cJSON_IsArray(pre)) return jfail(c, TD_ERR_INVALID, "%s.prefixItems: must be an array", path);
    int k = pre ? cJSON_GetArraySize(pre) : 0;
    char sub[512];
    const char *it = NULL;  // NULL with items false: no items after the prefix
    if (!items || cJSON_IsTrue(items)) {
        it = c->p_value;
    } else if (!cJSON_IsFalse(items)) {
        snprintf(sub, sizeof sub, "%s.items", path);
        if (!(it = gen(c, items, sub))) return NULL;
    }
    if (!it && lo > k) return jfail(c, TD_ERR_INVALID, "%s: minItems %d > prefixItems %d with items false", path, lo, k);
    const char *W = ws(c);
    char wsn[160];
    snprintf(wsn, sizeof wsn, "%s", W);
    gb_buf b = {0};
    // rest(i): items from position i on (i >= k), a separator before each when i > 0
    int rlo = lo > k ? lo - k : 0, rhi = hi < 0 ? -1 : (hi > k ? hi - k : 0);
    const char *rest = NULL;
    if (it && rhi != 0) {
        if (k == 0) {  // first item without a separator
            char rep[64];
            if (rhi < 0) snprintf(rep, sizeof rep, "{%d,}", rlo > 1 ? rlo - 1 : 0);
            else snprintf(rep, sizeof rep, "{%d,%d}", rlo > 1 ? rlo - 1 : 0, rhi - 1);
            gb_printf(&b, "%s %s (\",\" %s %s %s)%s", it, wsn, wsn, it, wsn, rep);
            if (rlo == 0) {
                const char *one = rule(c, b.p);
                b.n = 0;
                if (one) gb_printf(&b, "%s | \"\"", one);
            }
        } else {
            if (rhi < 0) gb_printf(&b, "(\",\" %s %s %s){%d,}", wsn, it, wsn, rlo);
            else gb_printf(&b, "(\",\" %s %s %s){%d,%d}", wsn, it, wsn, rlo, rhi);
        }
        rest = rule(c, b.p);
    }
    // P(i): prefix items from i on; each is optional once at least minItems are written
    const char *next = rest;
    for (int i = k - 1; i >= 0 && !c->failed; i--) {
        snprintf(sub, sizeof sub, "%s.prefixItems[%d]", path, i);
        const char *pi = gen(c, cJSON_GetArrayItem(pre, i), sub);
        if (!pi) break;
        if (hi >= 0 && i >= hi) continue;
        b.n = 0;
        if (i) gb_printf(&b, "\",\" %s ", wsn);
        gb_printf(&b, "%s %s%s%s", pi, wsn, next ? " " : "", next ? next : "");
        if (i >= lo) gb_puts(&b, " | \"\"");
        next = rule(c, b.p);
    }
    const char *res = NULL;
    if (!c->failed) {
        b.n = 0;
        gb_printf(&b, "\"[\" %s %s \"]\"", wsn, next ? next : "");
        res = rule(c, b.p);
    }
    free(b.p);
    return res;
}

// Resolves a local JSON pointer ("#", "#/$defs/a", ...).
static const cJSON *resolve(const cJSON *root, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *cur = root;
    const char *p = ref + 1;
    while (*p == '/' && cur) {
        p++;
        char tok[256];
        size_t n = 0;
        while (*p && *p != '/' && n < sizeof tok - 1) {
            if (p[0] == '~' && p[1] == '1') tok[n++] = '/', p += 2;
            else if (p[0] == '~' && p[1] == '0') tok[n++] = '~', p += 2;
            else tok[n++] = *p++;
        }
        tok[n] = 0;
        cur = cJSON_IsArray(cur) ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItemCaseSensitive(cur, tok);
    }
    return *p ? NULL : cur;
}

static const char *gen_ref(jc *c, const char *ref, const char *path) {
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i], ref)) return c->ref_names[i];
    const cJSON *t = resolve(c->root, ref);
    if (!t) return jfail(c, TD_ERR_UNSUPPORTED, "%s.$ref: '%s' is not a local reference that resolves", path, ref);
    if (c->n_refs % 32 == 0) {
        char **a = realloc(c->refs, (size_t)(c->n_refs + 32) * sizeof *a);
        if (a) c->refs = a;
        char **bn = a ? realloc(c->ref_names, (size_t)(c->n_refs + 32) * sizeof *bn) : NULL;
        if (!bn) return jfail(c, TD_ERR_NOMEM, "out of memory");
        c->ref_names = bn;
    }
    char *name = NULL;
    if (asprintf(&name, "%sref%d", c->px, c->n_refs) < 0) return jfail(c, TD_ERR_NOMEM, "out of memory");
    c->refs[c->n_refs] = strdup(ref);
    c->ref_names[c->n_refs++] = name;
    const char *body = gen(c, t, ref);
    if (!body) return NULL;
    gb_printf(&c->out, "%s ::= %s\n", name, body);
    return name;
}

static const char *gen_type(jc *c, const cJSON *s, const char *t, const char *path) {
    if (!strcmp(t, "string")) return gen_string(c, s, path);
    if (!strcmp(t, "integer")) return gen_integer(c, s, path);
    if (!strcmp(t, "number")) {
        static const char *const bounds[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if (cJSON_GetObjectItemCaseSensitive(s, bounds[i]))
                return jfail(c, TD_ERR_UNSUPPORTED, "%s: %s on numbers is not supported (integers only)", path, bounds[i]);
        return c->p_number;
    }
    if (!strcmp(t, "boolean")) return c->p_bool;
    if (!strcmp(t, "null")) return c->p_null;
    if (!strcmp(t, "object")) return gen_object(c, s, path);
    if (!strcmp(t, "array")) return gen_array(c, s, path);
    return jfail(c, TD_ERR_UNSUPPORTED, "%s.type: unknown type '%s'", path, t);
}

static const char *alternation(jc *c, const cJSON *arr, const char *kw, const char *path) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) == 0)
        return jfail(c, TD_ERR_INVALID, "%s.%s: must be a non-empty array", path, kw);
    gb_buf b = {0};
    int i = 0;
    for (const cJSON *x = arr->child; x; x = x->next, i++) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s.%s[%d]", path, kw, i);
        const char *r = gen(c, x, sub);
        if (!r) return free(b.p), NULL;
        gb_printf(&b, "%s%s", i ? " | " : "", r);
    }
    const char *r = rule(c, b.p);
    free(b.p);
    return r;
}

// allOf of several schemas (and the keywords beside it) merged into one schema, where that is
// exact: `properties` are united (a property in two parts must be the same schema), `required`
// united, `type` and every other keyword must agree where more than one part has it, and
// `additionalProperties` may not be false or a schema (a part closed to the others' properties).
// Conflicts are refused naming both JSON paths. Returns a new cJSON (caller deletes) or NULL.
static cJSON *merge_all_of(jc *c, const cJSON *s, const cJSON *all, const char *path) {
    cJSON *m = cJSON_CreateObject(), *props = NULL, *req = NULL;
    char *origin[64] = {0};  // path of the part that set each keyword of m, by position
    int n_origin = 0;
    int n = cJSON_GetArraySize(all);
    if (!m) return jfail(c, TD_ERR_NOMEM, "out of memory"), NULL;
    for (int i = -1; i < n && !c->failed; i++) {  // -1: the keywords beside allOf
        const cJSON *part = i < 0 ? s : cJSON_GetArrayItem(all, i);
        char ppath[512];
        if (i < 0) snprintf(ppath, sizeof ppath, "%s", path);
        else snprintf(ppath, sizeof ppath, "%s.allOf[%d]", path, i);
        if (cJSON_IsTrue(part)) continue;
        if (!cJSON_IsObject(part)) {
            jfail(c, TD_ERR_UNSUPPORTED, "%s: allOf parts must be schema objects", ppath);
            break;
        }
        for (const cJSON *k = part->child; k && !c->failed; k = k->next) {
            const char *key = k->string;
            if (i < 0 && !strcmp(key, "allOf")) continue;
            if (is_descriptive(key)) continue;
            if (!known(key)) {
                jfail(c, TD_ERR_UNSUPPORTED, "%s: keyword '%s' is not supported", ppath, key);
                break;
            }
            if (!strcmp(key, "$ref")) {
                jfail(c, TD_ERR_UNSUPPORTED, "%s: $ref inside an allOf of several schemas is not supported", ppath);
                break;
            }
            if (!strcmp(key, "additionalProperties") && !cJSON_IsTrue(k)) {
                jfail(c, TD_ERR_UNSUPPORTED,
                      "%s.additionalProperties: only true is supported inside an allOf of several schemas", ppath);
                break;
            }
            if (!strcmp(key, "properties")) {
                if (!cJSON_IsObject(k)) {
                    jfail(c, TD_ERR_INVALID, "%s.properties: must be an object", ppath);
                    break;
                }
                if (!props) props = cJSON_AddObjectToObject(m, "properties");
                for (const cJSON *p = k->child; p && props; p = p->next) {
                    const cJSON *have = cJSON_GetObjectItemCaseSensitive(props, p->string);
                    if (!have) {
                        cJSON_AddItemToObject(props, p->string, cJSON_Duplicate(p, true));
                    } else if (!cJSON_Compare(have, p, true)) {
                        jfail(c, TD_ERR_UNSUPPORTED, "%s.properties.%s: conflicts with the same property in another "
                              "part of the allOf (only identical schemas merge)", ppath, p->string);
                        break;
                    }
                }
                continue;
            }
            if (!strcmp(key, "required")) {
                if (!cJSON_IsArray(k)) {
                    jfail(c, TD_ERR_INVALID, "%s.required: must be an array", ppath);
                    break;
                }
                if (!req) req = cJSON_AddArrayToObject(m, "required");
                for (const cJSON *r = k->child; r && req; r = r->next) {
                    bool dup = false;
                    for (const cJSON *q = req->child; q && !dup; q = q->next) dup = cJSON_Compare(q, r, true);
                    if (!dup) cJSON_AddItemToArray(req, cJSON_Duplicate(r, true));
                }
                continue;
            }
            const cJSON *have = cJSON_GetObjectItemCaseSensitive(m, key);
            if (!have) {
                cJSON_AddItemToObject(m, key, cJSON_Duplicate(k, true));
                if (n_origin < 64) origin[n_origin++] = strdup(ppath);
            } else if (!cJSON_Compare(have, k, true)) {
                const char *o = "another part";
                int idx = 0;
                for (const cJSON *q = m->child; q && q != have; q = q->next)
                    if (strcmp(q->string, "properties") && strcmp(q->string, "required")) idx++;
                if (idx < n_origin && origin[idx]) o = origin[idx];
                jfail(c, TD_ERR_UNSUPPORTED, "%s.%s: conflicts with %s.%s (allOf parts must agree)", ppath, key, o, key);
            }
        }
    }
    for (int i = 0; i < n_origin; i++) free(origin[i]);
    if (c->failed) {
        cJSON_Delete(m);
        return NULL;
    }
    return m;
}

static const char *gen(jc *c, const cJSON *s, const char *path) {
    if (c->failed) return NULL;
    if (++c->depth > 64) return jfail(c, TD_ERR_LIMIT, "%s: schema nested too deeply", path);
    const char *res = NULL;
    if (cJSON_IsTrue(s)) {
        res = c->p_value;
        goto out;
    }
    if (cJSON_IsFalse(s)) {
        res = jfail(c, TD_ERR_UNSUPPORTED, "%s: schema false matches nothing", path);
        goto out;
    }
    if (!cJSON_IsObject(s)) {
        res = jfail(c, TD_ERR_INVALID, "%s: a schema must be an object or a boolean", path);
        goto out;
    }
    int n_constraining = 0;
    for (const cJSON *k = s->child; k; k = k->next) {
        if (!known(k->string)) {
            res = jfail(c, TD_ERR_UNSUPPORTED, "%s: keyword '%s' is not supported", path, k->string);
            goto out;
        }
        if (!is_descriptive(k->string)) n_constraining++;
    }
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (n_constraining > 1) res = jfail(c, TD_ERR_UNSUPPORTED, "%s: $ref with sibling keywords is not supported", path);
        else if (!cJSON_IsString(v)) res = jfail(c, TD_ERR_INVALID, "%s.$ref: must be a string", path);
        else res = gen_ref(c, v->valuestring, path);
        goto out;
    }
    const char *alt_kw = cJSON_GetObjectItemCaseSensitive(s, "anyOf") ? "anyOf"
                         : cJSON_GetObjectItemCaseSensitive(s, "oneOf") ? "oneOf" : NULL;
    if (alt_kw) {
        if (n_constraining > 1) res = jfail(c, TD_ERR_UNSUPPORTED, "%s: %s with sibling keywords is not supported", path, alt_kw);
        else res = alternation(c, cJSON_GetObjectItemCaseSensitive(s, alt_kw), alt_kw, path);
        goto out;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1) {
            res = jfail(c, TD_ERR_INVALID, "%s.allOf: must be a non-empty array of schemas", path);
        } else if (cJSON_GetArraySize(v) == 1 && n_constraining == 1) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s.allOf[0]", path);
            res = gen(c, v->child, sub);
        } else {
            cJSON *m = merge_all_of(c, s, v, path);
            res = m ? gen(c, m, path) : NULL;
            cJSON_Delete(m);
        }
        goto out;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        res = json_literal_rule(c, (const cJSON *const *)&v, 1);
        goto out;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        int n = cJSON_GetArraySize(v);
        if (!cJSON_IsArray(v) || n == 0) {
            res = jfail(c, TD_ERR_INVALID, "%s.enum: must be a non-empty array", path);
            goto out;
        }
        const cJSON **vals = malloc((size_t)n * sizeof *vals);
        if (!vals) {
            res = jfail(c, TD_ERR_NOMEM, "out of memory");
            goto out;
        }
        int i = 0;
        for (const cJSON *x = v->child; x; x = x->next) vals[i++] = x;
        res = json_literal_rule(c, vals, n);
        free(vals);
        goto out;
    }
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
    if (cJSON_IsString(ty)) {
        res = gen_type(c, s, ty->valuestring, path);
    } else if (cJSON_IsArray(ty)) {
        gb_buf b = {0};
        int i = 0;
        for (const cJSON *x = ty->child; x && !c->failed; x = x->next, i++) {
            if (!cJSON_IsString(x)) {
                jfail(c, TD_ERR_INVALID, "%s.type[%d]: must be a string", path, i);
                break;
            }
            const char *r = gen_type(c, s, x->valuestring, path);
            if (r) gb_printf(&b, "%s%s", i ? " | " : "", r);
        }
        if (i == 0) jfail(c, TD_ERR_INVALID, "%s.type: must not be empty", path);
        res = c->failed ? NULL : rule(c, b.p);
        free(b.p);
    } else if (ty) {
        res = jfail(c, TD_ERR_INVALID, "%s.type: must be a string or an array of strings", path);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
               cJSON_GetObjectItemCaseSensitive(s, "additionalProperties")) {
        res = gen_object(c, s, path);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems") ||
               cJSON_GetObjectItemCaseSensitive(s, "minItems") || cJSON_GetObjectItemCaseSensitive(s, "maxItems")) {
        res = gen_array(c, s, path);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
               cJSON_GetObjectItemCaseSensitive(s, "pattern")) {
        res = gen_string(c, s, path);
    } else if (cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") ||
               cJSON_GetObjectItemCaseSensitive(s, "maximum") || cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum")) {
        res = gen_integer(c, s, path);
    } else {
        res = c->p_value;
    }
out:
    c->depth--;
    return c->failed ? NULL : res;
}

// The primitive rules every converter output carries.
static void primitives(gb_buf *b, const char *p) {
    gb_printf(b, "%sws ::= \"\" | \" \" | \"\\n\" [ \\t]{0,20}\n", p);
    gb_printf(b, "%shex ::= [0-9a-fA-F]\n", p);
    gb_printf(b, "%schar ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" ([0-9a-cA-CeEfF] %shex{3} | [dD] [0-7] %shex{2}))\n",
              p, p, p);
    gb_printf(b, "%sstring ::= \"\\\"\" %schar* \"\\\"\"\n", p, p);
    gb_printf(b, "%snat ::= \"0\" | [1-9] [0-9]{0,15}\n", p);
    gb_printf(b, "%spos ::= [1-9] [0-9]{0,15}\n", p);
    gb_printf(b, "%sint ::= \"-\"? %snat\n", p, p);
    gb_printf(b, "%snumber ::= %sint (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n", p, p);
    gb_printf(b, "%sbool ::= \"true\" | \"false\"\n", p);
    gb_printf(b, "%snull ::= \"null\"\n", p);
    gb_printf(b, "%svalue ::= %sobject | %sarray | %sstring | %snumber | %sbool | %snull\n", p, p, p, p, p, p, p);
    gb_printf(b, "%sobject ::= \"{\" %sws (%sstring %sws \":\" %sws %svalue %sws (\",\" %sws %sstring %sws \":\" %sws %svalue %sws)*)? \"}\"\n",
              p, p, p, p, p, p, p, p, p, p, p, p, p);
    gb_printf(b, "%sarray ::= \"[\" %sws (%svalue %sws (\",\" %sws %svalue %sws)*)? \"]\"\n", p, p, p, p, p, p, p);
}

static void jc_names(jc *c) {
    snprintf(c->p_string, sizeof c->p_string, "%sstring", c->px);
    snprintf(c->p_value, sizeof c->p_value, "%svalue", c->px);
    snprintf(c->p_number, sizeof c->p_number, "%snumber", c->px);
    snprintf(c->p_int, sizeof c->p_int, "%sint", c->px);
    snprintf(c->p_nat, sizeof c->p_nat, "%snat", c->px);
    snprintf(c->p_pos, sizeof c->p_pos, "%spos", c->px);
    snprintf(c->p_bool, sizeof c->p_bool, "%sbool", c->px);
    snprintf(c->p_null, sizeof c->p_null, "%snull", c->px);
}

char *td_gbnf_from_json_schema(const cJSON *schema, const char *prefix, td_err *err) {
    if (!schema) return td_err_set(err, TD_ERR_INVALID, "json schema: none given"), NULL;
    if (!gb_prefix_ok(prefix, err)) return NULL;
    jc c = {.px = prefix ? prefix : "", .err = err, .root = schema};
    jc_names(&c);
    const char *top = gen(&c, schema, "$");
    char *res = NULL;
    if (top && !c.failed) {
        gb_buf b = {0};
        gb_printf(&b, "%sroot ::= %s\n", c.px, top);
        gb_put(&b, c.out.p ? c.out.p : "", c.out.n);
        primitives(&b, c.px);
        if (b.oom || c.out.oom) {
            free(b.p);
            td_err_set(err, TD_ERR_NOMEM, "json schema: out of memory");
        } else {
            res = b.p;
        }
    }
    for (int i = 0; i < c.n_b; i++) free(c.bodies[i]), free(c.names[i]);
    for (int i = 0; i < c.n_refs; i++) free(c.refs[i]), free(c.ref_names[i]);
    free(c.bodies), free(c.names), free(c.refs), free(c.ref_names), free(c.out.p);
    return res;
}

char *td_gbnf_json_value(const char *prefix) {
    if (!gb_prefix_ok(prefix, NULL)) return NULL;
    const char *p = prefix ? prefix : "";
    gb_buf b = {0};
    gb_printf(&b, "%sroot ::= %svalue\n", p, p);
    primitives(&b, p);
    if (b.oom) return free(b.p), NULL;
    return b.p;
}

char *td_gbnf_from_choices(const char *const *choices, int n, const char *prefix, td_err *err) {
    if (n < 1 || !choices) return td_err_set(err, TD_ERR_INVALID, "choice: at least one string is needed"), NULL;
    if (!gb_prefix_ok(prefix, err)) return NULL;
    gb_buf b = {0};
    gb_printf(&b, "%sroot ::= ", prefix ? prefix : "");
    for (int i = 0; i < n; i++) {
        if (!choices[i]) return free(b.p), td_err_set(err, TD_ERR_INVALID, "choice %d: not a string", i), NULL;
        if (i) gb_puts(&b, " | ");
        gb_literal(&b, choices[i], strlen(choices[i]));
    }
    gb_puts(&b, "\n");
    if (b.oom) return free(b.p), td_err_set(err, TD_ERR_NOMEM, "choice: out of memory"), NULL;
    return b.p;
}
