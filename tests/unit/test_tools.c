// Tool calling (server/tools.h): request validation with the field named in every error, the
// parser choice, tool-call history made renderable, and the hermes / llama3_json scanners on outputs
// built from known calls: whole, fed in pieces of every size (the streaming path), with text around
// them, several calls, and malformed calls (which must come back as content, byte for byte).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "grammar/grammar.h"
#include "server/tools.h"
#include "test_util.h"

// The parsed body stays alive (t borrows from it) until the next call.
static cJSON *g_body;
static bool parse_req(const char *body, td_tools_request *t, td_api_error *e) {
    cJSON_Delete(g_body);
    g_body = cJSON_Parse(body);
    if (!g_body) return false;
    memset(e, 0, sizeof *e);
    return td_tools_parse(g_body, t, e);
}

#define TOOL(n) "{\"type\":\"function\",\"function\":{\"name\":\"" n "\",\"parameters\":{\"type\":\"object\"}}}"

static void test_validation(void) {
    td_tools_request t;
    td_api_error e;
    CHECK(parse_req("{}", &t, &e) && t.choice == TD_TOOL_CHOICE_NONE && t.n_tools == 0 && t.parallel, "no tools");
    CHECK(parse_req("{\"tools\":[" TOOL("a") "," TOOL("b") "]}", &t, &e) && t.choice == TD_TOOL_CHOICE_AUTO &&
              t.n_tools == 2, "tools default auto");
    CHECK(parse_req("{\"tools\":[]}", &t, &e) && t.n_tools == 0 && t.choice == TD_TOOL_CHOICE_NONE, "empty tools");
    CHECK(parse_req("{\"tools\":[" TOOL("a") "],\"tool_choice\":\"none\"}", &t, &e) && t.choice == TD_TOOL_CHOICE_NONE,
          "none");
    CHECK(parse_req("{\"tools\":[" TOOL("a") "],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", &t, &e) &&
              t.choice == TD_TOOL_CHOICE_REQUIRED && !t.parallel, "required");
    CHECK(parse_req("{\"tools\":[" TOOL("a") "," TOOL("b") "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}}",
                    &t, &e) && t.choice == TD_TOOL_CHOICE_NAMED && !strcmp(t.named, "b"), "named");
    CHECK(td_tools_find(&t, "a") && !td_tools_find(&t, "zz"), "find");
    struct {
        const char *body, *param, *needle;
    } bad[] = {
        {"{\"tools\":{}}", "tools", "must be an array"},
        {"{\"tools\":[1]}", "tools", "tools[0] must be an object"},
        {"{\"tools\":[{\"type\":\"code\",\"function\":{\"name\":\"a\"}}]}", "tools", "tools[0].type"},
        {"{\"tools\":[{\"type\":\"function\"}]}", "tools", "tools[0].function must be"},
        {"{\"tools\":[" TOOL("a") ",{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}", "tools", "tools[1].function.name"},
        {"{\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":3}}]}", "tools", "parameters"},
        {"{\"tools\":[" TOOL("a") "," TOOL("a") "]}", "tools", "defined twice"},
        {"{\"tool_choice\":\"required\"}", "tool_choice", "needs a non-empty 'tools'"},
        {"{\"tools\":[" TOOL("a") "],\"tool_choice\":\"always\"}", "tool_choice", "\"always\""},
        {"{\"tools\":[" TOOL("a") "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}}", "tool_choice",
         "'b', which is not in 'tools'"},
        {"{\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"b\"}}}", "tool_choice", "needs a non-empty"},
        {"{\"tools\":[" TOOL("a") "],\"tool_choice\":{\"type\":\"function\"}}", "tool_choice", "named tool_choice"},
        {"{\"tools\":[" TOOL("a") "],\"tool_choice\":5}", "tool_choice", "must be a string"},
        {"{\"tools\":[" TOOL("a") "],\"parallel_tool_calls\":\"yes\"}", "parallel_tool_calls", "boolean"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bool ok = parse_req(bad[i].body, &t, &e);
        CHECK(!ok && e.http_status == 400 && !strcmp(e.param, bad[i].param) && strstr(e.message, bad[i].needle),
              "bad[%zu] %s -> %d %s: %s", i, bad[i].body, e.http_status, e.param, e.message);
    }
}

static void test_choose(void) {
    const char *qwen = "<|im_start|>system\n# Tools\n...within <tool_call></tool_call> XML tags:\n<tool_call>\n";
    const char *llama = "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name";
    CHECK(td_tool_parser_choose(NULL, qwen, strlen(qwen)) == TD_TOOL_PARSER_HERMES, "auto hermes");
    CHECK(td_tool_parser_choose("auto", llama, strlen(llama)) == TD_TOOL_PARSER_LLAMA3_JSON, "auto llama3");
    CHECK(td_tool_parser_choose("auto", "plain", 5) == TD_TOOL_PARSER_NONE, "auto none");
    CHECK(td_tool_parser_choose("llama3_json", qwen, strlen(qwen)) == TD_TOOL_PARSER_LLAMA3_JSON, "forced");
    CHECK(td_tool_parser_choose("hermes", "plain", 5) == TD_TOOL_PARSER_HERMES, "forced hermes");
    CHECK(td_tool_parser_choose("none", qwen, strlen(qwen)) == TD_TOOL_PARSER_NONE, "forced none");
    CHECK(td_tool_parser_name_ok(NULL) && td_tool_parser_name_ok("hermes") && !td_tool_parser_name_ok("mistral"), "names");
}

static void test_render_messages(void) {
    cJSON *m = cJSON_Parse(
        "[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":"
        "{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": [1, {\\\"y\\\": \\\"z\\\"}]}\"}},"
        "{\"id\":\"c2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"not json\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"42\"}]");
    cJSON *r = td_tools_render_messages(m);
    CHECK(r != NULL, "converted");
    if (r) {
        cJSON *a = cJSON_GetArrayItem(r, 1);
        cJSON *args = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a, "tool_calls"), 0), "function"), "arguments");
        cJSON *want = cJSON_Parse("{\"x\": [1, {\"y\": \"z\"}]}");
        CHECK(cJSON_Compare(args, want, 1), "arguments string -> object");
        cJSON_Delete(want);
        cJSON *args2 = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(a, "tool_calls"), 1), "function"), "arguments");
        CHECK(cJSON_IsString(args2) && !strcmp(args2->valuestring, "not json"), "non-JSON arguments kept");
        cJSON *content = cJSON_GetObjectItem(a, "content");
        CHECK(cJSON_IsString(content) && !content->valuestring[0], "content null -> \"\"");
        CHECK(cJSON_Compare(cJSON_GetArrayItem(r, 2), cJSON_GetArrayItem(m, 2), 1), "tool message untouched");
        CHECK(cJSON_IsString(cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(m, 1), "tool_calls"), 0)->child->next->next->child->next),
              "original untouched");
    }
    cJSON_Delete(r);
    cJSON_Delete(m);
    cJSON *plain = cJSON_Parse("[{\"role\":\"user\",\"content\":\"hi\"}]");
    CHECK(td_tools_render_messages(plain) == NULL, "nothing to convert");
    cJSON_Delete(plain);
}

// ---- scanners ---------------------------------------------------------------------------------------

typedef struct collected {
    char content[4096];
    size_t content_len;
    char names[8][64];
    cJSON *args[8];
    int n_calls;
    const char *text;
} collected;

static void collect(void *ctx, const td_tool_seg *g) {
    collected *c = ctx;
    if (g->kind == TD_TOOL_SEG_CALL) {
        if (c->n_calls < 8) {
            snprintf(c->names[c->n_calls], 64, "%s", g->name);
            c->args[c->n_calls] = cJSON_Parse(g->arguments);
        }
        c->n_calls++;
    } else {
        size_t n = g->end - g->start;
        if (c->content_len + n < sizeof c->content) memcpy(c->content + c->content_len, c->text + g->start, n);
        c->content_len += n;
    }
}

static void collected_free(collected *c) {
    for (int i = 0; i < c->n_calls && i < 8; i++) cJSON_Delete(c->args[i]);
}

// Scans text fed in pieces of `step` bytes (0: all at once), then a final feed.
static void scan(td_tool_parser p, const char *text, size_t step, collected *out) {
    memset(out, 0, sizeof *out);
    out->text = text;
    td_tool_scan s = {.parser = p};
    size_t len = strlen(text);
    if (step)
        for (size_t k = 0; k < len; k += step) td_tool_scan_feed(&s, text, k, false, collect, out);
    td_tool_scan_feed(&s, text, len, false, collect, out);
    td_tool_scan_feed(&s, text, len, true, collect, out);
    td_tool_scan_free(&s);
}

typedef struct call_spec {
    const char *name;
    const char *args;  // JSON object text
} call_spec;

// Builds "<pre><calls in format><post>" and checks the scanner returns the calls (arguments compared
// as JSON values) and content == pre + post (after a call, whitespace-only runs dropped), at every
// piece size.
static void check_format(td_tool_parser p, const char *pre, const call_spec *calls, int n, const char *sep,
                         const char *post, const char *want_content, const char *what) {
    char text[4096];
    size_t k = (size_t)snprintf(text, sizeof text, "%s", pre);
    for (int i = 0; i < n; i++) {
        if (i) k += (size_t)snprintf(text + k, sizeof text - k, "%s", sep);
        if (p == TD_TOOL_PARSER_HERMES)
            k += (size_t)snprintf(text + k, sizeof text - k, "<tool_call>\n{\"name\": \"%s\", \"arguments\": %s}\n</tool_call>",
                                  calls[i].name, calls[i].args);
        else
            k += (size_t)snprintf(text + k, sizeof text - k, "{\"name\": \"%s\", \"parameters\": %s}", calls[i].name,
                                  calls[i].args);
    }
    snprintf(text + k, sizeof text - k, "%s", post);
    size_t len = strlen(text);
    for (size_t step = 0; step <= len; step += step < 4 ? 1 : 7) {
        collected c;
        scan(p, text, step, &c);
        bool ok = c.n_calls == n && c.content_len == strlen(want_content) && !memcmp(c.content, want_content, c.content_len);
        for (int i = 0; ok && i < n; i++) {
            cJSON *want = cJSON_Parse(calls[i].args);
            ok = !strcmp(c.names[i], calls[i].name) && cJSON_Compare(c.args[i], want, 1);
            cJSON_Delete(want);
        }
        CHECK(ok, "%s (step %zu): %d calls, content '%.*s'", what, step, c.n_calls, (int)c.content_len, c.content);
        collected_free(&c);
        if (!ok) break;
    }
}

// Malformed: every byte comes back as content, no call, at every piece size.
static void check_verbatim(td_tool_parser p, const char *text, const char *what) {
    size_t len = strlen(text);
    for (size_t step = 0; step <= len; step++) {
        collected c;
        scan(p, text, step, &c);
        bool ok = c.n_calls == 0 && c.content_len == len && !memcmp(c.content, text, len);
        CHECK(ok, "%s (step %zu): %d calls, content '%.*s'", what, step, c.n_calls, (int)c.content_len, c.content);
        collected_free(&c);
        if (!ok) break;
    }
}

static void test_hermes(void) {
    const td_tool_parser H = TD_TOOL_PARSER_HERMES;
    call_spec w = {"get_weather", "{\"city\": \"Paris\", \"unit\": \"celsius\", \"days\": [1, 2], \"x\": {\"q\": \"}{\\\"<tool_call>\"}}"};
    call_spec t = {"get_time", "{}"};
    call_spec two[2] = {w, t};
    check_format(H, "", &w, 1, "", "", "", "one call");
    check_format(H, "Let me check.\n", &w, 1, "", "", "Let me check.\n", "content then call");
    check_format(H, "", two, 2, "\n", "\n", "", "two calls, newlines dropped");
    check_format(H, "a<tool", two, 2, "\n", " done", "a<tool done", "text around");
    check_verbatim(H, "no calls here, just <tool_ text and <b>tags</b>", "plain text");
    check_verbatim(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n", "never closed");
    check_verbatim(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": {bad json}}\n</tool_call>", "bad json");
    check_verbatim(H, "<tool_call>\n{\"arguments\": {}}\n</tool_call>", "no name");
    check_verbatim(H, "<tool_call>\n{\"name\": \"f\", \"arguments\": 3}\n</tool_call>", "arguments not an object");
    // A malformed block between good ones stays content; the good ones are calls.
    collected c;
    scan(H, "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n<tool_call>oops</tool_call>\n"
            "<tool_call>{\"name\":\"b\",\"arguments\":\"{\\\"k\\\":1}\"}</tool_call>", 3, &c);
    CHECK(c.n_calls == 2 && !strcmp(c.names[0], "a") && !strcmp(c.names[1], "b") && c.content_len == 28 &&
              !memcmp(c.content, "<tool_call>oops</tool_call>\n", 28),
          "mixed good/bad: %d calls, '%.*s'", c.n_calls, (int)c.content_len, c.content);
    collected_free(&c);

    // td_tools_extract: content NULL when only calls; the calls' JSON shape.
    char *content = NULL;
    const char *out = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>\n";
    cJSON *calls = td_tools_extract(H, out, strlen(out), &content);
    CHECK(cJSON_GetArraySize(calls) == 1 && content == NULL, "extract only calls");
    cJSON *c0 = cJSON_GetArrayItem(calls, 0);
    cJSON *id = cJSON_GetObjectItem(c0, "id");
    CHECK(cJSON_IsString(id) && !strncmp(id->valuestring, "call_", 5) && strlen(id->valuestring) == 29, "id call_<24>");
    CHECK(!strcmp(cJSON_GetObjectItem(c0, "type")->valuestring, "function"), "type function");
    cJSON *f = cJSON_GetObjectItem(c0, "function");
    cJSON *a = cJSON_Parse(cJSON_GetObjectItem(f, "arguments")->valuestring);
    cJSON *want = cJSON_Parse("{\"tz\":\"UTC\"}");
    CHECK(!strcmp(cJSON_GetObjectItem(f, "name")->valuestring, "get_time") && cJSON_Compare(a, want, 1), "arguments string");
    cJSON_Delete(a);
    cJSON_Delete(want);
    cJSON *calls2 = td_tools_extract(H, out, strlen(out), &content);
    CHECK(strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(calls2, 0), "id")->valuestring, id->valuestring) != 0, "ids differ");
    cJSON_Delete(calls);
    cJSON_Delete(calls2);
    calls = td_tools_extract(H, "just text", 9, &content);
    CHECK(!calls && content && !strcmp(content, "just text"), "extract text only");
    free(content);
}

static void test_llama3(void) {
    const td_tool_parser L = TD_TOOL_PARSER_LLAMA3_JSON;
    call_spec w = {"get_weather", "{\"city\": \"San Francisco, CA\", \"nested\": {\"a\": \"}\", \"b\": [{}]}}"};
    call_spec t = {"get_time", "{}"};
    call_spec two[2] = {w, t};
    check_format(L, "", &w, 1, "", "", "", "bare object");
    check_format(L, "<|python_tag|>", &w, 1, "", "", "", "after python_tag");
    check_format(L, "  \n", &w, 1, "", "\n", "", "leading whitespace");
    check_format(L, "", two, 2, "; ", "", "", "two calls with ;");
    check_format(L, "<|python_tag|>", two, 2, ";", "", "", "python_tag, two calls");
    check_format(L, "", &w, 1, "", " and then text", " and then text", "text after a call");
    check_verbatim(L, "The weather is {\"name\": \"x\", \"parameters\": {}}", "text first: content");
    check_verbatim(L, "{\"name\": \"f\", \"parameters\": {\"a\": 1}", "unterminated");
    check_verbatim(L, "{\"name\": \"f\", \"parameters\": {\"a\": tru}}", "bad json");
    check_verbatim(L, "<|python_tag|>{\"nom\": \"f\"}", "no name");
    check_verbatim(L, "<|python_ta", "partial tag at the end");
    check_verbatim(L, "{not json at all", "brace then junk");
    // "arguments" accepted as well as "parameters".
    collected c;
    scan(L, "{\"name\": \"f\", \"arguments\": {\"k\": 2}}", 1, &c);
    CHECK(c.n_calls == 1 && !strcmp(c.names[0], "f"), "llama3 arguments key");
    collected_free(&c);
}

// ---- grammars for "required" / named ------------------------------------------------------------------

static td_gvocab *byte_vocab(void) {
    static char bytes[256];
    const char *toks[256];
    size_t lens[256];
    for (int i = 0; i < 256; i++) {
        bytes[i] = (char)i;
        toks[i] = &bytes[i];
        lens[i] = i ? 1 : 0;
    }
    td_err err = {0};
    return td_gvocab_from_bytes(toks, lens, 256, NULL, 0, &err);
}

// Whether the whole of s is a complete match of the grammar text g.
static bool matches(const char *g, const char *s) {
    td_err err = {0};
    td_grammar *gr = td_grammar_compile(g, strlen(g), &err);
    if (!gr) {
        fprintf(stderr, "grammar does not compile: %s\n%s\n", err.msg, g);
        return false;
    }
    td_gvocab *v = byte_vocab();
    td_gmatch *m = v ? td_gmatch_create(gr, v, &err) : NULL;
    bool ok = m && td_gmatch_accept_bytes(m, s, strlen(s)) && td_gmatch_complete(m);
    td_gmatch_free(m);
    td_gvocab_free(v);
    td_grammar_unref(gr);
    return ok;
}

#define WEATHER "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\"," \
    "\"properties\":{\"city\":{\"enum\":[\"Paris\",\"Oslo\"]},\"metric\":{\"type\":\"boolean\"}},\"required\":[\"city\"]}}}"
#define TIME "{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}"

static void test_grammar(void) {
    td_tools_request t;
    td_api_error e;
    const char *W1 = "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\",\"metric\":true}}";
    const char *W2 = "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}";
    const char *T1 = "{\"name\":\"get_time\",\"arguments\":{}}";
    char buf[1024];
    // required, parallel, hermes
    CHECK(parse_req("{\"tools\":[" WEATHER "," TIME "],\"tool_choice\":\"required\"}", &t, &e), "required");
    char *g = td_tools_grammar(&t, TD_TOOL_PARSER_HERMES, &e);
    CHECK(g != NULL, "required grammar: %s", e.message);
    if (g) {
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", W1);
        CHECK(matches(g, buf), "one weather call");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>", W2, T1, W1);
        CHECK(matches(g, buf), "three calls");
        CHECK(!matches(g, ""), "no call");
        CHECK(!matches(g, "hello"), "text");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", "{\"name\": \"get_time\", \"arguments\": {}}");
        CHECK(!matches(g, buf), "compact JSON only (the converter's whitespace rule is replaced)");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Rome\"}}");
        CHECK(!matches(g, buf), "enum violated");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", "{\"name\":\"get_weather\",\"arguments\":{\"metric\":true}}");
        CHECK(!matches(g, buf), "required property missing");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", "{\"name\":\"get_date\",\"arguments\":{}}");
        CHECK(!matches(g, buf), "unknown function");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", "{\"name\":\"get_time\",\"arguments\":{\"x\":1}}");
        CHECK(!matches(g, buf), "extra property");
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n", W1);
        CHECK(!matches(g, buf), "unclosed");
        // What the grammar admits, the hermes parser reads back as the same calls.
        snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>", W2, T1);
        char *content = NULL;
        cJSON *calls = td_tools_extract(TD_TOOL_PARSER_HERMES, buf, strlen(buf), &content);
        CHECK(cJSON_GetArraySize(calls) == 2 && !content, "grammar output parses as 2 calls");
        cJSON_Delete(calls);
        free(content);
    }
    free(g);
    // not parallel: exactly one call
    CHECK(parse_req("{\"tools\":[" WEATHER "," TIME "],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}", &t, &e), "parse");
    g = td_tools_grammar(&t, TD_TOOL_PARSER_HERMES, &e);
    snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>", T1);
    CHECK(g && matches(g, buf), "single call");
    snprintf(buf, sizeof buf, "<tool_call>\n%s\n</tool_call>\n<tool_call>\n%s\n</tool_call>", T1, T1);
    CHECK(g && !matches(g, buf), "second call refused without parallel_tool_calls");
    free(g);
    // named, llama3_json ("parameters" key, "; " between calls)
    CHECK(parse_req("{\"tools\":[" WEATHER "," TIME "],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}", &t, &e), "parse");
    g = td_tools_grammar(&t, TD_TOOL_PARSER_LLAMA3_JSON, &e);
    CHECK(g && matches(g, "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}"), "named llama3");
    CHECK(g && matches(g, "{\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}; {\"name\":\"get_weather\",\"parameters\":{\"city\":\"Paris\",\"metric\":false}}"),
          "named llama3, two calls");
    CHECK(g && !matches(g, "{\"name\":\"get_time\",\"parameters\":{}}"), "named: other function refused");
    CHECK(g && !matches(g, "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}"), "llama3: parameters key");
    free(g);
    // auto / none: no grammar; an unusable parser or schema: 400 naming it
    CHECK(parse_req("{\"tools\":[" WEATHER "]}", &t, &e), "parse");
    e.http_status = 0;
    CHECK(!td_tools_grammar(&t, TD_TOOL_PARSER_HERMES, &e) && e.http_status == 0, "auto: no grammar");
    CHECK(parse_req("{\"tools\":[" TIME ",{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                    "\"properties\":{\"a\":{\"type\":\"string\",\"format\":\"email\"}}}}}],\"tool_choice\":\"required\"}", &t, &e), "parse");
    g = td_tools_grammar(&t, TD_TOOL_PARSER_HERMES, &e);
    CHECK(!g && e.http_status == 400 && !strcmp(e.param, "tools") && strstr(e.message, "tools[1]") && strstr(e.message, "format"),
          "unsupported schema keyword: %d %s", e.http_status, e.message);
    free(g);
    g = td_tools_grammar(&t, TD_TOOL_PARSER_NONE, &e);
    CHECK(!g && e.http_status == 400 && !strcmp(e.param, "tool_choice"), "no parser");
}

int main(void) {
    test_validation();
    test_choose();
    test_render_messages();
    test_hermes();
    test_llama3();
    test_grammar();
    cJSON_Delete(g_body);
    TEST_DONE();
}
