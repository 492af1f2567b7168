// libFuzzer target for tool calling (server/tools.h): the first byte picks the parser and a piece
// size, the rest is model output fed to the scanner whole and in pieces (the streaming path), and
// also parsed as a request body for td_tools_parse / td_tools_render_messages / td_tools_grammar.
// Must never crash, leak or read out of bounds; both feeds must report the same content and calls,
// and content segments must lie inside the text. Seeds: tests/fuzz/corpus/tools/.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/tools.h"

typedef struct acc {
    const char *text;
    size_t len;
    char *out;  // content bytes, then "\x01name\x02args\x03" per call
    size_t n, cap;
} acc;

static void put(acc *a, const char *s, size_t n) {
    if (a->n + n + 1 > a->cap) {
        a->cap = (a->n + n + 1) * 2;
        a->out = realloc(a->out, a->cap);
        if (!a->out) abort();
    }
    memcpy(a->out + a->n, s, n);
    a->n += n;
}

static void seg(void *ctx, const td_tool_seg *g) {
    acc *a = ctx;
    if (g->kind == TD_TOOL_SEG_CONTENT) {
        if (g->start > g->end || g->end > a->len) abort();
        put(a, a->text + g->start, g->end - g->start);
    } else {
        put(a, "\x01", 1);
        put(a, g->name, strlen(g->name));
        put(a, "\x02", 1);
        put(a, g->arguments, strlen(g->arguments));
        put(a, "\x03", 1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    td_tool_parser p = (data[0] & 1) ? TD_TOOL_PARSER_LLAMA3_JSON : TD_TOOL_PARSER_HERMES;
    size_t step = (size_t)(data[0] >> 1) % 16 + 1;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    acc whole = {.text = text, .len = len}, parts = {.text = text, .len = len};
    td_tool_scan s1 = {.parser = p}, s2 = {.parser = p};
    td_tool_scan_feed(&s1, text, len, true, seg, &whole);
    for (size_t k = 0; k < len; k += step) td_tool_scan_feed(&s2, text, k, false, seg, &parts);
    td_tool_scan_feed(&s2, text, len, true, seg, &parts);
    if (whole.n != parts.n || (whole.n && memcmp(whole.out, parts.out, whole.n))) abort();
    if (s1.n_calls != s2.n_calls) abort();
    td_tool_scan_free(&s1);
    td_tool_scan_free(&s2);
    free(whole.out);
    free(parts.out);

    cJSON *body = cJSON_ParseWithLength(text, len);
    if (cJSON_IsObject(body)) {
        td_tools_request t;
        td_api_error e;
        memset(&e, 0, sizeof e);
        if (td_tools_parse(body, &t, &e)) {
            if (t.choice == TD_TOOL_CHOICE_NAMED && !td_tools_find(&t, t.named)) abort();
            e.http_status = 0;
            free(td_tools_grammar(&t, p, &e));
        } else if (e.http_status != 400) {
            abort();
        }
        cJSON_Delete(td_tools_render_messages(cJSON_GetObjectItemCaseSensitive(body, "messages")));
    }
    cJSON_Delete(body);
    return 0;
}
