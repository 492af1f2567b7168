// Jinja filters and tests: FILTERS maps each filter name, form and operand type to one small
// function (or one per family), and run_test is Environment.TESTS, both as @huggingface/jinja's
// applyFilter / tests behave, messages included. The interpreter is eval.c.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/interp.h"

static val attr_path(const val *item, const char *path, size_t plen) {
    val v = *item;
    size_t i = 0;
    while (1) {
        size_t j = i;
        while (j < plen && path[j] != '.') j++;
        if (is_container(&v)) {
            val *g = td_jinja_map_get(v.u.o, path + i, j - i);
            v = g ? *g : v_undef();
        } else if (v.t == JV_ARRAY) {
            double idx = td_jinja_parse_int(path + i, j - i);
            if (!isnan(idx) && idx >= 0 && idx < (double)v.u.a->n) v = v.u.a->v[(size_t)idx];
            else return v_undef();
        } else
            return v_undef();
        if (j >= plen) break;
        i = j + 1;
    }
    return v;
}


// filters: FILTERS maps a name, a form (bare `x | f` or called `x | f(...)`) and the operand types
// to one function per filter or family; what no row takes falls to unknown_filter, which also
// gives objects their methods (`obj | items`). The rows mirror @huggingface/jinja's applyFilter,
// so which names a type accepts in which form is its set, quirks included (`x | int` floors a
// number, `x | int()` does not).

typedef struct {
    rctx *r;
    const val *o;      // the operand
    const node *at;    // the filter node (JN_IDENT, or JN_CALL with the arguments in at->list)
    const char *name;  // the filter's name
    size_t nl;
    int call;          // written with parentheses
    env *e;
    val *out;
} fcall;

#define FNAME_IS(c, w) name_is((c)->name, (c)->nl, w)

static int fargs(fcall *c, val **args, size_t *nargs, td_jinja_map **kw) {
    return td_jinja_eval_args(c->r, c->at->list, c->at->n, c->e, 0, args, nargs, kw);
}

static int f_safe(fcall *c) { return *c->out = *c->o, JR_OK; }

static int f_tojson(fcall *c) {
    rctx *r = c->r;
    json_opts jo = default_json();
    if (c->call) {
        val *args;
        size_t nargs;
        td_jinja_map *kw;
        int st = fargs(c, &args, &nargs, &kw);
        if (st) return st;
        val *ind = kwarg(kw, "indent"), *ea = kwarg(kw, "ensure_ascii"), *sk = kwarg(kw, "sort_keys"),
            *sp = kwarg(kw, "separators");
        if (ind && ind->t != JV_INT && ind->t != JV_NULL)
            return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "If set, indent must be a number");
        if (ea && ea->t != JV_BOOL) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "If set, ensure_ascii must be a boolean");
        if (sk && sk->t != JV_BOOL) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "If set, sort_keys must be a boolean");
        if (ind && ind->t == JV_INT && ind->u.n != 0 && !isnan(ind->u.n)) {
            if (ind->u.n < 0 || ind->u.n > 1024) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "indent out of range");
            jo.indent = (int)ind->u.n;
            jo.item_sep = ",";
            jo.item_sep_len = 1;
        }
        jo.ensure_ascii = ea && ea->u.b;
        jo.sort_keys = sk && sk->u.b;
        if (sp && sp->t == JV_ARRAY) {
            if (sp->u.a->n != 2 || sp->u.a->v[0].t != JV_STR || sp->u.a->v[1].t != JV_STR)
                return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "separators must be a tuple of two strings");
            jo.item_sep = sp->u.a->v[0].u.s, jo.item_sep_len = sp->u.a->v[0].len;
            jo.key_sep = sp->u.a->v[1].u.s, jo.key_sep_len = sp->u.a->v[1].len;
        } else if (sp && sp->t != JV_NULL)
            return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "If set, separators must be a tuple of two strings");
    }
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, "", 0) || !td_jinja_to_json(r, c->o, &jo, 0, 1, &b)) return JR_ERR;
    *c->out = sb_val(&b);
    return JR_OK;
}

static int f_first_last(fcall *c) {
    const td_jinja_arr *a = c->o->u.a;
    if (a->n == 0)
        return td_jinja_rerr(c->r, c->at, TD_ERR_INVALID,
                             "Cannot read properties of undefined (filter %.*s of an empty list)", (int)c->nl, c->name);
    *c->out = FNAME_IS(c, "first") ? a->v[0] : a->v[a->n - 1];
    return JR_OK;
}

static int f_length(fcall *c) {
    const val *o = c->o;
    if (o->t == JV_ARRAY) *c->out = v_int((double)o->u.a->n);
    else if (o->t == JV_STR) *c->out = v_int((double)td_jinja_utf16_len(o->u.s, o->len));
    else *c->out = v_int((double)o->u.o->n);
    return JR_OK;
}

static int f_reverse(fcall *c) {
    const td_jinja_arr *a = c->o->u.a;
    td_jinja_arr *r = td_jinja_arr_new(c->r, a->n);
    if (!r) return JR_ERR;
    for (size_t i = 0; i < a->n; i++) r->v[i] = a->v[a->n - 1 - i];
    *c->out = v_arr(r);
    return JR_OK;
}

static int f_unique(fcall *c) {
    const td_jinja_arr *a = c->o->u.a;
    td_jinja_arr *u = td_jinja_arr_new(c->r, a->n);
    if (!u) return JR_ERR;
    u->n = 0;
    for (size_t i = 0; i < a->n; i++) {
        int seen = 0;
        td_jinja_scan_work += u->n;
        for (size_t j = 0; j < u->n && !seen; j++) {
            seen = td_jinja_strict_eq(&u->v[j], &a->v[i]) ||
                   (is_num(&u->v[j]) && is_num(&a->v[i]) && isnan(u->v[j].u.n) && isnan(a->v[i].u.n));
        }
        if (!seen) u->v[u->n++] = a->v[i];
        if (td_jinja_step(c->r, c->at)) return JR_ERR;
    }
    *c->out = v_arr(u);
    return JR_OK;
}

// sort, and sort(reverse, case_sensitive, attribute) by a dotted attribute path
static int f_sort(fcall *c) {
    rctx *r = c->r;
    const td_jinja_arr *a = c->o->u.a;
    sort_ent *ents = NULL;
    if (!c->call) {
        if (!(ents = td_jinja_ralloc(r, (a->n + 1) * sizeof(sort_ent)))) return JR_ERR;
        for (size_t i = 0; i < a->n; i++) ents[i].item = a->v[i], ents[i].key = &a->v[i];
        if (td_jinja_sort_values(r, c->at, ents, a->n, 0, 0)) return JR_ERR;
    } else {
        val *args, *k;
        size_t nargs;
        td_jinja_map *kw;
        int st = fargs(c, &args, &nargs, &kw);
        if (st) return st;
        val rev = nargs > 0 ? args[0] : (k = kwarg(kw, "reverse")) ? *k : v_bool(0);
        if (rev.t != JV_BOOL) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "reverse must be a boolean");
        val cs = nargs > 1 ? args[1] : (k = kwarg(kw, "case_sensitive")) ? *k : v_bool(0);
        if (cs.t != JV_BOOL) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "case_sensitive must be a boolean");
        val attr = nargs > 2 ? args[2] : (k = kwarg(kw, "attribute")) ? *k : v_null();
        if (attr.t != JV_STR && attr.t != JV_INT && attr.t != JV_NULL)
            return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "attribute must be a string, integer, or null");
        sb path = {0};
        if (attr.t != JV_NULL && (!td_jinja_sb_add(r, &path, "", 0) || !td_jinja_raw_string(r, &attr, &path, 0))) return JR_ERR;
        ents = td_jinja_ralloc(r, (a->n + 1) * sizeof(sort_ent));
        val *keys = td_jinja_ralloc(r, (a->n + 1) * sizeof(val));
        if (!ents || !keys) return JR_ERR;
        for (size_t i = 0; i < a->n; i++) {
            keys[i] = attr.t == JV_NULL ? a->v[i] : attr_path(&a->v[i], path.s, path.n);
            ents[i].item = a->v[i];
            ents[i].key = &keys[i];
        }
        if (td_jinja_sort_values(r, c->at, ents, a->n, cs.u.b, rev.u.b)) return JR_ERR;
    }
    td_jinja_arr *s = td_jinja_arr_new(r, a->n);
    if (!s) return JR_ERR;
    for (size_t i = 0; i < a->n; i++) s->v[i] = ents[i].item;
    *c->out = v_arr(s);
    return JR_OK;
}

// join (a list's items, a string unchanged) and join(separator) (between a string's code points too)
static int f_join(fcall *c) {
    rctx *r = c->r;
    const val *o = c->o;
    if (!c->call && o->t == JV_STR) return *c->out = *o, JR_OK;
    val sep = v_str("", 0);
    if (c->call) {
        if (o->t != JV_STR && o->t != JV_ARRAY)
            return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "Cannot apply filter \"join\" to type: %s", td_jinja_type_name(o));
        val *args;
        size_t nargs;
        td_jinja_map *kw;
        int st = fargs(c, &args, &nargs, &kw);
        if (st) return st;
        val *sepk = kwarg(kw, "separator");
        if (nargs > 0) sep = args[0];
        else if (sepk) sep = *sepk;
        if (sep.t != JV_STR) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "separator must be a string");
    }
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, "", 0)) return JR_ERR;
    if (o->t == JV_STR) {
        size_t i = 0, adv;
        while (i < o->len) {
            td_jinja_utf8_decode(o->u.s + i, o->len - i, &adv);
            if (i && !td_jinja_sb_add(r, &b, sep.u.s, sep.len)) return JR_ERR;
            if (!td_jinja_sb_add(r, &b, o->u.s + i, adv)) return JR_ERR;
            i += adv;
        }
    } else {
        for (size_t i = 0; i < o->u.a->n; i++) {
            if (i && !td_jinja_sb_add(r, &b, sep.u.s, sep.len)) return JR_ERR;
            if (!td_jinja_raw_string(r, &o->u.a->v[i], &b, 1)) return JR_ERR;
        }
    }
    *c->out = sb_val(&b);
    return JR_OK;
}

static int f_string(fcall *c) {
    rctx *r = c->r;
    const val *o = c->o;
    if (o->t == JV_STR) return *c->out = *o, JR_OK;
    if (o->t == JV_BOOL) return *c->out = o->u.b ? v_str("true", 4) : v_str("false", 5), JR_OK;
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, "", 0)) return JR_ERR;
    if (o->t == JV_ARRAY) {
        json_opts jo = default_json();
        if (!td_jinja_to_json(r, o, &jo, 0, 0, &b)) return JR_ERR;
    } else if (!td_jinja_to_string(r, o, &b))
        return JR_ERR;
    *c->out = sb_val(&b);
    return JR_OK;
}

static int f_upper_lower(fcall *c) { return td_jinja_case_mapped(c->r, c->o, FNAME_IS(c, "upper"), c->out); }
static int f_title(fcall *c) { return td_jinja_str_title(c->r, c->o, c->out); }
static int f_capitalize(fcall *c) { return td_jinja_str_capitalize(c->r, c->o, c->out); }
static int f_trim(fcall *c) { return td_jinja_str_trim(c->r, c->o, 1, 1, c->out); }

// indent and indent(width, first, blank): bare, 4 spaces before every non-empty line but the first
static int f_indent(fcall *c) {
    rctx *r = c->r;
    const val *o = c->o;
    val width = v_int(4), first = v_bool(0), blank = v_bool(0);
    if (c->call) {
        val *args, *k;
        size_t nargs;
        td_jinja_map *kw;
        int st = fargs(c, &args, &nargs, &kw);
        if (st) return st;
        width = nargs > 0 ? args[0] : (k = kwarg(kw, "width")) ? *k : v_int(4);
        if (width.t != JV_INT) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "width must be a number");
        if (!(width.u.n >= 0 && width.u.n <= 1024)) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "Invalid count value");
        first = nargs > 1 ? args[1] : (k = kwarg(kw, "first")) ? *k : v_bool(0);
        blank = nargs > 2 ? args[2] : (k = kwarg(kw, "blank")) ? *k : v_bool(0);
    }
    int tf = td_jinja_truthy(&first), tb = td_jinja_truthy(&blank);
    if (first.t >= JV_ARRAY) tf = 1;  // raw JS objects are truthy
    if (blank.t >= JV_ARRAY) tb = 1;
    sb b = {0};
    if (!td_jinja_sb_add(r, &b, "", 0)) return JR_ERR;
    const char *p = o->u.s, *end = o->u.s + o->len;
    for (size_t line = 0;; line++) {
        const char *q = memchr(p, '\n', (size_t)(end - p));
        size_t l = q ? (size_t)(q - p) : (size_t)(end - p);
        if (!((!tf && line == 0) || (!tb && l == 0)))
            for (int i = 0; i < (int)width.u.n; i++)
                if (!td_jinja_sb_add(r, &b, " ", 1)) return JR_ERR;
        if (!td_jinja_sb_add(r, &b, p, l)) return JR_ERR;
        if (!q) break;
        if (!td_jinja_sb_add(r, &b, "\n", 1)) return JR_ERR;
        p = q + 1;
    }
    *c->out = sb_val(&b);
    return JR_OK;
}

// int, float, and int(default) / float(default) (a called one leaves numbers as they are)
static int f_int_float(fcall *c) {
    const val *o = c->o;
    const int is_int = FNAME_IS(c, "int");
    val dflt = is_int ? v_int(0) : v_float(0);
    if (c->call) {
        val *args;
        size_t nargs;
        td_jinja_map *kw;
        int st = fargs(c, &args, &nargs, &kw);
        if (st) return st;
        val *dk = kwarg(kw, "default");
        if (nargs > 0) dflt = args[0];
        else if (dk) dflt = *dk;
    }
    if (o->t == JV_STR) {
        double v = is_int ? td_jinja_parse_int(o->u.s, o->len) : td_jinja_parse_float(o->u.s, o->len);
        *c->out = isnan(v) ? dflt : is_int ? v_int(v) : v_float(v);
        return JR_OK;
    }
    if (is_num(o)) return *c->out = c->call ? *o : is_int ? v_int(floor(o->u.n)) : v_float(o->u.n), JR_OK;
    if (o->t == JV_BOOL) return *c->out = is_int ? v_int(o->u.b) : v_float(o->u.b), JR_OK;
    return td_jinja_rerr(c->r, c->at, TD_ERR_INVALID, "Cannot apply filter \"%.*s\" to type: %s", (int)c->nl, c->name,
                         td_jinja_type_name(o));
}

static int f_abs(fcall *c) { return *c->out = (val){.t = c->o->t, .u.n = fabs(c->o->u.n)}, JR_OK; }
static int f_items(fcall *c) { return td_jinja_items_of(c->r, c->o->u.o, c->out); }

static int f_default(fcall *c) {
    val *args;
    size_t nargs;
    td_jinja_map *kw;
    int st = fargs(c, &args, &nargs, &kw);
    if (st) return st;
    val dflt = nargs > 0 ? args[0] : v_str("", 0);
    val *bk = kwarg(kw, "boolean");
    val bv = nargs > 1 ? args[1] : bk ? *bk : v_bool(0);
    if (bv.t != JV_BOOL) return td_jinja_rerr(c->r, c->at, TD_ERR_INVALID, "`default` filter flag must be a boolean");
    *c->out = (c->o->t == JV_UNDEF || (bv.u.b && !td_jinja_truthy(c->o))) ? dflt : *c->o;
    return JR_OK;
}

// selectattr(attr[, test[, value]]) / rejectattr: the arguments must be string literals
static int f_select_reject(fcall *c) {
    rctx *r = c->r;
    const node *fnode = c->at;
    const td_jinja_arr *a = c->o->u.a;
    const int select = FNAME_IS(c, "selectattr");
    for (size_t i = 0; i < a->n; i++)
        if (!is_container(&a->v[i]))
            return td_jinja_rerr(r, fnode, TD_ERR_INVALID, "`%.*s` can only be applied to array of objects", (int)c->nl, c->name);
    for (size_t i = 0; i < fnode->n; i++)
        if (fnode->list[i]->kind != JN_STR)
            return td_jinja_rerr(r, fnode, TD_ERR_INVALID, "arguments of `%.*s` must be strings", (int)c->nl, c->name);
    if (fnode->n < 1) return td_jinja_rerr(r, fnode, TD_ERR_INVALID, "`%.*s` needs an attribute name", (int)c->nl, c->name);
    const node *attr = fnode->list[0], *test = fnode->n > 1 ? fnode->list[1] : NULL;
    val tv = fnode->n > 2 ? v_str(fnode->list[2]->s, fnode->list[2]->slen) : v_undef();
    td_jinja_arr *s = td_jinja_arr_new(r, a->n);
    if (!s) return JR_ERR;
    s->n = 0;
    for (size_t i = 0; i < a->n; i++) {
        val *av = td_jinja_map_get(a->v[i].u.o, attr->s, attr->slen);
        int res = 0;
        if (av) {
            if (test) {
                if (td_jinja_run_test(r, fnode, test->s, test->slen, av, fnode->n > 2 ? &tv : NULL, &res)) return JR_ERR;
            } else
                res = td_jinja_truthy(av);
        }
        if (select ? res : !res) s->v[s->n++] = a->v[i];
    }
    *c->out = v_arr(s);
    return JR_OK;
}

// map(attribute=path[, default=v])
static int f_map(fcall *c) {
    rctx *r = c->r;
    const td_jinja_arr *a = c->o->u.a;
    val *args;
    size_t nargs;
    td_jinja_map *kw;
    int st = fargs(c, &args, &nargs, &kw);
    if (st) return st;
    val *attr = kwarg(kw, "attribute");
    if (!attr)
        return td_jinja_rerr(r, c->at, TD_ERR_INVALID,
                             "`map` expressions without `attribute` set are not currently supported.");
    if (attr->t != JV_STR) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "attribute must be a string");
    val *dflt = kwarg(kw, "default");
    td_jinja_arr *m = td_jinja_arr_new(r, a->n);
    if (!m) return JR_ERR;
    for (size_t i = 0; i < a->n; i++) {
        if (!is_container(&a->v[i])) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "items in map must be an object");
        val v = attr_path(&a->v[i], attr->u.s, attr->len);
        m->v[i] = v.t == JV_UNDEF && dflt ? *dflt : v;
    }
    *c->out = v_arr(m);
    return JR_OK;
}

static int f_replace(fcall *c) {
    val *args;
    size_t nargs;
    int st = td_jinja_eval_args(c->r, c->at->list, c->at->n, c->e, 1, &args, &nargs, NULL);
    if (st) return st;
    return td_jinja_str_replace(c->r, c->at, c->o, args, nargs, c->out);
}

enum { FF_BARE = 1, FF_CALL = 2, FF_BOTH = 3 };  // the forms a row takes
#define TY(t) (1u << (t))
#define TY_NUM (TY(JV_INT) | TY(JV_FLOAT))
#define TY_ANY (~0u)

static const struct {
    const char *name;
    unsigned char forms;  // FF_*
    unsigned types;       // TY() of the operand types taken
    int (*fn)(fcall *c);
} FILTERS[] = {
    {"safe", FF_BARE, TY_ANY, f_safe},
    {"tojson", FF_BOTH, TY_ANY, f_tojson},
    {"list", FF_BARE, TY(JV_ARRAY), f_safe},
    {"first", FF_BARE, TY(JV_ARRAY), f_first_last},
    {"last", FF_BARE, TY(JV_ARRAY), f_first_last},
    {"length", FF_BARE, TY(JV_ARRAY) | TY(JV_STR) | TY(JV_OBJECT), f_length},
    {"reverse", FF_BARE, TY(JV_ARRAY), f_reverse},
    {"sort", FF_BOTH, TY(JV_ARRAY), f_sort},
    {"unique", FF_BARE, TY(JV_ARRAY), f_unique},
    {"join", FF_BARE, TY(JV_ARRAY) | TY(JV_STR), f_join},
    {"join", FF_CALL, TY_ANY, f_join},
    {"string", FF_BARE, TY(JV_ARRAY) | TY(JV_STR) | TY_NUM | TY(JV_BOOL), f_string},
    {"upper", FF_BARE, TY(JV_STR), f_upper_lower},
    {"lower", FF_BARE, TY(JV_STR), f_upper_lower},
    {"title", FF_BARE, TY(JV_STR), f_title},
    {"capitalize", FF_BARE, TY(JV_STR), f_capitalize},
    {"trim", FF_BARE, TY(JV_STR), f_trim},
    {"indent", FF_BOTH, TY(JV_STR), f_indent},
    {"int", FF_BARE, TY(JV_STR) | TY_NUM | TY(JV_BOOL), f_int_float},
    {"int", FF_CALL, TY_ANY, f_int_float},
    {"float", FF_BARE, TY(JV_STR) | TY_NUM | TY(JV_BOOL), f_int_float},
    {"float", FF_CALL, TY_ANY, f_int_float},
    {"abs", FF_BARE, TY_NUM, f_abs},
    {"items", FF_BARE, TY(JV_OBJECT), f_items},
    {"bool", FF_BARE, TY(JV_BOOL), f_safe},
    {"default", FF_CALL, TY_ANY, f_default},
    {"selectattr", FF_CALL, TY(JV_ARRAY), f_select_reject},
    {"rejectattr", FF_CALL, TY(JV_ARRAY), f_select_reject},
    {"map", FF_CALL, TY(JV_ARRAY), f_map},
    {"replace", FF_CALL, TY(JV_STR), f_replace},
};

// No row: an object's method of that name (called with the arguments), else the error
// @huggingface/jinja gives for the operand's type.
static int unknown_filter(fcall *c) {
    rctx *r = c->r;
    const val *o = c->o;
    if (o->t == JV_OBJECT) {
        val b;
        if (td_jinja_builtin_attr(r, o, c->name, c->nl, &b)) return JR_ERR;
        if (b.t == JV_FUNC) {
            if (!c->call) return td_jinja_call_fn(r, c->at, &b, NULL, 0, c->e, c->out);
            val *args;
            size_t nargs;
            int st = td_jinja_eval_args(r, c->at->list, c->at->n, c->e, 0, &args, &nargs, NULL);
            if (st) return st;
            return td_jinja_call_fn(r, c->at, &b, args, nargs, c->e, c->out);
        }
        if (!c->call && b.t != JV_UNDEF) return *c->out = b, JR_OK;
        return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "Unknown ObjectValue filter: %.*s", (int)c->nl, c->name);
    }
    const char *kind = o->t == JV_ARRAY              ? "ArrayValue"
                       : o->t == JV_STR              ? "StringValue"
                       : !c->call && is_num(o)       ? "NumericValue"
                       : !c->call && o->t == JV_BOOL ? "BooleanValue"
                                                     : NULL;
    if (kind) return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "Unknown %s filter: %.*s", kind, (int)c->nl, c->name);
    return td_jinja_rerr(r, c->at, TD_ERR_INVALID, "Cannot apply filter \"%.*s\" to type: %s", (int)c->nl, c->name,
                         td_jinja_type_name(o));
}

int td_jinja_apply_filter(rctx *r, const val *operand, const node *fnode, env *e, val *out) {
    const int call = fnode->kind != JN_IDENT;
    const node *id = call ? fnode->a : fnode;
    if (call && (fnode->kind != JN_CALL || id->kind != JN_IDENT))
        return td_jinja_rerr(r, fnode, TD_ERR_INVALID, "Unknown filter");
    fcall c = {.r = r, .o = operand, .at = fnode, .name = id->s, .nl = id->slen, .call = call, .e = e, .out = out};
    const unsigned form = call ? FF_CALL : FF_BARE, type = TY(operand->t);
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if ((FILTERS[i].forms & form) && (FILTERS[i].types & type) && name_is(c.name, c.nl, FILTERS[i].name))
            return FILTERS[i].fn(&c);
    return unknown_filter(&c);
}

static int is_lower_or_upper(rctx *r, const val *a, int upper, int *res) {
    if (a->t != JV_STR) return *res = 0, JR_OK;
    size_t l;
    char *m = td_jinja_case_map(a->u.s, a->len, upper, &l);
    if (!m) return td_jinja_rerr(r, NULL, TD_ERR_NOMEM, "out of memory");
    *res = l == a->len && memcmp(m, a->u.s, l) == 0;
    free(m);
    return JR_OK;
}

// Environment.TESTS; b is NULL when the test got no argument
int td_jinja_run_test(rctx *r, const node *at, const char *name, size_t nl, const val *a, const val *b, int *res) {
#define T(w) name_is(name, nl, w)
    if (T("boolean")) *res = a->t == JV_BOOL;
    else if (T("callable")) *res = a->t == JV_FUNC;
    else if (T("odd") || T("even")) {
        if (a->t != JV_INT)
            return td_jinja_rerr(r, at, TD_ERR_INVALID, "cannot %.*s on %s", (int)nl, name, td_jinja_type_name(a));
        double m = fmod(a->u.n, 2);
        *res = T("odd") ? m != 0 : m == 0;
    } else if (T("false")) *res = a->t == JV_BOOL && !a->u.b;
    else if (T("true")) *res = a->t == JV_BOOL && a->u.b;
    else if (T("none")) *res = a->t == JV_NULL;
    else if (T("string")) *res = a->t == JV_STR;
    else if (T("number")) *res = is_num(a);
    else if (T("integer")) *res = a->t == JV_INT;
    else if (T("iterable")) *res = (a->t == JV_ARRAY && !a->flag) || a->t == JV_STR;
    else if (T("mapping")) *res = a->t == JV_OBJECT;
    else if (T("sequence")) *res = a->t == JV_ARRAY || a->t == JV_OBJECT || a->t == JV_STR;
    else if (T("lower")) return is_lower_or_upper(r, a, 0, res);
    else if (T("upper")) return is_lower_or_upper(r, a, 1, res);
    else if (T("defined")) *res = a->t != JV_UNDEF;
    else if (T("undefined")) *res = a->t == JV_UNDEF;
    else if (T("equalto") || T("eq")) {
        if (!b)
            return td_jinja_rerr(r, at, TD_ERR_INVALID, "Cannot read properties of undefined (test %.*s needs a value)",
                                 (int)nl, name);
        *res = td_jinja_strict_eq(a, b);
    } else
        return td_jinja_rerr(r, at, TD_ERR_INVALID, "Unknown test: %.*s", (int)nl, name);
#undef T
    return JR_OK;
}
