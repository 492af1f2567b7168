// Tool calling on /v1/chat/completions: the request's `tools` / `tool_choice` / `parallel_tool_calls`
// validated, assistant tool-call history made renderable (arguments strings -> mappings, as vLLM does),
// and the model's output split into content and tool calls by a per-family parser (hermes:
// `<tool_call>{json}</tool_call>`; llama3_json: `{"name", "parameters"}` objects, optionally after
// `<|python_tag|>`, separated by `;`). The scanner is incremental, so streaming and non-streaming
// responses share one code path. No I/O, no engine: the unit tests drive it directly.
#ifndef TD_SERVER_TOOLS_H
#define TD_SERVER_TOOLS_H

#include <stdbool.h>
#include <stddef.h>
#include <cjson/cJSON.h>
#include "server/openai.h"

typedef enum td_tool_choice {
    TD_TOOL_CHOICE_NONE,      // "none": tools stay in the prompt, the output is never parsed
    TD_TOOL_CHOICE_AUTO,      // "auto" (the default when tools are given)
    TD_TOOL_CHOICE_REQUIRED,  // "required"
    TD_TOOL_CHOICE_NAMED,     // {"type": "function", "function": {"name": ...}}
} td_tool_choice;

typedef enum td_tool_parser {
    TD_TOOL_PARSER_NONE,
    TD_TOOL_PARSER_HERMES,       // Hermes, Qwen2.5, Qwen3
    TD_TOOL_PARSER_LLAMA3_JSON,  // Llama 3.1 / 3.2 JSON tool calls
} td_tool_parser;

typedef struct td_tools_request {
    const cJSON *tools;   // the body's "tools" array (borrowed from the body), NULL when absent or empty
    int n_tools;
    td_tool_choice choice;  // TD_TOOL_CHOICE_NONE when there are no tools
    const char *named;      // TD_TOOL_CHOICE_NAMED: the function's name (borrowed from the body)
    bool parallel;          // parallel_tool_calls (default true)
} td_tools_request;

// Validates tools / tool_choice / parallel_tool_calls in a chat request body. On failure fills *e (400
// naming the field: a tool without a function name, an unknown named function, "required" or a named
// choice without tools, ...) and returns false.
bool td_tools_parse(const cJSON *body, td_tools_request *out, td_api_error *e);

// The function object {"name", "description", "parameters"} of the tool called name, or NULL.
const cJSON *td_tools_find(const td_tools_request *t, const char *name);

// The parser for a request. flag: the server's --tool-call-parser ("auto", "hermes", "llama3_json",
// "none"; NULL = "auto"). "auto" looks at the rendered prompt, which carries the template's tool
// instructions when tools are given: "<tool_call>" -> hermes; "<|python_tag|>" or Llama 3.1's
// `"parameters": dictionary` -> llama3_json; otherwise none.
td_tool_parser td_tool_parser_choose(const char *flag, const char *prompt, size_t prompt_len);
// Whether flag is one of the accepted names (or NULL).
bool td_tool_parser_name_ok(const char *flag);

// A deep copy of messages made the way vLLM hands them to a template: every tool_calls[].function.
// arguments that is a string holding a JSON object is replaced by that object (what Qwen3's and Llama
// 3.1's templates iterate), and "content": null becomes "". NULL when no message needs either (render
// the original). Caller frees with cJSON_Delete.
cJSON *td_tools_render_messages(const cJSON *messages);

// "required" and named choices: GBNF (rule root) that admits only well-formed calls in the parser's
// format, each call's JSON (from td_gbnf_from_json_schema on {"name": const, "arguments" (hermes) /
// "parameters" (llama3_json): the function's parameters}, compact) for any of the tools ("required") or
// the named one; one call, or with parallel_tool_calls one or more (hermes: "<tool_call>\n" JSON
// "\n</tool_call>" blocks separated by "\n"; llama3_json: objects separated by "; "). NULL for the
// other choices (*e untouched), or NULL with *e set: 400 naming the tool whose parameters schema the
// converter refuses, or no usable parser. Caller frees.
char *td_tools_grammar(const td_tools_request *t, td_tool_parser p, td_api_error *e);

// ---- output scanning --------------------------------------------------------------------------------

typedef enum td_tool_seg_kind { TD_TOOL_SEG_CONTENT = 1, TD_TOOL_SEG_CALL } td_tool_seg_kind;

// One stable piece of output. CONTENT: text[start, end) of the scanned text. CALL: name and
// arguments (a JSON text), both pointing into scanner-owned storage valid until the next feed.
typedef struct td_tool_seg {
    td_tool_seg_kind kind;
    size_t start, end;
    const char *name;
    const char *arguments;
} td_tool_seg;

typedef void (*td_tool_seg_fn)(void *ctx, const td_tool_seg *seg);

// Incremental scanner state. Zero-initialise, set parser; free with td_tool_scan_free.
typedef struct td_tool_scan {
    td_tool_parser parser;
    size_t pos;       // bytes of the text already reported
    int mode;         // llama3_json: undecided / calls / content
    size_t mode_from; // llama3_json: where the calls started (the fallback content on a bad first call)
    int n_calls;
    bool after_call;  // whitespace-only content after a call is dropped
    char *name, *args;  // the last call's strings (malloc'd)
} td_tool_scan;

// Reports, through fn, every segment of text[0, len) that is stable: text is the whole output so far
// (it only grows between calls); final: no more text comes (everything left is reported, a call that
// never closed or does not parse as content). Text that may still begin a call is held back.
void td_tool_scan_feed(td_tool_scan *s, const char *text, size_t len, bool final, td_tool_seg_fn fn, void *ctx);
void td_tool_scan_free(td_tool_scan *s);

// Non-streaming convenience: the tool_calls array ([{id, type, function {name, arguments}}], NULL when
// none) and *content (malloc'd, NULL when the output was only calls and whitespace).
cJSON *td_tools_extract(td_tool_parser p, const char *text, size_t len, char **content);

// {"id": "call_<24 random alphanumerics>", "type": "function", "function": {"name", "arguments"}},
// with "index" too when index >= 0 (stream deltas).
cJSON *td_tool_call_json(const char *name, const char *arguments, int index);

#endif
