// The serving engine: continuous batching over one model. It owns the forward (external KV), one
// paged td_kv_pool sized once, the scheduler, per-request state (sampling parameters and a td_rng
// per choice, stop matcher, incremental detokenizer, log-probability requests) and one engine
// thread that runs the step loop: new submissions and cancels -> td_sched_step -> one flat batch
// with block tables from the pool -> forward -> sample -> events. It implements the server's
// td_engine_iface (engine/serve_api.h), whose request/sink/threading contract it follows.
// Not here: HTTP (server/), request validation beyond what it needs to stay safe (the server
// validates bodies), signals.
#ifndef TD_ENGINE_ENGINE_H
#define TD_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/model.h"
#include "engine/serve_api.h"
#include "tokenizer/tokenizer.h"

typedef struct td_eng td_eng;

#define TD_ENG_MAX_N 64  // choices per request (server caps n at 16)

typedef struct td_eng_params {
    const char *model_name;     // served model id (copied); NULL: the model path's last component
    size_t kv_cache_bytes;      // K/V budget in bytes; 0: kv_cache_fraction of MemAvailable, capped
                                //   at what max_seqs sequences of max_model_len tokens can use
    double kv_cache_fraction;   // default 0.25
    int kv_blocks;              // > 0: exactly this many blocks (tests); budget ignored
    int block_size;             // tokens per KV block (default 16)
    td_dtype kv_cache_dtype;    // K/V element type: TD_F32 (default; exact), TD_F16 or TD_BF16 (half
                                //   the bytes per token, so a budget holds twice the blocks)
    int max_batched_tokens;     // tokens per step, decodes + prefill chunks (default 512); also the
                                //   rows of the logits buffer (prompt logprobs need one per token)
    int max_seqs;               // sequences running at once (default 32)
    int max_waiting;            // sequences queued in the scheduler beyond those (default 256)
    int max_queue;              // requests accepted and not yet done; beyond: TD_ERR_LIMIT (default 4096)
    int max_model_len;          // tokens per sequence; 0: the model's max_position_embeddings
                                //   (4096 if unknown); more than that is TD_ERR_INVALID. Lowered
                                //   to what the pool holds.
    bool enable_prefix_cache;   // default true
    int n_threads;              // forward threads; <= 0: all online CPUs
    const char *chat_template;  // Jinja source overriding the tokenizer's (copied); NULL: tokenizer's
    bool debug_checks;          // run td_sched_check after every step (tests); failures are counted
} td_eng_params;

td_eng_params td_eng_default_params(void);

// Creates the engine and starts its thread. m and tok are borrowed and must outlive the engine.
// The pool holds kv_cache_dtype elements. Errors: TD_ERR_INVALID (bad params or KV dtype, a
// chat_template override that does not compile), TD_ERR_LIMIT (budget holds no block),
// TD_ERR_NOMEM. A tokenizer template that does not compile is logged and chat requests then fail
// with its message.
// On failure *out is NULL and nothing leaks.
td_status td_eng_create(const td_model *m, const td_tokenizer *tok, const td_eng_params *p, td_eng **out,
                        td_err *err);
// Cancels every request still live (on_finish(ABORT) for open choices, then on_done), joins the
// engine thread and frees everything. Stop the server first. NULL is fine.
void td_eng_free(td_eng *e);

// The server's view of this engine: vt + ctx, valid while e lives.
td_engine td_eng_iface(td_eng *e);

// The iface methods, callable directly (same contracts as td_engine_iface in engine/serve_api.h).
// submit copies *req and *sink (req's pointers must stay valid until on_done, as the contract
// says); it checks what the engine relies on (n in [1, TD_ENG_MAX_N], prompt ids inside the
// vocabulary, prompt shorter than max_model_len, max_tokens >= 1, sampling ranges, stop strings,
// logprobs <= 20): TD_ERR_INVALID with a message. TD_ERR_LIMIT when max_queue requests are live.
td_status td_eng_submit(td_eng *e, const td_gen_request *req, const td_gen_sink *sink, td_engine_handle *h,
                        td_err *err);
void td_eng_cancel(td_eng *e, td_engine_handle h);
void td_eng_stats(td_eng *e, td_engine_stats *out);
void td_eng_info(td_eng *e, td_engine_info *out);

// Pool and loop counters for tests and logs (a snapshot taken by the engine thread after each
// step, so it lags by at most one step).
typedef struct td_eng_debug {
    int n_blocks, n_blocks_free, n_blocks_evictable, n_blocks_used;  // blocks
    int block_size;                                                   // tokens
    int max_model_len;                                                // tokens
    int n_live;              // requests submitted and not yet done
    uint64_t n_steps;        // forward steps run
    uint64_t n_batch_tokens; // tokens through the forward, total
    uint64_t n_check_failures;  // td_sched_check failures (debug_checks)
    char check_msg[160];        // the first one's message
} td_eng_debug;
void td_eng_debug_get(td_eng *e, td_eng_debug *out);

#endif
