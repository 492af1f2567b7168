// The paged KV cache: one pool of fixed-size blocks of keys and values for all layers, sized once
// from a memory budget and allocated as one buffer of a backend (backend/backend.h; host memory
// without one), reference-counted so that blocks are shared, plus an exact prefix cache over full
// blocks (chained hash from a root that mixes in the weights version, token ids compared on every
// hit, LRU eviction of unused blocks).
// It is not a scheduler: it never decides who gets blocks (engine/sched.h does) and it is not
// thread-safe (one engine thread owns it).
#ifndef TD_ENGINE_KV_POOL_H
#define TD_ENGINE_KV_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "tensor/dtype.h"

struct td_backend;
struct td_buffer;

typedef struct td_kv_pool td_kv_pool;

// The blocks of one sequence as the forward reads them: logical block i holds positions
// [i * block_size, (i + 1) * block_size). Position p lives in block ids[p / block_size], slot
// p % block_size. A view: the ids belong to whoever filled the struct (the scheduler's sequence).
typedef struct td_block_table {
    const int32_t *ids;  // [n_blocks] pool block ids
    int n_blocks;        // blocks
    int n_tokens;        // positions with valid (or being-written) KV: [0, n_tokens)
} td_block_table;

// Optional override of the block hash (tests use it to force collisions). Must be deterministic.
typedef uint64_t (*td_kv_hash_fn)(uint64_t parent_hash, const int32_t *tokens, int n_tokens);

typedef struct td_kv_pool_params {
    int block_size;  // tokens per block (default 16)
    int n_layers;    // layers whose K and V the pool holds
    int n_kv_heads;
    int head_dim;
    td_dtype dtype;         // element type of K and V: TD_F32, TD_F16 or TD_BF16
    size_t budget_bytes;    // bytes for K and V of all layers; n_blocks = budget / bytes_per_block
    int n_blocks;           // > 0: exactly this many blocks, budget ignored
    bool alloc_data;        // false: bookkeeping only (scheduler tests, capacity planning); the
                            // data accessors then return NULL and dims may be 0
    struct td_backend *backend;  // where K/V live (borrowed: must outlive the pool); NULL: host
                                 // memory (td_host_buft)
    uint64_t hash_seed;     // parent hash of every sequence's first block (a salt; default 0)
    td_kv_hash_fn hash_fn;  // NULL: XXH3_64bits_withSeed(tokens, parent_hash)
} td_kv_pool_params;

td_kv_pool_params td_kv_pool_default_params(void);

// Bytes one block takes: block_size * n_layers * 2 (K, V) * n_kv_heads * head_dim * elem bytes.
// 0 when a dimension is not positive or the dtype is not a float cache type.
size_t td_kv_pool_bytes_per_block(const td_kv_pool_params *p);

// Creates the pool: one allocation for K/V (when alloc_data), one for the bookkeeping.
// Fails with TD_ERR_INVALID on bad params, TD_ERR_LIMIT when the budget holds no block,
// TD_ERR_NOMEM when allocation fails. On failure *out is NULL. The caller owns the pool.
td_status td_kv_pool_create(const td_kv_pool_params *p, td_kv_pool **out, td_err *err);
void td_kv_pool_free(td_kv_pool *pool);

int td_kv_pool_n_blocks(const td_kv_pool *pool);
int td_kv_pool_block_size(const td_kv_pool *pool);

// Block states (each block is in exactly one):
//   free       refcount 0, not cached: on the free stack.
//   evictable  refcount 0, cached: on the LRU list, reusable by its prefix until evicted.
//   used       refcount > 0 (cached or not).
int td_kv_pool_n_free(const td_kv_pool *pool);       // free blocks
int td_kv_pool_n_evictable(const td_kv_pool *pool);  // cached, unreferenced blocks
int td_kv_pool_n_cached(const td_kv_pool *pool);     // cached blocks, used or not
// Blocks td_kv_pool_alloc can still hand out: free + evictable.
static inline int td_kv_pool_n_available(const td_kv_pool *pool) {
    return td_kv_pool_n_free(pool) + td_kv_pool_n_evictable(pool);
}

// Allocates one block with refcount 1, not cached: a free block if any, else the least recently
// released evictable block (which leaves the prefix cache). TD_ERR_NOMEM when neither exists
// (no message: running out is the scheduler's normal signal).
td_status td_kv_pool_alloc(td_kv_pool *pool, int32_t *block);
// Adds a reference. The block must be used or evictable (an evictable block becomes used again
// and leaves the LRU list: this is how a prefix-cache hit is taken). Referencing a free block is
// an invariant failure.
void td_kv_pool_incref(td_kv_pool *pool, int32_t block);
// Drops a reference. At zero a cached block becomes evictable (most recently used end of the LRU
// list), an uncached one free.
void td_kv_pool_decref(td_kv_pool *pool, int32_t block);
int td_kv_pool_refcount(const td_kv_pool *pool, int32_t block);

// ---- Data access. Layout: for each layer, K then V, each [n_blocks, block_size, n_kv_heads *
// head_dim] contiguous, so one layer's K (or V) cache is a single array that kernels index with
// block * block_size + slot. Addresses are the backend's (host pointers for a host backend): only
// the backend's slots and buffer operations may touch them otherwise. All NULL for a pool without
// data.
size_t td_kv_pool_row_bytes(const td_kv_pool *pool);  // bytes of one token's K (or V) in a layer
td_dtype td_kv_pool_dtype(const td_kv_pool *pool);
void *td_kv_pool_layer_k(const td_kv_pool *pool, int layer);  // [n_blocks, block_size, kv_dim]
void *td_kv_pool_layer_v(const td_kv_pool *pool, int layer);
void *td_kv_pool_k_raw(const td_kv_pool *pool, int32_t block, int layer);  // [block_size, kv_dim]
void *td_kv_pool_v_raw(const td_kv_pool *pool, int32_t block, int layer);
// F32 pools only (an F16/BF16 pool asserts): [block_size, n_kv_heads * head_dim] floats.
float *td_kv_pool_k(const td_kv_pool *pool, int32_t block, int layer);
float *td_kv_pool_v(const td_kv_pool *pool, int32_t block, int layer);
// The buffer holding every block (NULL without data), and the byte offset in it of one block's K
// (kv 0) or V (kv 1) in a layer: where transfers and td_buffer_* calls address a block.
struct td_buffer *td_kv_pool_buffer(const td_kv_pool *pool);
size_t td_kv_pool_offset(const td_kv_pool *pool, int32_t block, int layer, int kv);
// Copies the K and V of slots [0, n_tokens) of every layer from block src to block dst (fork of a
// partially filled block) through the buffer's backend. No-op without data.
void td_kv_pool_copy(td_kv_pool *pool, int32_t src, int32_t dst, int n_tokens);
// A block copy the scheduler decided (engine/sched.h: td_sched_out.copies) and the engine runs.
typedef struct td_kv_copy {
    int32_t src, dst;  // blocks
    int n_tokens;      // slots [0, n_tokens) of every layer's K and V
} td_kv_copy;
void td_kv_pool_run_copies(td_kv_pool *pool, const td_kv_copy *ops, int n_ops);

// ---- Prefix cache. A cache entry is a full block keyed by (parent entry, its block_size token
// ids); its hash chains the parent's hash with its tokens. Lookups compare the parent entry and
// every token id, so a hash collision can never return another prefix's KV. Entry ids are unique
// for the pool's lifetime (never reused), so a child whose parent was evicted can no longer be
// reached through a recomputed parent; it just ages out of the LRU list. 0 means "no parent":
// the parent of a sequence's first block.
#define TD_KV_NO_ENTRY 0

// Hash of a full block given its parent's hash (td_kv_pool_root_hash for block 0). The root hash
// is the seed, mixed with the weights version when that is not 0.
uint64_t td_kv_pool_hash(const td_kv_pool *pool, uint64_t parent_hash, const int32_t *tokens);
uint64_t td_kv_pool_root_hash(const td_kv_pool *pool);

// New weights: every cache entry is dropped (evictable blocks become free; blocks in use stay
// with their sequences but are no longer cached, and are freed when released) and the root hash
// mixes in `version` from now on, so KV computed by other weights can never be matched. Reference
// counts are untouched. The scheduler calls it (td_sched_set_weights_version).
void td_kv_pool_cache_reset(td_kv_pool *pool, uint64_t version);
uint64_t td_kv_pool_version(const td_kv_pool *pool);

// Finds the cached block for (hash, parent_entry, tokens[block_size]); -1 if absent. Changes no
// reference count (take a hit with td_kv_pool_incref). *entry gets the entry id when found.
int32_t td_kv_pool_cache_lookup(const td_kv_pool *pool, uint64_t hash, uint64_t parent_entry,
                                const int32_t *tokens, uint64_t *entry);

// Registers used block `block`, now full of the KV of `tokens` after `parent_entry`, and returns
// the entry id that stands for this prefix. If an equal entry already exists (another sequence
// computed the same prefix concurrently) that entry's id is returned and `block` stays uncached
// (freed, not cached, when released). A block that is already cached returns its own entry.
uint64_t td_kv_pool_cache_insert(td_kv_pool *pool, int32_t block, uint64_t hash,
                                 uint64_t parent_entry, const int32_t *tokens);

// Walks tokens[0, n_blocks * block_size) block by block through the cache and returns how many
// leading blocks are cached. For each matched block i, hashes[i], entries[i], blocks[i] are
// filled (any of the arrays may be NULL). References are not taken.
int td_kv_pool_cache_match(const td_kv_pool *pool, const int32_t *tokens, int n_blocks,
                           uint64_t *hashes, uint64_t *entries, int32_t *blocks);

// Checks every invariant of the bookkeeping (block states, free stack, LRU list, hash chains)
// in O(n_blocks); TD_ERR_INVALID with a message naming the first violation. For tests and
// debug builds.
td_status td_kv_pool_check(const td_kv_pool *pool, td_err *err);

#endif
