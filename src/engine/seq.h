// A sequence as the scheduler sees it: its token ids, how many of them have KV in the pool, and
// its block table. Not the request (sampling parameters, stop strings, output text live in the
// engine); not thread-safe. The scheduler owns every td_seq; others read them through
// td_sched_get() and never write.
#ifndef TD_ENGINE_SEQ_H
#define TD_ENGINE_SEQ_H

#include <stdbool.h>
#include <stdint.h>

typedef enum td_seq_state {
    TD_SEQ_FREE = 0,  // slot unused
    TD_SEQ_WAITING,   // queued (new, forked without room, or preempted); holds no blocks
    TD_SEQ_RUNNING,   // admitted; holds blocks for positions [0, n_computed)
} td_seq_state;

typedef struct td_seq {
    uint64_t id;  // the caller's id (unique among live sequences)
    td_seq_state state;

    // tokens[0, n_tokens): prompt then sampled tokens; capacity = n_prompt + max_new_tokens,
    // clamped to max_ctx. KV exists for positions [0, n_computed); n_computed <= n_tokens.
    // A running sequence has pending work when n_computed < n_tokens.
    int32_t *tokens;  // [capacity]
    int capacity;     // tokens
    int n_prompt;     // tokens
    int n_tokens;     // tokens
    int n_computed;   // tokens (advanced when a step schedules them: the KV is written by that
                      // step's forward, which the engine runs before calling the scheduler again)

    // Block table: blocks[i] holds positions [i * block_size, (i + 1) * block_size).
    // Running: n_blocks == ceil(n_computed / block_size). Waiting: n_blocks == 0.
    int32_t *blocks;  // [max_blocks] pool block ids, one reference each
    int max_blocks;   // ceil(capacity / block_size)
    int n_blocks;

    // Prefix-cache chain of the first n_hashed full blocks: hashes[i] is the chained hash of
    // blocks 0..i, entries[i] the cache entry id that stands for that prefix (possibly another
    // sequence's block when both computed the same prefix).
    uint64_t *hashes;   // [max_blocks]
    uint64_t *entries;  // [max_blocks]
    int n_hashed;

    bool prefilling;      // still computing tokens it already knows (prompt, or recompute after
                          // preemption); false once a chunk reached n_tokens (decode phase)
    uint64_t order;       // FCFS rank: arrival number (a fork shares its parent's)
    int n_cached_tokens;  // prefix-cache hit at the first admission (tokens)
    int n_preemptions;
    bool no_prefix_hit;   // never admitted with prefix-cache hits (td_sched_set_no_prefix_hit):
                          // the engine needs every position's logits (prompt logprobs)
    void *mem;  // the one allocation that tokens, blocks, hashes, entries live in
} td_seq;

#endif
