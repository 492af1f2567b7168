// OpenAI request parsing/validation and small formatting helpers (see openai.h). Every field is checked
// for type and range with a message naming it; null is treated as absent, as the OpenAI clients send it.
// Unknown fields are ignored (as vLLM does). Nothing here talks to the engine or the network.
#include "grammar/grammar.h"
#include "server/openai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/stop.h"

td_api_limits td_api_default_limits(void) {
    return (td_api_limits){.max_n = 16, .max_prompts = 64, .max_logprobs = 20, .max_model_len = 0,
                           .vocab_size = 0, .max_prompt_ids = 1 << 20};
}

static const char *status_type(int status) {
    switch (status) {
    case 400: return "BadRequestError";
    case 404: return "NotFoundError";
    case 405: return "MethodNotAllowed";
    case 413: return "RequestEntityTooLarge";
    case 429: return "RateLimitError";
    case 501: return "NotImplementedError";
    case 503: return "ServiceUnavailableError";
    default: return status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

bool td_api_fail(td_api_error *e, int status, const char *param, const char *fmt, ...) {
    e->http_status = status;
    e->type = status_type(status);
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

char *td_api_error_json(const td_api_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_CreateObject();
    if (!root || !err) {
        cJSON_Delete(root);
        cJSON_Delete(err);
        return NULL;
    }
    cJSON_AddItemToObject(root, "error", err);
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : status_type(e->http_status));
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    cJSON_AddNumberToObject(err, "code", e->http_status);
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return s;
}

const char *td_finish_reason_str(td_finish_reason r) {
    switch (r) {
    case TD_FINISH_STOP: return "stop";
    case TD_FINISH_LENGTH: return "length";
    case TD_FINISH_ABORT: return "abort";
    default: return NULL;
    }
}

bool td_sse_append(td_srv_buf *out, const char *json, size_t len) {
    size_t old = out->len;
    if (td_srv_buf_append(out, "data: ", 6) && td_srv_buf_append(out, json, len) &&
        td_srv_buf_append(out, "\n\n", 2))
        return true;
    out->len = old;  // all or nothing
    return false;
}

bool td_sse_append_done(td_srv_buf *out) { return td_srv_buf_append(out, "data: [DONE]\n\n", 14); }

// ---- typed field access ------------------------------------------------------------------------

// The field, or NULL when absent or null.
static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, name);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static bool get_bool(const cJSON *obj, const char *name, bool *out, td_api_error *e) {
    const cJSON *it = field(obj, name);
    if (!it) return true;
    if (!cJSON_IsBool(it)) return td_api_fail(e, 400, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(it);
    return true;
}

static bool is_integer(const cJSON *it, double lo, double hi) {
    if (!cJSON_IsNumber(it)) return false;
    double v = it->valuedouble;
    return isfinite(v) && v == floor(v) && v >= lo && v <= hi;
}

static bool get_int(const cJSON *obj, const char *name, long lo, long hi, long *out, bool *given,
                    td_api_error *e) {
    const cJSON *it = field(obj, name);
    if (given) *given = it != NULL;
    if (!it) return true;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble != floor(it->valuedouble))
        return td_api_fail(e, 400, name, "'%s' must be an integer", name);
    if (it->valuedouble < (double)lo || it->valuedouble > (double)hi)
        return td_api_fail(e, 400, name, "'%s' must be in [%ld, %ld], got %.17g", name, lo, hi, it->valuedouble);
    *out = (long)it->valuedouble;
    return true;
}

// lo_open: lo itself is excluded.
static bool get_num(const cJSON *obj, const char *name, double lo, bool lo_open, double hi, float *out,
                    td_api_error *e) {
    const cJSON *it = field(obj, name);
    if (!it) return true;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble))
        return td_api_fail(e, 400, name, "'%s' must be a number", name);
    double v = it->valuedouble;
    if (v > hi || v < lo || (lo_open && v == lo))
        return td_api_fail(e, 400, name, "'%s' must be in %s%g, %g], got %g", name, lo_open ? "(" : "[", lo, hi, v);
    *out = (float)v;
    return true;
}

// ---- composite fields ----------------------------------------------------------------------------

static bool parse_ids(const cJSON *arr, const char *name, const td_api_limits *lim, td_srv_arena *a,
                      int32_t **out, int *n_out, td_api_error *e) {
    int n = cJSON_GetArraySize(arr);
    if (n > lim->max_prompt_ids) return td_api_fail(e, 400, name, "'%s' has %d token ids (at most %d)", name, n, lim->max_prompt_ids);
    int32_t *ids = td_srv_arena_alloc(a, sizeof(int32_t) * (size_t)(n ? n : 1));
    if (!ids) return td_api_fail(e, 500, NULL, "out of memory");
    int i = 0;
    double hi = lim->vocab_size > 0 ? lim->vocab_size - 1 : 2147483647.0;
    for (const cJSON *it = arr->child; it; it = it->next, i++) {
        if (!is_integer(it, 0, hi)) {
            if (cJSON_IsNumber(it) && isfinite(it->valuedouble) && it->valuedouble == floor(it->valuedouble))
                return td_api_fail(e, 400, name, "token id %.17g in '%s' is out of vocabulary (size %d)",
                                   it->valuedouble, name, lim->vocab_size);
            return td_api_fail(e, 400, name, "'%s' must hold integer token ids", name);
        }
        ids[i] = (int32_t)it->valuedouble;
    }
    *out = ids;
    *n_out = n;
    return true;
}

// "prompt" (completions) or "input" (embeddings): a string, an array of strings, an array of
// token ids or an array of token-id arrays, at most max_items prompts.
static bool parse_prompts(const cJSON *body, const char *name, int max_items, const td_api_limits *lim,
                          td_srv_arena *a, td_api_prompt **out, int *n_out, td_api_error *e) {
    const cJSON *p = field(body, name);
    if (!p) return td_api_fail(e, 400, name, "'%s' is required", name);
    if (cJSON_IsString(p)) {
        *out = td_srv_arena_calloc(a, 1, sizeof **out);
        if (!*out) return td_api_fail(e, 500, NULL, "out of memory");
        (*out)[0].text = p->valuestring;
        (*out)[0].text_len = strlen(p->valuestring);
        *n_out = 1;
        return true;
    }
    if (!cJSON_IsArray(p) || !p->child)
        return td_api_fail(e, 400, name, "'%s' must be a string, an array of strings, an array of token ids "
                                         "or an array of token-id arrays (non-empty)", name);
    if (cJSON_IsNumber(p->child)) {  // one token-array prompt
        *out = td_srv_arena_calloc(a, 1, sizeof **out);
        if (!*out) return td_api_fail(e, 500, NULL, "out of memory");
        int32_t *ids;
        if (!parse_ids(p, name, lim, a, &ids, &(*out)[0].n_ids, e)) return false;
        (*out)[0].ids = ids;
        *n_out = 1;
        return true;
    }
    int n = cJSON_GetArraySize(p);
    if (n > max_items) return td_api_fail(e, 400, name, "'%s' holds %d prompts (at most %d)", name, n, max_items);
    td_api_prompt *ps = td_srv_arena_calloc(a, (size_t)n, sizeof *ps);
    if (!ps) return td_api_fail(e, 500, NULL, "out of memory");
    bool strings = cJSON_IsString(p->child);
    int i = 0;
    for (const cJSON *it = p->child; it; it = it->next, i++) {
        if (strings && cJSON_IsString(it)) {
            ps[i].text = it->valuestring;
            ps[i].text_len = strlen(it->valuestring);
        } else if (!strings && cJSON_IsArray(it) && it->child) {
            int32_t *ids;
            if (!parse_ids(it, name, lim, a, &ids, &ps[i].n_ids, e)) return false;
            ps[i].ids = ids;
        } else {
            return td_api_fail(e, 400, name, "'%s' must not mix strings, token ids and token-id arrays "
                                             "(element %d), and token-id arrays must be non-empty", name, i);
        }
    }
    *out = ps;
    *n_out = n;
    return true;
}

static bool parse_prompt(const cJSON *body, const td_api_limits *lim, td_srv_arena *a, td_api_request *r,
                         td_api_error *e) {
    return parse_prompts(body, "prompt", lim->max_prompts, lim, a, &r->prompts, &r->n_prompts, e);
}

static bool parse_messages(const cJSON *body, td_api_request *r, td_api_error *e) {
    const cJSON *m = field(body, "messages");
    if (!m) return td_api_fail(e, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(m) || !m->child) return td_api_fail(e, 400, "messages", "'messages' must be a non-empty array");
    int i = 0;
    for (const cJSON *it = m->child; it; it = it->next, i++) {
        if (!cJSON_IsObject(it)) return td_api_fail(e, 400, "messages", "messages[%d] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsString(role)) return td_api_fail(e, 400, "messages", "messages[%d].role must be a string", i);
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (c && !cJSON_IsNull(c) && !cJSON_IsString(c) && !cJSON_IsArray(c))
            return td_api_fail(e, 400, "messages", "messages[%d].content must be a string, an array of parts or null", i);
        if (cJSON_IsArray(c))
            for (const cJSON *part = c->child; part; part = part->next) {
                const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
                if (!cJSON_IsObject(part) || !cJSON_IsString(type))
                    return td_api_fail(e, 400, "messages", "messages[%d].content parts must be objects with a 'type'", i);
                if (strcmp(type->valuestring, "text") != 0)
                    return td_api_fail(e, 400, "messages", "messages[%d]: content part type '%s' is not supported", i,
                                       type->valuestring);
                if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text")))
                    return td_api_fail(e, 400, "messages", "messages[%d]: a text part needs a string 'text'", i);
            }
    }
    r->messages = m;
    return true;
}

static bool parse_stop(const cJSON *body, td_srv_arena *a, td_gen_request *g, td_api_error *e) {
    const cJSON *s = field(body, "stop");
    if (!s) return true;
    if (cJSON_IsString(s)) {
        if (!s->valuestring[0]) return true;
        if (strlen(s->valuestring) > TD_STOP_MAX_LEN)
            return td_api_fail(e, 400, "stop", "'stop' strings are limited to %d bytes", TD_STOP_MAX_LEN);
        const char **arr = td_srv_arena_alloc(a, sizeof(char *));
        if (!arr) return td_api_fail(e, 500, NULL, "out of memory");
        arr[0] = s->valuestring;
        g->stop = arr;
        g->n_stop = 1;
        return true;
    }
    if (!cJSON_IsArray(s)) return td_api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
    int n = cJSON_GetArraySize(s);
    if (n > TD_STOP_MAX_STRINGS) return td_api_fail(e, 400, "stop", "'stop' holds %d strings (at most %d)", n, TD_STOP_MAX_STRINGS);
    const char **arr = td_srv_arena_alloc(a, sizeof(char *) * (size_t)(n ? n : 1));
    if (!arr) return td_api_fail(e, 500, NULL, "out of memory");
    int k = 0;
    for (const cJSON *it = s->child; it; it = it->next) {
        if (!cJSON_IsString(it)) return td_api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
        if (strlen(it->valuestring) > TD_STOP_MAX_LEN)
            return td_api_fail(e, 400, "stop", "'stop' strings are limited to %d bytes", TD_STOP_MAX_LEN);
        if (it->valuestring[0]) arr[k++] = it->valuestring;
    }
    g->stop = arr;
    g->n_stop = k;
    return true;
}

static bool parse_logit_bias(const cJSON *body, const td_api_limits *lim, td_srv_arena *a, td_gen_request *g,
                             td_api_error *e) {
    const cJSON *lb = field(body, "logit_bias");
    if (!lb) return true;
    if (!cJSON_IsObject(lb)) return td_api_fail(e, 400, "logit_bias", "'logit_bias' must be an object {token id: bias}");
    int n = cJSON_GetArraySize(lb);
    if (n > 1024) return td_api_fail(e, 400, "logit_bias", "'logit_bias' holds %d entries (at most 1024)", n);
    td_logit_bias_entry *arr = td_srv_arena_alloc(a, sizeof *arr * (size_t)(n ? n : 1));
    if (!arr) return td_api_fail(e, 500, NULL, "out of memory");
    int i = 0;
    for (const cJSON *it = lb->child; it; it = it->next, i++) {
        char *end;
        const char *k = it->string ? it->string : "";
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id > 2147483647L || (lim->vocab_size > 0 && id >= lim->vocab_size))
            return td_api_fail(e, 400, "logit_bias", "'logit_bias' key '%.40s' is not a token id in the vocabulary", k);
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 || it->valuedouble > 100)
            return td_api_fail(e, 400, "logit_bias", "'logit_bias' values must be numbers in [-100, 100]");
        arr[i].token = (int32_t)id;
        arr[i].bias = (float)it->valuedouble;
    }
    g->logit_bias = arr;
    g->n_logit_bias = n;
    return true;
}

static void delete_json(void *p) { cJSON_Delete(p); }

bool td_api_model_known(const td_api_limits *lim, const char *served_model, const char *name) {
    if (!name) return false;
    if (served_model && !strcmp(name, served_model)) return true;
    for (int i = 0; i < lim->n_model_aliases; i++)
        if (lim->model_aliases[i] && !strcmp(name, lim->model_aliases[i])) return true;
    return false;
}

// Structured output (docs/structured-output.md): OpenAI's response_format, vLLM's guided_json /
// guided_regex / guided_choice / guided_grammar, llama.cpp's grammar / json_schema. At most one;
// each becomes GBNF text (freed with the arena) for td_gen_request.grammar.
static void free_text(void *p) { free(p); }

static bool parse_structured(const cJSON *root, td_srv_arena *a, td_gen_request *g, td_api_error *e) {
    static const char *const keys[] = {"response_format", "guided_json", "guided_regex", "guided_choice",
                                       "guided_grammar", "grammar", "json_schema"};
    const char *used = NULL;
    const cJSON *val = NULL;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const cJSON *v = field(root, keys[i]);
        if (!v || cJSON_IsNull(v)) continue;
        if (i == 0) {  // {"type": "text"} constrains nothing
            const cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
            if (!cJSON_IsString(t))
                return td_api_fail(e, 400, "response_format", "'response_format' must be an object with a string 'type'");
            if (!strcmp(t->valuestring, "text")) continue;
        }
        if (used)
            return td_api_fail(e, 400, keys[i],
                               "'%s' and '%s' cannot be combined: give at most one structured-output constraint", used,
                               keys[i]);
        used = keys[i], val = v;
    }
    if (!used) return true;
    td_err err = {0};
    char *text = NULL;
    if (!strcmp(used, "response_format")) {
        const char *t = cJSON_GetObjectItemCaseSensitive(val, "type")->valuestring;
        if (!strcmp(t, "json_object")) {
            char *jv = td_gbnf_json_value("j-");
            size_t n = jv ? strlen(jv) + 32 : 0;
            if (jv && (text = malloc(n))) snprintf(text, n, "root ::= j-object\n%s", jv);
            free(jv);
        } else if (!strcmp(t, "json_schema")) {
            const cJSON *js = cJSON_GetObjectItemCaseSensitive(val, "json_schema");
            const cJSON *sc = cJSON_IsObject(js) ? cJSON_GetObjectItemCaseSensitive(js, "schema") : NULL;
            if (!sc)
                return td_api_fail(e, 400, "response_format",
                                   "response_format json_schema needs 'json_schema': {\"name\", \"schema\", \"strict\"}");
            text = td_gbnf_from_json_schema(sc, "", &err);
        } else {
            return td_api_fail(e, 400, "response_format",
                               "response_format type must be \"text\", \"json_object\" or \"json_schema\", got \"%s\"", t);
        }
    } else if (!strcmp(used, "guided_json") || !strcmp(used, "json_schema")) {
        cJSON *parsed = NULL;
        const cJSON *sc = val;
        if (cJSON_IsString(val)) {
            parsed = cJSON_Parse(val->valuestring);
            if (!parsed) return td_api_fail(e, 400, used, "'%s' is a string that is not JSON", used);
            sc = parsed;
        }
        text = td_gbnf_from_json_schema(sc, "", &err);
        cJSON_Delete(parsed);
    } else if (!strcmp(used, "guided_regex")) {
        if (!cJSON_IsString(val)) return td_api_fail(e, 400, used, "'guided_regex' must be a string");
        text = td_gbnf_from_regex(val->valuestring, "", &err);
    } else if (!strcmp(used, "guided_choice")) {
        int n = cJSON_IsArray(val) ? cJSON_GetArraySize(val) : 0;
        if (n < 1) return td_api_fail(e, 400, used, "'guided_choice' must be a non-empty array of strings");
        const char **ch = td_srv_arena_calloc(a, (size_t)n, sizeof *ch);
        if (!ch) return td_api_fail(e, 500, NULL, "out of memory");
        int i = 0;
        for (const cJSON *x = val->child; x; x = x->next, i++) {
            if (!cJSON_IsString(x)) return td_api_fail(e, 400, used, "'guided_choice' must be a non-empty array of strings");
            ch[i] = x->valuestring;
        }
        text = td_gbnf_from_choices(ch, n, "", &err);
    } else {  // guided_grammar, grammar: GBNF as given (the engine compiles it; errors become a 400)
        if (!cJSON_IsString(val)) return td_api_fail(e, 400, used, "'%s' must be a string of GBNF", used);
        g->grammar = val->valuestring;
        return true;
    }
    if (!text) return td_api_fail(e, 400, used, "%s", err.msg[0] ? err.msg : "out of memory");
    if (!td_srv_arena_cleanup(a, free_text, text)) {
        free(text);
        return td_api_fail(e, 500, NULL, "out of memory");
    }
    g->grammar = text;
    return true;
}

// One pass over the raw body, for what cJSON's tree loses: its strings end at a NUL, and its numbers
// are doubles (2^63 - 1 and 2^63 are the same double). Finds the first top-level member whose value
// holds a NUL character (a \u0000 escape or a raw NUL byte inside a string) and the literal of the
// top-level member `num_key` (the first one, as cJSON's lookup finds). Malformed JSON is left to
// cJSON: the scan only reads.
typedef struct body_scan {
    bool has_nul;
    char nul_key[64];       // the member's name (raw, cut at 63 bytes)
    const char *num;        // the literal of num_key's value, or NULL
    size_t num_len;
} body_scan;

static void scan_body(const char *b, size_t n, const char *num_key, body_scan *out) {
    memset(out, 0, sizeof *out);
    int depth = 0;
    bool in_str = false, is_key = false, expect_key = false;
    char key[64] = "", cur[64];
    size_t cur_len = 0;
    bool num_done = false;
    for (size_t i = 0; i < n; i++) {
        char ch = b[i];
        if (in_str) {
            bool nul = ch == 0;
            if (ch == '\\' && i + 1 < n) {
                nul = b[i + 1] == 'u' && i + 5 < n && !memcmp(b + i + 2, "0000", 4);
                if (is_key && cur_len < sizeof cur - 1) cur[cur_len++] = ch;
                ch = b[++i];
            } else if (ch == '"') {
                in_str = false;
                if (is_key) {
                    cur[cur_len] = 0;
                    memcpy(key, cur, cur_len + 1);
                }
                continue;
            }
            if (is_key && cur_len < sizeof cur - 1) cur[cur_len++] = ch;
            if (nul && !is_key && depth >= 1 && !out->has_nul) {
                out->has_nul = true;
                snprintf(out->nul_key, sizeof out->nul_key, "%s", key);
            }
            continue;
        }
        switch (ch) {
        case '"':
            in_str = true;
            is_key = depth == 1 && expect_key;
            cur_len = 0;
            expect_key = false;
            break;
        case '{':
        case '[':
            depth++;
            expect_key = depth == 1 && ch == '{';
            break;
        case '}':
        case ']': depth--; break;
        case ',': expect_key = depth == 1; break;
        case ':':
            if (depth == 1 && !num_done && num_key && !strcmp(key, num_key)) {
                size_t j = i + 1;
                while (j < n && (b[j] == ' ' || b[j] == '\t' || b[j] == '\r' || b[j] == '\n')) j++;
                size_t k = j;
                while (k < n && (b[k] == '-' || b[k] == '+' || b[k] == '.' || b[k] == 'e' || b[k] == 'E' ||
                                 (b[k] >= '0' && b[k] <= '9')))
                    k++;
                num_done = true;
                if (k > j) {
                    out->num = b + j;
                    out->num_len = k - j;
                }
            }
            break;
        default: break;
        }
    }
}

bool td_api_check_nul(const char *body, size_t len, td_api_error *e) {
    body_scan sc;
    scan_body(body, len, NULL, &sc);
    if (!sc.has_nul) return true;
    return td_api_fail(e, 400, sc.nul_key,
                       "'%s' contains a NUL character (U+0000), which prompts and strings cannot carry", sc.nul_key);
}

// The OpenAI seed is a signed 64-bit integer. A plain integer literal converts exactly (strtoll, so
// 2^63 - 1 is accepted and 2^63 refused); any other number (1e3, 5.0) must be integral and inside
// [-2^63, 2^63) as a double before it is converted.
static bool parse_seed(const cJSON *seed, const body_scan *sc, uint64_t *out, td_api_error *e) {
    if (!cJSON_IsNumber(seed)) return td_api_fail(e, 400, "seed", "'seed' must be an integer");
    bool plain = sc->num && sc->num_len < 32;
    for (size_t i = 0; plain && i < sc->num_len; i++)
        plain = (sc->num[i] >= '0' && sc->num[i] <= '9') || (i == 0 && sc->num[i] == '-');
    if (plain) {
        char lit[32];
        memcpy(lit, sc->num, sc->num_len);
        lit[sc->num_len] = 0;
        errno = 0;
        long long v = strtoll(lit, NULL, 10);
        if (errno == ERANGE)
            return td_api_fail(e, 400, "seed", "'seed' must be an integer in [-2^63, 2^63 - 1] (got %s)", lit);
        *out = (uint64_t)(int64_t)v;
        return true;
    }
    double v = seed->valuedouble;
    if (!isfinite(v) || v != floor(v)) return td_api_fail(e, 400, "seed", "'seed' must be an integer");
    if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
        return td_api_fail(e, 400, "seed", "'seed' must be an integer in [-2^63, 2^63 - 1] (got %g)", v);
    *out = (uint64_t)(int64_t)v;
    return true;
}

bool td_api_parse(td_api_kind kind, const char *body, size_t len, const td_api_limits *lim,
                  const char *served_model, td_srv_arena *a, td_api_request *r, td_api_error *e) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        if (!td_api_check_nul(body, len, e)) return false;  // a raw NUL byte: name its member
        return td_api_fail(e, 400, NULL, "the request body is not valid JSON");
    }
    if (!td_srv_arena_cleanup(a, delete_json, root)) {
        cJSON_Delete(root);
        return td_api_fail(e, 500, NULL, "out of memory");
    }
    r->body = root;
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n' && *p != 0)
            return td_api_fail(e, 400, NULL, "the request body is not valid JSON (trailing data)");
    if (!cJSON_IsObject(root)) return td_api_fail(e, 400, NULL, "the request body must be a JSON object");
    if (!td_api_check_nul(body, len, e)) return false;  // cJSON's strings would end at the NUL

    const cJSON *model = field(root, "model");
    if (model) {
        if (!cJSON_IsString(model)) return td_api_fail(e, 400, "model", "'model' must be a string");
        r->model = model->valuestring;
        if (served_model && !td_api_model_known(lim, served_model, model->valuestring))
            return td_api_fail(e, 404, "model", "The model `%.200s` does not exist.", model->valuestring);
    }

    td_gen_request *g = &r->gen;
    g->model = r->model ? r->model : served_model;
    g->n = 1;
    g->temperature = 1.0f;
    g->top_p = 1.0f;
    g->top_k = 0;
    g->min_p = 0.0f;
    g->repetition_penalty = 1.0f;
    g->logprobs = -1;
    g->prompt_logprobs = -1;

    if (kind == TD_API_COMPLETIONS) {
        if (!parse_prompt(root, lim, a, r, e)) return false;
        if (field(root, "suffix")) return td_api_fail(e, 400, "suffix", "'suffix' is not supported");
        r->add_special_tokens = true;
    } else {
        if (!parse_messages(root, r, e)) return false;
        r->add_generation_prompt = true;
        if (!get_bool(root, "add_generation_prompt", &r->add_generation_prompt, e)) return false;
        r->add_special_tokens = false;
    }
    if (!get_bool(root, "add_special_tokens", &r->add_special_tokens, e)) return false;

    long v;
    bool given;
    long max_len = lim->max_model_len > 0 ? lim->max_model_len : 2147483647L;
    // max_completion_tokens (OpenAI's newer name) wins over max_tokens on both endpoints, as vLLM's
    // chat route does (max_completion_tokens or max_tokens)
    const cJSON *mct = field(root, "max_completion_tokens");
    if (mct && !cJSON_IsNull(mct)) {
        if (!get_int(root, "max_completion_tokens", 1, max_len, &v, &given, e)) return false;
    } else {
        if (!get_int(root, "max_tokens", 1, max_len, &v, &given, e)) return false;
    }
    r->has_max_tokens = given;
    g->max_tokens = given ? (int)v : 0;
    if (!get_int(root, "n", 1, lim->max_n, &v, &given, e)) return false;
    if (given) g->n = (int)v;
    if (!get_int(root, "best_of", 1, lim->max_n, &v, &given, e)) return false;
    if (given && v != g->n) return td_api_fail(e, 400, "best_of", "'best_of' different from 'n' is not supported");
    if (!get_num(root, "temperature", 0, false, 2, &g->temperature, e)) return false;
    if (!get_num(root, "top_p", 0, true, 1, &g->top_p, e)) return false;
    if (!get_int(root, "top_k", -1, 1 << 30, &v, &given, e)) return false;
    if (given) g->top_k = v <= 0 ? 0 : (int)v;
    if (!get_num(root, "min_p", 0, false, 1, &g->min_p, e)) return false;
    if (!get_num(root, "repetition_penalty", 0, true, 2, &g->repetition_penalty, e)) return false;
    if (!get_num(root, "presence_penalty", -2, false, 2, &g->presence_penalty, e)) return false;
    if (!get_num(root, "frequency_penalty", -2, false, 2, &g->frequency_penalty, e)) return false;
    if (!parse_logit_bias(root, lim, a, g, e)) return false;
    const cJSON *seed = field(root, "seed");
    if (seed) {
        body_scan sc;
        scan_body(body, len, "seed", &sc);
        if (!parse_seed(seed, &sc, &g->seed, e)) return false;
        g->has_seed = true;
    }
    if (!parse_stop(root, a, g, e)) return false;
    const cJSON *sti = field(root, "stop_token_ids");
    if (sti) {
        if (!cJSON_IsArray(sti)) return td_api_fail(e, 400, "stop_token_ids", "'stop_token_ids' must be an array of token ids");
        int32_t *ids;
        if (!parse_ids(sti, "stop_token_ids", lim, a, &ids, &g->n_stop_token_ids, e)) return false;
        g->stop_token_ids = ids;
    }
    if (!get_bool(root, "ignore_eos", &g->ignore_eos, e)) return false;
    if (!get_bool(root, "stream", &g->stream, e)) return false;
    const cJSON *so = field(root, "stream_options");
    if (so) {
        if (!cJSON_IsObject(so)) return td_api_fail(e, 400, "stream_options", "'stream_options' must be an object");
        if (!g->stream) return td_api_fail(e, 400, "stream_options", "'stream_options' can only be set when 'stream' is true");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) {
            snprintf(e->param, sizeof e->param, "stream_options.include_usage");
            return false;
        }
    }
    if (!parse_structured(root, a, g, e)) return false;

    // Which distribution logprobs describe (vLLM's --logprobs-mode, per request here): the model's
    // (raw) or the processed one the sampler drew from (RL behaviour logprobs).
    g->logprobs_processed = lim->default_logprobs_processed;
    const cJSON *lm = field(root, "logprobs_mode");
    if (lm) {
        const char *m = cJSON_IsString(lm) ? lm->valuestring : NULL;
        if (m && (!strcmp(m, "raw") || !strcmp(m, "raw_logprobs")))
            g->logprobs_processed = false;
        else if (m && (!strcmp(m, "processed") || !strcmp(m, "processed_logprobs")))
            g->logprobs_processed = true;
        else
            return td_api_fail(e, 400, "logprobs_mode",
                               "'logprobs_mode' must be \"raw\" or \"processed\" (or \"raw_logprobs\", "
                               "\"processed_logprobs\")");
    }
    if (!get_bool(root, "return_token_ids", &r->return_token_ids, e)) return false;

    if (kind == TD_API_COMPLETIONS) {
        if (!get_bool(root, "echo", &g->echo, e)) return false;
        if (!get_int(root, "logprobs", 0, lim->max_logprobs, &v, &given, e)) return false;
        if (given) g->logprobs = (int)v;
        if (g->echo && g->logprobs >= 0) g->prompt_logprobs = g->logprobs;
    } else {
        if (!get_bool(root, "logprobs", &r->chat_logprobs, e)) return false;
        if (!get_int(root, "top_logprobs", 0, lim->max_logprobs, &v, &given, e)) return false;
        if (given && !r->chat_logprobs)
            return td_api_fail(e, 400, "top_logprobs", "'top_logprobs' requires 'logprobs' to be true");
        if (r->chat_logprobs) g->logprobs = given ? (int)v : 0;
    }
    return true;
}

// ---- embeddings -----------------------------------------------------------------------------------

bool td_api_parse_embeddings(const char *body, size_t len, const td_api_limits *lim, const char *served_model,
                             td_srv_arena *a, td_api_embed_request *r, td_api_error *e) {
    memset(r, 0, sizeof *r);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        if (!td_api_check_nul(body, len, e)) return false;
        return td_api_fail(e, 400, NULL, "the request body is not valid JSON");
    }
    if (!td_srv_arena_cleanup(a, delete_json, root)) {
        cJSON_Delete(root);
        return td_api_fail(e, 500, NULL, "out of memory");
    }
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n' && *p != 0)
            return td_api_fail(e, 400, NULL, "the request body is not valid JSON (trailing data)");
    if (!cJSON_IsObject(root)) return td_api_fail(e, 400, NULL, "the request body must be a JSON object");
    if (!td_api_check_nul(body, len, e)) return false;
    const cJSON *model = field(root, "model");
    if (model) {
        if (!cJSON_IsString(model)) return td_api_fail(e, 400, "model", "'model' must be a string");
        r->model = model->valuestring;
        if (served_model && !td_api_model_known(lim, served_model, model->valuestring))
            return td_api_fail(e, 404, "model", "The model `%.200s` does not exist.", model->valuestring);
    }
    if (!parse_prompts(root, "input", TD_API_MAX_EMBED_INPUTS, lim, a, &r->inputs, &r->n_inputs, e)) return false;
    for (int i = 0; i < r->n_inputs; i++)
        if (r->inputs[i].text && r->inputs[i].text_len == 0)
            return td_api_fail(e, 400, "input", "'input' must not hold an empty string (element %d)", i);
    const cJSON *fmt = field(root, "encoding_format");
    if (fmt) {
        if (!cJSON_IsString(fmt) || (strcmp(fmt->valuestring, "float") && strcmp(fmt->valuestring, "base64")))
            return td_api_fail(e, 400, "encoding_format", "'encoding_format' must be \"float\" or \"base64\"");
        r->base64 = !strcmp(fmt->valuestring, "base64");
    }
    long v;
    bool given;
    if (!get_int(root, "dimensions", 1, 1 << 20, &v, &given, e)) return false;
    r->dimensions = given ? (int)v : 0;
    r->add_special_tokens = true;
    if (!get_bool(root, "add_special_tokens", &r->add_special_tokens, e)) return false;
    const cJSON *user = field(root, "user");  // accepted and ignored, as vLLM
    if (user && !cJSON_IsString(user)) return td_api_fail(e, 400, "user", "'user' must be a string");
    return true;
}

// RFC 4648 base64 of n bytes into out (4 * ((n + 2) / 3) bytes, then a NUL).
void td_api_base64(const void *src, size_t n, char *out) {
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const unsigned char *p = src;
    size_t o = 0, i = 0;
    for (; i + 2 < n; i += 3) {
        const unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        out[o++] = tab[v >> 18], out[o++] = tab[(v >> 12) & 63], out[o++] = tab[(v >> 6) & 63], out[o++] = tab[v & 63];
    }
    if (i < n) {
        const unsigned v = (unsigned)p[i] << 16 | (i + 1 < n ? (unsigned)p[i + 1] << 8 : 0);
        out[o++] = tab[v >> 18], out[o++] = tab[(v >> 12) & 63];
        out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
        out[o++] = '=';
    }
    out[o] = 0;
}
