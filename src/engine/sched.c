// The scheduler (see sched.h; policy and invariants in docs/engine.md). Sequence slots, queues,
// the id map and the step output are preallocated by td_sched_create; only td_sched_add and
// td_sched_fork allocate (one buffer per sequence), td_sched_step never does.
#include "engine/sched.h"

#include <stdlib.h>
#include <string.h>

#define SCHED_MAX_SLOTS (1 << 20)

struct td_sched {
    td_sched_params p;
    td_kv_pool *pool;  // borrowed
    int bs;            // tokens per block

    int n_slots;      // max_seqs + max_waiting
    td_seq *slots;    // [n_slots]
    int *free_slots;  // [n_slots] stack of unused slot ids
    int n_free_slots;
    int *running;  // [max_seqs] slot ids, ordered by seq order (oldest first)
    int n_running;
    int *waiting;  // [n_slots] slot ids, ordered by seq order (next to admit first)
    int n_waiting;
    uint64_t *stamp;  // [n_slots] step number in which the slot was last scheduled

    // id -> slot, linear probing with backward-shift deletion; val -1 = empty.
    uint64_t *map_keys;  // [map_mask + 1]
    int32_t *map_vals;
    uint64_t map_mask;

    td_sched_entry *entries;  // [max_seqs] the step's batch
    uint64_t *preempted;      // [n_slots]
    int n_entries, n_preempted;
    td_kv_copy *pend_copies;  // [n_slots] decided by forks since the last step
    uint64_t *pend_seq;       // [n_slots] the child each pending copy is for
    int n_pend_copies;
    td_kv_copy *copies;       // [n_slots] the step's copies (out->copies)
    int n_copies;
    int32_t *held;            // [n_blocks] references held outside sequences (KV imports)
    int n_held;               // their sum

    uint64_t next_order;
    uint64_t n_steps;
    uint64_t prefix_queries, prefix_hits, n_preemptions, n_finished, n_cancelled;
    void *mem;  // the one allocation behind everything above but the struct
};

td_sched_params td_sched_default_params(void) {
    td_sched_params p;
    p.max_batched_tokens = 2048;
    p.max_seqs = 64;
    p.max_waiting = 1024;
    p.max_ctx = 4096;
    p.enable_prefix_cache = true;
    return p;
}

static inline int cdiv(int a, int b) { return (a + b - 1) / b; }

// ---- id map

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static int map_find(const td_sched *s, uint64_t id) {
    for (uint64_t i = mix64(id) & s->map_mask;; i = (i + 1) & s->map_mask) {
        if (s->map_vals[i] < 0) return -1;
        if (s->map_keys[i] == id) return s->map_vals[i];
    }
}

static void map_put(td_sched *s, uint64_t id, int slot) {
    uint64_t i = mix64(id) & s->map_mask;
    while (s->map_vals[i] >= 0) i = (i + 1) & s->map_mask;
    s->map_keys[i] = id;
    s->map_vals[i] = slot;
}

static void map_del(td_sched *s, uint64_t id) {
    uint64_t i = mix64(id) & s->map_mask;
    while (s->map_keys[i] != id || s->map_vals[i] < 0) {
        TD_ASSERT(s->map_vals[i] >= 0);  // the id is present
        i = (i + 1) & s->map_mask;
    }
    // Backward shift: move later entries of the probe run into the hole when their home slot
    // does not lie (cyclically) in (hole, j].
    uint64_t j = i;
    for (;;) {
        j = (j + 1) & s->map_mask;
        if (s->map_vals[j] < 0) break;
        uint64_t k = mix64(s->map_keys[j]) & s->map_mask;
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (stays) continue;
        s->map_keys[i] = s->map_keys[j];
        s->map_vals[i] = s->map_vals[j];
        i = j;
    }
    s->map_vals[i] = -1;
}

// ---- create / free

td_status td_sched_create(const td_sched_params *p, td_kv_pool *pool, td_sched **out, td_err *err) {
    *out = NULL;
    if (!pool) return td_err_set(err, TD_ERR_INVALID, "sched: no kv pool");
    if (p->max_seqs < 1 || p->max_waiting < 0 || p->max_ctx < 1 || p->max_batched_tokens < 1)
        return td_err_set(err, TD_ERR_INVALID,
                          "sched: max_seqs %d, max_waiting %d, max_ctx %d, max_batched_tokens %d "
                          "must be positive (max_waiting >= 0)",
                          p->max_seqs, p->max_waiting, p->max_ctx, p->max_batched_tokens);
    if (p->max_batched_tokens < p->max_seqs)
        return td_err_set(err, TD_ERR_INVALID,
                          "sched: max_batched_tokens %d < max_seqs %d (every running sequence "
                          "must fit its decode token in one step)",
                          p->max_batched_tokens, p->max_seqs);
    if ((int64_t)p->max_seqs + p->max_waiting > SCHED_MAX_SLOTS)
        return td_err_set(err, TD_ERR_LIMIT, "sched: max_seqs + max_waiting exceeds %d",
                          SCHED_MAX_SLOTS);

    int n_slots = p->max_seqs + p->max_waiting;
    uint64_t map_cap = 1;
    while (map_cap < 2 * (uint64_t)n_slots) map_cap <<= 1;
    size_t sz = 0;
#define SZ(x) (((x) + 7) & ~(size_t)7)
    sz += SZ((size_t)n_slots * sizeof(td_seq));
    sz += 3 * SZ((size_t)n_slots * sizeof(int));       // free_slots, waiting, running (over-sized)
    sz += 2 * SZ((size_t)n_slots * sizeof(uint64_t));  // stamp, preempted
    sz += SZ((size_t)map_cap * sizeof(uint64_t)) + SZ((size_t)map_cap * sizeof(int32_t));
    sz += SZ((size_t)p->max_seqs * sizeof(td_sched_entry));
    sz += 2 * SZ((size_t)n_slots * sizeof(td_kv_copy)) + SZ((size_t)n_slots * sizeof(uint64_t));
    sz += SZ((size_t)td_kv_pool_n_blocks(pool) * sizeof(int32_t));
#undef SZ
    td_sched *s = calloc(1, sizeof *s);
    uint8_t *m = calloc(1, sz);
    if (!s || !m) {
        free(s);
        free(m);
        return td_err_set(err, TD_ERR_NOMEM, "sched: no memory for %d slots", n_slots);
    }
    uint8_t *cur = m;
#define CARVE(ptr, n)                              \
    do {                                           \
        size_t nb_ = (size_t)(n) * sizeof(*(ptr)); \
        (ptr) = (void *)cur;                       \
        cur += (nb_ + 7) & ~(size_t)7;             \
    } while (0)
    CARVE(s->slots, n_slots);
    CARVE(s->free_slots, n_slots);
    CARVE(s->waiting, n_slots);
    CARVE(s->running, n_slots);
    CARVE(s->stamp, n_slots);
    CARVE(s->preempted, n_slots);
    CARVE(s->map_keys, map_cap);
    CARVE(s->map_vals, map_cap);
    CARVE(s->entries, p->max_seqs);
    CARVE(s->pend_copies, n_slots);
    CARVE(s->pend_seq, n_slots);
    CARVE(s->copies, n_slots);
    CARVE(s->held, td_kv_pool_n_blocks(pool));
#undef CARVE
    s->mem = m;
    s->p = *p;
    s->pool = pool;
    s->bs = td_kv_pool_block_size(pool);
    s->n_slots = n_slots;
    s->map_mask = map_cap - 1;
    for (uint64_t i = 0; i < map_cap; i++) s->map_vals[i] = -1;
    for (int i = 0; i < n_slots; i++) s->free_slots[i] = n_slots - 1 - i;
    s->n_free_slots = n_slots;
    s->next_order = 1;
    *out = s;
    return TD_OK;
}

static void seq_release_blocks(td_sched *s, td_seq *q) {
    // Last block first: at equal age the LRU list then evicts a sequence's tail before its
    // head, which other prompts are likelier to share.
    for (int i = q->n_blocks - 1; i >= 0; i--) td_kv_pool_decref(s->pool, q->blocks[i]);
    q->n_blocks = 0;
}

void td_sched_free(td_sched *s) {
    if (!s) return;
    for (int32_t b = 0; s->n_held > 0 && b < td_kv_pool_n_blocks(s->pool); b++)
        for (; s->held[b] > 0; s->held[b]--, s->n_held--) td_kv_pool_decref(s->pool, b);
    for (int i = 0; i < s->n_slots; i++) {
        td_seq *q = &s->slots[i];
        if (q->state == TD_SEQ_FREE) continue;
        seq_release_blocks(s, q);
        free(q->mem);
    }
    free(s->mem);
    free(s);
}

// ---- queues (ordered by seq order; equal orders keep insertion order)

static void queue_insert(td_sched *s, int *q, int *n, int slot) {
    uint64_t o = s->slots[slot].order;
    int i = *n;
    while (i > 0 && s->slots[q[i - 1]].order > o) {
        q[i] = q[i - 1];
        i--;
    }
    q[i] = slot;
    (*n)++;
}

static void queue_remove_at(int *q, int *n, int i) {
    memmove(q + i, q + i + 1, (size_t)(*n - i - 1) * sizeof(int));
    (*n)--;
}

static void queue_remove(int *q, int *n, int slot) {
    for (int i = 0; i < *n; i++)
        if (q[i] == slot) {
            queue_remove_at(q, n, i);
            return;
        }
    TD_ASSERT(!"slot is in its queue");
}

// ---- sequences

// Allocates a sequence's buffers for `capacity` tokens into slot q (not yet live).
static td_status seq_init(td_sched *s, td_seq *q, uint64_t id, int capacity) {
    int mb = cdiv(capacity, s->bs);
    size_t tok = (((size_t)capacity * sizeof(int32_t)) + 7) & ~(size_t)7;
    size_t blk = (((size_t)mb * sizeof(int32_t)) + 7) & ~(size_t)7;
    uint8_t *m = malloc(tok + blk + 2 * (size_t)mb * sizeof(uint64_t));
    if (!m) return TD_ERR_NOMEM;
    memset(q, 0, sizeof *q);
    q->mem = m;
    q->id = id;
    q->tokens = (int32_t *)m;
    q->blocks = (int32_t *)(m + tok);
    q->hashes = (uint64_t *)(m + tok + blk);
    q->entries = q->hashes + mb;
    q->capacity = capacity;
    q->max_blocks = mb;
    q->prefilling = true;
    return TD_OK;
}

static int slot_of(const td_sched *s, const td_seq *q) { return (int)(q - s->slots); }

// Drops the pending block copy decided for sequence id (it ended before any forward needed it).
static void drop_pending_copy(td_sched *s, uint64_t id) {
    for (int i = 0; i < s->n_pend_copies; i++)
        if (s->pend_seq[i] == id) {
            s->n_pend_copies--;
            memmove(s->pend_copies + i, s->pend_copies + i + 1, (size_t)(s->n_pend_copies - i) * sizeof *s->pend_copies);
            memmove(s->pend_seq + i, s->pend_seq + i + 1, (size_t)(s->n_pend_copies - i) * sizeof *s->pend_seq);
            return;
        }
}

static void seq_destroy(td_sched *s, td_seq *q) {
    int slot = slot_of(s, q);
    drop_pending_copy(s, q->id);
    if (q->state == TD_SEQ_RUNNING)
        queue_remove(s->running, &s->n_running, slot);
    else if (q->state == TD_SEQ_WAITING)
        queue_remove(s->waiting, &s->n_waiting, slot);
    seq_release_blocks(s, q);
    map_del(s, q->id);
    free(q->mem);
    memset(q, 0, sizeof *q);
    s->free_slots[s->n_free_slots++] = slot;
}

// Enters the full computed blocks not yet in the prefix cache. Only called when the KV of
// [0, n_computed) is known to be written (see the call protocol in sched.h).
static void seq_commit(td_sched *s, td_seq *q) {
    if (!s->p.enable_prefix_cache || q->state != TD_SEQ_RUNNING) return;
    int full = q->n_computed / s->bs;
    for (int i = q->n_hashed; i < full; i++) {
        const int32_t *t = q->tokens + (size_t)i * (size_t)s->bs;
        uint64_t ph = i ? q->hashes[i - 1] : td_kv_pool_root_hash(s->pool);
        uint64_t pe = i ? q->entries[i - 1] : TD_KV_NO_ENTRY;
        q->hashes[i] = td_kv_pool_hash(s->pool, ph, t);
        q->entries[i] = td_kv_pool_cache_insert(s->pool, q->blocks[i], q->hashes[i], pe, t);
    }
    if (full > q->n_hashed) q->n_hashed = full;
}

td_status td_sched_add(td_sched *s, uint64_t seq_id, const int32_t *prompt, int n_prompt,
                       int max_new_tokens, td_err *err) {
    if (n_prompt < 1 || !prompt)
        return td_err_set(err, TD_ERR_INVALID, "sequence %llu: empty prompt",
                          (unsigned long long)seq_id);
    if (max_new_tokens < 0)
        return td_err_set(err, TD_ERR_INVALID, "sequence %llu: max_new_tokens %d < 0",
                          (unsigned long long)seq_id, max_new_tokens);
    if (n_prompt > s->p.max_ctx)
        return td_err_set(err, TD_ERR_LIMIT,
                          "sequence %llu: prompt of %d tokens exceeds the context of %d",
                          (unsigned long long)seq_id, n_prompt, s->p.max_ctx);
    if (map_find(s, seq_id) >= 0)
        return td_err_set(err, TD_ERR_INVALID, "sequence %llu: id already in use",
                          (unsigned long long)seq_id);
    int64_t cap64 = (int64_t)n_prompt + max_new_tokens;
    int capacity = cap64 > s->p.max_ctx ? s->p.max_ctx : (int)cap64;
    int need = cdiv(capacity, s->bs);
    if (need > td_kv_pool_n_blocks(s->pool))
        return td_err_set(err, TD_ERR_LIMIT,
                          "sequence %llu: %d tokens need %d KV blocks, the pool has %d",
                          (unsigned long long)seq_id, capacity, need, td_kv_pool_n_blocks(s->pool));
    if (s->n_waiting >= s->p.max_waiting || s->n_free_slots == 0)
        return td_err_set(err, TD_ERR_LIMIT, "sequence %llu: waiting queue full (%d)",
                          (unsigned long long)seq_id, s->n_waiting);
    int slot = s->free_slots[s->n_free_slots - 1];
    td_seq *q = &s->slots[slot];
    if (seq_init(s, q, seq_id, capacity) != TD_OK)
        return td_err_set(err, TD_ERR_NOMEM, "sequence %llu: no memory for %d tokens",
                          (unsigned long long)seq_id, capacity);
    s->n_free_slots--;
    memcpy(q->tokens, prompt, (size_t)n_prompt * sizeof(int32_t));
    q->n_prompt = q->n_tokens = n_prompt;
    q->state = TD_SEQ_WAITING;
    q->order = s->next_order++;
    map_put(s, seq_id, slot);
    queue_insert(s, s->waiting, &s->n_waiting, slot);
    return TD_OK;
}

// ---- the step

// Sends running[run_idx] back to the waiting queue with its tokens: its KV is recomputed at the
// next admission.
static void requeue(td_sched *s, int run_idx) {
    int slot = s->running[run_idx];
    td_seq *q = &s->slots[slot];
    queue_remove_at(s->running, &s->n_running, run_idx);
    seq_release_blocks(s, q);  // committed full blocks stay cached, evictable
    q->n_computed = 0;
    q->n_hashed = 0;
    q->prefilling = true;
    q->state = TD_SEQ_WAITING;
    queue_insert(s, s->waiting, &s->n_waiting, slot);
}

static void preempt(td_sched *s, int run_idx) {
    const uint64_t id = s->slots[s->running[run_idx]].id;
    s->slots[s->running[run_idx]].n_preemptions++;
    requeue(s, run_idx);
    s->preempted[s->n_preempted++] = id;
    s->n_preemptions++;
}

void td_sched_set_weights_version(td_sched *s, uint64_t version) {
    // Nothing computed with the old weights is committed: the running sequences' blocks are
    // released uncached (the cache reset below also uncaches their earlier blocks), then every one
    // of them waits to be recomputed, oldest first, as a preempted sequence does.
    while (s->n_running > 0) requeue(s, s->n_running - 1);
    s->n_pend_copies = 0;  // their children were requeued with them
    td_kv_pool_cache_reset(s->pool, version);
}

// Gives running[idx] blocks for up to `want` more tokens; returns how many it got (0..want).
// Uses free and evictable blocks; when not even one token fits, preempts the newest running
// sequences not yet scheduled this step, but only ones newer than running[idx].
static int reserve(td_sched *s, int idx, int want, int *n_new) {
    td_seq *q = &s->slots[s->running[idx]];
    *n_new = 0;
    for (;;) {
        int need = cdiv(q->n_computed + want, s->bs) - q->n_blocks;
        int avail = td_kv_pool_n_available(s->pool);
        int got = want;
        if (need > avail) {
            got = (q->n_blocks + avail) * s->bs - q->n_computed;
            need = avail;
        }
        if (got >= 1) {
            if (got > want) got = want;
            need = cdiv(q->n_computed + got, s->bs) - q->n_blocks;
            for (int i = 0; i < need; i++) {
                int32_t b;
                td_status st = td_kv_pool_alloc(s->pool, &b);
                TD_ASSERT(st == TD_OK);  // counted available above
                q->blocks[q->n_blocks++] = b;
            }
            *n_new = need;
            return got;
        }
        int v = s->n_running - 1;
        while (v > idx && s->stamp[s->running[v]] == s->n_steps) v--;
        if (v <= idx) return 0;
        preempt(s, v);
    }
}

static void emit(td_sched *s, td_seq *q, int n, int n_new, bool is_prefill, int n_cached) {
    td_sched_entry *e = &s->entries[s->n_entries++];
    e->seq_id = q->id;
    e->tokens = q->tokens + q->n_computed;
    e->start_pos = q->n_computed;
    e->n_tokens = n;
    e->is_prefill = is_prefill;
    q->n_computed += n;
    TD_ASSERT(q->n_computed <= q->n_tokens && q->n_blocks == cdiv(q->n_computed, s->bs));
    e->needs_logits = q->n_computed == q->n_tokens;
    if (e->needs_logits) q->prefilling = false;
    e->table.ids = q->blocks;
    e->table.n_blocks = q->n_blocks;
    e->table.n_tokens = q->n_computed;
    e->n_new_blocks = n_new;
    e->n_cached_tokens = n_cached;
    s->stamp[slot_of(s, q)] = s->n_steps;
}

void td_sched_step(td_sched *s, td_sched_out *out) {
    s->n_steps++;
    s->n_entries = s->n_preempted = 0;
    // The forks' block copies, for the engine to run before this step's forward.
    memcpy(s->copies, s->pend_copies, (size_t)s->n_pend_copies * sizeof *s->copies);
    s->n_copies = s->n_pend_copies;
    s->n_pend_copies = 0;
    int n_admitted = 0, n_new_total = 0, n_tokens = 0;

    // The previous step's forward has run: its full blocks may now serve other prompts.
    for (int i = 0; i < s->n_running; i++) seq_commit(s, &s->slots[s->running[i]]);

    int budget = s->p.max_batched_tokens;
    bool blocked = false;  // a running sequence lacked blocks: admit nobody this step

    // Pass 1: one decode token for every running sequence in its decode phase, oldest first.
    // max_seqs <= max_batched_tokens, so the budget always covers them.
    for (int i = 0; i < s->n_running; i++) {
        td_seq *q = &s->slots[s->running[i]];
        if (q->prefilling || q->n_computed >= q->n_tokens) continue;
        int n_new;
        if (reserve(s, i, 1, &n_new) == 0) {
            blocked = true;
            continue;
        }
        emit(s, q, 1, n_new, false, 0);
        budget -= 1;
        n_tokens += 1;
        n_new_total += n_new;
    }
    int n_decode = s->n_entries;

    // Pass 2: the next chunk of every running sequence still prefilling, oldest first.
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        td_seq *q = &s->slots[s->running[i]];
        if (!q->prefilling || q->n_computed >= q->n_tokens) continue;
        int want = q->n_tokens - q->n_computed;
        if (want > budget) want = budget;
        int n_new, got = reserve(s, i, want, &n_new);
        if (got < want) blocked = true;
        if (got == 0) continue;
        emit(s, q, got, n_new, true, 0);
        budget -= got;
        n_tokens += got;
        n_new_total += n_new;
    }

    // Pass 3: admit waiting sequences in FCFS order while a running slot, budget and blocks
    // for the whole first chunk are there. The head that does not fit blocks those behind it.
    // Nobody is admitted in a step that preempted (it would take the blocks just freed for a
    // running sequence, and thrash) or in which a running sequence lacked blocks.
    while (!blocked && s->n_preempted == 0 && s->n_waiting > 0 && s->n_running < s->p.max_seqs &&
           budget > 0) {
        td_seq *q = &s->slots[s->waiting[0]];
        TD_ASSERT(q->n_blocks == 0 && q->n_computed == 0);
        int matched = 0;
        if (s->p.enable_prefix_cache && !q->no_prefix_hit)  // the last token is always computed
            matched = td_kv_pool_cache_match(s->pool, q->tokens, (q->n_tokens - 1) / s->bs,
                                             q->hashes, q->entries, q->blocks);
        int cached = matched * s->bs;
        int want = q->n_tokens - cached;
        if (want > budget) want = budget;
        int need = cdiv(cached + want, s->bs) - matched;
        int revived = 0;  // hits now evictable: taking them removes them from the available set
        for (int i = 0; i < matched; i++)
            revived += td_kv_pool_refcount(s->pool, q->blocks[i]) == 0;
        if (need > td_kv_pool_n_available(s->pool) - revived) break;

        for (int i = 0; i < matched; i++) td_kv_pool_incref(s->pool, q->blocks[i]);
        q->n_blocks = matched;
        q->n_hashed = matched;
        for (int i = 0; i < need; i++) {
            int32_t b;
            td_status st = td_kv_pool_alloc(s->pool, &b);
            TD_ASSERT(st == TD_OK);  // counted available above
            q->blocks[q->n_blocks++] = b;
        }
        queue_remove_at(s->waiting, &s->n_waiting, 0);
        q->state = TD_SEQ_RUNNING;
        queue_insert(s, s->running, &s->n_running, slot_of(s, q));
        q->n_computed = cached;
        q->prefilling = true;
        s->prefix_queries += (uint64_t)q->n_tokens;
        s->prefix_hits += (uint64_t)cached;
        if (q->n_preemptions == 0) q->n_cached_tokens = cached;
        emit(s, q, want, need, true, cached);
        budget -= want;
        n_tokens += want;
        n_new_total += need;
        n_admitted++;
    }

    out->entries = s->entries;
    out->n_entries = s->n_entries;
    out->n_decode = n_decode;
    out->n_tokens = n_tokens;
    out->preempted = s->preempted;
    out->n_preempted = s->n_preempted;
    out->n_admitted = n_admitted;
    out->n_new_blocks = n_new_total;
    out->copies = s->copies;
    out->n_copies = s->n_copies;
}

// ---- between steps

td_status td_sched_append_token(td_sched *s, uint64_t seq_id, int32_t token, td_err *err) {
    int slot = map_find(s, seq_id);
    if (slot < 0)
        return td_err_set(err, TD_ERR_NOT_FOUND, "sequence %llu: not found",
                          (unsigned long long)seq_id);
    td_seq *q = &s->slots[slot];
    if (q->n_tokens >= q->capacity)
        return td_err_set(err, TD_ERR_LIMIT, "sequence %llu: at its capacity of %d tokens",
                          (unsigned long long)seq_id, q->capacity);
    if (q->state == TD_SEQ_RUNNING && !q->prefilling && q->n_tokens > q->n_computed)
        return td_err_set(err, TD_ERR_INVALID, "sequence %llu: a token is already pending",
                          (unsigned long long)seq_id);
    q->tokens[q->n_tokens++] = token;
    return TD_OK;
}

td_status td_sched_set_no_prefix_hit(td_sched *s, uint64_t seq_id, bool no_hit) {
    int slot = map_find(s, seq_id);
    if (slot < 0) return TD_ERR_NOT_FOUND;
    s->slots[slot].no_prefix_hit = no_hit;
    return TD_OK;
}

td_status td_sched_finish(td_sched *s, uint64_t seq_id) {
    int slot = map_find(s, seq_id);
    if (slot < 0) return TD_ERR_NOT_FOUND;
    td_seq *q = &s->slots[slot];
    seq_commit(s, q);
    seq_destroy(s, q);
    s->n_finished++;
    return TD_OK;
}

td_status td_sched_cancel(td_sched *s, uint64_t seq_id) {
    int slot = map_find(s, seq_id);
    if (slot < 0) return TD_ERR_NOT_FOUND;
    seq_destroy(s, &s->slots[slot]);
    s->n_cancelled++;
    return TD_OK;
}

td_status td_sched_fork(td_sched *s, uint64_t parent_id, uint64_t child_id, td_err *err) {
    int pslot = map_find(s, parent_id);
    if (pslot < 0)
        return td_err_set(err, TD_ERR_NOT_FOUND, "fork: sequence %llu not found",
                          (unsigned long long)parent_id);
    if (map_find(s, child_id) >= 0)
        return td_err_set(err, TD_ERR_INVALID, "fork: id %llu already in use",
                          (unsigned long long)child_id);
    if (s->n_free_slots == 0) return td_err_set(err, TD_ERR_LIMIT, "fork: no free sequence slot");
    int cslot = s->free_slots[s->n_free_slots - 1];
    td_seq *par = &s->slots[pslot], *c = &s->slots[cslot];
    if (seq_init(s, c, child_id, par->capacity) != TD_OK)
        return td_err_set(err, TD_ERR_NOMEM, "fork: no memory for %d tokens", par->capacity);
    s->n_free_slots--;
    memcpy(c->tokens, par->tokens, (size_t)par->n_tokens * sizeof(int32_t));
    c->n_prompt = par->n_prompt;
    c->n_tokens = par->n_tokens;
    c->order = par->order;
    c->n_cached_tokens = par->n_cached_tokens;
    map_put(s, child_id, cslot);

    bool run = false;
    if (par->state == TD_SEQ_RUNNING && s->n_running < s->p.max_seqs) {
        seq_commit(s, par);  // the parent's last step has run (call protocol)
        int full = par->n_computed / s->bs, part = par->n_computed % s->bs;
        int32_t copy = -1;
        if (part == 0 || td_kv_pool_alloc(s->pool, &copy) == TD_OK) {
            for (int i = 0; i < full; i++) {
                td_kv_pool_incref(s->pool, par->blocks[i]);
                c->blocks[i] = par->blocks[i];
            }
            c->n_blocks = full;
            if (part) {
                // Recorded, not run: the engine runs it through the backend before the next
                // forward (td_sched_out.copies), and nothing writes slots [0, part) before that.
                s->pend_copies[s->n_pend_copies] = (td_kv_copy){par->blocks[full], copy, part};
                s->pend_seq[s->n_pend_copies++] = child_id;
                c->blocks[c->n_blocks++] = copy;
            }
            memcpy(c->hashes, par->hashes, (size_t)par->n_hashed * sizeof(uint64_t));
            memcpy(c->entries, par->entries, (size_t)par->n_hashed * sizeof(uint64_t));
            c->n_hashed = par->n_hashed;
            c->n_computed = par->n_computed;
            c->prefilling = par->prefilling;
            c->state = TD_SEQ_RUNNING;
            queue_insert(s, s->running, &s->n_running, cslot);
            run = true;
        }
    }
    if (!run) {
        c->state = TD_SEQ_WAITING;
        c->prefilling = true;
        queue_insert(s, s->waiting, &s->n_waiting, cslot);
    }
    return TD_OK;
}

td_status td_sched_hold_blocks(td_sched *s, int n, int32_t *blocks, td_err *err) {
    if (n < 0) return td_err_set(err, TD_ERR_INVALID, "hold: %d blocks", n);
    const int avail = td_kv_pool_n_available(s->pool);
    if (n > avail)
        return td_err_set(err, TD_ERR_LIMIT, "no room for %d blocks: %d free or evictable (held blocks never preempt)",
                          n, avail);
    for (int i = 0; i < n; i++) {
        td_status st = td_kv_pool_alloc(s->pool, &blocks[i]);
        TD_ASSERT(st == TD_OK);  // counted above
        s->held[blocks[i]]++;
        s->n_held++;
    }
    return TD_OK;
}

void td_sched_unhold_blocks(td_sched *s, const int32_t *blocks, int n) {
    for (int i = n - 1; i >= 0; i--) {
        TD_ASSERT(blocks[i] >= 0 && blocks[i] < td_kv_pool_n_blocks(s->pool) && s->held[blocks[i]] > 0);
        s->held[blocks[i]]--;
        s->n_held--;
        td_kv_pool_decref(s->pool, blocks[i]);
    }
}

int td_sched_n_held(const td_sched *s) { return s->n_held; }

const td_seq *td_sched_get(const td_sched *s, uint64_t seq_id) {
    int slot = map_find(s, seq_id);
    return slot < 0 ? NULL : &s->slots[slot];
}

void td_sched_stats_get(const td_sched *s, td_sched_stats *o) {
    memset(o, 0, sizeof *o);
    o->n_running = s->n_running;
    o->n_waiting = s->n_waiting;
    o->n_blocks = td_kv_pool_n_blocks(s->pool);
    o->n_blocks_free = td_kv_pool_n_free(s->pool);
    o->n_blocks_evictable = td_kv_pool_n_evictable(s->pool);
    o->n_blocks_used = o->n_blocks - o->n_blocks_free - o->n_blocks_evictable;
    o->kv_usage = (double)o->n_blocks_used / (double)o->n_blocks;
    o->prefix_queries = s->prefix_queries;
    o->prefix_hits = s->prefix_hits;
    o->n_preemptions = s->n_preemptions;
    o->n_steps = s->n_steps;
    o->n_finished = s->n_finished;
    o->n_cancelled = s->n_cancelled;
}

// ---- invariants

static td_status check_queue(const td_sched *s, const int *q, int n, td_seq_state st,
                             const char *name, uint8_t *seen, td_err *err) {
    for (int i = 0; i < n; i++) {
        int slot = q[i];
        if (slot < 0 || slot >= s->n_slots || seen[slot])
            return td_err_set(err, TD_ERR_INVALID, "%s[%d]: bad or repeated slot %d", name, i,
                              slot);
        seen[slot] = 1;
        const td_seq *x = &s->slots[slot];
        if (x->state != st)
            return td_err_set(err, TD_ERR_INVALID, "%s[%d]: state %d", name, i, x->state);
        if (i && s->slots[q[i - 1]].order > x->order)
            return td_err_set(err, TD_ERR_INVALID, "%s[%d]: out of order", name, i);
        if (map_find(s, x->id) != slot)
            return td_err_set(err, TD_ERR_INVALID, "%s[%d]: id %llu not mapped to its slot", name,
                              i, (unsigned long long)x->id);
    }
    return TD_OK;
}

td_status td_sched_check(const td_sched *s, td_err *err) {
    td_status st = td_kv_pool_check(s->pool, err);
    if (st != TD_OK) return st;
    if (s->n_running > s->p.max_seqs)
        return td_err_set(err, TD_ERR_INVALID, "%d running > max_seqs %d", s->n_running,
                          s->p.max_seqs);
    int nb = td_kv_pool_n_blocks(s->pool);
    int32_t *refs = calloc((size_t)nb, sizeof *refs);
    uint8_t *seen = calloc((size_t)s->n_slots, 1);
    if (!refs || !seen) {
        free(refs);
        free(seen);
        return td_err_set(err, TD_ERR_NOMEM, "sched check: no memory");
    }
    st = check_queue(s, s->running, s->n_running, TD_SEQ_RUNNING, "running", seen, err);
    if (st == TD_OK)
        st = check_queue(s, s->waiting, s->n_waiting, TD_SEQ_WAITING, "waiting", seen, err);
    int live = 0;
    for (int slot = 0; st == TD_OK && slot < s->n_slots; slot++) {
        const td_seq *q = &s->slots[slot];
        if (q->state == TD_SEQ_FREE) continue;
        live++;
        if (!seen[slot]) {
            st = td_err_set(err, TD_ERR_INVALID, "slot %d live but in no queue", slot);
            break;
        }
        if (q->n_prompt < 1 || q->n_tokens < q->n_prompt || q->n_tokens > q->capacity ||
            q->n_computed < 0 || q->n_computed > q->n_tokens) {
            st = td_err_set(err, TD_ERR_INVALID,
                            "seq %llu: token counts (prompt %d, tokens %d, computed %d, cap %d)",
                            (unsigned long long)q->id, q->n_prompt, q->n_tokens, q->n_computed,
                            q->capacity);
            break;
        }
        if (q->state == TD_SEQ_WAITING && (q->n_blocks || q->n_computed || q->n_hashed)) {
            st = td_err_set(err, TD_ERR_INVALID, "waiting seq %llu holds blocks or KV",
                            (unsigned long long)q->id);
            break;
        }
        if (q->n_blocks != cdiv(q->n_computed, s->bs) || q->n_blocks > q->max_blocks ||
            q->n_hashed > q->n_computed / s->bs) {
            st = td_err_set(err, TD_ERR_INVALID,
                            "seq %llu: %d blocks for %d computed tokens (%d hashed)",
                            (unsigned long long)q->id, q->n_blocks, q->n_computed, q->n_hashed);
            break;
        }
        if (!q->prefilling && q->state == TD_SEQ_RUNNING && q->n_tokens - q->n_computed > 1) {
            st = td_err_set(err, TD_ERR_INVALID, "decoding seq %llu has %d pending tokens",
                            (unsigned long long)q->id, q->n_tokens - q->n_computed);
            break;
        }
        uint64_t h = td_kv_pool_root_hash(s->pool);
        for (int i = 0; i < q->n_hashed; i++) {
            h = td_kv_pool_hash(s->pool, h, q->tokens + (size_t)i * (size_t)s->bs);
            if (h != q->hashes[i]) {
                st = td_err_set(err, TD_ERR_INVALID, "seq %llu: block %d hash does not chain",
                                (unsigned long long)q->id, i);
                break;
            }
        }
        for (int i = 0; st == TD_OK && i < q->n_blocks; i++) {
            int32_t b = q->blocks[i];
            if (b < 0 || b >= nb)
                st = td_err_set(err, TD_ERR_INVALID, "seq %llu: block id %d",
                                (unsigned long long)q->id, b);
            else
                refs[b]++;
        }
    }
    for (int b = 0; st == TD_OK && b < nb; b++) refs[b] += s->held[b];
    if (st == TD_OK && live != s->n_running + s->n_waiting)
        st = td_err_set(err, TD_ERR_INVALID, "%d live sequences, %d queued", live,
                        s->n_running + s->n_waiting);
    if (st == TD_OK && live + s->n_free_slots != s->n_slots)
        st = td_err_set(err, TD_ERR_INVALID, "%d live + %d free slots != %d", live, s->n_free_slots,
                        s->n_slots);
    for (int b = 0; st == TD_OK && b < nb; b++)
        if (refs[b] != td_kv_pool_refcount(s->pool, b))
            st = td_err_set(err, TD_ERR_INVALID, "block %d: refcount %d but %d table references", b,
                            td_kv_pool_refcount(s->pool, b), refs[b]);
    free(refs);
    free(seen);
    return st;
}
