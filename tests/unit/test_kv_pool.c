// Unit tests of the paged KV pool: sizing from a budget, layout of the K/V planes, allocation,
// reference counts, copies, and the bookkeeping checker. The prefix cache has test_prefix_cache.c.
#include <stdint.h>
#include <string.h>

#include "engine/kv_pool.h"
#include "test_util.h"

static td_kv_pool *make(int block_size, int n_layers, int n_kv_heads, int head_dim, td_dtype dt,
                        size_t budget, int n_blocks) {
    td_kv_pool_params p = td_kv_pool_default_params();
    p.block_size = block_size;
    p.n_layers = n_layers;
    p.n_kv_heads = n_kv_heads;
    p.head_dim = head_dim;
    p.dtype = dt;
    p.budget_bytes = budget;
    p.n_blocks = n_blocks;
    td_kv_pool *pool = NULL;
    td_err err = {0};
    td_status st = td_kv_pool_create(&p, &pool, &err);
    CHECK(st == TD_OK, "create: %s", err.msg);
    return pool;
}

static void check_ok(const td_kv_pool *pool, const char *where) {
    td_err err = {0};
    td_status st = td_kv_pool_check(pool, &err);
    CHECK(st == TD_OK, "%s: %s", where, err.msg);
}

static void test_sizing(void) {
    td_kv_pool_params p = td_kv_pool_default_params();
    CHECK(p.block_size == 16 && p.dtype == TD_F32 && p.alloc_data, "defaults");
    p.n_layers = 4;
    p.n_kv_heads = 2;
    p.head_dim = 8;
    // 16 tokens * 4 layers * 2 (K,V) * 2 heads * 8 dims * 4 bytes
    CHECK(td_kv_pool_bytes_per_block(&p) == 8192, "bytes per block %zu",
          td_kv_pool_bytes_per_block(&p));
    p.dtype = TD_BF16;
    CHECK(td_kv_pool_bytes_per_block(&p) == 4096, "bf16 bytes per block");
    p.dtype = TD_Q8_0;
    CHECK(td_kv_pool_bytes_per_block(&p) == 0, "q8_0 is not a cache type");

    td_kv_pool *pool = make(16, 4, 2, 8, TD_F32, 100000, 0);  // 100000 / 8192 = 12.2
    if (pool) {
        CHECK(td_kv_pool_n_blocks(pool) == 12, "n_blocks %d", td_kv_pool_n_blocks(pool));
        CHECK(td_kv_pool_n_free(pool) == 12 && td_kv_pool_n_available(pool) == 12, "all free");
        CHECK(td_kv_pool_row_bytes(pool) == 64, "row bytes %zu", td_kv_pool_row_bytes(pool));
        td_kv_pool_free(pool);
    }
    pool = make(16, 4, 2, 8, TD_F16, 8192 * 3, 0);
    if (pool) {
        CHECK(td_kv_pool_n_blocks(pool) == 6, "f16: n_blocks %d", td_kv_pool_n_blocks(pool));
        td_kv_pool_free(pool);
    }
    pool = make(16, 4, 2, 8, TD_F32, 8192 * 5, 0);  // exact multiple
    if (pool) {
        CHECK(td_kv_pool_n_blocks(pool) == 5, "exact budget: n_blocks %d",
              td_kv_pool_n_blocks(pool));
        td_kv_pool_free(pool);
    }
    pool = make(16, 4, 2, 8, TD_F32, 1, 7);  // explicit count wins over the budget
    if (pool) {
        CHECK(td_kv_pool_n_blocks(pool) == 7, "explicit n_blocks");
        td_kv_pool_free(pool);
    }

    // Errors: budget too small, bad block size, bad dtype, no shape and no count.
    td_err err = {0};
    td_kv_pool *bad = (td_kv_pool *)&err;
    p = td_kv_pool_default_params();
    p.n_layers = 4, p.n_kv_heads = 2, p.head_dim = 8, p.budget_bytes = 8191;
    CHECK(td_kv_pool_create(&p, &bad, &err) == TD_ERR_LIMIT && bad == NULL, "tiny budget");
    CHECK(strstr(err.msg, "8191") != NULL, "message names the budget: %s", err.msg);
    p.budget_bytes = 1 << 20;
    p.block_size = 0;
    CHECK(td_kv_pool_create(&p, &bad, &err) == TD_ERR_INVALID, "block_size 0");
    p.block_size = 16;
    p.dtype = TD_Q4_0;
    CHECK(td_kv_pool_create(&p, &bad, &err) == TD_ERR_UNSUPPORTED, "q4_0 cache");
    p.dtype = TD_F32;
    p.head_dim = 0;
    CHECK(td_kv_pool_create(&p, &bad, &err) == TD_ERR_INVALID, "head_dim 0 with data");
    p.alloc_data = false;
    CHECK(td_kv_pool_create(&p, &bad, &err) == TD_ERR_INVALID, "no shape, no n_blocks");
    p.n_blocks = 3;
    CHECK(td_kv_pool_create(&p, &bad, &err) == TD_OK && bad, "metadata-only pool");
    if (bad) {
        CHECK(td_kv_pool_k_raw(bad, 0, 0) == NULL && td_kv_pool_layer_v(bad, 0) == NULL, "no data");
        td_kv_pool_copy(bad, 0, 1, 5);  // no-op
        td_kv_pool_free(bad);
    }
}

// Every (layer, K/V, block, slot, dim) element gets a distinct value through the per-block
// accessors; reading back through the per-layer planes must find each where the layout says.
static void test_layout(void) {
    const int bs = 4, L = 3, H = 2, D = 3, kvd = H * D;
    td_kv_pool *pool = make(bs, L, H, D, TD_F32, 0, 5);
    if (!pool) return;
    int nb = td_kv_pool_n_blocks(pool);
    for (int l = 0; l < L; l++)
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < bs; t++)
                for (int d = 0; d < kvd; d++) {
                    float v = (float)(((l * nb + b) * bs + t) * kvd + d);
                    td_kv_pool_k(pool, b, l)[t * kvd + d] = v;
                    td_kv_pool_v(pool, b, l)[t * kvd + d] = -v - 1;
                }
    int bad = 0;
    for (int l = 0; l < L; l++) {
        const float *kl = td_kv_pool_layer_k(pool, l), *vl = td_kv_pool_layer_v(pool, l);
        for (int b = 0; b < nb; b++)
            for (int t = 0; t < bs; t++)
                for (int d = 0; d < kvd; d++) {
                    float v = (float)(((l * nb + b) * bs + t) * kvd + d);
                    size_t i = ((size_t)b * bs + t) * kvd + d;  // [n_blocks, block_size, kv_dim]
                    bad += kl[i] != v || vl[i] != -v - 1;
                }
    }
    CHECK(bad == 0, "%d elements misplaced (K/V planes overlap or layout differs)", bad);
    CHECK((char *)td_kv_pool_k_raw(pool, 2, 1) ==
              (char *)td_kv_pool_layer_k(pool, 1) + 2 * bs * kvd * 4,
          "raw pointer of block 2 layer 1");

    // Copy of a partial block: slots [0, 3) of every layer move, slot 3 stays.
    td_kv_pool_copy(pool, 1, 4, 3);
    bad = 0;
    for (int l = 0; l < L; l++)
        for (int t = 0; t < bs; t++)
            for (int d = 0; d < kvd; d++) {
                int src_b = t < 3 ? 1 : 4;
                float v = (float)(((l * nb + src_b) * bs + t) * kvd + d);
                bad += td_kv_pool_k(pool, 4, l)[t * kvd + d] != v;
                bad += td_kv_pool_v(pool, 4, l)[t * kvd + d] != -v - 1;
            }
    CHECK(bad == 0, "copy: %d elements wrong", bad);
    td_kv_pool_free(pool);

    // BF16 pool: raw pointers step by 2-byte elements.
    pool = make(bs, L, H, D, TD_BF16, 0, 2);
    if (pool) {
        CHECK(td_kv_pool_row_bytes(pool) == (size_t)kvd * 2, "bf16 row bytes");
        CHECK((char *)td_kv_pool_v_raw(pool, 1, 0) - (char *)td_kv_pool_k_raw(pool, 0, 0) ==
                  (ptrdiff_t)(3 * bs * kvd * 2),
              "bf16 V plane after 2 K blocks + 1 V block");
        td_kv_pool_free(pool);
    }
}

static void test_alloc_refcount(void) {
    td_kv_pool *pool = make(16, 1, 1, 4, TD_F32, 0, 4);
    if (!pool) return;
    int32_t b[5];
    for (int i = 0; i < 4; i++) {
        CHECK(td_kv_pool_alloc(pool, &b[i]) == TD_OK, "alloc %d", i);
        CHECK(b[i] == i, "allocation order: got %d want %d", b[i], i);
        CHECK(td_kv_pool_refcount(pool, b[i]) == 1, "fresh refcount");
    }
    CHECK(td_kv_pool_n_free(pool) == 0 && td_kv_pool_n_available(pool) == 0, "exhausted");
    CHECK(td_kv_pool_alloc(pool, &b[4]) == TD_ERR_NOMEM, "alloc past the end fails");
    check_ok(pool, "full");

    // Shared block: freed only when the last reference goes.
    td_kv_pool_incref(pool, b[2]);
    td_kv_pool_incref(pool, b[2]);
    CHECK(td_kv_pool_refcount(pool, b[2]) == 3, "refcount 3");
    td_kv_pool_decref(pool, b[2]);
    td_kv_pool_decref(pool, b[2]);
    CHECK(td_kv_pool_n_free(pool) == 0, "still referenced");
    td_kv_pool_decref(pool, b[2]);
    CHECK(td_kv_pool_n_free(pool) == 1 && td_kv_pool_refcount(pool, b[2]) == 0, "freed at zero");
    check_ok(pool, "after shared free");
    int32_t again;
    CHECK(td_kv_pool_alloc(pool, &again) == TD_OK && again == b[2], "freed block reused");
    for (int i = 0; i < 4; i++) td_kv_pool_decref(pool, b[i]);
    CHECK(td_kv_pool_n_free(pool) == 4 && td_kv_pool_n_cached(pool) == 0, "all free again");
    check_ok(pool, "all free");

    // LIFO free stack: the most recently freed block comes back first.
    int32_t x, y;
    td_kv_pool_alloc(pool, &x);
    td_kv_pool_alloc(pool, &y);
    td_kv_pool_decref(pool, x);
    td_kv_pool_decref(pool, y);
    int32_t z;
    td_kv_pool_alloc(pool, &z);
    CHECK(z == y, "LIFO reuse: got %d want %d", z, y);
    td_kv_pool_decref(pool, z);
    check_ok(pool, "end");
    td_kv_pool_free(pool);
}

// Many random alloc/incref/decref operations against a shadow refcount table.
static void test_random_ops(void) {
    const int n = 37;
    td_kv_pool_params p = td_kv_pool_default_params();
    p.alloc_data = false;
    p.n_blocks = n;
    td_kv_pool *pool = NULL;
    td_err err = {0};
    if (td_kv_pool_create(&p, &pool, &err) != TD_OK) {
        CHECK(0, "create: %s", err.msg);
        return;
    }
    int shadow[37] = {0};
    uint64_t rng = 12345;
    int mismatches = 0, bad_check = 0;
    for (int it = 0; it < 20000; it++) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int op = (int)(rng >> 60) % 3, blk = (int)((rng >> 33) % (uint64_t)n);
        if (op == 0) {
            int32_t b;
            td_status st = td_kv_pool_alloc(pool, &b);
            int any_free = 0;
            for (int i = 0; i < n; i++) any_free |= shadow[i] == 0;
            if (st == TD_OK) {
                mismatches += shadow[b] != 0;
                shadow[b] = 1;
            } else {
                mismatches += any_free;
            }
        } else if (op == 1 && shadow[blk] > 0) {
            td_kv_pool_incref(pool, blk);
            shadow[blk]++;
        } else if (op == 2 && shadow[blk] > 0) {
            td_kv_pool_decref(pool, blk);
            shadow[blk]--;
        }
        int nfree = 0;
        for (int i = 0; i < n; i++) {
            mismatches += td_kv_pool_refcount(pool, i) != shadow[i];
            nfree += shadow[i] == 0;
        }
        mismatches += nfree != td_kv_pool_n_free(pool);
        if (it % 97 == 0) bad_check += td_kv_pool_check(pool, NULL) != TD_OK;
    }
    CHECK(mismatches == 0, "%d refcount/free mismatches against the shadow table", mismatches);
    CHECK(bad_check == 0, "%d invariant check failures", bad_check);
    td_kv_pool_free(pool);
}

int main(void) {
    test_sizing();
    test_layout();
    test_alloc_refcount();
    test_random_ops();
    TEST_DONE();
}
