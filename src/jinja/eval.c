// Jinja, back half: the interpreter. Mirrors @huggingface/jinja's runtime (Interpreter,
// Environment, builtins; the filters and tests are filters.c) including its JavaScript-isms: loose ==,
// macros scoped at the call site, `continue`/`break` dropping the iteration's partial output, tojson
// spacing.
// All render-time memory comes from one arena per render, freed at the end; output streams into one
// buffer (blocks that produce values -- macro calls, {% set %} blocks -- render at its tail and cut).
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "jinja/interp.h"

#define MAX_RANGE (1u << 20)  // elements of one range()

typedef enum {
    F_RAISE, F_RANGE, F_NAMESPACE, F_STRFTIME,
    F_S_UPPER, F_S_LOWER, F_S_STRIP, F_S_TITLE, F_S_CAPITALIZE, F_S_RSTRIP, F_S_LSTRIP,
    F_S_STARTSWITH, F_S_ENDSWITH, F_S_SPLIT, F_S_REPLACE,
    F_O_GET, F_O_ITEMS, F_O_KEYS, F_O_VALUES, F_O_DICTSORT,
    F_MACRO, F_CALLER,
} fkind;

struct td_jinja_fn {
    int kind;
    val self;         // bound object of a method
    const node *def;  // macro / call statement
    env *defenv;      // call statement: lexical scope of the caller() body
};

// ---------------------------------------------------------------------------------------------
// errors

int td_jinja_rerr(rctx *r, const node *at, td_status st, const char *fmt, ...) {
    if (r->status != TD_OK) return JR_ERR;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = st;
    if (at) {
        int line, col;
        td_jinja_line_col(r->t->src, r->t->src_len, at->pos, &line, &col);
        td_err_set(r->err, st, "chat template error at line %d, column %d: %s", line, col, msg);
    } else {
        td_err_set(r->err, st, "chat template error: %s", msg);
    }
    return JR_ERR;
}

static int oom(rctx *r) {
    if (r->ar.failed == 2)
        return td_jinja_rerr(r, NULL, TD_ERR_LIMIT, "render used more than %zu bytes of memory", r->lim.max_memory);
    return td_jinja_rerr(r, NULL, TD_ERR_NOMEM, "out of memory");
}

void *td_jinja_ralloc(rctx *r, size_t n) {
    void *p = td_jinja_alloc(&r->ar, n);
    if (!p) oom(r);
    return p;
}

const char *td_jinja_type_name(const val *v) {
    switch (v->t) {
    case JV_UNDEF: return "UndefinedValue";
    case JV_NULL: return "NullValue";
    case JV_BOOL: return "BooleanValue";
    case JV_INT: return "IntegerValue";
    case JV_FLOAT: return "FloatValue";
    case JV_STR: return "StringValue";
    case JV_ARRAY: return v->flag ? "TupleValue" : "ArrayValue";
    case JV_OBJECT: return v->flag ? "KeywordArgumentsValue" : "ObjectValue";
    case JV_NS: return "NamespaceValue";
    default: return "FunctionValue";
    }
}

// ---------------------------------------------------------------------------------------------
// arrays, maps, string builder (the constructors are interp.h's)

td_jinja_arr *td_jinja_arr_new(rctx *r, size_t n) {
    td_jinja_arr *a = td_jinja_ralloc(r, sizeof *a);
    if (!a) return NULL;
    a->n = n;
    a->v = n ? td_jinja_ralloc(r, n * sizeof(val)) : NULL;
    if (n && !a->v) return NULL;
    return a;
}

static td_jinja_map *map_new(rctx *r) {
    td_jinja_map *m = td_jinja_ralloc(r, sizeof *m);
    if (m) memset(m, 0, sizeof *m);
    return m;
}

_Thread_local size_t td_jinja_scan_work;  // see interp.h

#define MAP_HASH_MIN 16  // below this many keys a linear scan is cheaper than hashing

static uint64_t key_hash(const char *k, size_t kl) {  // FNV-1a
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < kl; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
    return h;
}

val *td_jinja_map_get(const td_jinja_map *m, const char *k, size_t kl) {
    if (m->hidx) {
        size_t mask = m->hcap - 1, i = (size_t)key_hash(k, kl) & mask;
        for (;; i = (i + 1) & mask) {
            uint32_t e = m->hidx[i];
            if (!e) return NULL;
            if (m->klen[e - 1] == kl && memcmp(m->k[e - 1], k, kl) == 0) return &m->v[e - 1];
        }
    }
    td_jinja_scan_work += m->n;
    for (size_t i = 0; i < m->n; i++)
        if (m->klen[i] == kl && memcmp(m->k[i], k, kl) == 0) return &m->v[i];
    return NULL;
}

static void hidx_insert(td_jinja_map *m, size_t entry) {
    size_t mask = m->hcap - 1, i = (size_t)key_hash(m->k[entry], m->klen[entry]) & mask;
    while (m->hidx[i]) i = (i + 1) & mask;
    m->hidx[i] = (uint32_t)entry + 1;
}

static int hidx_rebuild(rctx *r, td_jinja_map *m) {
    size_t hc = 64;
    while (hc < m->cap * 2) hc *= 2;
    uint32_t *h = td_jinja_ralloc(r, hc * sizeof(uint32_t));
    if (!h) return 0;
    memset(h, 0, hc * sizeof(uint32_t));
    m->hidx = h;
    m->hcap = hc;
    for (size_t i = 0; i < m->n; i++) hidx_insert(m, i);
    return 1;
}

// appends without looking for an existing key (callers know it is new)
static int map_append(rctx *r, td_jinja_map *m, const char *k, size_t kl, val v) {
    if (m->n == m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 8;
        if (nc > UINT32_MAX - 1) return td_jinja_rerr(r, NULL, TD_ERR_LIMIT, "too many keys"), 0;
        const char **nk = td_jinja_ralloc(r, nc * sizeof(char *));
        size_t *nl = td_jinja_ralloc(r, nc * sizeof(size_t));
        val *nv = td_jinja_ralloc(r, nc * sizeof(val));
        if (!nk || !nl || !nv) return 0;
        if (m->n) {
            memcpy(nk, m->k, m->n * sizeof(char *));
            memcpy(nl, m->klen, m->n * sizeof(size_t));
            memcpy(nv, m->v, m->n * sizeof(val));
        }
        m->k = nk, m->klen = nl, m->v = nv, m->cap = nc;
        m->hidx = NULL;
    }
    m->k[m->n] = k;
    m->klen[m->n] = kl;
    m->v[m->n++] = v;
    if (m->hidx) hidx_insert(m, m->n - 1);
    else if (m->n >= MAP_HASH_MIN && !hidx_rebuild(r, m)) return 0;
    return 1;
}

static int map_set(rctx *r, td_jinja_map *m, const char *k, size_t kl, val v) {
    val *e = td_jinja_map_get(m, k, kl);
    if (e) {
        *e = v;
        return 1;
    }
    return map_append(r, m, k, kl, v);
}
static void map_del(td_jinja_map *m, const char *k, size_t kl) {
    for (size_t i = 0; i < m->n; i++)
        if (m->klen[i] == kl && memcmp(m->k[i], k, kl) == 0) {
            memmove(&m->k[i], &m->k[i + 1], (m->n - i - 1) * sizeof(char *));
            memmove(&m->klen[i], &m->klen[i + 1], (m->n - i - 1) * sizeof(size_t));
            memmove(&m->v[i], &m->v[i + 1], (m->n - i - 1) * sizeof(val));
            m->n--;
            if (m->hidx) {  // entries moved: rebuild the index in place
                memset(m->hidx, 0, m->hcap * sizeof(uint32_t));
                for (size_t j = 0; j < m->n; j++) hidx_insert(m, j);
            }
            return;
        }
}

int td_jinja_sb_add(rctx *r, sb *b, const char *s, size_t n) {
    if (n == 0 && b->s) return 1;
    if (b->n + n > r->lim.max_output + 4096)  // no single string may outgrow the output cap
        return td_jinja_rerr(r, NULL, TD_ERR_LIMIT, "string longer than %zu bytes", r->lim.max_output), 0;
    char *p = td_jinja_concat(&r->ar, b->s ? b->s : "", b->n, s, n);
    if (!p) return oom(r), 0;
    b->s = p;
    b->n += n;
    return 1;
}
static int sb_addz(rctx *r, sb *b, const char *s) { return td_jinja_sb_add(r, b, s, strlen(s)); }

// ---------------------------------------------------------------------------------------------
// environments

static env *env_new(rctx *r, env *parent) {
    env *e = td_jinja_ralloc(r, sizeof *e);
    if (e) {
        memset(e, 0, sizeof *e);
        e->parent = parent;
    }
    return e;
}
static int env_append(rctx *r, env *e, const char *k, size_t kl, val v);
static int env_set(rctx *r, env *e, const char *k, size_t kl, val v) {
    td_jinja_scan_work += e->n;
    for (size_t i = 0; i < e->n; i++)
        if (e->kl[i] == kl && memcmp(e->k[i], k, kl) == 0) {
            e->v[i] = v;
            return 1;
        }
    return env_append(r, e, k, kl, v);
}
static int env_append(rctx *r, env *e, const char *k, size_t kl, val v) {
    if (e->n == e->cap) {
        size_t nc = e->cap ? e->cap * 2 : 4;
        const char **nk = td_jinja_ralloc(r, nc * sizeof(char *));
        size_t *nl = td_jinja_ralloc(r, nc * sizeof(size_t));
        val *nv = td_jinja_ralloc(r, nc * sizeof(val));
        if (!nk || !nl || !nv) return 0;
        if (e->n) {
            memcpy(nk, e->k, e->n * sizeof(char *));
            memcpy(nl, e->kl, e->n * sizeof(size_t));
            memcpy(nv, e->v, e->n * sizeof(val));
        }
        e->k = nk, e->kl = nl, e->v = nv, e->cap = nc;
    }
    e->k[e->n] = k;
    e->kl[e->n] = kl;
    e->v[e->n++] = v;
    return 1;
}
static val env_get(const env *e, const char *k, size_t kl) {
    for (; e; e = e->parent, td_jinja_scan_work += e ? e->n : 0)
        for (size_t i = 0; i < e->n; i++)
            if (e->kl[i] == kl && memcmp(e->k[i], k, kl) == 0) return e->v[i];
    return v_undef();
}

// ---------------------------------------------------------------------------------------------
// JS semantics: truthiness, equality, string conversion, JSON

int td_jinja_truthy(const val *v) {
    switch (v->t) {
    case JV_UNDEF:
    case JV_NULL: return 0;
    case JV_BOOL: return v->u.b;
    case JV_INT:
    case JV_FLOAT: return v->u.n != 0 && !isnan(v->u.n);
    case JV_STR: return v->len > 0;
    case JV_ARRAY: return v->u.a->n > 0;
    case JV_OBJECT: return v->u.o->n > 0;
    default: return 1;  // namespace (a JS Map is truthy), function
    }
}

// a.value === b.value
int td_jinja_strict_eq(const val *a, const val *b) {
    if (is_num(a) && is_num(b)) return a->u.n == b->u.n;
    if (a->t != b->t) return 0;
    switch (a->t) {
    case JV_UNDEF:
    case JV_NULL: return 1;
    case JV_BOOL: return a->u.b == b->u.b;
    case JV_STR: return a->len == b->len && memcmp(a->u.s, b->u.s, a->len) == 0;
    case JV_ARRAY: return a->u.a == b->u.a;
    case JV_OBJECT:
    case JV_NS: return a->u.o == b->u.o;
    default: return a->u.f == b->u.f;
    }
}

// JS ToNumber of a string
static double str_to_number(const char *s, size_t n) {
    size_t a, b;
    td_jinja_trim(s, n, 1, 1, &a, &b);
    if (a == b) return 0;
    char *tmp = malloc(b - a + 1);
    if (!tmp) return NAN;
    memcpy(tmp, s + a, b - a);
    tmp[b - a] = 0;
    double v;
    char *end;
    const char *t = tmp;
    if ((t[0] == '0') && (t[1] == 'x' || t[1] == 'X' || t[1] == 'o' || t[1] == 'O' || t[1] == 'b' || t[1] == 'B')) {
        int base = (t[1] == 'x' || t[1] == 'X') ? 16 : (t[1] == 'o' || t[1] == 'O') ? 8 : 2;
        v = 0;
        const char *p = t + 2;
        if (!*p) v = NAN;
        for (; *p; p++) {
            int d = (*p >= '0' && *p <= '9')   ? *p - '0'
                    : (*p >= 'a' && *p <= 'f') ? *p - 'a' + 10
                    : (*p >= 'A' && *p <= 'F') ? *p - 'A' + 10
                                               : 99;
            if (d >= base) {
                v = NAN;
                break;
            }
            v = v * base + d;
        }
    } else if (!strcmp(t, "Infinity") || !strcmp(t, "+Infinity")) v = INFINITY;
    else if (!strcmp(t, "-Infinity")) v = -INFINITY;
    else {
        int ok = 1;
        for (const char *p = t; *p; p++)
            if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-')) ok = 0;
        v = ok ? strtod(t, &end) : NAN;
        if (ok && *end) v = NAN;
    }
    free(tmp);
    return v;
}

// a.value == b.value (JS loose equality on the raw values)
static int loose_eq(rctx *r, const val *a, const val *b, int *res) {
    int an = a->t == JV_UNDEF || a->t == JV_NULL, bn = b->t == JV_UNDEF || b->t == JV_NULL;
    if (an || bn) {
        *res = an && bn;
        return 1;
    }
    int aobj = a->t >= JV_ARRAY, bobj = b->t >= JV_ARRAY;
    if (aobj && bobj) {
        *res = td_jinja_strict_eq(a, b);
        return 1;
    }
    if (a->t == b->t || (is_num(a) && is_num(b))) {
        *res = td_jinja_strict_eq(a, b);
        return 1;
    }
    // coerce: booleans to numbers, objects to primitive strings, then string vs number
    val x = *a, y = *b;
    if (x.t == JV_BOOL) x = v_int(x.u.b);
    if (y.t == JV_BOOL) y = v_int(y.u.b);
    if (x.t >= JV_ARRAY) {
        sb s = {0};
        if (!td_jinja_raw_string(r, &x, &s, 1)) return 0;
        x = sb_val(&s);
    }
    if (y.t >= JV_ARRAY) {
        sb s = {0};
        if (!td_jinja_raw_string(r, &y, &s, 1)) return 0;
        y = sb_val(&s);
    }
    if (x.t == y.t || (is_num(&x) && is_num(&y))) {
        *res = td_jinja_strict_eq(&x, &y);
        return 1;
    }
    double dx = x.t == JV_STR ? str_to_number(x.u.s, x.len) : x.u.n;
    double dy = y.t == JV_STR ? str_to_number(y.u.s, y.len) : y.u.n;
    *res = dx == dy;
    return 1;
}

static int add_num(rctx *r, sb *out, double x) {
    char buf[40];
    size_t n = td_jinja_num_str(x, buf);
    return td_jinja_sb_add(r, out, buf, n);
}

// String(v.value): what `~`, `+` on strings and join see. Arrays join their elements' toString()
// with ","; Maps print as [object Map]. nullish_empty: null/undefined print as "" (Array#join).
int td_jinja_raw_string(rctx *r, const val *v, sb *out, int nullish_empty) {
    switch (v->t) {
    case JV_UNDEF: return nullish_empty ? td_jinja_sb_add(r, out, "", 0) : sb_addz(r, out, "undefined");
    case JV_NULL: return nullish_empty ? td_jinja_sb_add(r, out, "", 0) : sb_addz(r, out, "null");
    case JV_BOOL: return sb_addz(r, out, v->u.b ? "true" : "false");
    case JV_INT:
    case JV_FLOAT: return add_num(r, out, v->u.n);
    case JV_STR: return td_jinja_sb_add(r, out, v->u.s, v->len);
    case JV_ARRAY:
        if (!td_jinja_sb_add(r, out, "", 0)) return 0;
        for (size_t i = 0; i < v->u.a->n; i++) {
            if (i && !td_jinja_sb_add(r, out, ",", 1)) return 0;
            if (!td_jinja_to_string(r, &v->u.a->v[i], out)) return 0;
        }
        return 1;
    case JV_OBJECT:
    case JV_NS: return sb_addz(r, out, "[object Map]");
    default: return sb_addz(r, out, "[function]");
    }
}

// JSON.stringify(string), then optionally ensure_ascii's \uXXXX for every UTF-16 unit >= 0x7f
static int json_str(rctx *r, const char *s, size_t n, int ensure_ascii, sb *out) {
    if (!td_jinja_sb_add(r, out, "\"", 1)) return 0;
    size_t i = 0, run = 0, adv;
    char esc[16];
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        const char *rep = NULL;
        size_t rl = 0;
        uint32_t cp = c;
        adv = 1;
        if (c >= 0x80) cp = td_jinja_utf8_decode(s + i, n - i, &adv);
        if (c == '"') rep = "\\\"", rl = 2;
        else if (c == '\\') rep = "\\\\", rl = 2;
        else if (c == '\n') rep = "\\n", rl = 2;
        else if (c == '\r') rep = "\\r", rl = 2;
        else if (c == '\t') rep = "\\t", rl = 2;
        else if (c == '\b') rep = "\\b", rl = 2;
        else if (c == '\f') rep = "\\f", rl = 2;
        else if (c < 0x20) rl = (size_t)snprintf(esc, sizeof esc, "\\u%04x", c), rep = esc;
        else if (adv == 3 && cp >= 0xD800 && cp <= 0xDFFF) rl = (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp), rep = esc;
        else if (ensure_ascii && cp >= 0x7F && !(adv == 1 && c >= 0x80)) {
            if (cp >= 0x10000)
                rl = (size_t)snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                                      0xDC00 + ((cp - 0x10000) & 0x3FF));
            else
                rl = (size_t)snprintf(esc, sizeof esc, "\\u%04x", cp);
            rep = esc;
        }
        if (rep) {
            if (run && !td_jinja_sb_add(r, out, s + i - run, run)) return 0;
            run = 0;
            if (!td_jinja_sb_add(r, out, rep, rl)) return 0;
        } else
            run += adv;
        i += adv;
    }
    if (run && !td_jinja_sb_add(r, out, s + i - run, run)) return 0;
    return td_jinja_sb_add(r, out, "\"", 1);
}

static int add_padding(rctx *r, sb *out, const json_opts *o, int depth) {
    if (!td_jinja_sb_add(r, out, "\n", 1)) return 0;
    for (int i = 0; i < depth * o->indent; i++)
        if (!td_jinja_sb_add(r, out, " ", 1)) return 0;
    return 1;
}

static int key_cmp(const char *a, size_t al, const char *b, size_t bl) { return td_jinja_utf16_cmp(a, al, b, bl); }

// toJSON of @huggingface/jinja; undef_null: undefined prints as null (tojson) or undefined (toString)
int td_jinja_to_json(rctx *r, const val *v, const json_opts *o, int depth, int undef_null, sb *out) {
    if (depth > r->lim.max_depth) return td_jinja_rerr(r, NULL, TD_ERR_LIMIT, "value nested too deeply for JSON"), 0;
    switch (v->t) {
    case JV_NULL: return sb_addz(r, out, "null");
    case JV_UNDEF: return sb_addz(r, out, undef_null ? "null" : "undefined");
    case JV_BOOL: return sb_addz(r, out, v->u.b ? "true" : "false");
    case JV_INT:
    case JV_FLOAT:
        if (!isfinite(v->u.n)) return sb_addz(r, out, "null");
        return add_num(r, out, v->u.n);
    case JV_STR: return json_str(r, v->u.s, v->len, o->ensure_ascii, out);
    case JV_ARRAY:
        if (v->flag) break;  // TupleValue: not handled by toJSON
        if (!td_jinja_sb_add(r, out, "[", 1)) return 0;
        for (size_t i = 0; i < v->u.a->n; i++) {
            if (i && !td_jinja_sb_add(r, out, o->item_sep, o->item_sep_len)) return 0;
            if (o->indent && !add_padding(r, out, o, depth + 1)) return 0;
            if (!td_jinja_to_json(r, &v->u.a->v[i], o, depth + 1, undef_null, out)) return 0;
        }
        if (o->indent && v->u.a->n && !add_padding(r, out, o, depth)) return 0;
        return td_jinja_sb_add(r, out, "]", 1);
    case JV_OBJECT:
    case JV_NS: {
        if (v->t == JV_OBJECT && v->flag) break;  // KeywordArgumentsValue
        const td_jinja_map *m = v->u.o;
        size_t *idx = td_jinja_ralloc(r, (m->n + 1) * sizeof(size_t));
        if (!idx) return 0;
        for (size_t i = 0; i < m->n; i++) idx[i] = i;
        if (o->sort_keys)  // insertion sort, stable (localeCompare approximated by code-unit order)
            for (size_t i = 1; i < m->n; i++) {
                size_t x = idx[i], j = i;
                while (j > 0 && key_cmp(m->k[idx[j - 1]], m->klen[idx[j - 1]], m->k[x], m->klen[x]) > 0) {
                    idx[j] = idx[j - 1];
                    j--;
                }
                idx[j] = x;
            }
        if (!td_jinja_sb_add(r, out, "{", 1)) return 0;
        for (size_t q = 0; q < m->n; q++) {
            size_t i = idx[q];
            if (q && !td_jinja_sb_add(r, out, o->item_sep, o->item_sep_len)) return 0;
            if (o->indent && !add_padding(r, out, o, depth + 1)) return 0;
            if (!json_str(r, m->k[i], m->klen[i], o->ensure_ascii, out)) return 0;
            if (!td_jinja_sb_add(r, out, o->key_sep, o->key_sep_len)) return 0;
            if (!td_jinja_to_json(r, &m->v[i], o, depth + 1, undef_null, out)) return 0;
        }
        if (o->indent && m->n && !add_padding(r, out, o, depth)) return 0;
        return td_jinja_sb_add(r, out, "}", 1);
    }
    default: break;
    }
    return td_jinja_rerr(r, NULL, TD_ERR_INVALID, "Cannot convert to JSON: %s", td_jinja_type_name(v)), 0;
}

// RuntimeValue#toString
int td_jinja_to_string(rctx *r, const val *v, sb *out) {
    char buf[40];
    switch (v->t) {
    case JV_FLOAT: return td_jinja_sb_add(r, out, buf, td_jinja_float_str(v->u.n, buf));
    case JV_ARRAY:
    case JV_OBJECT:
    case JV_NS: {
        json_opts o = default_json();
        return td_jinja_to_json(r, v, &o, 0, 0, out);
    }
    default: return td_jinja_raw_string(r, v, out, 0);
    }
}

// ---------------------------------------------------------------------------------------------
// output

static int emit(rctx *r, const char *s, size_t n) {
    if (r->n + n > r->lim.max_output)
        return td_jinja_rerr(r, NULL, TD_ERR_LIMIT, "output longer than %zu bytes", r->lim.max_output);
    if (r->n + n + 1 > r->cap) {
        size_t nc = r->cap ? r->cap : 4096;
        while (nc < r->n + n + 1) nc *= 2;
        char *p = realloc(r->out, nc);
        if (!p) return td_jinja_rerr(r, NULL, TD_ERR_NOMEM, "out of memory");
        r->out = p;
        r->cap = nc;
    }
    if (n) memcpy(r->out + r->n, s, n);
    r->n += n;
    return JR_OK;
}

static int emit_value(rctx *r, const val *v) {
    if (v->t == JV_NULL || v->t == JV_UNDEF) return JR_OK;
    if (v->t == JV_STR) return emit(r, v->u.s, v->len);
    sb s = {0};
    if (!td_jinja_to_string(r, v, &s)) return JR_ERR;
    return emit(r, s.s, s.n);
}

// ---------------------------------------------------------------------------------------------
// evaluation

static int eval(rctx *r, const node *x, env *e, val *out);
static int exec_block(rctx *r, node *const *list, size_t n, env *e);

int td_jinja_step(rctx *r, const node *x) {
    r->steps += 1 + td_jinja_scan_work / 16;
    td_jinja_scan_work = 0;
    if (r->steps > r->lim.max_steps)
        return td_jinja_rerr(r, x, TD_ERR_LIMIT, "template ran more than %zu steps", r->lim.max_steps);
    return JR_OK;
}

// renders a block at the tail of the output and cuts it off as a string value
static int render_to_string(rctx *r, node *const *list, size_t n, env *e, val *out) {
    size_t mark = r->n;
    int st = exec_block(r, list, n, e);
    if (st == JR_OK) {
        char *s = td_jinja_strdup(&r->ar, r->out ? r->out + mark : "", r->n - mark);
        if (!s) st = oom(r);
        else *out = v_str(s, r->n - mark);
    }
    r->n = mark;
    return st;
}

// the argument list: positional values, then one keyword-arguments object (kw_always: even if empty)
int td_jinja_eval_args(rctx *r, node *const *args, size_t n, env *e, int kw_always, val **out, size_t *nout,
                     td_jinja_map **kwout) {
    size_t cap = n + 1, k = 0;
    val *pos = td_jinja_ralloc(r, cap * sizeof(val));
    td_jinja_map *kw = map_new(r);
    if (!pos || !kw) return JR_ERR;
    for (size_t i = 0; i < n; i++) {
        const node *a = args[i];
        if (a->kind == JN_SPREAD) {
            val v;
            int st = eval(r, a->a, e, &v);
            if (st) return st;
            if (v.t != JV_ARRAY)
                return td_jinja_rerr(r, a, TD_ERR_INVALID, "Cannot unpack non-iterable type: %s",
                                     td_jinja_type_name(&v));
            val *np = td_jinja_ralloc(r, (cap + v.u.a->n) * sizeof(val));
            if (!np) return JR_ERR;
            memcpy(np, pos, k * sizeof(val));
            pos = np;
            cap += v.u.a->n;
            for (size_t j = 0; j < v.u.a->n; j++) pos[k++] = v.u.a->v[j];
        } else if (a->kind != JN_KWARG && a->kind != JN_KWSPREAD) {
            int st = eval(r, a, e, &pos[k]);
            if (st) return st;
            k++;
        }
    }
    for (size_t i = 0; i < n; i++) {
        const node *a = args[i];
        if (a->kind == JN_KWARG) {
            val v;
            int st = eval(r, a->a, e, &v);
            if (st) return st;
            if (td_jinja_map_get(kw, a->s, a->slen))
                return td_jinja_rerr(r, a, TD_ERR_INVALID, "Got multiple values for keyword argument '%.*s'", (int)a->slen, a->s);
            if (!map_set(r, kw, a->s, a->slen, v)) return JR_ERR;
        } else if (a->kind == JN_KWSPREAD) {
            val v;
            int st = eval(r, a->a, e, &v);
            if (st) return st;
            if (v.t != JV_OBJECT)
                return td_jinja_rerr(r, a, TD_ERR_INVALID, "Argument after ** must be a mapping, not %s",
                                     td_jinja_type_name(&v));
            for (size_t j = 0; j < v.u.o->n; j++) {
                if (td_jinja_map_get(kw, v.u.o->k[j], v.u.o->klen[j]))
                    return td_jinja_rerr(r, a, TD_ERR_INVALID, "Got multiple values for keyword argument");
                if (!map_set(r, kw, v.u.o->k[j], v.u.o->klen[j], v.u.o->v[j])) return JR_ERR;
            }
        }
    }
    if (kwout) *kwout = kw;
    else if (kw_always || kw->n) {
        if (k == cap) {
            val *np = td_jinja_ralloc(r, (cap + 1) * sizeof(val));
            if (!np) return JR_ERR;
            memcpy(np, pos, k * sizeof(val));
            pos = np;
        }
        pos[k++] = (val){.t = JV_OBJECT, .flag = 1, .u.o = kw};
    }
    *out = pos;
    *nout = k;
    return JR_OK;
}

static val bound(rctx *r, int kind, const val *self) {
    td_jinja_fn *f = td_jinja_ralloc(r, sizeof *f);
    if (!f) return v_undef();
    memset(f, 0, sizeof *f);
    f->kind = kind;
    if (self) f->self = *self;
    return (val){.t = JV_FUNC, .u.f = f};
}

static const struct {
    const char *name;
    int kind;
} STR_METHODS[] = {
    {"upper", F_S_UPPER},   {"lower", F_S_LOWER},   {"strip", F_S_STRIP},           {"title", F_S_TITLE},
    {"capitalize", F_S_CAPITALIZE}, {"rstrip", F_S_RSTRIP}, {"lstrip", F_S_LSTRIP}, {"startswith", F_S_STARTSWITH},
    {"endswith", F_S_ENDSWITH}, {"split", F_S_SPLIT}, {"replace", F_S_REPLACE},
}, OBJ_METHODS[] = {
    {"get", F_O_GET}, {"items", F_O_ITEMS}, {"keys", F_O_KEYS}, {"values", F_O_VALUES}, {"dictsort", F_O_DICTSORT},
};

// obj.builtins.get(name), or undefined
int td_jinja_builtin_attr(rctx *r, const val *obj, const char *name, size_t nl, val *out) {
    *out = v_undef();
    if (obj->t == JV_STR) {
        if (name_is(name, nl, "length")) {
            *out = v_int((double)td_jinja_utf16_len(obj->u.s, obj->len));
            return JR_OK;
        }
        for (size_t i = 0; i < sizeof STR_METHODS / sizeof STR_METHODS[0]; i++)
            if (name_is(name, nl, STR_METHODS[i].name)) *out = bound(r, STR_METHODS[i].kind, obj);
    } else if (obj->t == JV_ARRAY) {
        if (name_is(name, nl, "length")) *out = v_int((double)obj->u.a->n);
    } else if (obj->t == JV_OBJECT) {
        for (size_t i = 0; i < sizeof OBJ_METHODS / sizeof OBJ_METHODS[0]; i++)
            if (name_is(name, nl, OBJ_METHODS[i].name)) *out = bound(r, OBJ_METHODS[i].kind, obj);
    }
    return r->status ? JR_ERR : JR_OK;
}

static double to_index(double d) { return isnan(d) ? 0 : trunc(d); }

// value[index] for arrays and strings (Array#at / String#at)
static int index_at(rctx *r, const val *obj, double d, val *out) {
    d = to_index(d);
    if (obj->t == JV_ARRAY) {
        double n = (double)obj->u.a->n;
        if (d < 0) d += n;
        *out = (d >= 0 && d < n) ? obj->u.a->v[(size_t)d] : v_undef();
        return JR_OK;
    }
    double n = (double)td_jinja_utf16_len(obj->u.s, obj->len);
    if (d < 0) d += n;
    if (!(d >= 0 && d < n)) {
        *out = v_undef();
        return JR_OK;
    }
    char buf[4];
    size_t l = td_jinja_utf16_at(obj->u.s, obj->len, (size_t)d, buf);
    char *s = td_jinja_strdup(&r->ar, buf, l);
    if (!s) return oom(r);
    *out = v_str(s, l);
    return JR_OK;
}

static int eval_slice(rctx *r, const node *x, const val *obj, env *e, val *out) {
    if (obj->t != JV_ARRAY && obj->t != JV_STR)
        return td_jinja_rerr(r, x, TD_ERR_INVALID, "Slice object must be an array or string");
    val sv[3];
    const node *parts[3] = {x->a, x->b, x->c};
    for (int i = 0; i < 3; i++) {
        if (!parts[i]) sv[i] = v_undef();
        else {
            int st = eval(r, parts[i], e, &sv[i]);
            if (st) return st;
        }
        if (sv[i].t != JV_INT && sv[i].t != JV_UNDEF)
            return td_jinja_rerr(r, x, TD_ERR_INVALID, "Slice %s must be numeric or undefined",
                                 i == 0   ? "start"
                                 : i == 1 ? "stop"
                                          : "step");
    }
    // elements: array items, or the string's code points
    size_t len;
    size_t *cpoff = NULL;  // byte offsets of code points (+ end)
    if (obj->t == JV_ARRAY) len = obj->u.a->n;
    else {
        size_t cnt = 0, i = 0, adv;
        while (i < obj->len) td_jinja_utf8_decode(obj->u.s + i, obj->len - i, &adv), i += adv, cnt++;
        cpoff = td_jinja_ralloc(r, (cnt + 1) * sizeof(size_t));
        if (!cpoff) return JR_ERR;
        cnt = 0, i = 0;
        while (i < obj->len) cpoff[cnt++] = i, td_jinja_utf8_decode(obj->u.s + i, obj->len - i, &adv), i += adv;
        cpoff[cnt] = obj->len;
        len = cnt;
    }
    double L = (double)len;
    double step = sv[2].t == JV_INT ? sv[2].u.n : 1;
    double start, stop;
    if (isnan(step) || (sv[0].t == JV_INT && isnan(sv[0].u.n)) || (sv[1].t == JV_INT && isnan(sv[1].u.n))) {
        start = stop = 0, step = 1;
    } else if (step >= 0) {
        start = sv[0].t == JV_INT ? sv[0].u.n : 0;
        stop = sv[1].t == JV_INT ? sv[1].u.n : L;
        start = start < 0 ? fmax(L + start, 0) : fmin(start, L);
        stop = stop < 0 ? fmax(L + stop, 0) : fmin(stop, L);
    } else {
        start = sv[0].t == JV_INT ? sv[0].u.n : L - 1;
        stop = sv[1].t == JV_INT ? sv[1].u.n : -1;
        start = start < 0 ? fmax(L + start, -1) : fmin(start, L - 1);
        stop = stop < -1 ? fmax(L + stop, -1) : fmin(stop, L - 1);
    }
    double dir = step > 0 ? 1 : step < 0 ? -1 : 0;
    size_t cnt = 0;
    if (dir != 0)
        for (double i = start; dir * i < dir * stop; i += step) cnt++;
    if (obj->t == JV_ARRAY) {
        td_jinja_arr *a = td_jinja_arr_new(r, cnt);
        if (!a) return JR_ERR;
        size_t k = 0;
        if (dir != 0)
            for (double i = start; dir * i < dir * stop; i += step) a->v[k++] = obj->u.a->v[(size_t)i];
        *out = v_arr(a);
        return JR_OK;
    }
    sb s = {0};
    if (!td_jinja_sb_add(r, &s, "", 0)) return JR_ERR;
    if (dir != 0)
        for (double i = start; dir * i < dir * stop; i += step) {
            size_t ci = (size_t)i;
            if (!td_jinja_sb_add(r, &s, obj->u.s + cpoff[ci], cpoff[ci + 1] - cpoff[ci])) return JR_ERR;
        }
    *out = sb_val(&s);
    return JR_OK;
}

static int eval_member(rctx *r, const node *x, env *e, val *out) {
    val obj, prop;
    int st = eval(r, x->a, e, &obj);
    if (st) return st;
    if (x->op) {
        if (x->b->kind == JN_SLICE) return eval_slice(r, x->b, &obj, e, out);
        if ((st = eval(r, x->b, e, &prop))) return st;
    } else if (x->b->kind == JN_INT) {
        prop = v_int(x->b->num);
    } else {
        prop = v_str(x->b->s, x->b->slen);
    }
    if (is_container(&obj)) {
        if (prop.t != JV_STR)
            return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot access property with non-string: got %s",
                                 td_jinja_type_name(&prop));
        val *v = td_jinja_map_get(obj.u.o, prop.u.s, prop.len);
        if (v) *out = *v;
        else if (obj.t == JV_OBJECT) return td_jinja_builtin_attr(r, &obj, prop.u.s, prop.len, out);
        else *out = v_undef();
        return JR_OK;
    }
    if (obj.t == JV_ARRAY || obj.t == JV_STR) {
        if (prop.t == JV_INT) return index_at(r, &obj, prop.u.n, out);
        if (prop.t == JV_STR) return td_jinja_builtin_attr(r, &obj, prop.u.s, prop.len, out);
        return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot access property with non-string/non-number: got %s",
                             td_jinja_type_name(&prop));
    }
    if (prop.t != JV_STR)
        return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot access property with non-string: got %s",
                             td_jinja_type_name(&prop));
    *out = v_undef();
    return JR_OK;
}

// compareRuntimeValues
static int compare_values(rctx *r, const node *at, const val *a, const val *b, int case_sensitive, int *res) {
    if (a->t == JV_NULL && b->t == JV_NULL) return *res = 0, JR_OK;
    if (a->t == JV_NULL || b->t == JV_NULL || a->t == JV_UNDEF || b->t == JV_UNDEF) {
        if (a->t == JV_UNDEF && b->t == JV_UNDEF) return *res = 0, JR_OK;
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "Cannot compare %s with %s", td_jinja_type_name(a), td_jinja_type_name(b));
    }
    int an = is_num(a) || a->t == JV_BOOL, bn = is_num(b) || b->t == JV_BOOL;
    if (an && bn) {
        double x = a->t == JV_BOOL ? a->u.b : a->u.n, y = b->t == JV_BOOL ? b->u.b : b->u.n;
        *res = x < y ? -1 : x > y ? 1 : 0;
        return JR_OK;
    }
    if (a->t != b->t || strcmp(td_jinja_type_name(a), td_jinja_type_name(b)) != 0)
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "Cannot compare different types: %s and %s", td_jinja_type_name(a),
                             td_jinja_type_name(b));
    if (a->t != JV_STR) return td_jinja_rerr(r, at, TD_ERR_INVALID, "Cannot compare type: %s", td_jinja_type_name(a));
    if (case_sensitive) {
        *res = td_jinja_utf16_cmp(a->u.s, a->len, b->u.s, b->len);
        return JR_OK;
    }
    size_t la, lb;
    char *x = td_jinja_case_map(a->u.s, a->len, 0, &la), *y = td_jinja_case_map(b->u.s, b->len, 0, &lb);
    if (!x || !y) {
        free(x);
        free(y);
        return td_jinja_rerr(r, at, TD_ERR_NOMEM, "out of memory");
    }
    *res = td_jinja_utf16_cmp(x, la, y, lb);
    free(x);
    free(y);
    return JR_OK;
}

// stable merge sort whose comparator may fail
int td_jinja_sort_values(rctx *r, const node *at, sort_ent *v, size_t n, int case_sensitive, int reverse) {
    if (n < 2) return JR_OK;
    sort_ent *tmp = td_jinja_ralloc(r, n * sizeof(sort_ent));
    if (!tmp) return JR_ERR;
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) {
                int c = 0;
                if (compare_values(r, at, v[j].key, v[i].key, case_sensitive, &c)) return JR_ERR;
                if (reverse) c = -c;
                tmp[k++] = c < 0 ? v[j++] : v[i++];
            }
            while (i < mid) tmp[k++] = v[i++];
            while (j < hi) tmp[k++] = v[j++];
        }
        memcpy(v, tmp, n * sizeof(sort_ent));
        td_jinja_scan_work += n * 16;
        if (td_jinja_step(r, at)) return JR_ERR;
    }
    return JR_OK;
}

int td_jinja_items_of(rctx *r, const td_jinja_map *m, val *out) {
    td_jinja_arr *a = td_jinja_arr_new(r, m->n);
    if (!a) return JR_ERR;
    for (size_t i = 0; i < m->n; i++) {
        td_jinja_arr *p = td_jinja_arr_new(r, 2);
        if (!p) return JR_ERR;
        p->v[0] = v_str(m->k[i], m->klen[i]);
        p->v[1] = m->v[i];
        a->v[i] = v_arr(p);
    }
    *out = v_arr(a);
    return JR_OK;
}

static int keys_of(rctx *r, const td_jinja_map *m, val *out) {
    td_jinja_arr *a = td_jinja_arr_new(r, m->n);
    if (!a) return JR_ERR;
    for (size_t i = 0; i < m->n; i++) a->v[i] = v_str(m->k[i], m->klen[i]);
    *out = v_arr(a);
    return JR_OK;
}

static int str_new(rctx *r, const char *s, size_t n, val *out) {
    char *p = td_jinja_strdup(&r->ar, s, n);
    if (!p) return oom(r);
    *out = v_str(p, n);
    return JR_OK;
}

int td_jinja_case_mapped(rctx *r, const val *s, int upper, val *out) {
    size_t l;
    char *m = td_jinja_case_map(s->u.s, s->len, upper, &l);
    if (!m) return td_jinja_rerr(r, NULL, TD_ERR_NOMEM, "out of memory");
    int st = str_new(r, m, l, out);
    free(m);
    return st;
}

static int is_word_byte(unsigned char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

int td_jinja_str_title(rctx *r, const val *s, val *out) {  // /\b\w/g -> upper (ASCII word characters)
    char *p = td_jinja_strdup(&r->ar, s->u.s, s->len);
    if (!p) return oom(r);
    for (size_t i = 0; i < s->len; i++)
        if (is_word_byte((unsigned char)p[i]) && (i == 0 || !is_word_byte((unsigned char)p[i - 1])) && p[i] >= 'a' && p[i] <= 'z')
            p[i] = (char)(p[i] - 32);
    *out = v_str(p, s->len);
    return JR_OK;
}

int td_jinja_str_capitalize(rctx *r, const val *s, val *out) {  // charAt(0).toUpperCase() + rest
    if (s->len == 0) return *out = *s, JR_OK;
    size_t adv;
    uint32_t cp = td_jinja_utf8_decode(s->u.s, s->len, &adv);
    if (cp >= 0x10000 || (adv == 1 && cp >= 0x80)) return *out = *s, JR_OK;
    val first = v_str(s->u.s, adv), up;
    if (td_jinja_case_mapped(r, &first, 1, &up)) return JR_ERR;
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, up.u.s, up.len) || !td_jinja_sb_add(r, &b, s->u.s + adv, s->len - adv)) return JR_ERR;
    *out = sb_val(&b);
    return JR_OK;
}

int td_jinja_str_trim(rctx *r, const val *s, int left, int right, val *out) {
    size_t a, b;
    td_jinja_trim(s->u.s, s->len, left, right, &a, &b);
    *out = v_str(s->u.s + a, b - a);
    return JR_OK;
}

static const char *memmem_(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    td_jinja_scan_work += hn;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static int arr_push(rctx *r, td_jinja_arr *a, size_t *cap, val v) {
    if (a->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 8;
        val *nv = td_jinja_ralloc(r, nc * sizeof(val));
        if (!nv) return 0;
        if (a->n) memcpy(nv, a->v, a->n * sizeof(val));
        a->v = nv;
        *cap = nc;
    }
    a->v[a->n++] = v;
    return 1;
}

static int str_split(rctx *r, const node *at, const val *s, val *args, size_t nargs, val *out) {
    val sep = nargs > 0 ? args[0] : v_null();
    if (sep.t != JV_STR && sep.t != JV_NULL) return td_jinja_rerr(r, at, TD_ERR_INVALID, "sep argument must be a string or null");
    val maxv = nargs > 1 ? args[1] : v_int(-1);
    if (maxv.t != JV_INT) return td_jinja_rerr(r, at, TD_ERR_INVALID, "maxsplit argument must be a number");
    double maxsplit = maxv.u.n;
    td_jinja_arr *a = td_jinja_arr_new(r, 0);
    size_t cap = 0;
    if (!a) return JR_ERR;
    if (sep.t == JV_NULL) {
        size_t st0, en;
        td_jinja_trim(s->u.s, s->len, 1, 0, &st0, &en);
        const char *t = s->u.s + st0;
        size_t n = s->len - st0, i = 0, w;
        while (i < n) {
            while (i < n && (w = td_jinja_ws_len(t + i, n - i)) > 0) i += w;
            if (i >= n) break;
            size_t j = i;
            while (j < n && td_jinja_ws_len(t + j, n - j) == 0) j++;
            if (maxsplit != -1 && (double)a->n >= maxsplit) {
                if (!arr_push(r, a, &cap, v_str(t + i, n - i))) return JR_ERR;
                break;
            }
            if (!arr_push(r, a, &cap, v_str(t + i, j - i))) return JR_ERR;
            i = j;
        }
    } else {
        if (sep.len == 0) return td_jinja_rerr(r, at, TD_ERR_INVALID, "empty separator");
        const char *p = s->u.s, *end = s->u.s + s->len;
        for (;;) {
            const char *q = memmem_(p, (size_t)(end - p), sep.u.s, sep.len);
            if (!q) {
                if (!arr_push(r, a, &cap, v_str(p, (size_t)(end - p)))) return JR_ERR;
                break;
            }
            if (!arr_push(r, a, &cap, v_str(p, (size_t)(q - p)))) return JR_ERR;
            p = q + sep.len;
        }
        if (maxsplit != -1 && (double)a->n > maxsplit) {  // result.push(result.splice(maxsplit).join(sep))
            double k = maxsplit < 0 ? fmax((double)a->n + maxsplit, 0) : maxsplit;
            size_t ki = (size_t)k;
            sb j = {0};
            if (!td_jinja_sb_add(r, &j, "", 0)) return JR_ERR;
            for (size_t i = ki; i < a->n; i++) {
                if (i > ki && !td_jinja_sb_add(r, &j, sep.u.s, sep.len)) return JR_ERR;
                if (!td_jinja_sb_add(r, &j, a->v[i].u.s, a->v[i].len)) return JR_ERR;
            }
            a->n = ki;
            if (!arr_push(r, a, &cap, sb_val(&j))) return JR_ERR;
        }
    }
    *out = v_arr(a);
    return JR_OK;
}

int td_jinja_str_replace(rctx *r, const node *at, const val *s, val *args, size_t nargs, val *out) {
    if (nargs < 2) return td_jinja_rerr(r, at, TD_ERR_INVALID, "replace() requires at least two arguments");
    val o = args[0], nw = args[1];
    if (o.t != JV_STR || nw.t != JV_STR) return td_jinja_rerr(r, at, TD_ERR_INVALID, "replace() arguments must be strings");
    val count = v_null();
    if (nargs > 2) {
        if (args[2].t == JV_OBJECT && args[2].flag) {
            val *c = kwarg(args[2].u.o, "count");
            count = c ? *c : v_null();
        } else
            count = args[2];
    }
    if (count.t != JV_INT && count.t != JV_NULL)
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "replace() count argument must be a number or null");
    if (count.t == JV_INT && count.u.n == 0) return *out = *s, JR_OK;
    double remaining = (count.t == JV_NULL || count.u.n < 0) ? INFINITY : count.u.n;
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, "", 0)) return JR_ERR;
    const char *p = s->u.s, *end = s->u.s + s->len;
    if (o.len == 0) {  // (?=) with /u: matches before every code point and at the end
        size_t adv;
        while (1) {
            if (remaining > 0) {
                if (!td_jinja_sb_add(r, &b, nw.u.s, nw.len)) return JR_ERR;
                remaining--;
            }
            if (p >= end) break;
            td_jinja_utf8_decode(p, (size_t)(end - p), &adv);
            if (!td_jinja_sb_add(r, &b, p, adv)) return JR_ERR;
            p += adv;
        }
    } else {
        while (p < end) {
            const char *q = remaining > 0 ? memmem_(p, (size_t)(end - p), o.u.s, o.len) : NULL;
            if (!q) break;
            if (!td_jinja_sb_add(r, &b, p, (size_t)(q - p)) || !td_jinja_sb_add(r, &b, nw.u.s, nw.len)) return JR_ERR;
            remaining--;
            p = q + o.len;
        }
        if (!td_jinja_sb_add(r, &b, p, (size_t)(end - p))) return JR_ERR;
    }
    *out = sb_val(&b);
    return JR_OK;
}

static int starts_ends(rctx *r, const node *at, const val *s, val *args, size_t nargs, int ends, val *out) {
    if (nargs == 0)
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "%s() requires at least one argument",
                             ends ? "endswith" : "startswith");
    const val *pat = &args[0];
    size_t np = 1;
    const val *pats = pat;
    if (pat->t == JV_ARRAY) pats = pat->u.a->v, np = pat->u.a->n;
    else if (pat->t != JV_STR)
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "%s() argument must be a string or tuple of strings",
                             ends ? "endswith" : "startswith");
    for (size_t i = 0; i < np; i++) {
        const val *p = &pats[i];
        if (p->t != JV_STR)
            return td_jinja_rerr(r, at, TD_ERR_INVALID, "%s() tuple elements must be strings",
                                 ends ? "endswith" : "startswith");
        if (p->len <= s->len && memcmp(ends ? s->u.s + s->len - p->len : s->u.s, p->u.s, p->len) == 0)
            return *out = v_bool(1), JR_OK;
    }
    *out = v_bool(0);
    return JR_OK;
}

// macro / caller(): bindMacroArguments + evaluate the body
static int call_macro(rctx *r, const node *at, const node *def, node *const *params, size_t np, node *const *body,
                      size_t nb, val *args, size_t nargs, env *scope, val *out) {
    size_t npos = nargs;
    td_jinja_map *kw = map_new(r);
    if (!kw) return JR_ERR;
    if (npos && args[npos - 1].t == JV_OBJECT && args[npos - 1].flag) {
        const td_jinja_map *src = args[--npos].u.o;
        for (size_t i = 0; i < src->n; i++)
            if (!map_set(r, kw, src->k[i], src->klen[i], src->v[i])) return JR_ERR;
    }
    const node **pending = td_jinja_ralloc(r, (np + 1) * sizeof(node *));
    if (!pending) return JR_ERR;
    size_t npend = 0;
    for (size_t i = 0; i < np; i++) {
        const node *p = params[i];
        val v = v_undef();
        int have = 0;
        if (i < npos) v = args[i], have = 1;
        if (!have) {
            val *k = td_jinja_map_get(kw, p->s, p->slen);
            if (k) {
                v = *k;
                have = 1;
                map_del(kw, p->s, p->slen);
            }
        }
        if (!have && p->kind == JN_KWARG) pending[npend++] = p;
        if (!env_set(r, scope, p->s, p->slen, v)) return JR_ERR;
    }
    if (def->uses_kwargs) {
        if (!env_set(r, scope, "kwargs", 6, (val){.t = JV_OBJECT, .u.o = kw})) return JR_ERR;
    } else if (kw->n)
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "macro takes no keyword argument '%.*s'", (int)kw->klen[0], kw->k[0]);
    if (def->uses_varargs) {
        size_t extra = npos > np ? npos - np : 0;
        td_jinja_arr *a = td_jinja_arr_new(r, extra);
        if (!a) return JR_ERR;
        for (size_t i = 0; i < extra; i++) a->v[i] = args[np + i];
        if (!env_set(r, scope, "varargs", 7, v_arr(a))) return JR_ERR;
    } else if (npos > np)
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "macro takes not more than %zu argument(s)", np);
    for (size_t i = 0; i < npend; i++) {
        val v;
        int st = eval(r, pending[i]->a, scope, &v);
        if (st) return st;
        if (!env_set(r, scope, pending[i]->s, pending[i]->slen, v)) return JR_ERR;
    }
    return render_to_string(r, body, nb, scope, out);
}

static int fn_range(rctx *r, const node *at, val *args, size_t nargs, val *out) {
    double a[3];
    size_t n = 0;
    for (size_t i = 0; i < nargs && i < 3; i++) {
        if (!is_num(&args[i])) return td_jinja_rerr(r, at, TD_ERR_INVALID, "range() arguments must be numbers");
        a[n++] = args[i].u.n;
    }
    if (n == 0) return td_jinja_rerr(r, at, TD_ERR_INVALID, "range() needs an argument");
    double start = 0, stop, stp = 1;
    if (n == 1) stop = a[0];
    else start = a[0], stop = a[1];
    if (n == 3) stp = a[2];
    if (stp == 0) return td_jinja_rerr(r, at, TD_ERR_INVALID, "range() step must not be zero");
    double cnt = 0;
    if (!isnan(start) && !isnan(stop) && !isnan(stp)) {
        cnt = stp > 0 ? ceil((stop - start) / stp) : ceil((stop - start) / stp);
        if (cnt < 0) cnt = 0;
    }
    if (!(cnt <= MAX_RANGE)) return td_jinja_rerr(r, at, TD_ERR_LIMIT, "range() of more than %u elements", MAX_RANGE);
    td_jinja_arr *arr = td_jinja_arr_new(r, 0);
    size_t cap = 0;
    if (!arr) return JR_ERR;
    if (stp > 0) {
        for (double i = start; i < stop; i += stp)
            if (!arr_push(r, arr, &cap, v_num(i))) return JR_ERR;
    } else {
        for (double i = start; i > stop; i += stp)
            if (!arr_push(r, arr, &cap, v_num(i))) return JR_ERR;
    }
    *out = v_arr(arr);
    return JR_OK;
}

static int fn_namespace(rctx *r, const node *at, val *args, size_t nargs, val *out) {
    const td_jinja_map *kw = NULL;
    if (nargs && args[nargs - 1].t == JV_OBJECT && args[nargs - 1].flag) kw = args[--nargs].u.o;
    if (nargs > 1) return td_jinja_rerr(r, at, TD_ERR_INVALID, "namespace expected at most 1 argument, got %zu", nargs);
    td_jinja_map *m = map_new(r);
    if (!m) return JR_ERR;
    if (nargs == 1) {
        const val *src = &args[0];
        if (src->t == JV_OBJECT) {
            for (size_t i = 0; i < src->u.o->n; i++)
                if (!map_set(r, m, src->u.o->k[i], src->u.o->klen[i], src->u.o->v[i])) return JR_ERR;
        } else if (src->t == JV_ARRAY) {
            for (size_t i = 0; i < src->u.a->n; i++) {
                const val *p = &src->u.a->v[i];
                if (p->t != JV_ARRAY || p->u.a->n != 2)
                    return td_jinja_rerr(r, at, TD_ERR_INVALID,
                                         "namespace expected an object or an iterable of [key, value] pairs");
                if (p->u.a->v[0].t != JV_STR) return td_jinja_rerr(r, at, TD_ERR_INVALID, "namespace keys must be strings");
                if (!map_set(r, m, p->u.a->v[0].u.s, p->u.a->v[0].len, p->u.a->v[1])) return JR_ERR;
            }
        } else
            return td_jinja_rerr(r, at, TD_ERR_INVALID, "'%s' object is not iterable", td_jinja_type_name(src));
    }
    if (kw)
        for (size_t i = 0; i < kw->n; i++)
            if (!map_set(r, m, kw->k[i], kw->klen[i], kw->v[i])) return JR_ERR;
    *out = (val){.t = JV_NS, .u.o = m};
    return JR_OK;
}

static int fn_strftime(rctx *r, const node *at, val *args, size_t nargs, val *out) {
    static const char *mon_long[] = {"January", "February", "March", "April", "May", "June", "July",
                                     "August", "September", "October", "November", "December"};
    if (nargs < 1 || args[0].t != JV_STR) return td_jinja_rerr(r, at, TD_ERR_INVALID, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tmv;
    localtime_r(&now, &tmv);
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, "", 0)) return JR_ERR;
    const char *f = args[0].u.s;
    size_t n = args[0].len;
    char buf[32];
    for (size_t i = 0; i < n; i++) {
        if (f[i] == '%' && i + 1 < n && strchr("YmdbBHM%", f[i + 1])) {
            char c = f[++i];
            switch (c) {
            case 'Y': snprintf(buf, sizeof buf, "%d", tmv.tm_year + 1900); break;
            case 'm': snprintf(buf, sizeof buf, "%02d", tmv.tm_mon + 1); break;
            case 'd': snprintf(buf, sizeof buf, "%02d", tmv.tm_mday); break;
            case 'b': snprintf(buf, sizeof buf, "%.3s", mon_long[tmv.tm_mon]); break;
            case 'B': snprintf(buf, sizeof buf, "%s", mon_long[tmv.tm_mon]); break;
            case 'H': snprintf(buf, sizeof buf, "%02d", tmv.tm_hour); break;
            case 'M': snprintf(buf, sizeof buf, "%02d", tmv.tm_min); break;
            default: snprintf(buf, sizeof buf, "%%"); break;
            }
            if (!sb_addz(r, &b, buf)) return JR_ERR;
        } else if (!td_jinja_sb_add(r, &b, f + i, 1))
            return JR_ERR;
    }
    *out = sb_val(&b);
    return JR_OK;
}

static int dictsort(rctx *r, const node *at, const val *self, val *args, size_t nargs, val *out) {
    const td_jinja_map *kw = NULL;
    size_t np = 0;
    val pos[3];
    for (size_t i = 0; i < nargs; i++) {
        if (args[i].t == JV_OBJECT && args[i].flag) kw = args[i].u.o;
        else if (np < 3) pos[np++] = args[i];
    }
    val *k;
    val cs = np > 0 ? pos[0] : (kw && (k = kwarg((td_jinja_map *)kw, "case_sensitive"))) ? *k : v_bool(0);
    if (cs.t != JV_BOOL) return td_jinja_rerr(r, at, TD_ERR_INVALID, "case_sensitive must be a boolean");
    val by = np > 1 ? pos[1] : (kw && (k = kwarg((td_jinja_map *)kw, "by"))) ? *k : v_str("key", 3);
    if (by.t != JV_STR) return td_jinja_rerr(r, at, TD_ERR_INVALID, "by must be a string");
    int by_value = name_is(by.u.s, by.len, "value");
    if (!by_value && !name_is(by.u.s, by.len, "key"))
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "by must be either 'key' or 'value'");
    val rev = np > 2 ? pos[2] : (kw && (k = kwarg((td_jinja_map *)kw, "reverse"))) ? *k : v_bool(0);
    if (rev.t != JV_BOOL) return td_jinja_rerr(r, at, TD_ERR_INVALID, "reverse must be a boolean");
    val items;
    if (td_jinja_items_of(r, self->u.o, &items)) return JR_ERR;
    size_t n = items.u.a->n;
    sort_ent *ents = td_jinja_ralloc(r, (n + 1) * sizeof(sort_ent));
    if (!ents) return JR_ERR;
    for (size_t i = 0; i < n; i++) ents[i].item = items.u.a->v[i], ents[i].key = &items.u.a->v[i].u.a->v[by_value];
    if (td_jinja_sort_values(r, at, ents, n, cs.u.b, rev.u.b)) return JR_ERR;
    for (size_t i = 0; i < n; i++) items.u.a->v[i] = ents[i].item;
    *out = items;
    return JR_OK;
}

int td_jinja_call_fn(rctx *r, const node *at, const val *fn, val *args, size_t nargs, env *e, val *out) {
    const td_jinja_fn *f = fn->u.f;
    const val *self = &f->self;
    switch (f->kind) {
    case F_RAISE: {
        sb b = {0};
        if (nargs > 0 && args[0].t == JV_STR) b = (sb){(char *)args[0].u.s, args[0].len};
        else if (nargs > 0 && !td_jinja_raw_string(r, &args[0], &b, 1)) return JR_ERR;
        td_jinja_rerr(r, NULL, TD_ERR_INVALID, "x");
        td_err_set(r->err, TD_ERR_INVALID, "raise_exception: %.*s", (int)(b.n > 400 ? 400 : b.n), b.s ? b.s : "");
        return JR_ERR;
    }
    case F_RANGE: return fn_range(r, at, args, nargs, out);
    case F_NAMESPACE: return fn_namespace(r, at, args, nargs, out);
    case F_STRFTIME: return fn_strftime(r, at, args, nargs, out);
    case F_S_UPPER: return td_jinja_case_mapped(r, self, 1, out);
    case F_S_LOWER: return td_jinja_case_mapped(r, self, 0, out);
    case F_S_STRIP: return td_jinja_str_trim(r, self, 1, 1, out);
    case F_S_LSTRIP: return td_jinja_str_trim(r, self, 1, 0, out);
    case F_S_RSTRIP: return td_jinja_str_trim(r, self, 0, 1, out);
    case F_S_TITLE: return td_jinja_str_title(r, self, out);
    case F_S_CAPITALIZE: return td_jinja_str_capitalize(r, self, out);
    case F_S_STARTSWITH: return starts_ends(r, at, self, args, nargs, 0, out);
    case F_S_ENDSWITH: return starts_ends(r, at, self, args, nargs, 1, out);
    case F_S_SPLIT: return str_split(r, at, self, args, nargs, out);
    case F_S_REPLACE: return td_jinja_str_replace(r, at, self, args, nargs, out);
    case F_O_GET: {
        if (nargs < 1 || args[0].t != JV_STR)
            return td_jinja_rerr(r, at, TD_ERR_INVALID, "Object key must be a string: got %s",
                                 nargs ? td_jinja_type_name(&args[0]) : "UndefinedValue");
        val *v = td_jinja_map_get(self->u.o, args[0].u.s, args[0].len);
        *out = v ? *v : nargs > 1 ? args[1] : v_null();
        return JR_OK;
    }
    case F_O_ITEMS: return td_jinja_items_of(r, self->u.o, out);
    case F_O_KEYS: return keys_of(r, self->u.o, out);
    case F_O_VALUES: {
        td_jinja_arr *a = td_jinja_arr_new(r, self->u.o->n);
        if (!a) return JR_ERR;
        for (size_t i = 0; i < self->u.o->n; i++) a->v[i] = self->u.o->v[i];
        *out = v_arr(a);
        return JR_OK;
    }
    case F_O_DICTSORT: return dictsort(r, at, self, args, nargs, out);
    case F_MACRO: {
        if (r->depth > r->lim.max_depth) return td_jinja_rerr(r, at, TD_ERR_LIMIT, "macro recursion too deep");
        env *scope = env_new(r, e);
        if (!scope) return JR_ERR;
        return call_macro(r, at, f->def, f->def->list, f->def->n, f->def->list2, f->def->n2, args, nargs, scope, out);
    }
    case F_CALLER: {
        env *scope = env_new(r, f->defenv);
        if (!scope) return JR_ERR;
        return call_macro(r, at, f->def, f->def->list, f->def->n, f->def->list2, f->def->n2, args, nargs, scope, out);
    }
    }
    return td_jinja_rerr(r, at, TD_ERR_INVALID, "unknown function");
}

static int eval_call(rctx *r, const node *x, env *e, val *out) {
    val *args;
    size_t nargs;
    int st = td_jinja_eval_args(r, x->list, x->n, e, 0, &args, &nargs, NULL);
    if (st) return st;
    val fn;
    if ((st = eval(r, x->a, e, &fn))) return st;
    if (fn.t != JV_FUNC)
        return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot call something that is not a function: got %s",
                             td_jinja_type_name(&fn));
    return td_jinja_call_fn(r, x, &fn, args, nargs, e, out);
}

// getAttributeValue: dotted path through objects / namespaces / arrays
static int eval_binary(rctx *r, const node *x, env *e, val *out) {
    val L, R;
    int st = eval(r, x->a, e, &L);
    if (st) return st;
    int op = x->op;
    if (op == JOP_AND) return td_jinja_truthy(&L) ? eval(r, x->b, e, out) : (*out = L, JR_OK);
    if (op == JOP_OR) return td_jinja_truthy(&L) ? (*out = L, JR_OK) : eval(r, x->b, e, out);
    if ((st = eval(r, x->b, e, &R))) return st;
    if (op == JOP_EQ || op == JOP_NE) {
        int eq;
        if (!loose_eq(r, &L, &R, &eq)) return JR_ERR;
        *out = v_bool(op == JOP_EQ ? eq : !eq);
        return JR_OK;
    }
    if (L.t == JV_UNDEF || R.t == JV_UNDEF) {
        if (R.t == JV_UNDEF && (op == JOP_IN || op == JOP_NOTIN)) return *out = v_bool(op == JOP_NOTIN), JR_OK;
        return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot perform operation on undefined values");
    }
    if (L.t == JV_NULL || R.t == JV_NULL) return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot perform operation on null values");
    if (op == JOP_CONCAT) {
        sb b = {0};
        if (!td_jinja_sb_add(r, &b, "", 0) || !td_jinja_raw_string(r, &L, &b, 0) || !td_jinja_raw_string(r, &R, &b, 0))
            return JR_ERR;
        *out = sb_val(&b);
        return JR_OK;
    }
    int ln = is_num(&L) || L.t == JV_BOOL, rn = is_num(&R) || R.t == JV_BOOL;
    if (op == JOP_POW && ln && rn) {
        double a = L.t == JV_BOOL ? L.u.b : L.u.n, b = R.t == JV_BOOL ? R.u.b : R.u.n;
        if (a == 0 && b < 0) return td_jinja_rerr(r, x, TD_ERR_INVALID, "0.0 cannot be raised to a negative power");
        double res = pow(a, b);
        if (isnan(b)) res = NAN;  // JS: 1 ** NaN is NaN (C's pow says 1)
        if (!isfinite(res)) return td_jinja_rerr(r, x, TD_ERR_INVALID, "Exponentiation result is not a finite real number");
        *out = (L.t == JV_FLOAT || R.t == JV_FLOAT || b < 0) ? v_float(res) : v_int(res);
        return JR_OK;
    }
    if (is_num(&L) && is_num(&R)) {
        double a = L.u.n, b = R.u.n, res;
        int fl = L.t == JV_FLOAT || R.t == JV_FLOAT;
        switch (op) {
        case JOP_ADD: res = a + b; break;
        case JOP_SUB: res = a - b; break;
        case JOP_MUL: res = a * b; break;
        case JOP_DIV: return *out = v_float(a / b), JR_OK;
        case JOP_FLOORDIV: res = floor(a / b); break;
        case JOP_MOD: res = fmod(a, b); break;
        case JOP_LT: return *out = v_bool(a < b), JR_OK;
        case JOP_GT: return *out = v_bool(a > b), JR_OK;
        case JOP_GE: return *out = v_bool(a >= b), JR_OK;
        case JOP_LE: return *out = v_bool(a <= b), JR_OK;
        default: goto fallthrough;
        }
        *out = fl ? v_float(res) : v_int(res);
        return JR_OK;
    } else if (L.t == JV_ARRAY && R.t == JV_ARRAY) {
        if (op == JOP_ADD) {
            td_jinja_arr *c = td_jinja_arr_new(r, L.u.a->n + R.u.a->n);
            if (!c) return JR_ERR;
            if (L.u.a->n) memcpy(c->v, L.u.a->v, L.u.a->n * sizeof(val));
            if (R.u.a->n) memcpy(c->v + L.u.a->n, R.u.a->v, R.u.a->n * sizeof(val));
            *out = v_arr(c);
            return JR_OK;
        }
    } else if (R.t == JV_ARRAY) {
        if (op == JOP_IN || op == JOP_NOTIN) {
            int found = 0;
            td_jinja_scan_work += R.u.a->n;
            for (size_t i = 0; i < R.u.a->n && !found; i++) found = td_jinja_strict_eq(&R.u.a->v[i], &L);
            *out = v_bool(op == JOP_IN ? found : !found);
            return JR_OK;
        }
    }
fallthrough:
    if ((L.t == JV_STR || R.t == JV_STR) && op == JOP_ADD) {
        sb b = {0};
        if (!td_jinja_sb_add(r, &b, "", 0) || !td_jinja_raw_string(r, &L, &b, 0) || !td_jinja_raw_string(r, &R, &b, 0))
            return JR_ERR;
        *out = sb_val(&b);
        return JR_OK;
    }
    if (L.t == JV_STR && R.t == JV_STR && (op == JOP_IN || op == JOP_NOTIN)) {
        int found = memmem_(R.u.s, R.len, L.u.s, L.len) != NULL;
        *out = v_bool(op == JOP_IN ? found : !found);
        return JR_OK;
    }
    if (L.t == JV_STR && R.t == JV_OBJECT && (op == JOP_IN || op == JOP_NOTIN)) {
        int found = td_jinja_map_get(R.u.o, L.u.s, L.len) != NULL;
        *out = v_bool(op == JOP_IN ? found : !found);
        return JR_OK;
    }
    static const char *OPS[] = {
        "+", "-", "~", "*", "/", "//", "%", "**", "==", "!=", "<", ">", "<=", ">=", "and", "or", "in", "not in"};
    return td_jinja_rerr(r, x, TD_ERR_INVALID, "Unknown operator \"%s\" between %s and %s", op < 18 ? OPS[op] : "?",
                         td_jinja_type_name(&L), td_jinja_type_name(&R));
}

static int eval(rctx *r, const node *x, env *e, val *out) {
    if (!x) return *out = v_undef(), JR_OK;
    if (td_jinja_step(r, x)) return JR_ERR;
    if (++r->depth > r->lim.max_depth) {
        r->depth--;
        return td_jinja_rerr(r, x, TD_ERR_LIMIT, "evaluation nested more than %d levels", r->lim.max_depth);
    }
    int st = JR_OK;
    switch (x->kind) {
    case JN_INT: *out = v_int(x->num); break;
    case JN_FLOAT: *out = v_float(x->num); break;
    case JN_STR:
    case JN_TEXT: *out = v_str(x->s, x->slen); break;
    case JN_ARRAY:
    case JN_TUPLE: {
        td_jinja_arr *a = td_jinja_arr_new(r, x->n);
        if (!a) {
            st = JR_ERR;
            break;
        }
        for (size_t i = 0; i < x->n && !st; i++) st = eval(r, x->list[i], e, &a->v[i]);
        *out = v_arr(a);
        out->flag = x->kind == JN_TUPLE;
        break;
    }
    case JN_OBJECT: {
        td_jinja_map *m = map_new(r);
        if (!m) {
            st = JR_ERR;
            break;
        }
        for (size_t i = 0; i < x->n && !st; i++) {
            val k, v;
            if ((st = eval(r, x->list[i], e, &k))) break;
            if (k.t != JV_STR) {
                st = td_jinja_rerr(r, x->list[i], TD_ERR_INVALID, "Object keys must be strings: got %s", td_jinja_type_name(&k));
                break;
            }
            if ((st = eval(r, x->list2[i], e, &v))) break;
            if (!map_set(r, m, k.u.s, k.len, v)) st = JR_ERR;
        }
        *out = (val){.t = JV_OBJECT, .u.o = m};
        break;
    }
    case JN_IDENT: *out = env_get(e, x->s, x->slen); break;
    case JN_MEMBER: st = eval_member(r, x, e, out); break;
    case JN_CALL: st = eval_call(r, x, e, out); break;
    case JN_UNARY: {
        val a;
        if ((st = eval(r, x->a, e, &a))) break;
        if (x->op == JOP_NOT) *out = v_bool(!td_jinja_truthy(&a));
        else if (is_num(&a) || a.t == JV_BOOL) {
            double v = a.t == JV_BOOL ? a.u.b : a.u.n;
            if (x->op == JOP_NEG) v = -v;
            *out = a.t == JV_FLOAT ? v_float(v) : v_int(v);
        } else
            st = td_jinja_rerr(r, x, TD_ERR_INVALID, "Unknown operator \"%s\" for %s", x->op == JOP_NEG ? "-" : "+",
                               td_jinja_type_name(&a));
        break;
    }
    case JN_BINARY: st = eval_binary(r, x, e, out); break;
    case JN_FILTER: {
        val a;
        if ((st = eval(r, x->a, e, &a))) break;
        st = td_jinja_apply_filter(r, &a, x->b, e, out);
        break;
    }
    case JN_TEST: {
        val a;
        int res;
        if ((st = eval(r, x->a, e, &a))) break;
        if ((st = td_jinja_run_test(r, x, x->s, x->slen, &a, NULL, &res))) break;
        *out = v_bool(x->op ? !res : res);
        break;
    }
    case JN_SELECT: {
        val c;
        if ((st = eval(r, x->b, e, &c))) break;
        if (!td_jinja_truthy(&c)) *out = v_undef();
        else st = eval(r, x->a, e, out);
        break;
    }
    case JN_TERNARY: {
        val c;
        if ((st = eval(r, x->a, e, &c))) break;
        st = eval(r, td_jinja_truthy(&c) ? x->b : x->c, e, out);
        break;
    }
    default: st = td_jinja_rerr(r, x, TD_ERR_INVALID, "unexpected node in expression"); break;
    }
    r->depth--;
    if (st == JR_OK && r->status != TD_OK) st = JR_ERR;
    return st;
}

// ---------------------------------------------------------------------------------------------
// statements

static int bind_loopvar(rctx *r, const node *lv, const val *cur, env *scope) {
    if (lv->kind == JN_IDENT) return env_set(r, scope, lv->s, lv->slen, *cur) ? JR_OK : JR_ERR;
    if (cur->t != JV_ARRAY || cur->flag)
        return td_jinja_rerr(r, lv, TD_ERR_INVALID, "Cannot unpack non-iterable type: %s", td_jinja_type_name(cur));
    if (lv->n != cur->u.a->n)
        return td_jinja_rerr(r, lv, TD_ERR_INVALID, "Too %s items to unpack", lv->n > cur->u.a->n ? "few" : "many");
    for (size_t j = 0; j < lv->n; j++) {
        if (lv->list[j]->kind != JN_IDENT) return td_jinja_rerr(r, lv, TD_ERR_INVALID, "Cannot unpack non-identifier type");
        if (!env_set(r, scope, lv->list[j]->s, lv->list[j]->slen, cur->u.a->v[j])) return JR_ERR;
    }
    return JR_OK;
}

static int exec_for(rctx *r, const node *x, env *e) {
    env *scope = env_new(r, e);
    if (!scope) return JR_ERR;
    const node *test = NULL;
    val it;
    int st;
    if (x->b->kind == JN_SELECT) {
        st = eval(r, x->b->a, scope, &it);
        test = x->b->b;
    } else
        st = eval(r, x->b, scope, &it);
    if (st) return st;
    if (it.t == JV_OBJECT) {
        if (keys_of(r, it.u.o, &it)) return JR_ERR;
    } else if (it.t != JV_ARRAY)
        return td_jinja_rerr(r, x->b, TD_ERR_INVALID, "Expected iterable or object type in for loop: got %s",
                             td_jinja_type_name(&it));
    td_jinja_arr *items = td_jinja_arr_new(r, it.u.a->n);
    if (!items) return JR_ERR;
    items->n = 0;
    for (size_t i = 0; i < it.u.a->n; i++) {
        const val *cur = &it.u.a->v[i];
        if (x->a->kind == JN_TUPLE) {  // the unpacking checks run while collecting items
            if (cur->t != JV_ARRAY || cur->flag)
                return td_jinja_rerr(r, x->a, TD_ERR_INVALID, "Cannot unpack non-iterable type: %s",
                                     td_jinja_type_name(cur));
            if (x->a->n != cur->u.a->n)
                return td_jinja_rerr(r, x->a, TD_ERR_INVALID, "Too %s items to unpack", x->a->n > cur->u.a->n ? "few" : "many");
        }
        if (test) {
            env *ls = env_new(r, scope);
            if (!ls) return JR_ERR;
            if ((st = bind_loopvar(r, x->a, cur, ls))) return st;
            val tv;
            if ((st = eval(r, test, ls, &tv))) return st;
            if (!td_jinja_truthy(&tv)) continue;
        }
        items->v[items->n++] = *cur;
    }
    int none = 1;
    size_t n = items->n;
    for (size_t i = 0; i < n; i++) {
        if (td_jinja_step(r, x)) return JR_ERR;
        td_jinja_map *loop = map_new(r);
        if (!loop) return JR_ERR;
        int ok = map_set(r, loop, "index", 5, v_int((double)i + 1)) && map_set(r, loop, "index0", 6, v_int((double)i)) &&
                 map_set(r, loop, "revindex", 8, v_int((double)(n - i))) &&
                 map_set(r, loop, "revindex0", 9, v_int((double)(n - i - 1))) && map_set(r, loop, "first", 5, v_bool(i == 0)) &&
                 map_set(r, loop, "last", 4, v_bool(i == n - 1)) && map_set(r, loop, "length", 6, v_int((double)n)) &&
                 map_set(r, loop, "previtem", 8, i > 0 ? items->v[i - 1] : v_undef()) &&
                 map_set(r, loop, "nextitem", 8, i + 1 < n ? items->v[i + 1] : v_undef()) &&
                 env_set(r, scope, "loop", 4, (val){.t = JV_OBJECT, .u.o = loop});
        if (!ok) return JR_ERR;
        if ((st = bind_loopvar(r, x->a, &items->v[i], scope))) return st;
        size_t mark = r->n;
        st = exec_block(r, x->list, x->n, scope);
        if (st == JR_CONTINUE) {  // the iteration's partial output is dropped, as in the original
            r->n = mark;
            continue;
        }
        if (st == JR_BREAK) {
            r->n = mark;
            break;
        }
        if (st) return st;
        none = 0;
    }
    if (none) return exec_block(r, x->list2, x->n2, scope);
    return JR_OK;
}

static int exec_set(rctx *r, const node *x, env *e) {
    val rhs;
    int st = x->b ? eval(r, x->b, e, &rhs) : render_to_string(r, x->list, x->n, e, &rhs);
    if (st) return st;
    const node *lhs = x->a;
    if (lhs->kind == JN_IDENT) return env_set(r, e, lhs->s, lhs->slen, rhs) ? JR_OK : JR_ERR;
    if (lhs->kind == JN_TUPLE) {
        if (rhs.t != JV_ARRAY)
            return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot unpack non-iterable type in set: %s",
                                 td_jinja_type_name(&rhs));
        if (rhs.u.a->n != lhs->n)
            return td_jinja_rerr(r, x, TD_ERR_INVALID, "Too %s items to unpack in set", lhs->n > rhs.u.a->n ? "few" : "many");
        for (size_t i = 0; i < lhs->n; i++) {
            if (lhs->list[i]->kind != JN_IDENT)
                return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot unpack to non-identifier in set");
            if (!env_set(r, e, lhs->list[i]->s, lhs->list[i]->slen, rhs.u.a->v[i])) return JR_ERR;
        }
        return JR_OK;
    }
    if (lhs->kind == JN_MEMBER) {
        val obj;
        if ((st = eval(r, lhs->a, e, &obj))) return st;
        if (obj.t != JV_NS) return td_jinja_rerr(r, x, TD_ERR_INVALID, "cannot assign attribute on non-namespace object");
        if (lhs->b->kind != JN_IDENT)
            return td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot assign to member with non-identifier property");
        return map_set(r, obj.u.o, lhs->b->s, lhs->b->slen, rhs) ? JR_OK : JR_ERR;
    }
    return td_jinja_rerr(r, x, TD_ERR_INVALID, "Invalid LHS inside assignment expression");
}

static int exec_stmt(rctx *r, const node *x, env *e) {
    if (td_jinja_step(r, x)) return JR_ERR;
    if (++r->depth > r->lim.max_depth) {
        r->depth--;
        return td_jinja_rerr(r, x, TD_ERR_LIMIT, "evaluation nested more than %d levels", r->lim.max_depth);
    }
    int st = JR_OK;
    switch (x->kind) {
    case JN_TEXT: st = emit(r, x->s, x->slen); break;
    case JN_COMMENT: break;
    case JN_BREAK: st = JR_BREAK; break;
    case JN_CONTINUE: st = JR_CONTINUE; break;
    case JN_IF: {
        val c;
        if ((st = eval(r, x->a, e, &c))) break;
        st = td_jinja_truthy(&c) ? exec_block(r, x->list, x->n, e) : exec_block(r, x->list2, x->n2, e);
        break;
    }
    case JN_FOR: st = exec_for(r, x, e); break;
    case JN_SET: st = exec_set(r, x, e); break;
    case JN_MACRO: {
        td_jinja_fn *f = td_jinja_ralloc(r, sizeof *f);
        if (!f) {
            st = JR_ERR;
            break;
        }
        memset(f, 0, sizeof *f);
        f->kind = F_MACRO;
        f->def = x;
        if (!env_set(r, e, x->s, x->slen, (val){.t = JV_FUNC, .u.f = f})) st = JR_ERR;
        break;
    }
    case JN_CALLSTMT: {
        td_jinja_fn *cf = td_jinja_ralloc(r, sizeof *cf);
        if (!cf) {
            st = JR_ERR;
            break;
        }
        memset(cf, 0, sizeof *cf);
        cf->kind = F_CALLER;
        cf->def = x;
        cf->defenv = e;
        val *args, fn, res;
        size_t nargs;
        if ((st = td_jinja_eval_args(r, x->a->list, x->a->n, e, 1, &args, &nargs, NULL))) break;
        if ((st = eval(r, x->a->a, e, &fn))) break;
        if (fn.t != JV_FUNC) {
            st = td_jinja_rerr(r, x, TD_ERR_INVALID, "Cannot call something that is not a function: got %s",
                               td_jinja_type_name(&fn));
            break;
        }
        env *ne = env_new(r, e);
        if (!ne || !env_set(r, ne, "caller", 6, (val){.t = JV_FUNC, .u.f = cf})) {
            st = JR_ERR;
            break;
        }
        if ((st = td_jinja_call_fn(r, x, &fn, args, nargs, ne, &res))) break;
        st = emit_value(r, &res);
        break;
    }
    case JN_FILTERSTMT: {
        val body, res;
        if ((st = render_to_string(r, x->list, x->n, e, &body))) break;
        if ((st = td_jinja_apply_filter(r, &body, x->a, e, &res))) break;
        st = emit_value(r, &res);
        break;
    }
    default: {
        val v;
        if ((st = eval(r, x, e, &v))) break;
        st = emit_value(r, &v);
        break;
    }
    }
    r->depth--;
    if (st == JR_OK && r->status != TD_OK) st = JR_ERR;
    return st;
}

static int exec_block(rctx *r, node *const *list, size_t n, env *e) {
    for (size_t i = 0; i < n; i++) {
        int st = exec_stmt(r, list[i], e);
        if (st) return st;
    }
    return JR_OK;
}

// ---------------------------------------------------------------------------------------------
// context: cJSON -> values (object keys in JS property order: array indices first, ascending)

static int is_array_index(const char *k, double *v) {
    size_t n = strlen(k);
    if (n == 0 || n > 10) return 0;
    if (n > 1 && k[0] == '0') return 0;
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9') return 0;
        d = d * 10 + (k[i] - '0');
    }
    if (d >= 4294967295.0) return 0;
    *v = d;
    return 1;
}

static int from_json(rctx *r, const cJSON *j, int depth, val *out) {
    if (depth > 1000) return td_jinja_rerr(r, NULL, TD_ERR_LIMIT, "context nested too deeply");
    if (cJSON_IsString(j)) *out = v_str(j->valuestring ? j->valuestring : "", j->valuestring ? strlen(j->valuestring) : 0);
    else if (cJSON_IsNumber(j)) *out = v_num(j->valuedouble);
    else if (cJSON_IsBool(j)) *out = v_bool(cJSON_IsTrue(j));
    else if (cJSON_IsArray(j)) {
        size_t n = (size_t)cJSON_GetArraySize(j), i = 0;
        td_jinja_arr *a = td_jinja_arr_new(r, n);
        if (!a) return JR_ERR;
        for (const cJSON *c = j->child; c && i < n; c = c->next, i++)
            if (from_json(r, c, depth + 1, &a->v[i])) return JR_ERR;
        *out = v_arr(a);
    } else if (cJSON_IsObject(j)) {
        td_jinja_map *m = map_new(r);
        if (!m) return JR_ERR;
        // pass 1: integer-like keys in ascending order (JS own-property order), pass 2: the rest
        size_t nidx = 0;
        double d;
        for (const cJSON *c = j->child; c; c = c->next)
            if (c->string && is_array_index(c->string, &d)) nidx++;
        if (nidx) {
            const cJSON **ix = td_jinja_ralloc(r, nidx * sizeof(cJSON *));
            if (!ix) return JR_ERR;
            size_t k = 0;
            for (const cJSON *c = j->child; c; c = c->next)
                if (c->string && is_array_index(c->string, &d)) {
                    size_t q = k++;
                    while (q > 0) {
                        double pd;
                        is_array_index(ix[q - 1]->string, &pd);
                        if (pd <= d) break;
                        ix[q] = ix[q - 1];
                        q--;
                    }
                    ix[q] = c;
                }
            for (size_t q = 0; q < nidx; q++) {
                val v;
                if (from_json(r, ix[q], depth + 1, &v)) return JR_ERR;
                if (!map_set(r, m, ix[q]->string, strlen(ix[q]->string), v)) return JR_ERR;
            }
        }
        for (const cJSON *c = j->child; c; c = c->next) {
            if (!c->string || is_array_index(c->string, &d)) continue;
            val v;
            if (from_json(r, c, depth + 1, &v)) return JR_ERR;
            if (!map_set(r, m, c->string, strlen(c->string), v)) return JR_ERR;
        }
        *out = (val){.t = JV_OBJECT, .u.o = m};
    } else
        *out = v_null();
    return JR_OK;
}

// ---------------------------------------------------------------------------------------------
// public: render

td_jinja_limits td_jinja_default_limits(void) {
    return (td_jinja_limits){
        .max_output = 64u << 20,
        .max_memory = 512u << 20,
        .max_steps = 50u * 1000 * 1000,
        .max_depth = 400,
    };
}

td_status td_jinja_render(const td_jinja_template *t, const cJSON *ctx, char **out, size_t *len, td_err *err) {
    td_jinja_limits lim = td_jinja_default_limits();
    return td_jinja_render_limits(t, ctx, &lim, out, len, err);
}

td_status td_jinja_render_limits(const td_jinja_template *t, const cJSON *ctx, const td_jinja_limits *limits,
                                         char **out, size_t *len, td_err *err) {
    if (!out) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL output");
    *out = NULL;
    if (len) *len = 0;
    if (!t) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL template");
    if (ctx && !cJSON_IsObject(ctx)) return td_err_set(err, TD_ERR_INVALID, "chat template: context must be a JSON object");
    rctx r = {0};
    td_jinja_scan_work = 0;
    r.t = t;
    r.lim = limits ? *limits : td_jinja_default_limits();
    if (r.lim.max_depth < 1) r.lim.max_depth = 1;
    r.ar.budget = r.lim.max_memory;
    r.err = err;
    int st = JR_OK;
    env *root = env_new(&r, NULL);
    if (!root) st = JR_ERR;
    static const struct {
        const char *name;
        int kind;  // -1: true, -2: false, -3: none
    } GLOBALS[] = {
        {"namespace", F_NAMESPACE}, {"false", -2}, {"true", -1}, {"none", -3}, {"raise_exception", F_RAISE},
        {"range", F_RANGE}, {"strftime_now", F_STRFTIME}, {"True", -1}, {"False", -2}, {"None", -3},
    };
    for (size_t i = 0; !st && i < sizeof GLOBALS / sizeof GLOBALS[0]; i++) {
        val v;
        if (GLOBALS[i].kind == -1) v = v_bool(1);
        else if (GLOBALS[i].kind == -2) v = v_bool(0);
        else if (GLOBALS[i].kind == -3) v = v_null();
        else v = bound(&r, GLOBALS[i].kind, NULL);
        if (r.status || !env_set(&r, root, GLOBALS[i].name, strlen(GLOBALS[i].name), v)) st = JR_ERR;
    }
    if (!st && ctx) {
        val cv;
        if (from_json(&r, ctx, 0, &cv)) st = JR_ERR;
        for (size_t i = 0; !st && i < cv.u.o->n; i++) {
            for (size_t g = 0; g < sizeof GLOBALS / sizeof GLOBALS[0]; g++)
                if (name_is(cv.u.o->k[i], cv.u.o->klen[i], GLOBALS[g].name)) {
                    st = td_jinja_rerr(&r, NULL, TD_ERR_INVALID, "Variable already declared: %s", GLOBALS[g].name);
                    break;
                }
            if (!st && !env_append(&r, root, cv.u.o->k[i], cv.u.o->klen[i], cv.u.o->v[i])) st = JR_ERR;
        }
    }
    if (!st) st = emit(&r, "", 0);
    if (!st) st = exec_block(&r, t->body, t->n_body, root);
    if (st == JR_BREAK || st == JR_CONTINUE) st = td_jinja_rerr(&r, NULL, TD_ERR_INVALID, "break/continue outside of a loop");
    if (st && r.status == TD_OK) {  // an allocation failed somewhere without a message
        if (r.ar.failed) oom(&r);
        else td_jinja_rerr(&r, NULL, TD_ERR_INVALID, "render failed");
    }
    td_status code = r.status;
    td_jinja_arena_free(&r.ar);
    if (code != TD_OK) {
        free(r.out);
        return code;
    }
    r.out[r.n] = 0;
    *out = r.out;
    if (len) *len = r.n;
    return TD_OK;
}
