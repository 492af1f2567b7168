// Internals of the Jinja interpreter shared by eval.c (values, scopes, JSON, evaluation, statements,
// builtins) and filters.c (filters and tests). Not a public header. The short type names and the
// inline value constructors are for these two files only; functions with linkage carry td_jinja_.
#ifndef TD_JINJA_INTERP_H
#define TD_JINJA_INTERP_H

#include <math.h>
#include <string.h>

#include "jinja/value.h"

typedef td_jinja_node node;
typedef td_jinja_val val;

// What evaluating a node returns: JR_ERR once r->status and the message are set; JR_BREAK /
// JR_CONTINUE travel up from {% break %} / {% continue %} to their loop.
enum { JR_OK = 0, JR_ERR, JR_BREAK, JR_CONTINUE };

// A scope: insertion-ordered variables, looked up through the parents.
typedef struct td_jinja_env {
    struct td_jinja_env *parent;
    const char **k;
    size_t *kl;
    val *v;
    size_t n, cap;
} td_jinja_env;
typedef td_jinja_env env;

// One render: its arena (all render-time memory), the output buffer, the limits and the counters
// that enforce them, and the first error.
typedef struct td_jinja_rctx {
    const td_jinja_template *t;
    td_jinja_arena ar;
    char *out;
    size_t n, cap;
    td_jinja_limits lim;
    size_t steps;
    int depth;
    td_err *err;
    td_status status;
} td_jinja_rctx;
typedef td_jinja_rctx rctx;

// A string under construction in the render arena (td_jinja_sb_add grows it in place).
typedef struct {
    char *s;
    size_t n;
} td_jinja_sb;
typedef td_jinja_sb sb;

// tojson's options (Python json.dumps's, as @huggingface/jinja takes them).
typedef struct {
    int indent;  // spaces; 0 = none
    int ensure_ascii, sort_keys;
    const char *item_sep, *key_sep;
    size_t item_sep_len, key_sep_len;
} td_jinja_json_opts;
typedef td_jinja_json_opts json_opts;

typedef struct {
    const val *key;  // sort key per element (may alias the element)
    val item;
} td_jinja_sort_ent;
typedef td_jinja_sort_ent sort_ent;

// Work done by linear scans (array membership, substring search, unique) since the last step();
// charged against max_steps so that a loop of scans cannot run unbounded. One render runs on one
// thread, hence thread-local.
extern _Thread_local size_t td_jinja_scan_work;

// ---- eval.c ----
// Sets r's error (the first one wins) with the line and column of at (NULL: none); returns JR_ERR.
int td_jinja_rerr(rctx *r, const node *at, td_status st, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void *td_jinja_ralloc(rctx *r, size_t n);  // from the render arena; NULL with r's error set
const char *td_jinja_type_name(const val *v);  // @huggingface/jinja's class name ("ArrayValue")
td_jinja_arr *td_jinja_arr_new(rctx *r, size_t n);
val *td_jinja_map_get(const td_jinja_map *m, const char *k, size_t kl);  // NULL: absent
// The string builder returns 1 on success, 0 with r's error set.
int td_jinja_sb_add(rctx *r, sb *b, const char *s, size_t n);
int td_jinja_truthy(const val *v);
int td_jinja_strict_eq(const val *a, const val *b);  // ===
// Value to text (1 on success, 0 with r's error set): String(v); v's raw text (nullish_empty: null
// and undefined as ""); JSON.stringify-like with o (undef_null: undefined as null).
int td_jinja_to_string(rctx *r, const val *v, sb *out);
int td_jinja_raw_string(rctx *r, const val *v, sb *out, int nullish_empty);
int td_jinja_to_json(rctx *r, const val *v, const json_opts *o, int depth, int undef_null, sb *out);
// The rest return JR_OK or JR_ERR (with r's error set).
int td_jinja_step(rctx *r, const node *x);  // one evaluated node against max_steps
// A call's arguments: positional values, then one keyword-arguments object (kw_always: even if
// empty) unless kwout takes it.
int td_jinja_eval_args(rctx *r, node *const *args, size_t n, env *e, int kw_always, val **out, size_t *nout,
                       td_jinja_map **kwout);
// obj.name for the builtin methods and attributes of strings and objects (undefined if none).
int td_jinja_builtin_attr(rctx *r, const val *obj, const char *name, size_t nl, val *out);
int td_jinja_call_fn(rctx *r, const node *at, const val *fn, val *args, size_t nargs, env *e, val *out);
int td_jinja_sort_values(rctx *r, const node *at, sort_ent *v, size_t n, int case_sensitive, int reverse);  // stable
int td_jinja_items_of(rctx *r, const td_jinja_map *m, val *out);  // [[key, value], ...]
// String methods that filters share: upper/lower (full case mapping), title, capitalize, strip,
// replace(old, new[, count]).
int td_jinja_case_mapped(rctx *r, const val *s, int upper, val *out);
int td_jinja_str_title(rctx *r, const val *s, val *out);
int td_jinja_str_capitalize(rctx *r, const val *s, val *out);
int td_jinja_str_trim(rctx *r, const val *s, int left, int right, val *out);
int td_jinja_str_replace(rctx *r, const node *at, const val *s, val *args, size_t nargs, val *out);

// ---- filters.c ----
// operand | fnode (a JN_IDENT, or a JN_CALL of one with its arguments).
int td_jinja_apply_filter(rctx *r, const val *operand, const node *fnode, env *e, val *out);
// Environment.TESTS: `a is name` (b: the test's argument, NULL when it has none); *res 0 or 1.
int td_jinja_run_test(rctx *r, const node *at, const char *name, size_t nl, const val *a, const val *b, int *res);

// ---- value constructors and small predicates ----
static inline val v_undef(void) { return (val){.t = JV_UNDEF}; }
static inline val v_null(void) { return (val){.t = JV_NULL}; }
static inline val v_bool(int b) { return (val){.t = JV_BOOL, .u.b = !!b}; }
static inline val v_int(double n) { return (val){.t = JV_INT, .u.n = n}; }
static inline val v_float(double n) { return (val){.t = JV_FLOAT, .u.n = n}; }
static inline val v_str(const char *s, size_t n) { return (val){.t = JV_STR, .len = n, .u.s = s}; }
static inline val v_num(double n) { return isfinite(n) && n == floor(n) ? v_int(n) : v_float(n); }
static inline val v_arr(td_jinja_arr *a) { return (val){.t = JV_ARRAY, .u.a = a}; }
static inline int is_num(const val *v) { return v->t == JV_INT || v->t == JV_FLOAT; }
static inline int is_container(const val *v) { return v->t == JV_OBJECT || v->t == JV_NS; }
static inline val sb_val(sb *b) { return v_str(b->s ? b->s : "", b->n); }
static inline int name_is(const char *s, size_t n, const char *w) { return strlen(w) == n && memcmp(s, w, n) == 0; }
static inline val *kwarg(td_jinja_map *kw, const char *name) { return td_jinja_map_get(kw, name, strlen(name)); }
static inline json_opts default_json(void) { return (json_opts){0, 0, 0, ", ", ": ", 2, 2}; }

#endif
