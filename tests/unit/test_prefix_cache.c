// Unit tests of the prefix cache: chained lookups, token comparison under forced hash collisions,
// orphaned children of evicted parents, duplicates, LRU eviction order; then through the
// scheduler: exact hit counts for shared prefixes, partial blocks never shared, the last token
// always recomputed, and hits that carry the right KV (checked by the fake engine in sched_sim.h).
#include <stdint.h>
#include <string.h>

#include "engine/kv_pool.h"
#include "engine/sched.h"
#include "sched_sim.h"
#include "test_util.h"

#define BS 4

static uint64_t const_hash(uint64_t parent, const int32_t *t, int n) {
    (void)parent, (void)t, (void)n;
    return 42;  // every block collides
}

static td_kv_pool *meta_pool(int n_blocks, td_kv_hash_fn fn) {
    td_kv_pool_params p = td_kv_pool_default_params();
    p.block_size = BS;
    p.alloc_data = false;
    p.n_blocks = n_blocks;
    p.hash_fn = fn;
    td_kv_pool *pool = NULL;
    td_err err = {0};
    CHECK(td_kv_pool_create(&p, &pool, &err) == TD_OK, "create: %s", err.msg);
    return pool;
}

// Allocates and caches the blocks of tokens[0, nb*BS) as one sequence would; blocks[] gets ids.
static void cache_chain(td_kv_pool *pool, const int32_t *tokens, int nb, int32_t *blocks) {
    uint64_t h = td_kv_pool_root_hash(pool), e = TD_KV_NO_ENTRY;
    for (int i = 0; i < nb; i++) {
        CHECK(td_kv_pool_alloc(pool, &blocks[i]) == TD_OK, "alloc");
        h = td_kv_pool_hash(pool, h, tokens + i * BS);
        e = td_kv_pool_cache_insert(pool, blocks[i], h, e, tokens + i * BS);
        CHECK(e != TD_KV_NO_ENTRY, "entry id");
    }
}

static void release(td_kv_pool *pool, const int32_t *blocks, int nb) {
    for (int i = nb - 1; i >= 0; i--) td_kv_pool_decref(pool, blocks[i]);
}

static void test_chain(td_kv_hash_fn fn, const char *what) {
    td_kv_pool *pool = meta_pool(32, fn);
    if (!pool) return;
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t ba[3], got[3];
    cache_chain(pool, a, 3, ba);
    CHECK(td_kv_pool_n_cached(pool) == 3, "%s: 3 cached", what);

    CHECK(td_kv_pool_cache_match(pool, a, 3, NULL, NULL, got) == 3, "%s: full match", what);
    CHECK(got[0] == ba[0] && got[1] == ba[1] && got[2] == ba[2], "%s: matched blocks", what);
    CHECK(td_kv_pool_cache_match(pool, a, 2, NULL, NULL, NULL) == 2,
          "%s: match limited by n_blocks", what);

    int32_t b[12];
    memcpy(b, a, sizeof b);
    b[9] = 99;  // third block differs
    CHECK(td_kv_pool_cache_match(pool, b, 3, NULL, NULL, got) == 2, "%s: diverging 3rd block",
          what);
    b[0] = 99;  // first block differs: nothing matches although blocks 2.. are equal
    CHECK(td_kv_pool_cache_match(pool, b, 3, NULL, NULL, NULL) == 0, "%s: diverging 1st block",
          what);

    // Same tokens in block 1 after a different block 0: must not hit a's block 1.
    int32_t c[8] = {100, 101, 102, 103, 5, 6, 7, 8};
    int32_t bc[2];
    cache_chain(pool, c, 2, bc);
    CHECK(bc[1] != ba[1], "distinct blocks");
    CHECK(td_kv_pool_cache_match(pool, c, 2, NULL, NULL, got) == 2 && got[1] == bc[1],
          "%s: c's block 1 is its own", what);
    CHECK(td_kv_pool_cache_match(pool, a, 2, NULL, NULL, got) == 2 && got[1] == ba[1],
          "%s: a's block 1 is its own", what);

    // Duplicate insert (another sequence computed the same prefix): existing entry returned,
    // the duplicate block stays uncached and is freed, not cached, when released.
    int32_t dup;
    td_kv_pool_alloc(pool, &dup);
    uint64_t e0;
    CHECK(td_kv_pool_cache_lookup(pool, td_kv_pool_hash(pool, td_kv_pool_root_hash(pool), a), 0, a,
                                  &e0) == ba[0],
          "%s: lookup", what);
    uint64_t e = td_kv_pool_cache_insert(
        pool, dup, td_kv_pool_hash(pool, td_kv_pool_root_hash(pool), a), TD_KV_NO_ENTRY, a);
    CHECK(e == e0, "%s: duplicate returns the existing entry", what);
    CHECK(td_kv_pool_n_cached(pool) == 5, "%s: duplicate not cached", what);
    int nfree = td_kv_pool_n_free(pool);
    td_kv_pool_decref(pool, dup);
    CHECK(td_kv_pool_n_free(pool) == nfree + 1, "%s: duplicate freed", what);
    CHECK(td_kv_pool_check(pool, NULL) == TD_OK, "%s: check", what);
    release(pool, ba, 3);
    release(pool, bc, 2);
    CHECK(td_kv_pool_n_evictable(pool) == 5 && td_kv_pool_n_free(pool) == 27, "%s: all evictable",
          what);
    CHECK(td_kv_pool_cache_match(pool, a, 3, NULL, NULL, NULL) == 3, "%s: evictable still hit",
          what);
    CHECK(td_kv_pool_check(pool, NULL) == TD_OK, "%s: check", what);
    td_kv_pool_free(pool);
}

// Parent evicted, prefix recomputed into a new block: the old child must not hang off the new
// parent (entry ids are never reused), even when every hash collides.
static void test_orphan(void) {
    td_kv_pool *pool = meta_pool(3, const_hash);
    if (!pool) return;
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t ba[2];
    cache_chain(pool, a, 2, ba);
    // Release the parent first so it is the least recently used, then the child.
    td_kv_pool_decref(pool, ba[0]);
    td_kv_pool_decref(pool, ba[1]);
    int32_t x, y;
    CHECK(td_kv_pool_alloc(pool, &x) == TD_OK && x == 2, "free block first");
    CHECK(td_kv_pool_alloc(pool, &y) == TD_OK && y == ba[0],
          "then the LRU head (parent) is evicted");
    CHECK(td_kv_pool_cache_match(pool, a, 2, NULL, NULL, NULL) == 0, "no parent, no match");
    // Recompute block 0 of a into y and cache it again: a new entry.
    uint64_t e = td_kv_pool_cache_insert(pool, y, td_kv_pool_hash(pool, 0, a), TD_KV_NO_ENTRY, a);
    CHECK(e != TD_KV_NO_ENTRY, "recached");
    int32_t got[2];
    CHECK(td_kv_pool_cache_match(pool, a, 2, NULL, NULL, got) == 1 && got[0] == y,
          "the orphaned child (block %d) is not reachable from the new parent", ba[1]);
    CHECK(td_kv_pool_check(pool, NULL) == TD_OK, "check");
    td_kv_pool_decref(pool, x);
    td_kv_pool_decref(pool, y);
    td_kv_pool_free(pool);
}

static void test_lru(void) {
    td_kv_pool *pool = meta_pool(6, NULL);
    if (!pool) return;
    int32_t t[4][BS];
    int32_t b[4];
    for (int i = 0; i < 4; i++) {
        for (int j = 0; j < BS; j++) t[i][j] = 1000 * i + j;
        CHECK(td_kv_pool_alloc(pool, &b[i]) == TD_OK, "alloc");
        td_kv_pool_cache_insert(pool, b[i], td_kv_pool_hash(pool, 0, t[i]), TD_KV_NO_ENTRY, t[i]);
    }
    // Release order 2, 0, 3, 1; then revive 0 (a hit) and release it again: order 2, 3, 1, 0.
    td_kv_pool_decref(pool, b[2]);
    td_kv_pool_decref(pool, b[0]);
    td_kv_pool_decref(pool, b[3]);
    td_kv_pool_decref(pool, b[1]);
    td_kv_pool_incref(pool, b[0]);
    CHECK(td_kv_pool_n_evictable(pool) == 3, "revived block leaves the LRU list");
    td_kv_pool_decref(pool, b[0]);
    CHECK(td_kv_pool_n_evictable(pool) == 4 && td_kv_pool_n_free(pool) == 2, "4 evictable, 2 free");
    int32_t x[6];
    // Free blocks go first (they cost no cache), then LRU order.
    for (int i = 0; i < 6; i++) CHECK(td_kv_pool_alloc(pool, &x[i]) == TD_OK, "alloc %d", i);
    CHECK(x[0] == 4 && x[1] == 5, "free blocks before evictions: %d %d", x[0], x[1]);
    CHECK(x[2] == b[2] && x[3] == b[3] && x[4] == b[1] && x[5] == b[0],
          "eviction order %d %d %d %d", x[2], x[3], x[4], x[5]);
    CHECK(td_kv_pool_n_cached(pool) == 0, "evicted blocks left the cache");
    for (int i = 0; i < 4; i++)
        CHECK(td_kv_pool_cache_lookup(pool, td_kv_pool_hash(pool, 0, t[i]), 0, t[i], NULL) < 0,
              "gone");
    CHECK(td_kv_pool_check(pool, NULL) == TD_OK, "check");
    td_kv_pool_free(pool);
}

// ---- through the scheduler

static td_sched_params sp(int budget, int max_seqs) {
    td_sched_params p = td_sched_default_params();
    p.max_batched_tokens = budget;
    p.max_seqs = max_seqs;
    p.max_waiting = 64;
    p.max_ctx = 256;
    return p;
}

static void run_one(sim *s, uint64_t id, const int32_t *prompt, int n, int out) {
    CHECK(sim_add(s, id, prompt, n, out) == TD_OK, "add %llu", (unsigned long long)id);
    sim_run(s, 1000);
    CHECK(s->r[id].finished, "seq %llu finished", (unsigned long long)id);
}

static void test_sched_hits(void) {
    sim s;
    td_sched_params p = sp(256, 8);
    if (!sim_init(&s, 16, 64, &p)) return;
    int32_t base[40], other[40];
    for (int i = 0; i < 40; i++) base[i] = 7 * i + 1, other[i] = 5000 + i;
    td_sched_stats st;

    run_one(&s, 1, base, 40, 3);
    td_sched_stats_get(s.sched, &st);
    CHECK(st.prefix_queries == 40 && st.prefix_hits == 0, "cold: %llu/%llu",
          (unsigned long long)st.prefix_hits, (unsigned long long)st.prefix_queries);

    struct {
        int n_same, n;  // first n_same tokens from base, then from other
        int hits;       // expected cached tokens
    } cases[] = {
        {32, 40, 32},  // two shared full blocks
        {20, 40, 16},  // a shared partial block is not shared
        {40, 40, 32},  // whole prompt cached: 2 of its 3 blocks (the 3rd is partial anyway)
        {32, 32, 16},  // prompt = 2 cached blocks: the last block is recomputed for the logits
        {16, 16, 0},   // one full cached block, but the last token must be computed
        {17, 17, 16}, {0, 40, 0},  // different first block
    };
    uint64_t q = 40, h = 0;
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
        int32_t pr[40];
        for (int i = 0; i < cases[c].n; i++) pr[i] = i < cases[c].n_same ? base[i] : other[i];
        uint64_t id = 10 + (uint64_t)c;
        run_one(&s, id, pr, cases[c].n, 2);
        q += (uint64_t)cases[c].n;
        h += (uint64_t)cases[c].hits;
        td_sched_stats_get(s.sched, &st);
        CHECK(s.r[id].n_cached_tokens == cases[c].hits, "case %d: %d cached tokens, want %d", c,
              s.r[id].n_cached_tokens, cases[c].hits);
        CHECK(st.prefix_queries == q && st.prefix_hits == h,
              "case %d: hits %llu/%llu want %llu/%llu", c, (unsigned long long)st.prefix_hits,
              (unsigned long long)st.prefix_queries, (unsigned long long)h, (unsigned long long)q);
    }
    // Generated tokens are cached too: a sequence of 20 prompt tokens that generated 19 more
    // (fed back: 39 computed) cached 2 full blocks, the 2nd mostly generated tokens. A prompt
    // that repeats the first 33 of those tokens hits both.
    run_one(&s, 30, other, 20, 20);
    CHECK(s.r[30].n_tok == 39, "seq 30 holds %d tokens", s.r[30].n_tok);
    run_one(&s, 31, s.r[30].tok, 33, 2);
    CHECK(s.r[31].n_cached_tokens == 32, "generated block hit: %d cached", s.r[31].n_cached_tokens);
    CHECK(s.errors == 0 && s.check_errors == 0,
          "fake engine found %d errors, %d invariant failures", s.errors, s.check_errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// Two identical prompts admitted in the same step both compute (the cache fills only after a
// step's forward ran); a third one later hits, and only one copy of each block is cached.
static void test_sched_same_step(void) {
    sim s;
    td_sched_params p = sp(256, 8);
    if (!sim_init(&s, 16, 64, &p)) return;
    int32_t pr[50];
    for (int i = 0; i < 50; i++) pr[i] = 3 * i + 2;
    CHECK(sim_add(&s, 1, pr, 50, 4) == TD_OK && sim_add(&s, 2, pr, 50, 4) == TD_OK, "add");
    sim_step(&s, NULL);
    CHECK(s.r[1].n_cached_tokens == 0 && s.r[2].n_cached_tokens == 0, "same-step: no hits");
    sim_step(&s, NULL);
    CHECK(td_kv_pool_n_cached(s.pool) == 3, "3 blocks cached once: %d",
          td_kv_pool_n_cached(s.pool));
    CHECK(sim_add(&s, 3, pr, 50, 4) == TD_OK, "add 3");
    sim_run(&s, 100);
    CHECK(s.r[3].n_cached_tokens == 48, "later one hits 48: %d", s.r[3].n_cached_tokens);
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine found %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// LRU through the scheduler: finished prompts' blocks stay cached until a new prompt needs
// their room; the least recently released go first.
static void test_sched_lru(void) {
    sim s;
    td_sched_params p = sp(64, 4);
    if (!sim_init(&s, 4, 8, &p)) return;
    int32_t a[9], b[9], c[17];
    for (int i = 0; i < 9; i++) a[i] = 100 + i, b[i] = 200 + i;
    for (int i = 0; i < 17; i++) c[i] = 300 + i;
    // Each computes its prompt only (1 output, finished at the first sample): 2 full blocks
    // cached per 9-token prompt, the partial 3rd freed. LRU after both: a1 a0 b1 b0.
    run_one(&s, 1, a, 9, 1);
    run_one(&s, 2, b, 9, 1);
    CHECK(td_kv_pool_n_evictable(s.pool) == 4 && td_kv_pool_n_free(s.pool) == 4,
          "4 cached, 4 free");
    // c needs 5 blocks: the 4 free ones and one eviction, a's block 1.
    run_one(&s, 3, c, 17, 1);
    run_one(&s, 4, b, 9, 1);
    CHECK(s.r[4].n_cached_tokens == 8, "b still fully cached: %d", s.r[4].n_cached_tokens);
    run_one(&s, 5, a, 9, 1);
    CHECK(s.r[5].n_cached_tokens == 4, "a lost its 2nd block: %d", s.r[5].n_cached_tokens);
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine found %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

static void test_sched_disabled(void) {
    sim s;
    td_sched_params p = sp(256, 8);
    p.enable_prefix_cache = false;
    if (!sim_init(&s, 16, 64, &p)) return;
    int32_t pr[40];
    for (int i = 0; i < 40; i++) pr[i] = i;
    run_one(&s, 1, pr, 40, 2);
    run_one(&s, 2, pr, 40, 2);
    td_sched_stats st;
    td_sched_stats_get(s.sched, &st);
    CHECK(st.prefix_hits == 0 && td_kv_pool_n_cached(s.pool) == 0,
          "cache off: no hits, nothing cached");
    CHECK(td_kv_pool_n_free(s.pool) == 64, "all free");
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine found %d errors", s.errors);
    sim_destroy(&s);
}

// Colliding hashes through the scheduler: many prompts that share tokens at block level but
// not prefixes; the fake engine verifies every hit carried the right KV.
static void test_sched_collisions(void) {
    sim s;
    memset(&s, 0, sizeof s);
    s.r = calloc(SIM_MAX_REQ, sizeof *s.r);
    td_kv_pool_params pp = td_kv_pool_default_params();
    pp.block_size = 4, pp.n_layers = 1, pp.n_kv_heads = 1, pp.head_dim = 2, pp.n_blocks = 40;
    pp.hash_fn = const_hash;
    td_sched_params p = sp(32, 4);
    td_err err = {0};
    CHECK(td_kv_pool_create(&pp, &s.pool, &err) == TD_OK, "pool");
    CHECK(td_sched_create(&p, s.pool, &s.sched, &err) == TD_OK, "sched");
    s.bs = 4;
    s.check_each_step = true;
    s.next_fork_id = SIM_MAX_REQ / 2;
    // Prompts over a 2-letter alphabet of blocks: X = {1,1,1,1}, Y = {2,2,2,2}.
    int hits = 0;
    for (int r = 0; r < 32; r++) {
        int32_t pr[17];
        for (int blk = 0; blk < 4; blk++)
            for (int j = 0; j < 4; j++) pr[blk * 4 + j] = ((r >> blk) & 1) + 1;
        pr[16] = 7;
        CHECK(sim_add(&s, (uint64_t)r, pr, 17, 2) == TD_OK, "add");
        sim_run(&s, 100);
        hits += s.r[r].n_cached_tokens;
    }
    // Each 4-block prefix pattern of r (mod 16) repeats at r + 16: full hits then. Earlier
    // ones hit their longest previously seen prefix.
    CHECK(hits > 0, "collisions still allow hits: %d", hits);
    CHECK(s.errors == 0 && s.check_errors == 0,
          "fake engine found %d errors, %d invariant failures", s.errors, s.check_errors);
    int exp = 0;  // independent count: longest common prefix (in blocks) with any earlier prompt
    for (int r = 0; r < 32; r++) {
        int best = 0;
        for (int o = 0; o < r; o++) {
            int k = 0;
            while (k < 4 && ((r >> k) & 1) == ((o >> k) & 1)) k++;
            if (k > best) best = k;
        }
        exp += best * 4;
    }
    CHECK(hits == exp, "hits %d, expected %d (no eviction: 40 blocks)", hits, exp);
    sim_destroy(&s);
}

// New weights: td_kv_pool_cache_reset drops every entry (evictable blocks free, used ones uncached
// and freed on release) and changes the root hash; through the scheduler,
// td_sched_set_weights_version requeues the running sequences (recomputed, no hit on KV of the
// old weights) while later prompts hit what the new version computed.
static void test_weights_version(void) {
    td_kv_pool *pool = meta_pool(16, NULL);
    if (!pool) return;
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, ba[3], bb[3];
    const uint64_t root0 = td_kv_pool_root_hash(pool);
    cache_chain(pool, a, 3, ba);
    release(pool, ba, 2);  // blocks 0, 1 evictable; block 2 still used
    td_kv_pool_cache_reset(pool, 7);
    CHECK(td_kv_pool_version(pool) == 7 && td_kv_pool_root_hash(pool) != root0, "version in the root hash");
    CHECK(td_kv_pool_n_cached(pool) == 0 && td_kv_pool_n_evictable(pool) == 0 && td_kv_pool_n_free(pool) == 15,
          "reset: nothing cached, evictable blocks free (free %d)", td_kv_pool_n_free(pool));
    CHECK(td_kv_pool_refcount(pool, ba[2]) == 1, "a used block keeps its reference");
    CHECK(td_kv_pool_cache_match(pool, a, 3, NULL, NULL, NULL) == 0, "old KV is never matched");
    td_kv_pool_decref(pool, ba[2]);
    CHECK(td_kv_pool_n_free(pool) == 16, "the uncached block is freed on release");
    cache_chain(pool, a, 3, bb);
    CHECK(td_kv_pool_cache_match(pool, a, 3, NULL, NULL, NULL) == 3, "the new version's chain is matched");
    release(pool, bb, 3);
    CHECK(td_kv_pool_check(pool, NULL) == TD_OK, "check");
    td_kv_pool_free(pool);

    sim s;
    td_sched_params p = sp(256, 8);
    if (!sim_init(&s, 16, 64, &p)) return;
    int32_t base[40];
    for (int i = 0; i < 40; i++) base[i] = 3 * i + 2;
    td_sched_stats st0, st1;
    run_one(&s, 1, base, 40, 3);  // cached under version 0
    CHECK(sim_add(&s, 2, base, 40, 12) == TD_OK, "add 2");
    for (int i = 0; i < 4; i++) sim_step(&s, NULL);  // 2 hit the cache, now decoding
    CHECK(s.r[2].n_cached_tokens == 32 && !s.r[2].finished, "2 took 32 cached tokens and runs");
    td_sched_stats_get(s.sched, &st0);
    td_sched_set_weights_version(s.sched, 1);
    td_sched_stats_get(s.sched, &st1);
    CHECK(st1.n_running == 0 && st1.n_waiting == 1 && st1.n_blocks_used == 0 && st1.n_blocks_evictable == 0,
          "requeued with no block (running %d, waiting %d, used %d, evictable %d)", st1.n_running, st1.n_waiting,
          st1.n_blocks_used, st1.n_blocks_evictable);
    CHECK(td_sched_check(s.sched, NULL) == TD_OK, "check after the version change");
    sim_run(&s, 1000);
    td_sched_stats_get(s.sched, &st1);
    CHECK(s.r[2].finished && st1.prefix_hits == st0.prefix_hits, "2 recomputed everything (hits %llu -> %llu)",
          (unsigned long long)st0.prefix_hits, (unsigned long long)st1.prefix_hits);
    run_one(&s, 3, base, 40, 2);
    CHECK(s.r[3].n_cached_tokens == 32, "a later prompt hits the new version's blocks (%d)", s.r[3].n_cached_tokens);
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors, %d invariant failures", s.errors,
          s.check_errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

int main(void) {
    test_chain(NULL, "xxh3");
    test_chain(const_hash, "colliding");
    test_orphan();
    test_lru();
    test_sched_hits();
    test_sched_same_step();
    test_sched_lru();
    test_sched_disabled();
    test_sched_collisions();
    test_weights_version();
    TEST_DONE();
}
