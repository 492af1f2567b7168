// Tool calling: request validation, tool-call history for the templates, and the hermes / llama3_json
// output scanners (see tools.h). The scanners look only at the text; they do not know tokens, so a
// call split across any number of tokens is found the same way as one that arrives whole.
#include "server/tools.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "grammar/grammar.h"
#include "server/srv_mem.h"

static const cJSON *field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return v && !cJSON_IsNull(v) ? v : NULL;
}

bool td_tools_parse(const cJSON *body, td_tools_request *out, td_api_error *e) {
    *out = (td_tools_request){.parallel = true};
    const cJSON *tools = field(body, "tools");
    if (tools) {
        if (!cJSON_IsArray(tools)) return td_api_fail(e, 400, "tools", "'tools' must be an array");
        int i = 0;
        for (const cJSON *t = tools->child; t; t = t->next, i++) {
            if (!cJSON_IsObject(t)) return td_api_fail(e, 400, "tools", "tools[%d] must be an object", i);
            const cJSON *type = field(t, "type");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0)
                return td_api_fail(e, 400, "tools", "tools[%d].type must be \"function\"", i);
            const cJSON *f = field(t, "function");
            if (!cJSON_IsObject(f)) return td_api_fail(e, 400, "tools", "tools[%d].function must be an object", i);
            const cJSON *name = field(f, "name");
            if (!cJSON_IsString(name) || !name->valuestring[0])
                return td_api_fail(e, 400, "tools", "tools[%d].function.name must be a non-empty string", i);
            const cJSON *d = field(f, "description");
            if (d && !cJSON_IsString(d))
                return td_api_fail(e, 400, "tools", "tools[%d].function.description must be a string", i);
            const cJSON *p = field(f, "parameters");
            if (p && !cJSON_IsObject(p))
                return td_api_fail(e, 400, "tools", "tools[%d].function.parameters must be a JSON schema object", i);
            for (const cJSON *u = tools->child; u != t; u = u->next)
                if (!strcmp(field(field(u, "function"), "name")->valuestring, name->valuestring))
                    return td_api_fail(e, 400, "tools", "tools[%d]: function '%.100s' is defined twice", i,
                                       name->valuestring);
        }
        if (i > 0) {
            out->tools = tools;
            out->n_tools = i;
        }
    }
    const cJSON *pc = field(body, "parallel_tool_calls");
    if (pc) {
        if (!cJSON_IsBool(pc)) return td_api_fail(e, 400, "parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
        out->parallel = cJSON_IsTrue(pc);
    }
    const cJSON *tc = field(body, "tool_choice");
    out->choice = out->n_tools ? TD_TOOL_CHOICE_AUTO : TD_TOOL_CHOICE_NONE;
    if (!tc) return true;
    if (cJSON_IsString(tc)) {
        const char *s = tc->valuestring;
        if (!strcmp(s, "none")) {
            out->choice = TD_TOOL_CHOICE_NONE;
            return true;
        }
        if (!strcmp(s, "auto")) return true;
        if (strcmp(s, "required") != 0)
            return td_api_fail(e, 400, "tool_choice",
                               "'tool_choice' must be \"none\", \"auto\", \"required\" or a named function, not \"%.60s\"", s);
        if (!out->n_tools) return td_api_fail(e, 400, "tool_choice", "tool_choice \"required\" needs a non-empty 'tools'");
        out->choice = TD_TOOL_CHOICE_REQUIRED;
        return true;
    }
    if (!cJSON_IsObject(tc))
        return td_api_fail(e, 400, "tool_choice", "'tool_choice' must be a string or {\"type\": \"function\", ...}");
    const cJSON *type = field(tc, "type");
    const cJSON *name = field(field(tc, "function"), "name");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") != 0 || !cJSON_IsString(name))
        return td_api_fail(e, 400, "tool_choice",
                           "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": \"...\"}}");
    if (!out->n_tools) return td_api_fail(e, 400, "tool_choice", "a named tool_choice needs a non-empty 'tools'");
    out->named = name->valuestring;
    out->choice = TD_TOOL_CHOICE_NAMED;
    if (!td_tools_find(out, out->named))
        return td_api_fail(e, 400, "tool_choice", "tool_choice names function '%.100s', which is not in 'tools'", out->named);
    return true;
}

const cJSON *td_tools_find(const td_tools_request *t, const char *name) {
    if (!t->tools || !name) return NULL;
    for (const cJSON *u = t->tools->child; u; u = u->next) {
        const cJSON *f = field(u, "function");
        const cJSON *n = field(f, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return f;
    }
    return NULL;
}

bool td_tool_parser_name_ok(const char *flag) {
    return !flag || !strcmp(flag, "auto") || !strcmp(flag, "hermes") || !strcmp(flag, "llama3_json") ||
           !strcmp(flag, "none");
}

static bool contains(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return true;
    return false;
}

td_tool_parser td_tool_parser_choose(const char *flag, const char *prompt, size_t prompt_len) {
    if (flag && !strcmp(flag, "none")) return TD_TOOL_PARSER_NONE;
    if (flag && !strcmp(flag, "hermes")) return TD_TOOL_PARSER_HERMES;
    if (flag && !strcmp(flag, "llama3_json")) return TD_TOOL_PARSER_LLAMA3_JSON;
    if (!prompt) return TD_TOOL_PARSER_NONE;
    if (contains(prompt, prompt_len, "<tool_call>")) return TD_TOOL_PARSER_HERMES;
    if (contains(prompt, prompt_len, "<|python_tag|>") || contains(prompt, prompt_len, "\"parameters\": dictionary"))
        return TD_TOOL_PARSER_LLAMA3_JSON;
    return TD_TOOL_PARSER_NONE;
}

cJSON *td_tools_render_messages(const cJSON *messages) {
    bool need = false;
    for (const cJSON *m = messages ? messages->child : NULL; m && !need; m = m->next) {
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "content"))) need = true;
        const cJSON *calls = field(m, "tool_calls");
        for (const cJSON *c = cJSON_IsArray(calls) ? calls->child : NULL; c; c = c->next)
            if (cJSON_IsString(field(field(c, "function"), "arguments"))) need = true;
    }
    if (!need) return NULL;
    cJSON *copy = cJSON_Duplicate(messages, 1);
    if (!copy) return NULL;
    for (cJSON *m = copy->child; m; m = m->next) {
        if (cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(m, "content")))
            cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(""));
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        for (cJSON *c = cJSON_IsArray(calls) ? calls->child : NULL; c; c = c->next) {
            cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
            cJSON *a = f ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
            if (!cJSON_IsString(a)) continue;
            cJSON *parsed = cJSON_Parse(a->valuestring);
            // Not a JSON object: left as the string (the template then renders what it was given).
            if (cJSON_IsObject(parsed))
                cJSON_ReplaceItemInObjectCaseSensitive(f, "arguments", parsed);
            else
                cJSON_Delete(parsed);
        }
    }
    return copy;
}

// ---- scanning -----------------------------------------------------------------------------------------

static const char HERMES_OPEN[] = "<tool_call>";
static const char HERMES_CLOSE[] = "</tool_call>";
static const char PYTHON_TAG[] = "<|python_tag|>";

enum { L3_UNDECIDED, L3_CALLS, L3_CONTENT };

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static bool all_ws(const char *s, size_t a, size_t b) {
    for (size_t i = a; i < b; i++)
        if (!is_ws(s[i])) return false;
    return true;
}

static const char *find(const char *s, size_t from, size_t len, const char *needle) {
    size_t k = strlen(needle);
    for (size_t i = from; i + k <= len; i++)
        if (s[i] == needle[0] && !memcmp(s + i, needle, k)) return s + i;
    return NULL;
}

// Longest suffix of s[from, len) that is a proper prefix of needle (text that may still begin it).
static size_t partial_suffix(const char *s, size_t from, size_t len, const char *needle) {
    size_t k = strlen(needle);
    for (size_t m = k - 1; m > 0; m--)
        if (m <= len - from && !memcmp(s + len - m, needle, m)) return m;
    return 0;
}

// Parses text[a, b) as {"name": string, key: object} (key "arguments", or for llama3 also
// "parameters"); on success stores the strings in s and returns true.
static bool parse_call(td_tool_scan *s, const char *text, size_t a, size_t b, bool llama) {
    cJSON *j = cJSON_ParseWithLength(text + a, b - a);
    bool ok = false;
    if (cJSON_IsObject(j)) {
        const cJSON *name = field(j, "name");
        const cJSON *args = field(j, llama ? "parameters" : "arguments");
        if (!args) args = field(j, llama ? "arguments" : "parameters");
        cJSON *sargs = NULL;
        if (cJSON_IsString(args)) {  // arguments given as a JSON string
            sargs = cJSON_Parse(args->valuestring);
            args = sargs;
        }
        if (cJSON_IsString(name) && name->valuestring[0] && cJSON_IsObject(args)) {
            char *ps = cJSON_PrintUnformatted(args);
            char *pn = strdup(name->valuestring);
            if (ps && pn) {
                free(s->name);
                free(s->args);
                s->name = pn;
                s->args = ps;
                ok = true;
            } else {
                free(ps);
                free(pn);
            }
        }
        cJSON_Delete(sargs);
    }
    cJSON_Delete(j);
    return ok;
}

static void emit_content(td_tool_scan *s, size_t a, size_t b, td_tool_seg_fn fn, void *ctx) {
    if (b <= a) return;
    s->pos = b;
    s->after_call = false;
    td_tool_seg g = {.kind = TD_TOOL_SEG_CONTENT, .start = a, .end = b};
    fn(ctx, &g);
}

static void emit_call(td_tool_scan *s, size_t end, td_tool_seg_fn fn, void *ctx) {
    s->pos = end;
    s->n_calls++;
    s->after_call = true;
    td_tool_seg g = {.kind = TD_TOOL_SEG_CALL, .name = s->name, .arguments = s->args};
    fn(ctx, &g);
}

// Content after a call: whitespace-only runs are dropped (the newlines between <tool_call> blocks).
static void emit_text(td_tool_scan *s, const char *text, size_t a, size_t b, td_tool_seg_fn fn, void *ctx) {
    if (b <= a) return;
    if (s->after_call && all_ws(text, a, b)) {
        s->pos = b;
        return;
    }
    emit_content(s, a, b, fn, ctx);
}

static void feed_hermes(td_tool_scan *s, const char *text, size_t len, bool final, td_tool_seg_fn fn, void *ctx) {
    while (s->pos < len) {
        const char *open = find(text, s->pos, len, HERMES_OPEN);
        if (!open) {
            size_t hold = final ? 0 : partial_suffix(text, s->pos, len, HERMES_OPEN);
            // After a call, trailing whitespace may precede another call: hold it until decided.
            if (!final && s->after_call && all_ws(text, s->pos, len - hold)) return;
            emit_text(s, text, s->pos, len - hold, fn, ctx);
            return;
        }
        size_t o = (size_t)(open - text);
        if (o > s->pos) {
            emit_text(s, text, s->pos, o, fn, ctx);
            continue;
        }
        const char *close = find(text, o + sizeof HERMES_OPEN - 1, len, HERMES_CLOSE);
        if (!close) {
            if (final) emit_content(s, o, len, fn, ctx);  // never closed: stays content
            return;
        }
        size_t end = (size_t)(close - text) + sizeof HERMES_CLOSE - 1;
        if (parse_call(s, text, o + sizeof HERMES_OPEN - 1, (size_t)(close - text), false))
            emit_call(s, end, fn, ctx);
        else
            emit_content(s, o, end, fn, ctx);
    }
}

// End (one past the closing brace) of the JSON object starting at text[a] == '{', or 0 if not complete.
static size_t object_end(const char *text, size_t a, size_t len) {
    int depth = 0;
    bool str = false, esc = false;
    for (size_t i = a; i < len; i++) {
        char c = text[i];
        if (str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"')
                str = false;
        } else if (c == '"') {
            str = true;
        } else if (c == '{') {
            depth++;
        } else if (c == '}') {
            if (--depth == 0) return i + 1;
        }
    }
    return 0;
}

static void feed_llama3(td_tool_scan *s, const char *text, size_t len, bool final, td_tool_seg_fn fn, void *ctx) {
    if (s->mode == L3_UNDECIDED) {
        size_t i = s->pos;
        while (i < len && is_ws(text[i])) i++;
        size_t rest = len - i, k = sizeof PYTHON_TAG - 1;
        if (rest >= k && !memcmp(text + i, PYTHON_TAG, k)) {
            s->mode = L3_CALLS;
            s->mode_from = s->pos;
            s->pos = i + k;
        } else if (rest > 0 && text[i] == '{') {
            s->mode = L3_CALLS;
            s->mode_from = s->pos;
            s->pos = i;
        } else if (!final && (rest == 0 || !memcmp(text + i, PYTHON_TAG, rest < k ? rest : k))) {
            return;  // only whitespace or a partial tag so far
        } else {
            s->mode = L3_CONTENT;
        }
    }
    while (s->mode == L3_CALLS) {
        size_t i = s->pos;
        while (i < len && (is_ws(text[i]) || (s->n_calls > 0 && text[i] == ';'))) i++;
        if (i >= len) {
            if (final) s->pos = len;
            return;
        }
        if (text[i] != '{') {  // something else after the calls: the rest is content
            s->mode = L3_CONTENT;
            if (!s->n_calls) s->pos = s->mode_from;
            break;
        }
        size_t end = object_end(text, i, len);
        if (!end) {
            if (final) {
                s->mode = L3_CONTENT;
                if (!s->n_calls) s->pos = s->mode_from;
                break;
            }
            return;
        }
        if (!parse_call(s, text, i, end, true)) {
            s->mode = L3_CONTENT;
            if (!s->n_calls) s->pos = s->mode_from;
            break;
        }
        emit_call(s, end, fn, ctx);
    }
    if (s->mode == L3_CONTENT) emit_content(s, s->pos, len, fn, ctx);
}

void td_tool_scan_feed(td_tool_scan *s, const char *text, size_t len, bool final, td_tool_seg_fn fn, void *ctx) {
    switch (s->parser) {
    case TD_TOOL_PARSER_HERMES: feed_hermes(s, text, len, final, fn, ctx); break;
    case TD_TOOL_PARSER_LLAMA3_JSON: feed_llama3(s, text, len, final, fn, ctx); break;
    default: emit_content(s, s->pos, len, fn, ctx); break;
    }
}

void td_tool_scan_free(td_tool_scan *s) {
    free(s->name);
    free(s->args);
    s->name = s->args = NULL;
}

// call_ + 24 alphanumerics from a xorshift generator seeded once per thread from the clock.
static void random_id(char *out, size_t cap) {
    static _Thread_local uint64_t x;
    if (!x) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)(uintptr_t)&x;
        if (!x) x = 0x9e3779b97f4a7c15u;
    }
    static const char al[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    size_t n = snprintf(out, cap, "call_");
    for (int i = 0; i < 24 && n + 1 < cap; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out[n++] = al[x % (sizeof al - 1)];
    }
    out[n] = 0;
}

cJSON *td_tool_call_json(const char *name, const char *arguments, int index) {
    cJSON *c = cJSON_CreateObject();
    if (index >= 0) cJSON_AddNumberToObject(c, "index", index);
    char id[40];
    random_id(id, sizeof id);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(f, "name", name);
    cJSON_AddStringToObject(f, "arguments", arguments);
    return c;
}

typedef struct extract_ctx {
    const char *text;
    char *content;
    size_t content_len;
    cJSON *calls;
    bool oom;
} extract_ctx;

static void extract_seg(void *vctx, const td_tool_seg *g) {
    extract_ctx *x = vctx;
    if (g->kind == TD_TOOL_SEG_CALL) {
        if (!x->calls) x->calls = cJSON_CreateArray();
        cJSON_AddItemToArray(x->calls, td_tool_call_json(g->name, g->arguments, -1));
        return;
    }
    size_t n = g->end - g->start;
    char *p = realloc(x->content, x->content_len + n + 1);
    if (!p) {
        x->oom = true;
        return;
    }
    memcpy(p + x->content_len, x->text + g->start, n);
    x->content_len += n;
    p[x->content_len] = 0;
    x->content = p;
}

cJSON *td_tools_extract(td_tool_parser p, const char *text, size_t len, char **content) {
    td_tool_scan s = {.parser = p};
    extract_ctx x = {.text = text};
    td_tool_scan_feed(&s, text, len, true, extract_seg, &x);
    td_tool_scan_free(&s);
    if (x.calls && x.content && all_ws(x.content, 0, x.content_len)) {
        free(x.content);
        x.content = NULL;
    }
    *content = x.content;
    return x.calls;
}

// ---- constrained calls ----------------------------------------------------------------------------

// The JSON schema of one call object: {"name": const, key: the function's parameters}.
static cJSON *call_schema(const cJSON *fn, const char *key) {
    cJSON *s = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "object");
    cJSON *props = cJSON_AddObjectToObject(s, "properties");
    cJSON *name = cJSON_AddObjectToObject(props, "name");
    cJSON_AddStringToObject(name, "const", field(fn, "name")->valuestring);
    const cJSON *params = field(fn, "parameters");
    if (params) {
        cJSON_AddItemToObject(props, key, cJSON_Duplicate(params, 1));
    } else {  // no parameters: an empty object, as OpenAI treats an omitted schema
        cJSON *p = cJSON_AddObjectToObject(props, key);
        cJSON_AddStringToObject(p, "type", "object");
        cJSON_AddObjectToObject(p, "properties");
    }
    cJSON *req = cJSON_AddArrayToObject(s, "required");
    cJSON_AddItemToArray(req, cJSON_CreateString("name"));
    cJSON_AddItemToArray(req, cJSON_CreateString(key));
    return s;
}

char *td_tools_grammar(const td_tools_request *t, td_tool_parser p, td_api_error *e) {
    if (t->choice != TD_TOOL_CHOICE_REQUIRED && t->choice != TD_TOOL_CHOICE_NAMED) return NULL;
    if (p != TD_TOOL_PARSER_HERMES && p != TD_TOOL_PARSER_LLAMA3_JSON) {
        td_api_fail(e, 400, "tool_choice", "tool_choice needs a tool-call parser (hermes or llama3_json)");
        return NULL;
    }
    const bool hermes = p == TD_TOOL_PARSER_HERMES;
    td_srv_buf g;
    td_srv_buf_init(&g, 0);
    bool ok = td_srv_buf_printf(&g, "root ::= tc-call%s\n", t->parallel ? " (tc-sep tc-call)*" : "");
    if (hermes)
        ok = ok && td_srv_buf_printf(&g, "tc-call ::= \"<tool_call>\\n\" tc-fn \"\\n</tool_call>\"\ntc-sep ::= \"\\n\"\n");
    else
        ok = ok && td_srv_buf_printf(&g, "tc-call ::= tc-fn\ntc-sep ::= \"; \"\n");
    ok = ok && td_srv_buf_printf(&g, "tc-fn ::=");
    int i = 0;
    for (const cJSON *u = t->tools->child; ok && u; u = u->next, i++) {
        const cJSON *fn = field(u, "function");
        if (t->choice == TD_TOOL_CHOICE_NAMED && strcmp(field(fn, "name")->valuestring, t->named) != 0) continue;
        ok = td_srv_buf_printf(&g, "%s f%d-root", g.p[g.len - 1] == '=' ? "" : " |", i);
    }
    ok = ok && td_srv_buf_printf(&g, "\n");
    i = 0;
    for (const cJSON *u = t->tools->child; ok && u; u = u->next, i++) {
        const cJSON *fn = field(u, "function");
        if (t->choice == TD_TOOL_CHOICE_NAMED && strcmp(field(fn, "name")->valuestring, t->named) != 0) continue;
        cJSON *schema = call_schema(fn, hermes ? "arguments" : "parameters");
        char prefix[24];
        snprintf(prefix, sizeof prefix, "f%d-", i);
        td_err err = {0};
        char *text = schema ? td_gbnf_from_json_schema(schema, prefix, &err) : NULL;
        cJSON_Delete(schema);
        if (!text) {
            td_api_fail(e, 400, "tools", "tools[%d].function.parameters: %s", i, err.msg[0] ? err.msg : "out of memory");
            td_srv_buf_free(&g);
            return NULL;
        }
        // Compact JSON: the converter's whitespace rule (`<prefix>ws`, up to a newline and 20 blanks at
        // every token boundary) is replaced by none, so a call costs few tokens and cannot wander.
        char rule[32];
        int rl = snprintf(rule, sizeof rule, "%sws ::=", prefix);
        for (char *line = text; line && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
            if (strncmp(line, rule, (size_t)rl) != 0) continue;
            char *end = strchr(line, '\n');
            size_t tail = end ? strlen(end) : 0;
            memmove(line + rl, " \"\"", 4);
            if (end) memmove(line + rl + 3, end, tail + 1);
            else line[rl + 3] = 0;
            break;
        }
        ok = td_srv_buf_append(&g, text, strlen(text)) && td_srv_buf_printf(&g, "\n");
        free(text);
    }
    if (!ok || !td_srv_buf_append(&g, "", 1)) {
        td_api_fail(e, 500, NULL, "out of memory");
        td_srv_buf_free(&g);
        return NULL;
    }
    return g.p;  // NUL-terminated
}
