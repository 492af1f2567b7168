// Table-driven command-line parsing and the --help generated from the same table (base/opts.h).
#include "base/opts.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// Whether the space-separated list `list` holds the word s[0..n).
static bool in_list(const char *list, const char *s, size_t n) {
    if (!list) return false;
    for (const char *p = list; *p;) {
        while (*p == ' ') p++;
        const char *e = p;
        while (*e && *e != ' ') e++;
        if ((size_t)(e - p) == n && n && !memcmp(p, s, n)) return true;
        p = e;
    }
    return false;
}

static bool takes_value(const td_opt *o) {
    return o->kind == TD_OPT_FN ? o->takes_value : o->kind != TD_OPT_FLAG && o->kind != TD_OPT_SECTION;
}

bool td_opts_int(const char *prog, const char *name, const char *v, double lo, double hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (errno || end == v || *end || (double)x < lo || (double)x > hi) {
        fprintf(stderr, "%s: %s expects an integer in [%.0f, %.0f], got '%s'\n", prog, name, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

bool td_opts_float(const char *prog, const char *name, const char *v, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "%s: %s expects a number in [%g, %g], got '%s'\n", prog, name, lo, hi, v);
        return false;
    }
    *out = x;
    return true;
}

bool td_opts_bytes(const char *prog, const char *name, const char *v, size_t *out) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1024.0 * 1024, end++;
    else if (*end == 'G' || *end == 'g') mul = 1024.0 * 1024 * 1024, end++;
    if (*end == 'i' || *end == 'B') end++;
    if (*end == 'B') end++;
    if (errno || end == v || *end || !(x > 0) || x * mul > 1e15) {
        fprintf(stderr, "%s: %s expects a positive byte count (e.g. 268435456 or 256M), got '%s'\n", prog, name, v);
        return false;
    }
    *out = (size_t)(x * mul);
    return true;
}

static bool store(const td_opts *t, const td_opt *o, const char *name, const char *v) {
    switch (o->kind) {
    case TD_OPT_FLAG: *(bool *)o->dst = !o->negate; return true;
    case TD_OPT_STR: *(const char **)o->dst = v; return true;
    case TD_OPT_BYTES: return td_opts_bytes(t->prog, name, v, (size_t *)o->dst);
    case TD_OPT_FN: return o->fn(t->ctx, o, v);
    case TD_OPT_INT: {
        long long x;
        if (!td_opts_int(t->prog, name, v, o->lo, o->hi, &x)) return false;
        switch (o->size) {
        case 1: *(int8_t *)o->dst = (int8_t)x; break;
        case 2: *(int16_t *)o->dst = (int16_t)x; break;
        case 4: *(int32_t *)o->dst = (int32_t)x; break;
        default: *(int64_t *)o->dst = (int64_t)x; break;
        }
        return true;
    }
    case TD_OPT_FLOAT: {
        double x;
        if (!td_opts_float(t->prog, name, v, o->lo, o->hi, &x)) return false;
        if (o->size == sizeof(float)) *(float *)o->dst = (float)x;
        else *(double *)o->dst = x;
        return true;
    }
    case TD_OPT_CHOICE: {
        int idx = 0;
        for (const char *p = o->choices; *p; idx++) {
            while (*p == ' ') p++;
            const char *e = p;
            while (*e && *e != ' ') e++;
            if (e > p && strlen(v) == (size_t)(e - p) && !memcmp(p, v, (size_t)(e - p))) {
                *(int *)o->dst = idx;
                return true;
            }
            p = e;
        }
        fprintf(stderr, "%s: %s expects one of: %s; got '%s'\n", t->prog, name, o->choices, v);
        return false;
    }
    case TD_OPT_SECTION: break;
    }
    return false;
}

int td_opts_parse(const td_opts *t, int argc, char **argv, int *n_pos) {
    int np = 0;
    bool only_pos = false, any_short = false;
    for (int k = 0; k < t->n; k++) any_short |= t->opts[k].shorts != NULL;
    for (int i = 1; i < argc; i++) {
        char *a = argv[i];
        const bool dash_word = a[0] == '-' && a[1] && a[1] != '-' && strcmp(a, "-h") && !any_short;
        if (only_pos || a[0] != '-' || !a[1] || dash_word) {
            if (t->max_pos >= 0 && np >= t->max_pos) {
                fprintf(stderr, "%s: unexpected argument '%s' (see %s --help)\n", t->prog, a, t->prog);
                return -1;
            }
            argv[1 + np++] = a;  // never overtakes i: positionals only move towards the front
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            td_opts_help(t, stdout);
            return 0;
        }
        if (!strcmp(a, "--help-options")) {
            td_opts_help_json(t, stdout);
            return 0;
        }
        const bool is_long = a[1] == '-';
        const char *nm = a + (is_long ? 2 : 1);
        const char *eq = strchr(nm, '=');
        size_t len = eq ? (size_t)(eq - nm) : strlen(nm);
        const td_opt *o = NULL;
        for (int k = 0; k < t->n && !o; k++) {
            const td_opt *c = &t->opts[k];
            if (c->kind == TD_OPT_SECTION) continue;
            if (is_long ? (strlen(c->name) == len && !memcmp(c->name, nm, len)) || in_list(c->aliases, nm, len)
                        : in_list(c->shorts, nm, len))
                o = c;
        }
        char name[96];  // the option as written, without "=value"
        snprintf(name, sizeof name, "%.*s", (int)(len + (is_long ? 2 : 1)), a);
        if (!o) {
            fprintf(stderr, "%s: unknown option '%s' (see %s --help)\n", t->prog, name, t->prog);
            return -1;
        }
        const char *v = NULL;
        if (takes_value(o)) {
            if (eq) {
                v = eq + 1;
            } else if (i + 1 < argc) {
                v = argv[++i];
            } else {
                fprintf(stderr, "%s: %s needs a value%s%s\n", t->prog, name, o->metavar ? " " : "",
                        o->metavar ? o->metavar : "");
                return -1;
            }
        } else if (eq) {
            fprintf(stderr, "%s: %s takes no value, got '%s'\n", t->prog, name, a);
            return -1;
        }
        if (!store(t, o, name, v)) return -1;
        if (o->multi && !eq)
            while (i + 1 < argc && (argv[i + 1][0] != '-' || !argv[i + 1][1]))
                if (!store(t, o, name, argv[++i])) return -1;
        if (o->seen) *o->seen = true;
    }
    *n_pos = np;
    return 1;
}

// "--name, --alias, -s METAVAR" into buf.
static void left_column(const td_opt *o, char *buf, size_t cap) {
    size_t n = (size_t)snprintf(buf, cap, "--%s", o->name);
    const char *lists[2] = {o->aliases, o->shorts};
    for (int l = 0; l < 2; l++)
        for (const char *p = lists[l]; p && *p && n < cap;) {
            while (*p == ' ') p++;
            const char *e = p;
            while (*e && *e != ' ') e++;
            if (e > p) n += (size_t)snprintf(buf + n, cap - n, ", %s%.*s", l ? "-" : "--", (int)(e - p), p);
            p = e;
        }
    if (takes_value(o) && n < cap) snprintf(buf + n, cap - n, " %s", o->metavar ? o->metavar : "VALUE");
}

void td_opts_help(const td_opts *t, FILE *f) {
    if (t->usage) fputs(t->usage, f);
    enum { COL = 28 };
    for (int k = 0; k < t->n; k++) {
        const td_opt *o = &t->opts[k];
        if (o->kind == TD_OPT_SECTION) {
            fprintf(f, "%s\n", o->help);
            continue;
        }
        char left[256];
        left_column(o, left, sizeof left);
        fprintf(f, "  %s", left);
        int w = 2 + (int)strlen(left);
        const char *h = o->help ? o->help : "";
        if (w + 2 > COL) {
            fputc('\n', f);
            w = 0;
        }
        fprintf(f, "%*s", COL - w, "");
        for (const char *p = h; *p; p++) {
            fputc(*p, f);
            if (*p == '\n' && p[1]) fprintf(f, "%*s", COL, "");
        }
        fputc('\n', f);
    }
    if (t->epilog) fputs(t->epilog, f);
    if (t->epilog_fn) t->epilog_fn(f);
}

static void json_list(FILE *f, const char *list, const char *prefix) {
    fputc('[', f);
    bool first = true;
    for (const char *p = list; p && *p;) {
        while (*p == ' ') p++;
        const char *e = p;
        while (*e && *e != ' ') e++;
        if (e > p) fprintf(f, "%s\"%s%.*s\"", first ? "" : ", ", prefix, (int)(e - p), p), first = false;
        p = e;
    }
    fputc(']', f);
}

void td_opts_help_json(const td_opts *t, FILE *f) {
    static const char *kinds[] = {"section", "flag", "int", "float", "string", "bytes", "choice", "custom"};
    fputc('[', f);
    bool first = true;
    for (int k = 0; k < t->n; k++) {
        const td_opt *o = &t->opts[k];
        if (o->kind == TD_OPT_SECTION) continue;
        fprintf(f, "%s\n {\"name\": \"--%s\", \"aliases\": ", first ? "" : ",", o->name);
        json_list(f, o->aliases, "--");
        fputs(", \"shorts\": ", f);
        json_list(f, o->shorts, "-");
        fprintf(f, ", \"kind\": \"%s\", \"takes_value\": %s", kinds[o->kind], takes_value(o) ? "true" : "false");
        if (o->kind == TD_OPT_INT || o->kind == TD_OPT_FLOAT) fprintf(f, ", \"lo\": %.17g, \"hi\": %.17g", o->lo, o->hi);
        fputc('}', f);
        first = false;
    }
    fputs("\n]\n", f);
}
