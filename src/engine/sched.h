// The scheduler: continuous batching with chunked prefill, prefix caching and preemption by
// recomputation, as pure decision logic over a td_kv_pool. Each td_sched_step says which
// sequences run this step with how many tokens, and hands out the blocks they need; it runs no
// model and never allocates. Not thread-safe: the engine's step loop owns it and forwards
// cancellations from other threads. Policy and invariants: docs/engine.md.
//
// Call protocol (the engine's step loop):
//   td_sched_add / td_sched_fork / td_sched_cancel / td_sched_finish   at any time between steps
//   td_sched_step(&out)  -> run out.copies (td_kv_pool_run_copies), then the forward over
//                           out.entries (writing K/V through each table)
//   td_sched_append_token for every entry with needs_logits, after sampling
//   ... and again. Calling td_sched_step (or td_sched_finish / td_sched_fork) tells the scheduler
//   that the previous step's forward completed: only then are its full blocks entered into the
//   prefix cache. If a forward fails, cancel the sequences of that step (td_sched_cancel never
//   caches anything).
#ifndef TD_ENGINE_SCHED_H
#define TD_ENGINE_SCHED_H

#include <stdbool.h>
#include <stdint.h>
#include "base/status.h"
#include "engine/kv_pool.h"
#include "engine/seq.h"

typedef struct td_sched td_sched;

typedef struct td_sched_params {
    int max_batched_tokens;  // tokens per step, decodes and prefill chunks together (>= max_seqs)
    int max_seqs;            // running sequences at once
    int max_waiting;         // queued sequences accepted by td_sched_add beyond those
    int max_ctx;             // tokens per sequence (prompt + generated)
    bool enable_prefix_cache;
} td_sched_params;

td_sched_params td_sched_default_params(
    void);  // 2048 tokens, 64 seqs, 1024 waiting, ctx 4096, cache on

// Creates a scheduler over `pool` (borrowed: it must outlive the scheduler, and the scheduler
// must be its only client: blocks held outside sequences go through td_sched_hold_blocks). Slots
// for max_seqs + max_waiting sequences and the step output are preallocated here. TD_ERR_INVALID on bad params. On failure *out is NULL.
td_status td_sched_create(const td_sched_params *p, td_kv_pool *pool, td_sched **out, td_err *err);
// Releases every sequence's blocks back to the pool (cached ones stay cached) and frees all.
void td_sched_free(td_sched *s);

// Queues a new sequence (FCFS). The prompt is copied; token ids are not checked here (the engine
// knows the vocabulary). The sequence may hold up to n_prompt + max_new_tokens tokens (clamped
// to max_ctx, so a prompt of max_ctx tokens leaves no room to append: the engine finishes it
// after its first sample); its buffers are allocated here.
// Errors: TD_ERR_INVALID (empty prompt, max_new_tokens < 0, id already live),
// TD_ERR_LIMIT (prompt longer than max_ctx; the sequence's full need exceeds the whole pool;
// the waiting queue is full: retryable), TD_ERR_NOMEM. On error nothing changed.
td_status td_sched_add(td_sched *s, uint64_t seq_id, const int32_t *prompt, int n_prompt,
                       int max_new_tokens, td_err *err);

typedef struct td_sched_entry {
    uint64_t seq_id;
    const int32_t *tokens;  // [n_tokens] ids at positions start_pos.. (a view into the sequence)
    int start_pos;          // KV of positions [0, start_pos) is in the table's blocks already
    int n_tokens;           // tokens to compute this step (>= 1)
    bool is_prefill;        // prompt (or recompute) chunk rather than a decode
    bool needs_logits;      // the chunk ends at the last known token: sample one after the forward
    td_block_table table;   // covers positions [0, start_pos + n_tokens)
    int n_new_blocks;       // the last n_new_blocks ids of the table were allocated this step
    int n_cached_tokens;    // on admission: leading tokens served by the prefix cache (else 0)
} td_sched_entry;

typedef struct td_sched_out {
    const td_sched_entry *entries;  // [n_entries]: decodes first, then prefill chunks
    int n_entries;
    int n_decode;               // entries [0, n_decode) are decodes (1 token each)
    int n_tokens;               // sum of n_tokens, <= max_batched_tokens
    const uint64_t *preempted;  // [n_preempted] ids sent back to the waiting queue this step
    int n_preempted;
    int n_admitted;    // sequences moved from waiting to running this step
    int n_new_blocks;  // blocks allocated this step
    // Block copies decided since the previous step (forks' partly filled blocks): the engine runs
    // them, in order, before this step's forward, even when n_entries is 0.
    const td_kv_copy *copies;
    int n_copies;
} td_sched_out;

// Forms the next batch (policy in docs/engine.md). Everything `out` points to is owned by the
// scheduler and valid until the next call that changes it (step, add, fork, finish, cancel,
// append). An empty batch (n_entries 0) means nothing can run: no live sequence, or every
// running one awaits its sampled token.
void td_sched_step(td_sched *s, td_sched_out *out);

// Appends a sampled (or forced) token. Running sequences in their decode phase accept one token
// at a time (TD_ERR_INVALID if one is already pending); waiting ones accept any number.
// TD_ERR_LIMIT when the sequence is at its capacity (the engine should have finished it),
// TD_ERR_NOT_FOUND for an unknown id.
td_status td_sched_append_token(td_sched *s, uint64_t seq_id, int32_t token, td_err *err);

// Makes every (re-)admission of this sequence compute its whole prefix instead of taking
// prefix-cache hits (its own full blocks are still entered into the cache). For requests that
// need the logits of every prompt position (prompt log-probabilities), as vLLM does.
// TD_ERR_NOT_FOUND for an unknown id.
td_status td_sched_set_no_prefix_hit(td_sched *s, uint64_t seq_id, bool no_hit);

// Ends a sequence normally: its computed full blocks enter the prefix cache, then all its blocks
// are released and its slot freed. TD_ERR_NOT_FOUND for an unknown id.
td_status td_sched_finish(td_sched *s, uint64_t seq_id);
// Ends a sequence in any state (client gone, failed forward): blocks released at once, nothing
// new is cached. TD_ERR_NOT_FOUND for an unknown id.
td_status td_sched_cancel(td_sched *s, uint64_t seq_id);

// Forks sequence parent_id into a new sequence child_id with the same tokens and capacity (n > 1
// samples: fork after the prompt's last chunk, then append a different sampled token to each).
// The child shares the parent's full blocks (one more reference each) and gets a private copy of
// the partly filled last block (a copy returned by the next td_sched_step in out.copies, which the
// engine runs before that step's forward), so no block is ever written by two sequences.
// A running parent's child runs at once when a running slot and a block for the copy are free;
// otherwise it waits (ahead of later arrivals) and recomputes, reusing the shared prefix from
// the cache. Errors: TD_ERR_NOT_FOUND (parent), TD_ERR_INVALID (child id live),
// TD_ERR_LIMIT (no free slot), TD_ERR_NOMEM. On error nothing changed.
td_status td_sched_fork(td_sched *s, uint64_t parent_id, uint64_t child_id, td_err *err);

// New model weights (engine command): every running sequence goes back to the waiting queue with
// its tokens (nothing of its KV is entered into the prefix cache) to be recomputed under the new
// weights, pending fork copies are dropped, and the pool's prefix cache is reset to `version`
// (td_kv_pool_cache_reset): no KV computed by the old weights is ever read again. Call between
// steps, after the last step's forward.
void td_sched_set_weights_version(td_sched *s, uint64_t version);

// Blocks held outside any sequence (a KV import being written by a transport): n blocks taken from
// free or evictable ones, never by preempting (TD_ERR_LIMIT when there is no room), one reference
// each, counted by td_sched_check. The holder writes them, may enter them into the prefix cache
// (td_kv_pool_cache_insert), and releases them with td_sched_unhold_blocks (last to first, as a
// sequence releases its blocks); td_sched_free releases what is still held.
td_status td_sched_hold_blocks(td_sched *s, int n, int32_t *blocks, td_err *err);
void td_sched_unhold_blocks(td_sched *s, const int32_t *blocks, int n);
int td_sched_n_held(const td_sched *s);  // references held

// The live sequence with this id, or NULL. Read-only; valid until it finishes or is cancelled.
const td_seq *td_sched_get(const td_sched *s, uint64_t seq_id);

typedef struct td_sched_stats {
    int n_running, n_waiting;
    int n_blocks;             // pool size
    int n_blocks_free;        // free (never cached or evicted)
    int n_blocks_evictable;   // cached and unreferenced
    int n_blocks_used;        // referenced by sequences
    double kv_usage;          // n_blocks_used / n_blocks
    uint64_t prefix_queries;  // tokens looked up at admissions (each admission counts its tokens)
    uint64_t prefix_hits;     // of which found in the cache
    uint64_t n_preemptions;
    uint64_t n_steps;
    uint64_t n_finished, n_cancelled;
} td_sched_stats;

void td_sched_stats_get(const td_sched *s, td_sched_stats *out);

// Checks every invariant (pool bookkeeping; each block's refcount equals the references from
// sequence tables plus held blocks; table sizes; queue order; id map) in O(n_blocks + live tokens). For tests and
// debug builds; allocates scratch. TD_ERR_INVALID naming the first violation.
td_status td_sched_check(const td_sched *s, td_err *err);

#endif
