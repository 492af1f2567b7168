// Strict parsing of numeric (and KV dtype) command-line values.
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include "cli/cli.h"

int td_arg_int(const char *name, const char *v, long lo, long hi, long *out) {
    if (!v) {
        fprintf(stderr, "tandem: %s needs a value\n", name);
        return 0;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < lo || x > hi) {
        fprintf(stderr, "tandem: %s expects an integer in [%ld, %ld], got '%s'\n", name, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int td_arg_float(const char *name, const char *v, double lo, double hi, double *out) {
    if (!v) {
        fprintf(stderr, "tandem: %s needs a value\n", name);
        return 0;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "tandem: %s expects a number in [%g, %g], got '%s'\n", name, lo, hi, v);
        return 0;
    }
    *out = x;
    return 1;
}

int td_arg_kv_dtype(const char *name, const char *v, td_dtype *out) {
    if (!v) {
        fprintf(stderr, "tandem: %s needs a value\n", name);
        return 0;
    }
    if (!strcasecmp(v, "auto") || !strcasecmp(v, "f32")) {
        *out = TD_F32;
    } else if (!strcasecmp(v, "f16")) {
        *out = TD_F16;
    } else if (!strcasecmp(v, "bf16")) {
        *out = TD_BF16;
    } else {
        fprintf(stderr, "tandem: %s expects auto, f32, f16 or bf16, got '%s'\n", name, v);
        return 0;
    }
    return 1;
}

long td_arg_ids(const char *v, int **out) {
    *out = NULL;
    long n = 0, cap = 0;
    const char *p = v;
    for (;;) {
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (errno || end == p || x < 0 || x > 0x7fffffff || (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\t')) {
            free(*out);
            *out = NULL;
            return -1;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 64;
            int *nb = realloc(*out, (size_t)cap * sizeof(int));
            if (!nb) {
                free(*out);
                *out = NULL;
                return -1;
            }
            *out = nb;
        }
        (*out)[n++] = (int)x;
        p = end;
    }
    return n;
}
