// The OpenAI request surface, without any I/O: JSON body -> validated td_api_request (in the request's
// arena), OpenAI error bodies, and the JSON of responses and stream chunks. Pure functions, so the unit
// tests and the fuzz target drive them directly. Tokenization and context-length checks need the
// engine and live in server.c.
#ifndef TD_SERVER_OPENAI_H
#define TD_SERVER_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <cjson/cJSON.h>
#include "engine/serve_api.h"
#include "server/srv_mem.h"

typedef enum td_api_kind { TD_API_COMPLETIONS, TD_API_CHAT } td_api_kind;

typedef struct td_api_limits {
    int max_n;            // choices per prompt
    int max_prompts;      // prompts in one completions request (list of strings / token lists)
    int max_logprobs;     // alternatives per token
    int max_model_len;    // tokens; 0 = unknown (max_tokens then only checked for >= 1)
    int vocab_size;       // token ids must be in [0, vocab_size); 0 = unchecked
    int max_prompt_ids;   // token ids in one token-array prompt
    bool default_logprobs_processed;  // logprobs_mode when a request omits it (serve --logprobs-mode)
    const char *const *model_aliases;  // [n_model_aliases] more accepted "model" names (borrowed)
    int n_model_aliases;
} td_api_limits;

td_api_limits td_api_default_limits(void);

// An OpenAI error, ready for td_api_error_json. param names the offending field ("" if none).
typedef struct td_api_error {
    int http_status;    // 400, 404, 405, 413, 500, 501, 503
    const char *type;   // "BadRequestError", "NotFoundError", ...
    char param[64];
    char message[400];
} td_api_error;

// Sets *e and returns false (so validators can `return api_fail(...)`).
bool td_api_fail(td_api_error *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// {"error": {"message", "type", "param", "code"}} (code = the HTTP status, as vLLM), malloc'd.
char *td_api_error_json(const td_api_error *e);

typedef struct td_api_prompt {
    const char *text;      // NUL-terminated text prompt (NULL when ids given), points into the arena
    size_t text_len;
    const int32_t *ids;    // token-array prompt [n_ids]
    int n_ids;
} td_api_prompt;

typedef struct td_api_request {
    td_api_kind kind;
    td_gen_request gen;    // sampling fields filled; prompt/n_prompt left for the server
    bool has_max_tokens;   // false: the server fills max_model_len - prompt length
    const char *model;     // NULL when not given
    td_api_prompt *prompts;  // completions: [n_prompts]
    int n_prompts;
    const cJSON *messages;   // chat: the "messages" array (inside body)
    bool add_generation_prompt;  // chat (vLLM extension; default true)
    bool chat_logprobs;          // chat: "logprobs": true
    bool include_usage;          // stream_options.include_usage
    bool add_special_tokens;     // completions default true, chat default false (vLLM)
    bool return_token_ids;       // vLLM extension: choices carry token_ids, responses prompt_token_ids
    cJSON *body;                 // the parsed body; owned by the arena (freed at its destroy)
} td_api_request;

// Parses and validates a request body. On success fills *out with pointers into arena a (the parsed
// cJSON tree is registered for cleanup with a) and returns true. On failure fills *e (400 with the
// field named, or 404 for an unknown model when served_model is non-NULL) and returns false; the
// arena may hold partial allocations, freed with it.
bool td_api_parse(td_api_kind kind, const char *body, size_t len, const td_api_limits *lim,
                  const char *served_model, td_srv_arena *a, td_api_request *out, td_api_error *e);

#define TD_API_MAX_EMBED_INPUTS 2048  // inputs in one embeddings request (OpenAI's limit)

// POST /v1/embeddings, validated (docs/server.md "Embeddings").
typedef struct td_api_embed_request {
    const char *model;        // NULL when not given
    td_api_prompt *inputs;    // [n_inputs] "input": strings or token-id arrays (arena); no empty string
    int n_inputs;
    bool base64;              // "encoding_format": "base64" (little-endian float32 bytes), else "float"
    int dimensions;           // "dimensions"; 0 when not given (the server checks it against the model)
    bool add_special_tokens;  // vLLM extension; default true (a BOS as completions prompts get)
} td_api_embed_request;

// Parses an embeddings body as td_api_parse does (same errors for JSON, NULs and "model"); "input"
// is required, "user" accepted and ignored, other fields ignored.
bool td_api_parse_embeddings(const char *body, size_t len, const td_api_limits *lim, const char *served_model,
                             td_srv_arena *a, td_api_embed_request *out, td_api_error *e);
// RFC 4648 base64 of n bytes into out, which holds 4 * ((n + 2) / 3) + 1 bytes (NUL-terminated).
void td_api_base64(const void *src, size_t n, char *out);

// Whether a request's "model" names this server: served_model or one of lim's aliases.
bool td_api_model_known(const td_api_limits *lim, const char *served_model, const char *name);
// Refuses a body whose strings hold a NUL character (a \u0000 escape or a raw NUL byte): cJSON's
// strings end at the first NUL, so a prompt would be silently cut. On one: a 400 in *e naming the
// top-level member that holds it, and false. td_api_parse calls it; routes that parse with cJSON
// themselves call it too.
bool td_api_check_nul(const char *body, size_t len, td_api_error *e);

const char *td_finish_reason_str(td_finish_reason r);  // "stop", "length", "abort"; NULL for NONE

// Server-sent events: appends "data: <json>\n\n" (json without newlines, as cJSON prints it).
bool td_sse_append(td_srv_buf *out, const char *json, size_t len);
bool td_sse_append_done(td_srv_buf *out);  // "data: [DONE]\n\n"

#endif
