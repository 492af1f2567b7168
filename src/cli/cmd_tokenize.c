// `tandem tokenize` and `tandem detokenize`: thin front ends over src/tokenizer/ for scripts and
// manual checks. Not a benchmark and not a REPL.
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/opts.h"
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

#define CLI_MAX_INPUT ((size_t)1 << 30)  // bytes

// Reads all of a stream into a malloc'd NUL-terminated buffer.
static char *read_stream(FILE *f, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        if (n + 1 == cap) {
            if (cap >= CLI_MAX_INPUT) break;
            char *q = realloc(p, cap * 2);
            if (!q) break;
            p = q, cap *= 2;
        }
        size_t r = fread(p + n, 1, cap - 1 - n, f);
        if (r == 0) {
            p[n] = 0;
            *len = n;
            return p;
        }
        n += r;
    }
    free(p);
    return NULL;
}

int td_cmd_tokenize(int argc, char **argv) {
    const char *path = NULL, *text = NULL, *file = NULL;
    bool json = false, no_special = false;
    const td_opt opts[] = {
        {TD_OPT_S("file", &file, "F", "encode the contents of file F (instead of TEXT or stdin)")},
        {TD_OPT_B("json", &json, "print {\"ids\": [...], \"tokens\": [...]} instead of ids")},
        {TD_OPT_B("no-special", &no_special, "do not add BOS/EOS (added tokens in the text are still matched)")},
    };
    const td_opts t = {.prog = "tandem tokenize",
                       .usage = "usage: tandem tokenize PATH [TEXT | --file F] [--json] [--no-special]\n"
                                "  PATH: model directory, tokenizer.json, tokenizer-only directory or .gguf\n"
                                "  TEXT is encoded as given; without TEXT or --file, stdin is read.\n"
                                "  Prints ids separated by spaces.\n",
                       .opts = opts,
                       .n = (int)(sizeof opts / sizeof opts[0]),
                       .max_pos = 2};
    int n_pos = 0, pr = td_opts_parse(&t, argc, argv, &n_pos);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    const bool special = !no_special;
    if (n_pos > 0) path = argv[1];
    if (n_pos > 1) text = argv[2];
    if (!path || (text && file)) return td_opts_help(&t, stderr), 2;
    td_err err = {0};
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        if (td_read_file(file, CLI_MAX_INPUT, &buf, &len, &err)) {
            fprintf(stderr, "tokenize: %s\n", err.msg);
            return 1;
        }
    } else if (text) {
        len = strlen(text);
    } else if (!(buf = read_stream(stdin, &len))) {
        fprintf(stderr, "tokenize: cannot read stdin\n");
        return 1;
    }
    td_tokenizer *tok;
    if (td_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        free(buf);
        return 1;
    }
    td_tokens ids = {0};
    int rc = 0;
    if (td_tokenizer_encode(tok, buf ? buf : text, len, special, &ids, &err)) {
        fprintf(stderr, "tokenize: %s\n", err.msg);
        rc = 1;
    } else if (json) {
        cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "ids"), *t = cJSON_AddArrayToObject(o, "tokens");
        char piece[1024];
        for (size_t i = 0; i < ids.n; i++) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(ids.ids[i]));
            td_tokenizer_id_to_piece(tok, ids.ids[i], piece, sizeof piece);
            cJSON_AddItemToArray(t, cJSON_CreateString(piece));
        }
        char *s = cJSON_PrintUnformatted(o);
        if (s) puts(s);
        else rc = 1;
        free(s);
        cJSON_Delete(o);
    } else {
        for (size_t i = 0; i < ids.n; i++) printf(i ? " %d" : "%d", ids.ids[i]);
        putchar('\n');
    }
    td_tokens_free(&ids);
    td_tokenizer_free(tok);
    free(buf);
    return rc;
}

// Appends the ids found in s (numbers separated by anything non-numeric, or JSON) to *v.
static int parse_ids(const char *s, int32_t **v, size_t *n, size_t *cap) {
    cJSON *j = cJSON_Parse(s);
    const cJSON *arr = cJSON_IsArray(j) ? j : cJSON_GetObjectItemCaseSensitive(j, "ids");
    if (j && !cJSON_IsArray(arr)) {
        cJSON_Delete(j);
        j = NULL, arr = NULL;
    }
    for (const char *p = s; !arr && *p;) {
        while (*p && (*p == ' ' || *p == ',' || *p == '\n' || *p == '\t' || *p == '\r' || *p == '[' || *p == ']')) p++;
        if (!*p) break;
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > INT32_MAX) return -1;
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 64;
            int32_t *q = realloc(*v, *cap * sizeof *q);
            if (!q) return -1;
            *v = q;
        }
        (*v)[(*n)++] = (int32_t)x;
        p = end;
    }
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > INT32_MAX) {
            cJSON_Delete(j);
            return -1;
        }
        if (*n == *cap) {
            *cap = *cap ? *cap * 2 : 64;
            int32_t *q = realloc(*v, *cap * sizeof *q);
            if (!q) {
                cJSON_Delete(j);
                return -1;
            }
            *v = q;
        }
        (*v)[(*n)++] = (int32_t)x->valuedouble;
    }
    cJSON_Delete(j);
    return 0;
}

int td_cmd_detokenize(int argc, char **argv) {
    const char *path = NULL;
    bool skip = false;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    bool any_arg_ids = false;
    bool json = false;
    const td_opt opts[] = {
        {TD_OPT_B("skip-special", &skip, "leave special tokens out of the text")},
        {TD_OPT_B("json", &json, "accepted for symmetry with tokenize: JSON on stdin is detected by content")},
    };
    const td_opts t = {.prog = "tandem detokenize",
                       .usage = "usage: tandem detokenize PATH [ID...] [--skip-special]\n"
                                "  Without IDs, reads ids from stdin: whitespace/comma separated, or JSON ([...] or {\"ids\": [...]}).\n"
                                "  Prints the decoded text exactly (no newline added).\n",
                       .opts = opts,
                       .n = (int)(sizeof opts / sizeof opts[0]),
                       .max_pos = -1};
    int n_pos = 0, pr = td_opts_parse(&t, argc, argv, &n_pos);
    if (pr <= 0) return pr == 0 ? 0 : 2;
    if (n_pos > 0) path = argv[1];
    for (int i = 2; i <= n_pos; i++) {
        any_arg_ids = true;
        if (parse_ids(argv[i], &ids, &n, &cap)) {
            fprintf(stderr, "detokenize: bad id list '%s'\n", argv[i]);
            free(ids);
            return 2;
        }
    }
    if (!path) return td_opts_help(&t, stderr), 2;
    if (!any_arg_ids) {
        size_t len;
        char *in = read_stream(stdin, &len);
        if (!in || parse_ids(in, &ids, &n, &cap)) {
            fprintf(stderr, "detokenize: cannot read ids from stdin\n");
            free(in), free(ids);
            return 2;
        }
        free(in);
    }
    td_err err = {0};
    td_tokenizer *tok;
    if (td_tokenizer_load(path, &tok, &err)) {
        fprintf(stderr, "detokenize: %s\n", err.msg);
        free(ids);
        return 1;
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= td_tokenizer_vocab_size(tok)) {
            fprintf(stderr, "detokenize: id %d out of range (vocabulary has %d)\n", ids[i], td_tokenizer_vocab_size(tok));
            rc = 1;
        }
    char *text = NULL;
    size_t len = 0;
    if (!rc && td_tokenizer_decode(tok, ids, n, skip, &text, &len, &err)) {
        fprintf(stderr, "detokenize: %s\n", err.msg);
        rc = 1;
    }
    if (!rc) fwrite(text, 1, len, stdout);
    free(text), free(ids);
    td_tokenizer_free(tok);
    return rc;
}
