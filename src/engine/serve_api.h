// The only door between the HTTP layer (src/server/) and an inference engine: a generation request, a sink of
// generation events, and a table of function pointers + ctx (submit, cancel, stats, tokenizer and chat
// template hooks). The real engine and the test mock both implement it. This file defines shapes and
// the threading/ownership contract; it does no work itself.
#ifndef TD_ENGINE_SERVE_API_H
#define TD_ENGINE_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>
#include "base/status.h"

#define TD_GEN_MAX_TOP_LOGPROBS 20  // OpenAI's cap for chat top_logprobs (legacy completions: 5)

typedef enum td_finish_reason {
    TD_FINISH_NONE = 0,
    TD_FINISH_STOP,    // EOS, a stop token id or a stop string
    TD_FINISH_LENGTH,  // max_tokens or the context length
    TD_FINISH_ABORT,   // cancelled (client gone, shutdown)
} td_finish_reason;

typedef struct td_logit_bias_entry {
    int32_t token;
    float bias;  // [-100, 100]
} td_logit_bias_entry;

// One generation request. Built by the server in the request's arena; the engine must treat it as
// read-only and may keep pointers into it until its terminal sink callback (on_done) has returned.
typedef struct td_gen_request {
    uint64_t id;               // server-assigned, unique per process; for logs
    const char *model;         // model name requested (already checked by the server)
    const int32_t *prompt;     // [n_prompt] token ids (the server tokenizes text prompts)
    int n_prompt;
    int n;                     // choices to generate (>= 1), each reported with its index
    int max_tokens;            // per choice, >= 1 (the server fills the default: context left)
    float temperature;         // >= 0; 0 = greedy
    float top_p;               // (0, 1]
    int top_k;                 // <= 0: off
    float min_p;               // [0, 1]
    float repetition_penalty;  // > 0; 1 = off
    float presence_penalty;    // [-2, 2]
    float frequency_penalty;   // [-2, 2]
    const td_logit_bias_entry *logit_bias;  // [n_logit_bias]
    int n_logit_bias;
    bool has_seed;
    uint64_t seed;
    const char *const *stop;   // [n_stop] NUL-terminated stop strings (engine matches them with
    int n_stop;                //   engine/stop.h and never emits them)
    const int32_t *stop_token_ids;  // [n_stop_token_ids]
    int n_stop_token_ids;
    bool ignore_eos;
    int logprobs;              // -1: none; k >= 0: logprob of each sampled token plus k alternatives
    bool logprobs_processed;   // false (raw): logprobs are log_softmax of the model's logits. true: the
                               //   sampled token's logprob is (float)td_sampler_logprob (engine/sampler.h)
                               //   on the same logits row and history the sampler saw: the distribution
                               //   actually drawn from; alternatives are the best of its kept set (so
                               //   maybe fewer than k). Prompt logprobs stay raw.
    int prompt_logprobs;       // -1: none; k >= 0: same for the prompt tokens (completions echo+logprobs)
    const char *grammar;       // NULL: unconstrained. Else a grammar in llama.cpp's GBNF (rule "root")
                               //   that each choice's output text must match: the engine allows only
                               //   tokens that keep it matchable and lets EOS through only where it is
                               //   complete (src/grammar/grammar.h), and finishes the choice (STOP)
                               //   as soon as nothing but EOS can follow. max_tokens and stop strings
                               //   still apply (a cut output is incomplete: finish LENGTH / STOP).
                               //   Processed logprobs see the masked distribution; raw ones stay the
                               //   model's. Compiled by the engine at submit (cached by text); a bad
                               //   grammar fails submit with TD_ERR_INVALID and a message.
    bool echo;                 // informational: the server echoes the prompt itself
    bool stream;               // informational: the server frames events itself
} td_gen_request;

typedef struct td_top_logprob {
    int32_t token;
    float logprob;
} td_top_logprob;

// One token event. Pointers are valid only during the callback (the server copies).
typedef struct td_gen_token {
    int index;              // choice index in [0, n); -1 with prompt == true
    bool prompt;            // a prompt token's logprob (prompt_logprobs), in prompt order; first has none
    int32_t token;
    const char *text;       // bytes to emit now (after stop-string hold-back; may be empty)
    size_t text_len;
    bool has_logprob;       // false for the first prompt token
    float logprob;
    const td_top_logprob *top;  // [n_top] alternatives, best first
    int n_top;
    uint64_t weights_version;  // the engine's weights version whose logits gave this event (0: the
                               //   weights it started with; engine/engine.h); servers may ignore it
} td_gen_token;

typedef struct td_gen_usage {
    int prompt_tokens;
    int completion_tokens;  // over all choices
    int cached_tokens;      // prompt tokens served from the prefix cache
} td_gen_usage;

// Events from the engine. Callbacks arrive on engine threads, never concurrently for one request, in
// order: tokens of a choice, then that choice's on_finish; finally exactly one on_done per accepted
// submit, also after cancel (with on_finish(TD_FINISH_ABORT) first for choices still open) or an error.
// After on_done returns the engine never touches the sink or the request again. Callbacks must not
// block for long: the server only copies and wakes its connection.
typedef struct td_gen_sink {
    void *ctx;
    void (*on_token)(void *ctx, const td_gen_token *tok);
    // tail: held-back text released at the end (length/EOS finish), may be empty.
    void (*on_finish)(void *ctx, int index, td_finish_reason reason, const char *tail, size_t tail_len);
    // status TD_OK, or the failure (message in msg) that ended the request early.
    void (*on_done)(void *ctx, const td_gen_usage *usage, td_status status, const char *msg);
} td_gen_sink;

typedef struct td_engine_stats {
    int num_running;                    // sequences being decoded
    int num_waiting;                    // accepted, not yet scheduled
    double kv_cache_usage;              // fraction [0, 1] of KV blocks in use
    uint64_t prefix_cache_queries;      // tokens looked up in the prefix cache (cumulative)
    uint64_t prefix_cache_hits;         // of which found (cumulative)
    uint64_t num_preemptions;           // cumulative
    uint64_t num_aborted;               // requests cancelled and freed by the engine (cumulative)
} td_engine_stats;

typedef struct td_engine_info {
    const char *model_name;   // served model id; pointer owned by the engine, stable while it lives
    int max_model_len;        // tokens, prompt + completion
    int vocab_size;
    int64_t created;          // unix seconds, for /v1/models
    int embed_dim;            // floats per embedding (the hidden size); 0: no embeddings (embed NULL)
    const char *embed_pooling;  // "last" or "mean" (static string), NULL without embeddings
    bool embed_normalized;    // embeddings are L2-normalised
} td_engine_info;

// One embeddings request: every input already as token ids. Built by the server in the request's
// arena; the engine reads it, and writes out, until on_done has returned.
typedef struct td_embed_request {
    const int32_t *tokens;  // [offsets[n_inputs]] the inputs' ids, concatenated
    const int *offsets;     // [n_inputs + 1]: input i is tokens[offsets[i], offsets[i + 1]); offsets[0] == 0
    int n_inputs;           // >= 1; each input has 1..max_model_len tokens
    float *out;             // [n_inputs, embed_dim] written before on_done reports TD_OK
} td_embed_request;

typedef struct td_embed_sink {
    void *ctx;
    // Exactly once per accepted embed call, on an engine thread, without engine locks held; status
    // TD_OK (out is filled) or the failure that ended it (message in msg). Must not block for long.
    void (*on_done)(void *ctx, td_status status, const char *msg);
} td_embed_sink;

typedef struct td_engine_handle {
    uint64_t v;  // opaque to the server
} td_engine_handle;

// The engine's method table (a static const table in each implementation). Methods marked optional
// may be NULL; the server then answers the route that needs them with 501.
typedef struct td_engine_iface {
    void (*info)(void *ctx, td_engine_info *out);
    // Accepts a request; events follow on sink (see td_gen_sink). Thread-safe. On failure returns a
    // status (TD_ERR_LIMIT: queue full, retry later) and makes no sink call.
    td_status (*submit)(void *ctx, const td_gen_request *req, const td_gen_sink *sink, td_engine_handle *h,
                        td_err *err);
    // Asks the engine to stop a submitted request and free its blocks. Thread-safe, idempotent,
    // never blocks on generation; on_done still follows (possibly already in flight).
    void (*cancel)(void *ctx, td_engine_handle h);
    void (*stats)(void *ctx, td_engine_stats *out);
    // Text -> token ids. Size-first: writes min(count, cap) ids and returns count, or -1 with err.
    int (*tokenize)(void *ctx, const char *text, size_t len, bool add_special, int32_t *ids, int cap,
                    td_err *err);
    // Token ids -> text. Writes min(len, cap) bytes and returns the full length, or -1 with err.
    long (*detokenize)(void *ctx, const int32_t *ids, int n, char *out, size_t cap, td_err *err);
    // Optional. Renders OpenAI chat messages (the request body's "messages", plus "tools" etc. in body)
    // with the model's chat template. *out is malloc'd (caller frees). add_generation_prompt as vLLM.
    td_status (*apply_chat_template)(void *ctx, const cJSON *messages, const cJSON *body,
                                     bool add_generation_prompt, char **out, size_t *len, td_err *err);
    // Optional (NULL: the server answers POST /v1/embeddings with 400, "this model does not serve
    // embeddings"). Pools the final hidden state of each input (td_engine_info says how). Thread-safe.
    // On failure returns a status (TD_ERR_INVALID: bad input; TD_ERR_UNSUPPORTED: not on this
    // engine; TD_ERR_LIMIT: busy, shutting down, retry later) with a message and makes no sink call.
    td_status (*embed)(void *ctx, const td_embed_request *req, const td_embed_sink *sink, td_err *err);
} td_engine_iface;

typedef struct td_engine {
    const td_engine_iface *vt;
    void *ctx;
} td_engine;

#endif
