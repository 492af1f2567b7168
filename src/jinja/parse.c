// Jinja front half, second part: the parser (recursive descent, @huggingface/jinja's grammar and
// precedence, rule for rule) and td_jinja_compile. The lexer is lex.c; evaluation is eval.c.
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jinja/lex.h"

#define MAX_SOURCE (16u << 20)  // bytes of template source
#define MAX_PARSE_NEST 100      // nested parentheses / blocks / unary operators while parsing
#define MAX_AST_DEPTH 256       // depth of the tree (left-nested operator chains count)

typedef td_jinja_compiler jstate;
typedef td_jinja_token token;

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
    return t && t->type == JT_IDENT && t->len == l && memcmp(t->s, word, l) == 0;
}
static int is_ident(jstate *st, const char *w) { return tok_is(tk(st, 0), w); }
static int is_ident2(jstate *st, const char *w1, const char *w2) { return tok_is(tk(st, 0), w1) && tok_is(tk(st, 1), w2); }
// {% name ... with name one of the given words
static int is_stmt(jstate *st, const char *w1, const char *w2, const char *w3) {
    token *t0 = tk(st, 0), *t1 = tk(st, 1);
    if (!t0 || t0->type != JT_OPEN_STMT || !t1) return 0;
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
        td_jinja_fail_at(st, x->pos, "template nested too deeply (more than %d levels)", MAX_AST_DEPTH);
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
        td_jinja_fail_at(st, cur_pos(st), "%s", what);
        return 0;
    }
    st->p++;
    return 1;
}
static int expect_ident(jstate *st, const char *w) {
    if (!is_ident(st, w)) {
        td_jinja_fail_at(st, cur_pos(st), "expected '%s'", w);
        return 0;
    }
    st->p++;
    return 1;
}

static int enter(jstate *st) {
    if (++st->nest > MAX_PARSE_NEST) {
        td_jinja_fail_at(st, cur_pos(st), "template nested too deeply (more than %d levels)", MAX_PARSE_NEST);
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
            td_jinja_fail_at(st, st->orig_len, "unexpected end of template: missing {%% %s %%}", w1);
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
    if (!is_t(st, JT_COMMA)) return first;
    nvec v = {0};
    if (!nv_push(st, &v, first)) return NULL;
    while (1) {
        st->p++;
        if (!nv_push(st, &v, primary ? parse_primary(st) : parse_expression(st))) return NULL;
        if (!is_t(st, JT_COMMA)) break;
    }
    node *t = mk(st, JN_TUPLE, pos);
    if (!t) return NULL;
    t->list = v.v;
    t->n = v.n;
    return fin(st, t);
}

// parseArgumentsList; parameters = 1 for macro/caller parameter declarations
static int parse_args(jstate *st, int parameters, node ***out, size_t *nout) {
    if (!expect(st, JT_LPAREN, "expected '(' for the argument list")) return 0;
    nvec v = {0};
    int saw_kw = 0, saw_spread = 0;
    while (!is_t(st, JT_RPAREN)) {
        if (st->failed) return 0;
        if (!tk(st, 0)) {
            td_jinja_fail_at(st, st->orig_len, "unexpected end of template in argument list");
            return 0;
        }
        size_t pos = cur_pos(st);
        int kw_spread = is_t(st, JT_POW);
        int pos_spread = is_t(st, JT_MUL) && tk(st, 0)->len == 1 && tk(st, 0)->s[0] == '*';
        if (parameters && (kw_spread || pos_spread)) {
            td_jinja_fail_at(st, pos, "argument unpacking is not allowed in parameter declarations");
            return 0;
        }
        if (kw_spread) {
            st->p++;
            node *x = mk(st, JN_KWSPREAD, pos);
            if (!x || !(x->a = parse_expression(st)) || !nv_push(st, &v, fin(st, x))) return 0;
            if (is_t(st, JT_COMMA)) st->p++;
            if (!is_t(st, JT_RPAREN)) {
                td_jinja_fail_at(st, cur_pos(st), "expected ')': ** must be applied to the final argument");
                return 0;
            }
            break;
        }
        node *arg;
        if (pos_spread) {
            if (saw_spread) {
                td_jinja_fail_at(st, pos, "only one * argument unpacking is allowed");
                return 0;
            }
            saw_spread = 1;
            st->p++;
            arg = mk(st, JN_SPREAD, pos);
            if (!arg || !(arg->a = parse_expression(st)) || !fin(st, arg)) return 0;
        } else {
            arg = parse_expression(st);
            if (!arg) return 0;
            if (is_t(st, JT_EQUALS)) {
                st->p++;
                if (arg->kind != JN_IDENT) {
                    td_jinja_fail_at(st, pos, "expected identifier for keyword argument");
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
                    td_jinja_fail_at(st, pos, "expected identifier for parameter declaration");
                    return 0;
                }
                for (size_t i = 0; i < v.n; i++)
                    if (v.v[i]->slen == arg->slen && memcmp(v.v[i]->s, arg->s, arg->slen) == 0) {
                        td_jinja_fail_at(st, pos, "duplicate parameter name");
                        return 0;
                    }
            }
            if (arg->kind == JN_KWARG) saw_kw = 1;
            else if (saw_kw) {
                td_jinja_fail_at(st, pos, parameters ? "non-default argument follows default argument"
                                            : "positional arguments must come before keyword arguments");
                return 0;
            } else if (saw_spread) {
                td_jinja_fail_at(st, pos, "positional arguments must not follow * argument unpacking");
                return 0;
            }
        }
        if (!nv_push(st, &v, arg)) return 0;
        if (is_t(st, JT_COMMA)) st->p++;
    }
    if (!expect(st, JT_RPAREN, "expected ')' after the argument list")) return 0;
    *out = v.v;
    *nout = v.n;
    return 1;
}

static node *parse_if_expr(jstate *st);

static node *parse_primary(jstate *st) {
    token *t = tk(st, 0);
    if (!t) {
        td_jinja_fail_at(st, st->orig_len, "unexpected end of template in expression");
        return NULL;
    }
    st->p++;
    size_t pos = t->pos;
    switch (t->type) {
    case JT_NUM: {
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
    case JT_STR: {
        node *x = mk(st, JN_STR, pos);
        if (!x) return NULL;
        x->s = t->s;
        x->slen = t->len;
        if (is_t(st, JT_STR)) {  // adjacent literals concatenate
            char *acc = td_jinja_strdup(st->arena, t->s, t->len);
            size_t n = t->len;
            while (acc && is_t(st, JT_STR)) {
                token *u = tk(st, 0);
                acc = td_jinja_concat(st->arena, acc, n, u->s, u->len);
                n += u->len;
                st->p++;
            }
            if (!acc) {
                td_jinja_fail_at(st, pos, "out of memory");
                return NULL;
            }
            x->s = acc;
            x->slen = n;
        }
        return x;
    }
    case JT_IDENT: {
        node *x = mk(st, JN_IDENT, pos);
        if (!x) return NULL;
        x->s = t->s;
        x->slen = t->len;
        return x;
    }
    case JT_LPAREN: {
        if (!enter(st)) return NULL;
        node *x = parse_expr_seq(st, 0);
        if (!x || !expect(st, JT_RPAREN, "expected ')'")) return LEAVE(st, NULL);
        return LEAVE(st, x);
    }
    case JT_LBRACKET: {
        if (!enter(st)) return NULL;
        nvec v = {0};
        while (!is_t(st, JT_RBRACKET)) {
            if (!tk(st, 0)) {
                td_jinja_fail_at(st, st->orig_len, "unexpected end of template in list");
                return LEAVE(st, NULL);
            }
            if (!nv_push(st, &v, parse_expression(st))) return LEAVE(st, NULL);
            if (is_t(st, JT_COMMA)) st->p++;
        }
        st->p++;
        node *x = mk(st, JN_ARRAY, pos);
        if (!x) return LEAVE(st, NULL);
        x->list = v.v;
        x->n = v.n;
        return LEAVE(st, fin(st, x));
    }
    case JT_LBRACE: {
        if (!enter(st)) return NULL;
        nvec k = {0}, v = {0};
        while (!is_t(st, JT_RBRACE)) {
            if (!tk(st, 0)) {
                td_jinja_fail_at(st, st->orig_len, "unexpected end of template in dict");
                return LEAVE(st, NULL);
            }
            if (!nv_push(st, &k, parse_expression(st))) return LEAVE(st, NULL);
            if (!expect(st, JT_COLON, "expected ':' between key and value in dict literal")) return LEAVE(st, NULL);
            if (!nv_push(st, &v, parse_expression(st))) return LEAVE(st, NULL);
            if (is_t(st, JT_COMMA)) st->p++;
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
        td_jinja_fail_at(st, pos, "unexpected token '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
        return NULL;
    }
}

// inside [ ]: an index or a slice a:b:c
static node *parse_subscript(jstate *st) {
    node *sl[3] = {0};
    int count = 0, is_slice = 0;
    size_t pos = cur_pos(st);
    while (!is_t(st, JT_RBRACKET)) {
        if (!tk(st, 0)) {
            td_jinja_fail_at(st, st->orig_len, "unexpected end of template in subscript");
            return NULL;
        }
        if (count >= 3) {
            td_jinja_fail_at(st, cur_pos(st), "expected 0-3 arguments for slice expression");
            return NULL;
        }
        if (is_t(st, JT_COLON)) {
            sl[count++] = NULL;
            st->p++;
            is_slice = 1;
        } else {
            node *e = parse_expression(st);
            if (!e) return NULL;
            sl[count++] = e;
            if (is_t(st, JT_COLON)) {
                st->p++;
                is_slice = 1;
            }
        }
    }
    if (count == 0) {
        td_jinja_fail_at(st, pos, "expected at least one argument for member/slice expression");
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
    while (obj && (is_t(st, JT_DOT) || is_t(st, JT_LBRACKET))) {
        size_t pos = cur_pos(st);
        int computed = is_t(st, JT_LBRACKET);
        st->p++;
        node *prop;
        if (computed) {
            prop = parse_subscript(st);
            if (!prop || !expect(st, JT_RBRACKET, "expected ']'")) return NULL;
        } else {
            prop = parse_primary(st);
            if (!prop) return NULL;
            if (prop->kind != JN_IDENT && prop->kind != JN_INT) {
                td_jinja_fail_at(st, pos, "expected identifier or integer following dot operator");
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
    if (x && is_t(st, JT_LPAREN)) x = parse_call(st, x);
    return LEAVE(st, x);
}

static node *parse_call_member(jstate *st) {
    node *m = parse_member(st, parse_primary(st));
    if (m && is_t(st, JT_LPAREN)) return parse_call(st, m);
    return m;
}

static node *parse_unary_sign(jstate *st) {
    token *t = tk(st, 0);
    if (t && (t->type == JT_UNARY || t->type == JT_ADD) && t->len == 1 && (t->s[0] == '-' || t->s[0] == '+')) {
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
    while (operand && is_t(st, JT_PIPE)) {
        size_t pos = cur_pos(st);
        st->p++;
        node *f = parse_primary(st);
        if (!f) return NULL;
        if (f->kind != JN_IDENT) {
            td_jinja_fail_at(st, pos, "expected identifier for the filter");
            return NULL;
        }
        if (is_t(st, JT_LPAREN)) f = parse_call(st, f);
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
            td_jinja_fail_at(st, pos, "expected identifier for the test");
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
    while (l && is_t(st, JT_POW)) {
        size_t pos = cur_pos(st);
        st->p++;
        l = mk_bin(st, JOP_POW, pos, l, parse_test_expr(st));
    }
    return l;
}

static node *parse_mul(jstate *st) {
    node *l = parse_power(st);
    while (l && is_t(st, JT_MUL)) {
        token *t = tk(st, 0);
        st->p++;
        l = mk_bin(st, binop_of(t), t->pos, l, parse_power(st));
    }
    return l;
}

static node *parse_add(jstate *st) {
    node *l = parse_mul(st);
    while (l && is_t(st, JT_ADD)) {
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
        } else if (is_t(st, JT_CMP)) {
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
    if (!x || !(x->a = parse_expression(st)) || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    nvec body = {0}, alt = {0};
    if (!parse_body_until(st, &body, "elif", "else", "endif")) return LEAVE(st, NULL);
    if (is_stmt(st, "elif", NULL, NULL)) {
        size_t epos = tk(st, 1)->pos;
        st->p += 2;
        if (!nv_push(st, &alt, parse_if_stmt(st, epos))) return LEAVE(st, NULL);
    } else if (is_stmt(st, "else", NULL, NULL)) {
        st->p += 2;
        if (!expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
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
    if (!expect(st, JT_OPEN_STMT, "expected '{%'")) return NULL;
    token *t = tk(st, 0);
    if (!t || t->type != JT_IDENT) {
        td_jinja_fail_at(st, cur_pos(st), "expected a statement name after '{%%'");
        return NULL;
    }
    if (!enter(st)) return NULL;
    node *x = NULL;
    if (tok_is(t, "set")) {
        st->p++;
        x = mk(st, JN_SET, pos);
        if (!x || !(x->a = parse_expr_seq(st, 0))) return LEAVE(st, NULL);
        if (is_t(st, JT_EQUALS)) {
            st->p++;
            if (!(x->b = parse_expr_seq(st, 0))) return LEAVE(st, NULL);
        } else {
            nvec body = {0};
            if (!expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
            if (!parse_body_until(st, &body, "endset", NULL, NULL)) return LEAVE(st, NULL);
            st->p += 2;
            x->list = body.v;
            x->n = body.n;
        }
        if (!expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    } else if (tok_is(t, "if")) {
        st->p++;
        x = parse_if_stmt(st, pos);
        if (!x || !expect(st, JT_OPEN_STMT, "expected {% endif %}") || !expect_ident(st, "endif") ||
            !expect(st, JT_CLOSE_STMT, "expected '%}'"))
            return LEAVE(st, NULL);
    } else if (tok_is(t, "macro")) {
        st->p++;
        x = mk(st, JN_MACRO, pos);
        if (!x) return LEAVE(st, NULL);
        node *name = parse_primary(st);
        if (!name) return LEAVE(st, NULL);
        if (name->kind != JN_IDENT) {
            td_jinja_fail_at(st, name->pos, "expected identifier following macro statement");
            return LEAVE(st, NULL);
        }
        x->s = name->s;
        x->slen = name->slen;
        if (!parse_args(st, 1, &x->list, &x->n) || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        nvec body = {0};
        if (!parse_body_until(st, &body, "endmacro", NULL, NULL)) return LEAVE(st, NULL);
        x->list2 = body.v;
        x->n2 = body.n;
        st->p++;
        if (!expect_ident(st, "endmacro") || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        mark_special(x, x->list, x->n, x->list2, x->n2);
    } else if (tok_is(t, "for")) {
        st->p++;
        x = mk(st, JN_FOR, pos);
        if (!x || !(x->a = parse_expr_seq(st, 1))) return LEAVE(st, NULL);
        if (x->a->kind != JN_IDENT && x->a->kind != JN_TUPLE) {
            td_jinja_fail_at(st, x->a->pos, "expected identifier/tuple for the loop variable");
            return LEAVE(st, NULL);
        }
        if (!is_ident(st, "in")) {
            td_jinja_fail_at(st, cur_pos(st), "expected 'in' keyword following loop variable");
            return LEAVE(st, NULL);
        }
        st->p++;
        if (!(x->b = parse_expression(st)) || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        nvec body = {0}, alt = {0};
        if (!parse_body_until(st, &body, "endfor", "else", NULL)) return LEAVE(st, NULL);
        if (is_stmt(st, "else", NULL, NULL)) {
            st->p += 2;
            if (!expect(st, JT_CLOSE_STMT, "expected '%}'") || !parse_body_until(st, &alt, "endfor", NULL, NULL))
                return LEAVE(st, NULL);
        }
        x->list = body.v;
        x->n = body.n;
        x->list2 = alt.v;
        x->n2 = alt.n;
        st->p++;
        if (!expect_ident(st, "endfor") || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    } else if (tok_is(t, "call")) {
        st->p++;
        x = mk(st, JN_CALLSTMT, pos);
        if (!x) return LEAVE(st, NULL);
        node **params = NULL;
        size_t np = 0;
        if (is_t(st, JT_LPAREN)) {
            if (!parse_args(st, 1, &params, &np)) return LEAVE(st, NULL);
            x->op = 1;
        }
        node *callee = parse_primary(st);
        if (!callee) return LEAVE(st, NULL);
        if (callee->kind != JN_IDENT) {
            td_jinja_fail_at(st, callee->pos, "expected identifier following call statement");
            return LEAVE(st, NULL);
        }
        node *call = mk(st, JN_CALL, callee->pos);
        if (!call) return LEAVE(st, NULL);
        call->a = callee;
        if (!parse_args(st, 0, &call->list, &call->n) || !expect(st, JT_CLOSE_STMT, "expected '%}'"))
            return LEAVE(st, NULL);
        x->a = fin(st, call);
        nvec body = {0};
        if (!x->a || !parse_body_until(st, &body, "endcall", NULL, NULL)) return LEAVE(st, NULL);
        st->p++;
        if (!expect_ident(st, "endcall") || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        // params in list (caller parameters), body in list2
        x->list = params;
        x->n = np;
        x->list2 = body.v;
        x->n2 = body.n;
        mark_special(x, params, np, body.v, body.n);
    } else if (tok_is(t, "break") || tok_is(t, "continue")) {
        x = mk(st, tok_is(t, "break") ? JN_BREAK : JN_CONTINUE, pos);
        st->p++;
        if (!x || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
    } else if (tok_is(t, "filter")) {
        st->p++;
        x = mk(st, JN_FILTERSTMT, pos);
        if (!x) return LEAVE(st, NULL);
        node *f = parse_primary(st);
        if (f && f->kind == JN_IDENT && is_t(st, JT_LPAREN)) f = parse_call(st, f);
        if (!f || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        x->a = f;
        nvec body = {0};
        if (!parse_body_until(st, &body, "endfilter", NULL, NULL)) return LEAVE(st, NULL);
        st->p++;
        if (!expect_ident(st, "endfilter") || !expect(st, JT_CLOSE_STMT, "expected '%}'")) return LEAVE(st, NULL);
        x->list = body.v;
        x->n = body.n;
    } else {
        td_jinja_fail_at(st, t->pos, "unknown statement '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
        return LEAVE(st, NULL);
    }
    return LEAVE(st, fin(st, x));
}

static node *parse_any(jstate *st) {
    token *t = tk(st, 0);
    if (!t) {
        td_jinja_fail_at(st, st->orig_len, "unexpected end of template");
        return NULL;
    }
    switch (t->type) {
    case JT_COMMENT: {
        node *x = mk(st, JN_COMMENT, t->pos);
        st->p++;
        return x;
    }
    case JT_TEXT: {
        node *x = mk(st, JN_TEXT, t->pos);
        if (!x) return NULL;
        x->s = t->s;
        x->slen = t->len;
        st->p++;
        return x;
    }
    case JT_OPEN_STMT:
        return parse_statement(st);
    case JT_OPEN_EXPR: {
        st->p++;
        node *x = parse_expression(st);
        if (!x || !expect(st, JT_CLOSE_EXPR, "expected '}}'")) return NULL;
        return x;
    }
    default:
        td_jinja_fail_at(st, t->pos, "unexpected token '%.*s'", (int)(t->len > 20 ? 20 : t->len), t->s);
        return NULL;
    }
}

// ---------------------------------------------------------------------------------------------
// public: compile / free
td_status td_jinja_compile(const char *src, size_t len, td_jinja_template **out, td_err *err) {
    if (!out) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL output");
    *out = NULL;
    if (!src && len) return td_err_set(err, TD_ERR_INVALID, "chat template: NULL source");
    if (len > MAX_SOURCE) return td_err_set(err, TD_ERR_LIMIT, "chat template: source of %zu bytes exceeds %u", len, MAX_SOURCE);
    td_jinja_template *t = calloc(1, sizeof *t);
    if (!t) return td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    t->src = malloc(len + 1);
    if (!t->src) {
        free(t);
        return td_err_set(err, TD_ERR_NOMEM, "chat template: out of memory");
    }
    if (len) memcpy(t->src, src, len);
    t->src[len] = 0;
    t->src_len = len;

    td_status st_code = TD_OK;
    jstate st = {0};
    st.orig = t->src;
    st.orig_len = len;
    st.arena = &t->arena;
    st.err = err;
    if (td_jinja_lex(&st, t->src, len)) {
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
    if (st.failed) {
        td_jinja_free(t);
        return st_code;
    }
    *out = t;
    return TD_OK;
}

void td_jinja_free(td_jinja_template *t) {
    if (!t) return;
    td_jinja_arena_free(&t->arena);
    free(t->src);
    free(t);
}
