// The serving engine: continuous batching over one model. It owns the forward (external KV), one
// paged td_kv_pool sized once, the scheduler, per-request state (sampling parameters and a td_rng
// per choice, stop matcher, incremental detokenizer, log-probability requests) and one engine
// thread that runs the step loop: new submissions, cancels and commands (weights updates, KV
// imports, drain) -> td_sched_step -> one flat batch with block tables from the pool -> forward ->
// sample -> events. It implements the server's
// td_engine_iface (engine/serve_api.h), whose request/sink/threading contract it follows.
// Not here: HTTP (server/), request validation beyond what it needs to stay safe (the server
// validates bodies), signals.
#ifndef TD_ENGINE_ENGINE_H
#define TD_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/export.h"
#include "model/model.h"
#include "engine/serve_api.h"
#include "tokenizer/tokenizer.h"

typedef struct td_eng td_eng;
struct td_buffer;

#define TD_ENG_MAX_N 64  // choices per request (server caps n at 16)

// How an embedding pools the final hidden states of its input's tokens (TD_ENG_CMD_EMBED).
typedef enum td_eng_pooling {
    TD_ENG_POOL_LAST = 0,  // the last token's (vLLM's default for decoder-only models)
    TD_ENG_POOL_MEAN,      // the mean over every token of the input (a BOS the tokenizer added included)
} td_eng_pooling;

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
    const char *backend;        // td_backend_create's name: NULL = $TANDEM_BACKEND, else cpu
    int device;                 // the backend's device index (< 0: $TANDEM_DEVICE, else 0)
    const char *chat_template;  // Jinja source overriding the tokenizer's (copied); NULL: tokenizer's
    bool debug_checks;          // run td_sched_check after every step and command (tests); failures
                                //   are counted
    bool updatable_weights;     // create the forward with own_weights so that SET_WEIGHTS can replace
                                //   the weights (default false: it costs a copy of the weights)
    td_eng_pooling pooling;     // embeddings: TD_ENG_POOL_LAST (default) or TD_ENG_POOL_MEAN
    bool embed_no_normalize;    // embeddings are L2-normalised unless this is set
} td_eng_params;

td_eng_params td_eng_default_params(void);

// Creates the engine and starts its thread. m and tok are borrowed and must outlive the engine.
// The pool holds kv_cache_dtype elements; with updatable_weights the forward owns a copy of the
// weights. Errors: TD_ERR_INVALID (bad params or KV dtype, a
// chat_template override that does not compile), TD_ERR_LIMIT (budget holds no block),
// TD_ERR_NOMEM. A tokenizer template that does not compile is logged and chat requests then fail
// with its message.
// On failure *out is NULL and nothing leaks.
td_status td_eng_create(const td_model *m, const td_tokenizer *tok, const td_eng_params *p, td_eng **out,
                        td_err *err);
// Cancels every request still live (on_finish(ABORT) for open choices, then on_done), completes
// commands still queued (and DRAINs still waiting, EMBEDs still running) with TD_ERR_LIMIT
// "shutting down", drops pending
// KV imports, joins the engine thread and frees everything, tickets included. Stop the server, and
// every thread that may call td_eng_command, first. NULL is fine.
void td_eng_free(td_eng *e);

// The server's view of this engine: vt + ctx, valid while e lives.
td_engine td_eng_iface(td_eng *e);

// The iface methods, callable directly (same contracts as td_engine_iface in engine/serve_api.h).
// submit copies *req and *sink (req's pointers must stay valid until on_done, as the contract
// says); it checks what the engine relies on (n in [1, TD_ENG_MAX_N], prompt ids inside the
// vocabulary, prompt shorter than max_model_len, max_tokens >= 1, sampling ranges, stop strings,
// logprobs <= 20): TD_ERR_INVALID with a message. TD_ERR_LIMIT when max_queue requests are live,
// while draining (DRAIN), or while the weights are unusable after a failed SET_WEIGHTS.
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
    uint64_t weights_version;   // see td_eng_state
    bool weights_ok;
    bool draining;
    int n_imports;              // KV imports pending (between IMPORT_BEGIN and TRANSFER_DONE)
} td_eng_debug;
void td_eng_debug_get(td_eng *e, td_eng_debug *out);

// ---- Commands: typed requests to the engine thread besides generation (docs/engine.md, "The
// command queue"). They are applied by the engine thread between steps, never inside one, in the
// order they were submitted (FIFO), each with its own completion status. With debug_checks the
// scheduler and pool invariants are checked after every command.
//
// Weights versions: 0 is the weights the engine was created with; every successful SET_WEIGHTS
// adds 1. The prefix cache mixes the version into its keys (td_sched_set_weights_version), so KV
// computed by other weights is never reused, and every token event carries the version whose
// logits produced it (td_gen_token.weights_version).

typedef enum td_eng_cmd_type {
    TD_ENG_CMD_SET_WEIGHTS = 1,  // replace every weight from a named-tensor source
    TD_ENG_CMD_IMPORT_BEGIN,     // reserve blocks for the KV of a token prefix written by the caller
    TD_ENG_CMD_TRANSFER_DONE,    // that KV is written (or the transfer failed): cache it (or drop it)
    TD_ENG_CMD_DRAIN,            // stop admitting submissions; completes when no request is live
    TD_ENG_CMD_RESUME,           // admit submissions again
    TD_ENG_CMD_REPORT_STATE,     // fill a td_eng_state
    TD_ENG_CMD_EMBED,            // pooled final hidden states of token sequences (embeddings)
} td_eng_cmd_type;

typedef struct td_eng_state {
    uint64_t weights_version;  // 0: the weights of td_eng_create; +1 per successful SET_WEIGHTS
    bool weights_ok;           // false after a failed SET_WEIGHTS, until a successful one
    bool draining;             // DRAIN applied, no RESUME since: submissions are refused
    int n_running, n_waiting;  // scheduler sequences (choices), running / queued
    int n_live;                // requests submitted and not yet done
    int n_blocks, n_blocks_free, n_blocks_evictable, n_blocks_used;  // blocks; used includes imports'
    int n_imports;             // KV imports pending
    int n_import_blocks;       // blocks they reserve
    uint64_t n_steps;          // forward steps run
    uint64_t n_commands;       // commands applied, this one included
} td_eng_state;

typedef struct td_eng_cmd {
    td_eng_cmd_type type;
    union {
        struct {  // TD_ENG_CMD_SET_WEIGHTS
            // in: the source (model/export.h): HF names and layout, f32 values, e.g.
            // td_export_model_get with another loaded td_model * of the same config. Called on
            // the engine thread, once per tensor; get and ctx must stay valid until the command
            // has completed (see td_eng_command for a timeout).
            td_export_get_fn get;
            void *ctx;
            uint64_t version;  // out: the engine's weights version after the command
            td_export_get_typed_fn get_typed;  // in, optional: the source's typed form
                                               //   (td_forward_set_weights_typed), same ctx
        } set_weights;
        struct {  // TD_ENG_CMD_IMPORT_BEGIN
            // in: the prefix whose KV will be imported; only its full blocks are, n_tokens /
            // block_size of them (at least one; n_tokens <= max_model_len). Copied at submit.
            const int32_t *tokens;
            int n_tokens;
            uint64_t weights_version;  // in: the version the KV was computed with (must be current)
            int lease_ms;              // in: the reservation ends (blocks freed, nothing cached)
                                       //   unless TRANSFER_DONE is applied within this; > 0
            // out, written by the waiting call into caller-owned arrays (either may be NULL):
            int32_t *blocks;   // [n_tokens / block_size] pool block ids of logical blocks 0..
            size_t *offsets;   // [n_tokens / block_size][n_layers][2]: byte offsets in `buffer`
                               //   of each block's K (index 0) and V (1) in each layer
            uint64_t import_id;        // out
            int n_blocks;              // out: blocks reserved
            struct td_buffer *buffer;  // out: the pool's buffer (td_kv_pool_buffer), valid while
                                       //   the engine lives; write with td_buffer_set
            size_t block_bytes;        // out: bytes of one block's K (or V) in one layer
                                       //   (block_size rows of n_kv_heads * head_dim elements)
            td_dtype dtype;            // out: the element type of those rows (the KV cache dtype)
        } import;
        struct {  // TD_ENG_CMD_TRANSFER_DONE
            uint64_t import_id;   // in
            td_status status;     // in: TD_OK when every block's K and V are written; otherwise the
                                  //   transfer failed and the blocks are freed, nothing cached
            int n_cached_tokens;  // out: tokens entered into the prefix cache (0 after a failure)
        } transfer_done;
        td_eng_state state;  // out: TD_ENG_CMD_REPORT_STATE
        struct {  // TD_ENG_CMD_EMBED
            // in (copied at submit): input i is tokens[offsets[i], offsets[i + 1]), offsets[0] == 0,
            // each 1..max_model_len ids inside the vocabulary; n_inputs >= 1.
            const int32_t *tokens;
            const int *offsets;
            int n_inputs;
            // out: [n_inputs, dim] caller-owned (may be NULL), filled by the waiting call: each
            // input's final hidden state (forward.h, td_forward_run_kv_hidden) pooled by
            // td_eng_params.pooling, L2-normalised unless embed_no_normalize. The inputs run
            // through the forward in batches of up to max_seqs inputs and max_batched_tokens
            // tokens, each over KV blocks held for it alone and released when it is done, so
            // running sequences and the prefix cache are untouched (nothing is cached). Once
            // applied, the command runs one such forward after each generation step (both
            // advance; later commands do not wait for it; EMBEDs run one after another) and
            // completes when its last input is pooled. TD_ERR_LIMIT when the pool cannot hold
            // one input now (blocks in use: retry later), while draining, with unusable
            // weights, when a SET_WEIGHTS is applied meanwhile (its hidden states would mix
            // weights) or at shutdown. A DRAIN completes only once no EMBED runs.
            float *out;
            int dim;       // out: floats per embedding (the model's hidden size)
            int n_tokens;  // out: tokens run, offsets[n_inputs]
        } embed;
    };
} td_eng_cmd;

// Submits *cmd and waits for its completion, at most timeout_ms (> 0). Returns the command's
// status (err says why it failed) and fills its out fields. Callable from any thread except the
// engine's own (sink callbacks: use td_eng_cmd_submit there), not after td_eng_free has begun.
// Statuses: TD_ERR_INVALID (bad command: checked before anything is queued), TD_ERR_LIMIT (engine
// shutting down; IMPORT_BEGIN: no room), TD_ERR_TIMEOUT (the deadline passed, see below), TD_ERR_UNSUPPORTED
// (SET_WEIGHTS without updatable_weights; IMPORT_BEGIN with the prefix cache off), TD_ERR_NOT_FOUND
// (TRANSFER_DONE for an unknown, finished, expired or dropped import: the message names the id and
// why), or a SET_WEIGHTS source's own status and message.
// Deadline (TD_ERR_TIMEOUT, message "... timed out ..."): a command
// still queued is cancelled and never runs; one already being applied completes on the engine
// thread and its result is discarded (its effect stands: e.g. a DRAIN keeps admission closed).
// Nothing of the caller's *cmd is touched after return. A SET_WEIGHTS source timed out while
// running is still in use until the command completes; since commands are applied one at a time
// in FIFO order, any later command's completion (e.g. a REPORT_STATE) proves it has.
td_status td_eng_command(td_eng *e, td_eng_cmd *cmd, int timeout_ms, td_err *err);

// The same in two halves. A ticket is engine-owned; the caller releases it exactly once.
typedef struct td_eng_ticket td_eng_ticket;
// Checks and queues *cmd (inputs copied: the caller's struct may go away) and returns at once;
// callable from any thread, sink callbacks included. On failure *t is NULL and nothing is queued.
td_status td_eng_cmd_submit(td_eng *e, const td_eng_cmd *cmd, td_eng_ticket **t, td_err *err);
// Waits up to timeout_ms (0: poll; the engine thread may only poll) for the command. Completed:
// *done = true, the out fields are copied into *cmd (may be NULL; for IMPORT_BEGIN into the
// arrays *cmd names) and the command's status is returned. Not yet: *done = false, TD_ERR_TIMEOUT.
td_status td_eng_cmd_wait(td_eng *e, td_eng_ticket *t, td_eng_cmd *cmd, int timeout_ms, bool *done,
                          td_err *err);
// TD_ENG_CMD_EMBED without a waiter (the iface's embed method): checks and queues req as that
// command and returns at once; when it completes, the engine thread copies the embeddings into
// req->out (on success) and calls sink->on_done exactly once (also with TD_ERR_LIMIT "shutting
// down" when the engine ends first). req's arrays must stay valid until then. On failure nothing
// is queued and no sink call follows. Callable from any thread.
td_status td_eng_embed(td_eng *e, const td_embed_request *req, const td_embed_sink *sink, td_err *err);

// Frees the ticket: a command still queued is cancelled (never runs), one being applied completes
// and its result is discarded. Tickets not released are freed by td_eng_free (and die with it).
void td_eng_cmd_release(td_eng *e, td_eng_ticket *t);

#endif
