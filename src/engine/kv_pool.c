// The paged KV block pool and its prefix cache (see kv_pool.h). Bookkeeping is a handful of
// per-block arrays carved from one allocation; K/V data is one buffer of the pool's backend (host
// memory without one).
// Nothing here allocates after td_kv_pool_create (except the debug td_kv_pool_check).
#include "engine/kv_pool.h"

#include <stdlib.h>

#include "backend/backend.h"
#include <string.h>
#include <xxhash.h>

#define KV_MAX_BLOCK_SIZE 65536
#define KV_MAX_BLOCKS (INT32_MAX / 2)

struct td_kv_pool {
    int block_size;  // tokens
    int n_blocks;
    int n_layers, kv_dim;  // kv_dim = n_kv_heads * head_dim
    td_dtype dtype;
    size_t row_bytes;    // bytes of one token's K (or V) in one layer
    size_t block_bytes;  // bytes of one block's K (or V) in one layer: block_size * row_bytes
    td_buffer *buf;      // K/V: [n_layers][2][n_blocks][block_size][kv_dim] elements, or NULL
    uint8_t *data;       // buf's base address (backend memory), or NULL
    uint64_t version;    // weights version mixed into the root hash (td_kv_pool_cache_reset)
    uint64_t hash_seed;
    td_kv_hash_fn hash_fn;

    // Per-block bookkeeping, [n_blocks] each.
    int32_t *refcnt;
    uint64_t *entry;               // cache entry id, TD_KV_NO_ENTRY when not cached
    uint64_t *parent_entry;        // of a cached block
    uint64_t *hash;                // of a cached block
    int32_t *hnext;                // next block in the same hash bucket, -1 ends
    int32_t *lru_prev, *lru_next;  // evictable list links, -1 ends
    int32_t *tokens;               // [n_blocks][block_size] token ids of cached blocks

    int32_t *free_stack;  // [n_blocks] free block ids; top at n_free - 1
    int n_free;
    int32_t lru_head, lru_tail;  // head = least recently released (evicted first)
    int n_evictable;
    int n_cached;
    uint64_t next_entry;  // next entry id to hand out (starts at 1)

    int32_t *buckets;  // [bucket_mask + 1] first block of each hash chain, -1 empty
    uint64_t bucket_mask;
    void *meta;  // the bookkeeping allocation
};

td_kv_pool_params td_kv_pool_default_params(void) {
    td_kv_pool_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    p.dtype = TD_F32;
    p.alloc_data = true;
    return p;
}

static size_t kv_elem_bytes(td_dtype t) {
    switch (t) {
        case TD_F32:
            return 4;
        case TD_F16:
        case TD_BF16:
            return 2;
        default:
            return 0;
    }
}

size_t td_kv_pool_bytes_per_block(const td_kv_pool_params *p) {
    size_t e = kv_elem_bytes(p->dtype);
    if (!e || p->block_size <= 0 || p->n_layers <= 0 || p->n_kv_heads <= 0 || p->head_dim <= 0)
        return 0;
    if (p->block_size > KV_MAX_BLOCK_SIZE || p->n_layers > 65536 || p->n_kv_heads > 65536 ||
        p->head_dim > 65536 || (uint64_t)p->n_kv_heads * (uint64_t)p->head_dim > (1u << 24))
        return 0;
    // <= 2^16 * 2^16 * 2 * 2^24 * 4: fits 64 bits.
    uint64_t b = (uint64_t)p->block_size * (uint64_t)p->n_layers * 2u * (uint64_t)p->n_kv_heads *
                 (uint64_t)p->head_dim * e;
    if (b > SIZE_MAX) return 0;
    return (size_t)b;
}

static uint64_t kv_default_hash(uint64_t parent, const int32_t *tokens, int n) {
    return XXH3_64bits_withSeed(tokens, (size_t)n * sizeof(int32_t), parent);
}

// Carves n bytes (rounded up to 8) from *cur.
static void *kv_carve(uint8_t **cur, size_t n) {
    void *p = *cur;
    *cur += (n + 7) & ~(size_t)7;
    return p;
}

td_status td_kv_pool_create(const td_kv_pool_params *p, td_kv_pool **out, td_err *err) {
    *out = NULL;
    if (p->block_size <= 0 || p->block_size > KV_MAX_BLOCK_SIZE)
        return td_err_set(err, TD_ERR_INVALID, "kv pool: block_size %d not in [1, %d]",
                          p->block_size, KV_MAX_BLOCK_SIZE);
    if (!kv_elem_bytes(p->dtype))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "kv pool: cache dtype %s (want f32, f16, bf16)",
                          td_dtype_name(p->dtype));
    size_t bpb = td_kv_pool_bytes_per_block(p);
    if (p->alloc_data && !bpb)
        return td_err_set(err, TD_ERR_INVALID,
                          "kv pool: bad shape (n_layers %d, n_kv_heads %d, head_dim %d)",
                          p->n_layers, p->n_kv_heads, p->head_dim);
    int64_t nb;
    if (p->n_blocks > 0) {
        nb = p->n_blocks;
    } else {
        if (!bpb)
            return td_err_set(err, TD_ERR_INVALID,
                              "kv pool: n_blocks not given and no shape to size the budget by");
        nb = (int64_t)(p->budget_bytes / bpb);
        if (nb < 1)
            return td_err_set(err, TD_ERR_LIMIT,
                              "kv pool: budget of %zu bytes holds no block (%zu bytes per block)",
                              p->budget_bytes, bpb);
    }
    if (nb > KV_MAX_BLOCKS)
        return td_err_set(err, TD_ERR_LIMIT, "kv pool: %lld blocks exceed the limit of %d",
                          (long long)nb, KV_MAX_BLOCKS);
    int n = (int)nb;
    int bs = p->block_size;

    uint64_t nbuckets = 1;
    while (nbuckets < (uint64_t)n) nbuckets <<= 1;

    size_t meta = 0;
#define KV_SZ(x) (((x) + 7) & ~(size_t)7)
    meta += KV_SZ(sizeof(td_kv_pool));
    meta += 5 * KV_SZ((size_t)n * sizeof(int32_t));   // refcnt, hnext, lru_prev, lru_next, free
    meta += 3 * KV_SZ((size_t)n * sizeof(uint64_t));  // entry, parent_entry, hash
    meta += KV_SZ((size_t)n * (size_t)bs * sizeof(int32_t));  // tokens
    meta += KV_SZ((size_t)nbuckets * sizeof(int32_t));
#undef KV_SZ
    uint8_t *m = malloc(meta);
    if (!m)
        return td_err_set(err, TD_ERR_NOMEM, "kv pool: no memory for %zu bytes of bookkeeping",
                          meta);
    uint8_t *cur = m;
    td_kv_pool *pool = kv_carve(&cur, sizeof *pool);
    memset(pool, 0, sizeof *pool);
    pool->meta = m;
    pool->block_size = bs;
    pool->n_blocks = n;
    pool->dtype = p->dtype;
    pool->hash_seed = p->hash_seed;
    pool->hash_fn = p->hash_fn ? p->hash_fn : kv_default_hash;
    pool->refcnt = kv_carve(&cur, (size_t)n * sizeof(int32_t));
    pool->hnext = kv_carve(&cur, (size_t)n * sizeof(int32_t));
    pool->lru_prev = kv_carve(&cur, (size_t)n * sizeof(int32_t));
    pool->lru_next = kv_carve(&cur, (size_t)n * sizeof(int32_t));
    pool->free_stack = kv_carve(&cur, (size_t)n * sizeof(int32_t));
    pool->entry = kv_carve(&cur, (size_t)n * sizeof(uint64_t));
    pool->parent_entry = kv_carve(&cur, (size_t)n * sizeof(uint64_t));
    pool->hash = kv_carve(&cur, (size_t)n * sizeof(uint64_t));
    pool->tokens = kv_carve(&cur, (size_t)n * (size_t)bs * sizeof(int32_t));
    pool->buckets = kv_carve(&cur, (size_t)nbuckets * sizeof(int32_t));
    pool->bucket_mask = nbuckets - 1;

    for (int i = 0; i < n; i++) {
        pool->refcnt[i] = 0;
        pool->hnext[i] = pool->lru_prev[i] = pool->lru_next[i] = -1;
        pool->entry[i] = pool->parent_entry[i] = pool->hash[i] = 0;
        pool->free_stack[i] = n - 1 - i;  // block 0 on top: allocation order 0, 1, 2, ...
    }
    memset(pool->tokens, 0, (size_t)n * (size_t)bs * sizeof(int32_t));
    for (uint64_t i = 0; i < nbuckets; i++) pool->buckets[i] = -1;
    pool->n_free = n;
    pool->lru_head = pool->lru_tail = -1;
    pool->next_entry = 1;

    if (p->alloc_data) {
        pool->n_layers = p->n_layers;
        pool->kv_dim = p->n_kv_heads * p->head_dim;
        pool->row_bytes = (size_t)pool->kv_dim * kv_elem_bytes(p->dtype);
        pool->block_bytes = (size_t)bs * pool->row_bytes;
        uint64_t total = (uint64_t)bpb * (uint64_t)n;
        if (total / bpb != (uint64_t)n || total > SIZE_MAX - 63) {
            free(m);
            return td_err_set(err, TD_ERR_LIMIT, "kv pool: %d blocks of %zu bytes overflow", n,
                              bpb);
        }
        td_buft *bt = p->backend ? td_backend_buft(p->backend) : td_host_buft();
        td_err e2 = {0};
        if (td_buffer_alloc(bt, (size_t)total, "kv pool", &pool->buf, &e2) != TD_OK) {
            free(m);
            return td_err_set(err, TD_ERR_NOMEM,
                              "kv pool: no memory for %llu bytes of K/V (%d blocks)",
                              (unsigned long long)total, n);
        }
        pool->data = pool->buf->base;
    }
    *out = pool;
    return TD_OK;
}

void td_kv_pool_free(td_kv_pool *pool) {
    if (!pool) return;
    td_buffer_free(pool->buf);
    free(pool->meta);
}

int td_kv_pool_n_blocks(const td_kv_pool *pool) { return pool->n_blocks; }
int td_kv_pool_block_size(const td_kv_pool *pool) { return pool->block_size; }
int td_kv_pool_n_free(const td_kv_pool *pool) { return pool->n_free; }
int td_kv_pool_n_evictable(const td_kv_pool *pool) { return pool->n_evictable; }
int td_kv_pool_n_cached(const td_kv_pool *pool) { return pool->n_cached; }

// ---- LRU list of evictable blocks.

static void lru_push_tail(td_kv_pool *p, int32_t b) {
    p->lru_prev[b] = p->lru_tail;
    p->lru_next[b] = -1;
    if (p->lru_tail >= 0)
        p->lru_next[p->lru_tail] = b;
    else
        p->lru_head = b;
    p->lru_tail = b;
    p->n_evictable++;
}

static void lru_unlink(td_kv_pool *p, int32_t b) {
    int32_t pr = p->lru_prev[b], nx = p->lru_next[b];
    if (pr >= 0)
        p->lru_next[pr] = nx;
    else
        p->lru_head = nx;
    if (nx >= 0)
        p->lru_prev[nx] = pr;
    else
        p->lru_tail = pr;
    p->lru_prev[b] = p->lru_next[b] = -1;
    p->n_evictable--;
}

// ---- Hash chains.

static void cache_unlink(td_kv_pool *p, int32_t b) {
    int32_t *link = &p->buckets[p->hash[b] & p->bucket_mask];
    while (*link != b) {
        TD_ASSERT(*link >= 0);  // a cached block is on its bucket's chain
        link = &p->hnext[*link];
    }
    *link = p->hnext[b];
    p->hnext[b] = -1;
    p->entry[b] = TD_KV_NO_ENTRY;
    p->n_cached--;
}

td_status td_kv_pool_alloc(td_kv_pool *pool, int32_t *block) {
    int32_t b;
    if (pool->n_free > 0) {
        b = pool->free_stack[--pool->n_free];
    } else if (pool->lru_head >= 0) {
        b = pool->lru_head;
        lru_unlink(pool, b);
        cache_unlink(pool, b);
    } else {
        return TD_ERR_NOMEM;
    }
    TD_ASSERT(pool->refcnt[b] == 0 && pool->entry[b] == TD_KV_NO_ENTRY);
    pool->refcnt[b] = 1;
    *block = b;
    return TD_OK;
}

void td_kv_pool_incref(td_kv_pool *pool, int32_t block) {
    TD_ASSERT(block >= 0 && block < pool->n_blocks);
    if (pool->refcnt[block] == 0) {
        TD_ASSERT(pool->entry[block] != TD_KV_NO_ENTRY);  // only an evictable block may be revived
        lru_unlink(pool, block);
    }
    pool->refcnt[block]++;
}

void td_kv_pool_decref(td_kv_pool *pool, int32_t block) {
    TD_ASSERT(block >= 0 && block < pool->n_blocks);
    TD_ASSERT(pool->refcnt[block] > 0);
    if (--pool->refcnt[block] > 0) return;
    if (pool->entry[block] != TD_KV_NO_ENTRY)
        lru_push_tail(pool, block);
    else
        pool->free_stack[pool->n_free++] = block;
}

int td_kv_pool_refcount(const td_kv_pool *pool, int32_t block) {
    TD_ASSERT(block >= 0 && block < pool->n_blocks);
    return pool->refcnt[block];
}

// ---- Data.

size_t td_kv_pool_row_bytes(const td_kv_pool *pool) { return pool->row_bytes; }
td_dtype td_kv_pool_dtype(const td_kv_pool *pool) { return pool->dtype; }

// kv: 0 = K, 1 = V.
static void *kv_ptr(const td_kv_pool *p, int32_t block, int layer, int kv) {
    if (!p->data) return NULL;
    TD_ASSERT(layer >= 0 && layer < p->n_layers && block >= 0 && block < p->n_blocks);
    size_t plane = ((size_t)layer * 2 + (size_t)kv) * (size_t)p->n_blocks;
    return p->data + (plane + (size_t)block) * p->block_bytes;
}

void *td_kv_pool_layer_k(const td_kv_pool *pool, int layer) { return kv_ptr(pool, 0, layer, 0); }
void *td_kv_pool_layer_v(const td_kv_pool *pool, int layer) { return kv_ptr(pool, 0, layer, 1); }
void *td_kv_pool_k_raw(const td_kv_pool *pool, int32_t block, int layer) {
    return kv_ptr(pool, block, layer, 0);
}
void *td_kv_pool_v_raw(const td_kv_pool *pool, int32_t block, int layer) {
    return kv_ptr(pool, block, layer, 1);
}
float *td_kv_pool_k(const td_kv_pool *pool, int32_t block, int layer) {
    TD_ASSERT(pool->dtype == TD_F32);
    return kv_ptr(pool, block, layer, 0);
}
float *td_kv_pool_v(const td_kv_pool *pool, int32_t block, int layer) {
    TD_ASSERT(pool->dtype == TD_F32);
    return kv_ptr(pool, block, layer, 1);
}

td_buffer *td_kv_pool_buffer(const td_kv_pool *pool) { return pool->buf; }

size_t td_kv_pool_offset(const td_kv_pool *pool, int32_t block, int layer, int kv) {
    TD_ASSERT(pool->data && layer >= 0 && layer < pool->n_layers && block >= 0 && block < pool->n_blocks &&
              (kv == 0 || kv == 1));
    return (((size_t)layer * 2 + (size_t)kv) * (size_t)pool->n_blocks + (size_t)block) * pool->block_bytes;
}

void td_kv_pool_copy(td_kv_pool *pool, int32_t src, int32_t dst, int n_tokens) {
    TD_ASSERT(n_tokens >= 0 && n_tokens <= pool->block_size);
    if (!pool->data || n_tokens == 0 || src == dst) return;
    size_t n = (size_t)n_tokens * pool->row_bytes;
    for (int l = 0; l < pool->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            td_buffer_copy(pool->buf, td_kv_pool_offset(pool, dst, l, kv), pool->buf,
                           td_kv_pool_offset(pool, src, l, kv), n);
}

void td_kv_pool_run_copies(td_kv_pool *pool, const td_kv_copy *ops, int n_ops) {
    for (int i = 0; i < n_ops; i++) td_kv_pool_copy(pool, ops[i].src, ops[i].dst, ops[i].n_tokens);
}

// ---- Prefix cache.

uint64_t td_kv_pool_root_hash(const td_kv_pool *pool) {
    // Version 0 keeps the plain seed (the hashes tests and older callers know).
    return pool->version ? XXH3_64bits_withSeed(&pool->version, sizeof pool->version, pool->hash_seed)
                         : pool->hash_seed;
}

uint64_t td_kv_pool_version(const td_kv_pool *pool) { return pool->version; }

void td_kv_pool_cache_reset(td_kv_pool *pool, uint64_t version) {
    // Evictable blocks leave the cache and become free; used cached blocks leave the cache
    // (freed, not cached, when released): no entry of the old weights survives to be matched.
    while (pool->lru_head >= 0) {
        int32_t b = pool->lru_head;
        lru_unlink(pool, b);
        cache_unlink(pool, b);
        pool->free_stack[pool->n_free++] = b;
    }
    for (int32_t b = 0; b < pool->n_blocks; b++)
        if (pool->entry[b] != TD_KV_NO_ENTRY) cache_unlink(pool, b);
    pool->version = version;
}

uint64_t td_kv_pool_hash(const td_kv_pool *pool, uint64_t parent_hash, const int32_t *tokens) {
    return pool->hash_fn(parent_hash, tokens, pool->block_size);
}

static int32_t cache_find(const td_kv_pool *p, uint64_t hash, uint64_t parent_entry,
                          const int32_t *tokens) {
    size_t tb = (size_t)p->block_size * sizeof(int32_t);
    for (int32_t b = p->buckets[hash & p->bucket_mask]; b >= 0; b = p->hnext[b]) {
        if (p->hash[b] == hash && p->parent_entry[b] == parent_entry &&
            memcmp(p->tokens + (size_t)b * (size_t)p->block_size, tokens, tb) == 0)
            return b;
    }
    return -1;
}

int32_t td_kv_pool_cache_lookup(const td_kv_pool *pool, uint64_t hash, uint64_t parent_entry,
                                const int32_t *tokens, uint64_t *entry) {
    int32_t b = cache_find(pool, hash, parent_entry, tokens);
    if (b >= 0 && entry) *entry = pool->entry[b];
    return b;
}

uint64_t td_kv_pool_cache_insert(td_kv_pool *pool, int32_t block, uint64_t hash,
                                 uint64_t parent_entry, const int32_t *tokens) {
    TD_ASSERT(block >= 0 && block < pool->n_blocks && pool->refcnt[block] > 0);
    if (pool->entry[block] != TD_KV_NO_ENTRY) return pool->entry[block];
    int32_t other = cache_find(pool, hash, parent_entry, tokens);
    if (other >= 0) return pool->entry[other];
    size_t bs = (size_t)pool->block_size;
    memcpy(pool->tokens + (size_t)block * bs, tokens, bs * sizeof(int32_t));
    pool->hash[block] = hash;
    pool->parent_entry[block] = parent_entry;
    pool->entry[block] = pool->next_entry++;
    int32_t *head = &pool->buckets[hash & pool->bucket_mask];
    pool->hnext[block] = *head;
    *head = block;
    pool->n_cached++;
    return pool->entry[block];
}

int td_kv_pool_cache_match(const td_kv_pool *pool, const int32_t *tokens, int n_blocks,
                           uint64_t *hashes, uint64_t *entries, int32_t *blocks) {
    uint64_t h = td_kv_pool_root_hash(pool), e = TD_KV_NO_ENTRY;
    size_t bs = (size_t)pool->block_size;
    int i = 0;
    for (; i < n_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * bs;
        h = td_kv_pool_hash(pool, h, t);
        int32_t b = td_kv_pool_cache_lookup(pool, h, e, t, &e);
        if (b < 0) break;
        if (hashes) hashes[i] = h;
        if (entries) entries[i] = e;
        if (blocks) blocks[i] = b;
    }
    return i;
}

// ---- Invariants.

td_status td_kv_pool_check(const td_kv_pool *p, td_err *err) {
    int n = p->n_blocks;
    if (p->n_free < 0 || p->n_free > n || p->n_evictable < 0 || p->n_cached < 0)
        return td_err_set(err, TD_ERR_INVALID, "kv pool: counters out of range");
    int n_free = 0, n_evict = 0, n_cached = 0;
    for (int b = 0; b < n; b++) {
        if (p->refcnt[b] < 0)
            return td_err_set(err, TD_ERR_INVALID, "block %d: refcount %d", b, p->refcnt[b]);
        bool cached = p->entry[b] != TD_KV_NO_ENTRY;
        n_cached += cached;
        if (p->refcnt[b] == 0) {
            if (cached)
                n_evict++;
            else
                n_free++;
        }
        if (!cached && (p->lru_prev[b] >= 0 || p->lru_next[b] >= 0 || p->hnext[b] >= 0))
            return td_err_set(err, TD_ERR_INVALID, "block %d: uncached but linked", b);
        if (cached && p->entry[b] >= p->next_entry)
            return td_err_set(err, TD_ERR_INVALID, "block %d: entry id from the future", b);
    }
    if (n_free != p->n_free)
        return td_err_set(err, TD_ERR_INVALID, "free blocks %d, counter %d", n_free, p->n_free);
    if (n_evict != p->n_evictable)
        return td_err_set(err, TD_ERR_INVALID, "evictable blocks %d, counter %d", n_evict,
                          p->n_evictable);
    if (n_cached != p->n_cached)
        return td_err_set(err, TD_ERR_INVALID, "cached blocks %d, counter %d", n_cached,
                          p->n_cached);
    // Free stack: exactly the free blocks, each once (the counts agree, so no duplicates means
    // no free block is missing).
    uint8_t *seen = calloc((size_t)n, 1);
    if (!seen) return td_err_set(err, TD_ERR_NOMEM, "kv pool check: no memory");
    for (int i = 0; i < p->n_free; i++) {
        int32_t b = p->free_stack[i];
        if (b < 0 || b >= n || p->refcnt[b] != 0 || p->entry[b] != TD_KV_NO_ENTRY || seen[b]) {
            free(seen);
            return td_err_set(err, TD_ERR_INVALID,
                              "free stack[%d] = %d is not a distinct free block", i, b);
        }
        seen[b] = 1;
    }
    free(seen);
    // LRU list: exactly the evictable blocks, links consistent.
    int cnt = 0;
    for (int32_t b = p->lru_head, prev = -1; b >= 0; prev = b, b = p->lru_next[b]) {
        if (++cnt > n) return td_err_set(err, TD_ERR_INVALID, "LRU list has a cycle");
        if (p->lru_prev[b] != prev)
            return td_err_set(err, TD_ERR_INVALID, "LRU block %d: bad prev link", b);
        if (p->refcnt[b] != 0 || p->entry[b] == TD_KV_NO_ENTRY)
            return td_err_set(err, TD_ERR_INVALID, "LRU block %d is not evictable", b);
        if (p->lru_next[b] < 0 && p->lru_tail != b)
            return td_err_set(err, TD_ERR_INVALID, "LRU tail wrong");
    }
    if (cnt != p->n_evictable)
        return td_err_set(err, TD_ERR_INVALID, "LRU list %d, evictable %d", cnt, p->n_evictable);
    // Hash chains: every cached block exactly once, in its own bucket; keys unique.
    cnt = 0;
    for (uint64_t k = 0; k <= p->bucket_mask; k++) {
        for (int32_t b = p->buckets[k]; b >= 0; b = p->hnext[b]) {
            if (++cnt > n) return td_err_set(err, TD_ERR_INVALID, "hash chains have a cycle");
            if (p->entry[b] == TD_KV_NO_ENTRY)
                return td_err_set(err, TD_ERR_INVALID, "uncached block %d on a chain", b);
            if ((p->hash[b] & p->bucket_mask) != k)
                return td_err_set(err, TD_ERR_INVALID, "block %d in the wrong bucket", b);
            int32_t f = cache_find(p, p->hash[b], p->parent_entry[b],
                                   p->tokens + (size_t)b * (size_t)p->block_size);
            if (f != b)
                return td_err_set(err, TD_ERR_INVALID, "blocks %d and %d hold the same cache key",
                                  f, b);
        }
    }
    if (cnt != p->n_cached)
        return td_err_set(err, TD_ERR_INVALID, "chains hold %d blocks, %d cached", cnt,
                          p->n_cached);
    return TD_OK;
}
