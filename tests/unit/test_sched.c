// Unit tests of the scheduler, no model: exact batches of small traces (chunking, decode-first,
// preemption), the token budget and max_seqs every step, cancellation in every state, fork for
// n > 1, FCFS fairness, and randomized simulations under a pool barely larger than one
// request's need, checking every invariant after every step. The fake engine (sched_sim.h)
// verifies that every scheduled sequence reads its own KV.
#include <stdint.h>
#include <string.h>

#include "engine/kv_pool.h"
#include "engine/sched.h"
#include "sched_sim.h"
#include "test_util.h"

static td_sched_params sp(int budget, int max_seqs, int max_waiting, int max_ctx) {
    td_sched_params p = td_sched_default_params();
    p.max_batched_tokens = budget;
    p.max_seqs = max_seqs;
    p.max_waiting = max_waiting;
    p.max_ctx = max_ctx;
    return p;
}

static void test_params(void) {
    td_kv_pool_params pp = td_kv_pool_default_params();
    pp.alloc_data = false;
    pp.n_blocks = 10;
    pp.block_size = 4;
    td_kv_pool *pool = NULL;
    td_err err = {0};
    CHECK(td_kv_pool_create(&pp, &pool, &err) == TD_OK, "pool");
    if (!pool) return;
    td_sched *s = (td_sched *)&err;
    td_sched_params p = sp(4, 8, 2, 64);
    CHECK(td_sched_create(&p, pool, &s, &err) == TD_ERR_INVALID && s == NULL, "budget < max_seqs");
    p = sp(64, 0, 2, 64);
    CHECK(td_sched_create(&p, pool, &s, &err) == TD_ERR_INVALID, "max_seqs 0");
    p = sp(64, 2, 2, 0);
    CHECK(td_sched_create(&p, pool, &s, &err) == TD_ERR_INVALID, "max_ctx 0");
    p = sp(64, 2, 2, 64);
    CHECK(td_sched_create(&p, NULL, &s, &err) == TD_ERR_INVALID, "no pool");
    CHECK(td_sched_create(&p, pool, &s, &err) == TD_OK, "create: %s", err.msg);
    if (!s) return;
    td_sched_out o;
    td_sched_step(s, &o);
    CHECK(o.n_entries == 0 && o.n_tokens == 0 && o.n_preempted == 0, "empty scheduler: empty batch");
    int32_t pr[100] = {0};
    CHECK(td_sched_add(s, 1, pr, 0, 4, &err) == TD_ERR_INVALID, "empty prompt");
    CHECK(td_sched_add(s, 1, pr, 4, -1, &err) == TD_ERR_INVALID, "negative max_new");
    CHECK(td_sched_add(s, 1, pr, 65, 0, &err) == TD_ERR_LIMIT, "prompt > max_ctx");
    // 10 blocks of 4 = 40 tokens: a sequence needing 41 is rejected up front, not left waiting.
    CHECK(td_sched_add(s, 1, pr, 30, 11, &err) == TD_ERR_LIMIT, "need > pool");
    CHECK(strstr(err.msg, "11 KV blocks") != NULL, "message: %s", err.msg);
    CHECK(td_sched_add(s, 1, pr, 30, 10, &err) == TD_OK, "exactly the pool");
    CHECK(td_sched_add(s, 1, pr, 3, 1, &err) == TD_ERR_INVALID, "duplicate id");
    CHECK(td_sched_add(s, 2, pr, 3, 1, &err) == TD_OK, "2nd waiting");
    CHECK(td_sched_add(s, 3, pr, 3, 1, &err) == TD_ERR_LIMIT, "waiting queue full (2)");
    // max_new beyond max_ctx is clamped, not rejected.
    CHECK(td_sched_cancel(s, 2) == TD_OK, "cancel");
    CHECK(td_sched_add(s, 3, pr, 3, 1000000, &err) == TD_ERR_LIMIT,
          "clamped to 64 tokens = 16 blocks > 10");
    CHECK(td_sched_cancel(s, 2) == TD_ERR_NOT_FOUND, "cancel twice");
    CHECK(td_sched_finish(s, 99) == TD_ERR_NOT_FOUND, "finish unknown");
    CHECK(td_sched_append_token(s, 99, 5, &err) == TD_ERR_NOT_FOUND, "append unknown");
    const td_seq *q = td_sched_get(s, 1);
    CHECK(q && q->state == TD_SEQ_WAITING && q->capacity == 40 && q->n_prompt == 30, "seq view");
    CHECK(td_sched_check(s, &err) == TD_OK, "check: %s", err.msg);
    td_sched_free(s);
    CHECK(td_kv_pool_n_free(pool) == 10, "free returns everything");
    td_kv_pool_free(pool);
}

// Exact batches of a small trace: budget 8, block size 4.
static void test_trace_chunking(void) {
    sim s;
    td_sched_params p = sp(8, 4, 8, 64);
    if (!sim_init(&s, 4, 32, &p)) return;
    sim_add_gen(&s, 1, 1, 10, 5);
    sim_add_gen(&s, 2, 2, 5, 5);
    td_sched_out o;
    sim_step(&s, &o);  // A's first chunk takes the whole budget; B waits
    CHECK(o.n_entries == 1 && o.entries[0].seq_id == 1 && o.entries[0].start_pos == 0 &&
              o.entries[0].n_tokens == 8 && o.entries[0].is_prefill && !o.entries[0].needs_logits,
          "step 1: A[0,8)");
    CHECK(o.entries[0].n_new_blocks == 2 && o.n_new_blocks == 2 && o.n_admitted == 1, "2 blocks");
    sim_step(&s, &o);  // A's last chunk, then B admitted
    CHECK(o.n_entries == 2 && o.n_decode == 0 && o.n_tokens == 7,
          "step 2: 2 prefill entries, 7 tokens");
    CHECK(o.entries[0].seq_id == 1 && o.entries[0].start_pos == 8 && o.entries[0].n_tokens == 2 &&
              o.entries[0].needs_logits && o.entries[0].n_new_blocks == 1,
          "step 2: A[8,10) with logits");
    CHECK(o.entries[1].seq_id == 2 && o.entries[1].n_tokens == 5 && o.entries[1].needs_logits,
          "step 2: B[0,5) whole");
    sim_step(&s, &o);  // both decode
    CHECK(o.n_entries == 2 && o.n_decode == 2 && o.n_tokens == 2, "step 3: two decodes");
    CHECK(o.entries[0].start_pos == 10 && !o.entries[0].is_prefill && o.entries[0].needs_logits &&
              o.entries[0].n_new_blocks == 0 && o.entries[0].table.n_blocks == 3,
          "A decodes position 10 into its 3rd block");
    CHECK(o.entries[1].start_pos == 5 && o.entries[1].table.n_blocks == 2, "B decodes position 5");
    sim_run(&s, 100);
    CHECK(s.r[1].finished && s.r[2].finished, "both finished");
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// A long prompt arrives while three sequences decode: every step keeps all three decodes first,
// the prompt advances one budget-sized chunk per step, and the budget holds.
static void test_long_prompt_chunked(void) {
    sim s;
    td_sched_params p = sp(64, 8, 8, 2048);
    if (!sim_init(&s, 16, 256, &p)) return;
    for (uint64_t i = 1; i <= 3; i++) sim_add_gen(&s, i, i, 5, 200);
    sim_step(&s, NULL);
    sim_add_gen(&s, 4, 4, 1000, 3);
    td_sched_out o;
    int steps = 0, bad = 0;
    int last[4] = {0};
    for (uint64_t i = 1; i <= 3; i++) last[i] = td_sched_get(s.sched, i)->n_computed;
    while (s.r[4].n_out == 0 && steps < 100) {
        sim_step(&s, &o);
        steps++;
        bad += o.n_decode != 3 || o.n_tokens > 64;
        for (int i = 0; i < 3; i++) bad += o.entries[i].n_tokens != 1 || o.entries[i].is_prefill;
        bad += o.n_entries != 4 || o.entries[3].seq_id != 4;
        if (o.n_entries == 4)
            bad += o.entries[3].n_tokens != (o.entries[3].needs_logits ? 1000 - 16 * 61 : 61);
        for (uint64_t i = 1; i <= 3; i++) {
            int c = td_sched_get(s.sched, i)->n_computed;
            bad += c != last[i] + 1;
            last[i] = c;
        }
    }
    CHECK(bad == 0, "%d violations of decode-first / chunk size / progress", bad);
    CHECK(steps == 17, "1000 tokens in chunks of 61: %d steps, want 17", steps);
    for (uint64_t i = 1; i <= 3; i++) td_sched_cancel(s.sched, i), s.r[i].live = false;
    sim_run(&s, 100);
    CHECK(s.r[4].finished && s.errors == 0 && s.check_errors == 0,
          "long prompt finished, %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// max_seqs bounds the running set; the rest wait and are admitted FCFS as others finish.
static void test_max_seqs(void) {
    sim s;
    td_sched_params p = sp(512, 3, 16, 256);
    if (!sim_init(&s, 8, 128, &p)) return;
    for (uint64_t i = 0; i < 10; i++) sim_add_gen(&s, i, i, 10 + (int)i, 3 + (int)(i % 4));
    int bad = 0;
    while (sim_n_live(&s) > 0 && s.step < 200) {
        td_sched_out o;
        sim_step(&s, &o);
        td_sched_stats st;
        td_sched_stats_get(s.sched, &st);
        bad += st.n_running > 3 || o.n_entries > 3;
    }
    CHECK(bad == 0, "max_seqs exceeded %d times", bad);
    for (int i = 0; i < 10; i++) CHECK(s.r[i].finished, "seq %d finished", i);
    for (int i = 1; i < s.n_admit_log; i++)
        CHECK(s.admit_log[i] > s.admit_log[i - 1], "FCFS admission");
    CHECK(s.max_entries_seen == 3, "3 ran together");
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    sim_destroy(&s);
}

// Preemption traced by hand: block size 2, 4 blocks, two sequences of 3 prompt tokens.
static void test_trace_preemption(void) {
    sim s;
    td_sched_params p = sp(16, 4, 8, 64);
    if (!sim_init(&s, 2, 4, &p)) return;
    sim_add_gen(&s, 1, 1, 3, 5);  // 8 tokens: 4 blocks, the whole pool
    sim_add_gen(&s, 2, 2, 3, 5);
    td_sched_out o;
    sim_step(&s, &o);  // both admitted, 2 blocks each: pool full
    CHECK(o.n_entries == 2 && o.n_admitted == 2 && td_kv_pool_n_available(s.pool) == 0, "step 1");
    sim_step(&s, &o);  // position 3 fits in each 2nd block
    CHECK(o.n_entries == 2 && o.n_decode == 2 && o.n_new_blocks == 0, "step 2: decodes, no blocks");
    sim_step(&s, &o);  // A needs a 3rd block: B, the newest, is preempted
    CHECK(o.n_preempted == 1 && o.preempted[0] == 2, "step 3: B preempted");
    CHECK(o.n_entries == 1 && o.entries[0].seq_id == 1 && o.entries[0].n_new_blocks == 1,
          "step 3: A runs");
    const td_seq *b = td_sched_get(s.sched, 2);
    CHECK(b && b->state == TD_SEQ_WAITING && b->n_blocks == 0 && b->n_preemptions == 1 &&
              b->n_tokens == 5,
          "B waits with its 5 tokens and no blocks");
    // A took B's LRU tail block (positions 2,3); B's first block stays cached but one hit
    // leaves B needing 2 more blocks, and only that cached one is left: B waits.
    CHECK(td_kv_pool_n_evictable(s.pool) == 1 && td_kv_pool_n_free(s.pool) == 0, "1 evictable");
    sim_step(&s, &o);
    CHECK(o.n_entries == 1 && o.n_admitted == 0, "step 4: only A");
    sim_step(&s, &o);  // A's last token: it evicts B's cached block, then finishes
    CHECK(s.r[1].finished, "A finished at step 5");
    sim_step(&s, &o);  // B recomputes all 5 tokens
    CHECK(o.n_entries == 1 && o.entries[0].seq_id == 2 && o.entries[0].start_pos == 0 &&
              o.entries[0].n_tokens == 5 && o.entries[0].is_prefill && o.entries[0].needs_logits,
          "step 6: B recomputes [0,5)");
    sim_run(&s, 100);
    CHECK(s.r[2].finished && s.r[2].n_tok == 3 + 4, "B finished with its own tokens");
    td_sched_stats st;
    td_sched_stats_get(s.sched, &st);
    CHECK(st.n_preemptions == 1, "one preemption");
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// The victim is the newest running sequence, not merely a newer one.
static void test_victim_newest(void) {
    sim s;
    td_sched_params p = sp(16, 4, 8, 64);
    if (!sim_init(&s, 2, 6, &p)) return;
    for (uint64_t i = 1; i <= 3; i++) sim_add_gen(&s, i, i, 3, 5);
    td_sched_out o;
    sim_step(&s, &o);
    CHECK(o.n_admitted == 3 && td_kv_pool_n_available(s.pool) == 0, "three admitted, pool full");
    sim_step(&s, &o);
    sim_step(&s, &o);  // A and B each need a 3rd block: C goes, its 2 blocks serve both
    CHECK(o.n_preempted == 1 && o.preempted[0] == 3, "C (newest) preempted, not B");
    CHECK(o.n_entries == 2 && o.entries[0].seq_id == 1 && o.entries[1].seq_id == 2, "A and B run");
    sim_run(&s, 200);
    for (int i = 1; i <= 3; i++) CHECK(s.r[i].finished, "seq %d finished", i);
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// FCFS under pressure: a long request arrives after a running one and before a stream of short
// ones. It cannot start until the pool has room, and the short ones, though each would fit
// sooner, must not overtake it (no request waits forever while later ones complete).
static void test_fairness(void) {
    sim s;
    td_sched_params p = sp(64, 8, 32, 128);
    if (!sim_init(&s, 4, 20, &p)) return;
    sim_add_gen(&s, 1, 1, 40, 20);  // running: 10 blocks, up to 15
    sim_step(&s, NULL);
    sim_add_gen(&s, 2, 2, 60, 10);  // its first chunk (60 tokens) needs 15 blocks: waits for seq 1
    for (uint64_t i = 3; i < 13; i++) sim_add_gen(&s, i, i, 3, 3);
    td_sched_stats st;
    td_sched_stats_get(s.sched, &st);
    CHECK(st.kv_usage > 0.49 && st.kv_usage < 0.51, "kv usage 10/20 blocks: %.3f", st.kv_usage);
    sim_run(&s, 1000);
    for (uint64_t i = 1; i < 13; i++)
        CHECK(s.r[i].finished, "seq %llu finished", (unsigned long long)i);
    for (uint64_t i = 3; i < 13; i++)
        CHECK(s.r[i].admit_step >= s.r[2].admit_step,
              "short seq %llu admitted at step %lld before the long one (%lld)",
              (unsigned long long)i, (long long)s.r[i].admit_step, (long long)s.r[2].admit_step);
    CHECK(s.r[2].admit_step >= s.r[1].finish_step,
          "the long one waited for seq 1 (admitted at %lld, seq 1 done at %lld)",
          (long long)s.r[2].admit_step, (long long)s.r[1].finish_step);
    CHECK(s.r[1].finish_step >= 20, "seq 1 ran its 20 steps: %lld", (long long)s.r[1].finish_step);
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

static int used_blocks(const sim *s) {
    td_sched_stats st;
    td_sched_stats_get(s->sched, &st);
    return st.n_blocks_used;
}

static void test_cancel_states(void) {
    sim s;
    td_sched_params p = sp(8, 4, 8, 64);
    if (!sim_init(&s, 4, 16, &p)) return;
    // Waiting, never admitted.
    sim_add_gen(&s, 1, 1, 20, 4);
    sim_cancel(&s, 1);
    CHECK(sim_n_live(&s) == 0 && used_blocks(&s) == 0, "cancel waiting");
    // Running, mid-prefill (8 of 20 tokens): blocks back, nothing cached (never committed).
    sim_add_gen(&s, 2, 2, 20, 4);
    sim_step(&s, NULL);
    CHECK(td_sched_get(s.sched, 2)->n_computed == 8 && used_blocks(&s) == 2, "prefilling");
    sim_cancel(&s, 2);
    CHECK(
        used_blocks(&s) == 0 && td_kv_pool_n_cached(s.pool) == 0 && td_kv_pool_n_free(s.pool) == 16,
        "cancel prefilling: all free, nothing cached");
    // Running, decoding.
    sim_add_gen(&s, 3, 3, 6, 10);
    sim_step(&s, NULL);
    sim_step(&s, NULL);
    CHECK(!td_sched_get(s.sched, 3)->prefilling && used_blocks(&s) == 2, "decoding");
    sim_cancel(&s, 3);
    CHECK(used_blocks(&s) == 0, "cancel decoding");
    // Preempted (waiting again): pool of 16 blocks of 4; A and B each need up to 8.
    sim_add_gen(&s, 4, 4, 7, 25);  // 32 tokens: 8 blocks
    sim_add_gen(&s, 5, 5, 7, 25);
    sim_add_gen(&s, 6, 6, 7, 25);
    int guard = 0;
    while (guard++ < 200 &&
           !(td_sched_get(s.sched, 6) && td_sched_get(s.sched, 6)->n_preemptions > 0 &&
             td_sched_get(s.sched, 6)->state == TD_SEQ_WAITING))
        sim_step(&s, NULL);
    CHECK(guard < 200, "seq 6 got preempted");
    int before = used_blocks(&s);
    sim_cancel(&s, 6);
    CHECK(used_blocks(&s) == before, "cancel preempted: it held nothing");
    // Forked parent cancelled: the child keeps the shared blocks and finishes correctly.
    sim_run(&s, 500);
    sim_add_gen(&s, 7, 7, 9, 6);
    s.r[7].n_fork = 1;
    sim_step(&s, NULL);  // 8 tokens
    sim_step(&s, NULL);  // 1 token, logits: fork happens in the sample
    uint64_t child = s.next_fork_id - 1;
    const td_seq *c = td_sched_get(s.sched, child), *par = td_sched_get(s.sched, 7);
    CHECK(c && par && c->blocks[0] == par->blocks[0] && c->blocks[1] == par->blocks[1] &&
              c->blocks[2] != par->blocks[2],
          "child shares 2 full blocks, owns its partial copy");
    if (c && par) CHECK(td_kv_pool_refcount(s.pool, c->blocks[0]) == 2, "shared refcount 2");
    sim_cancel(&s, 7);
    c = td_sched_get(s.sched, child);
    if (c) CHECK(td_kv_pool_refcount(s.pool, c->blocks[0]) == 1, "child holds the last reference");
    sim_run(&s, 100);
    CHECK(s.r[child].finished, "child finished after its parent was cancelled");
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

static void test_fork(void) {
    for (int variant = 0; variant < 2; variant++) {
        sim s;
        td_sched_params p = sp(256, 8, 8, 256);
        if (!sim_init(&s, 16, 64, &p)) return;
        int n_prompt = variant == 0 ? 40 : 32;  // partial last block, or none
        sim_add_gen(&s, 1, 1, n_prompt, 12);
        s.r[1].n_fork = 3;
        td_sched_out o;
        // The engine samples 4 tokens from the prompt's logits: it forks 3 children, then
        // appends a different token to each (sim_step does this at the first sample).
        sim_step(&s, &o);
        CHECK(o.n_entries == 1 && o.entries[0].needs_logits, "prefilled");
        uint64_t kids[3];
        for (int k = 0; k < 3; k++) kids[k] = s.next_fork_id - 3 + (uint64_t)k;
        const td_seq *par = td_sched_get(s.sched, 1);
        int full = n_prompt / 16;
        for (int i = 0; i < full; i++)
            CHECK(td_kv_pool_refcount(s.pool, par->blocks[i]) == 4, "full block %d shared by 4", i);
        if (variant == 0) {
            CHECK(td_kv_pool_refcount(s.pool, par->blocks[2]) == 1,
                  "parent's partial block private");
            for (int k = 0; k < 3; k++) {
                const td_seq *c = td_sched_get(s.sched, kids[k]);
                CHECK(c->n_blocks == 3 && c->blocks[2] != par->blocks[2],
                      "child %d has its own copy", k);
            }
            CHECK(used_blocks(&s) == 2 + 4, "2 shared + 4 partial blocks");
        } else {
            CHECK(used_blocks(&s) == 2, "nothing to copy: 2 shared blocks");
        }
        CHECK(td_sched_check(s.sched, NULL) == TD_OK, "check after fork");
        // The copies were decided by the forks and run at the next step, before its forward.
        sim_step(&s, &o);
        if (variant == 0) {
            CHECK(o.n_copies == 3, "3 block copies handed to the engine (got %d)", o.n_copies);
            for (int k = 0; k < 3; k++) {
                const td_seq *c = td_sched_get(s.sched, kids[k]);
                CHECK(memcmp(td_kv_pool_k(s.pool, c->blocks[2], 0),
                             td_kv_pool_k(s.pool, par->blocks[2], 0), 8 * 2 * sizeof(float)) == 0,
                      "copied K of the 8 filled slots");
                CHECK(memcmp(td_kv_pool_v(s.pool, c->blocks[2], 0),
                             td_kv_pool_v(s.pool, par->blocks[2], 0), 8 * 2 * sizeof(float)) == 0,
                      "copied V");
            }
        } else {
            CHECK(o.n_copies == 0, "no partial block, no copy");
        }
        sim_run(&s, 200);
        for (int k = 0; k < 3; k++) CHECK(s.r[kids[k]].finished, "child %d finished", k);
        CHECK(s.r[1].finished, "parent finished");
        CHECK(s.r[kids[0]].tok[n_prompt] != s.r[kids[1]].tok[n_prompt],
              "children sampled differently");
        CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
        CHECK(sim_pool_whole(&s), "all forks freed: pool whole");
        sim_destroy(&s);
    }
    // No room to run the child (max_seqs 1): it waits, then recomputes from the cache.
    sim s;
    td_sched_params p = sp(64, 1, 8, 256);
    if (!sim_init(&s, 16, 64, &p)) return;
    sim_add_gen(&s, 1, 1, 40, 4);
    s.r[1].n_fork = 1;
    sim_run(&s, 200);
    uint64_t child = s.next_fork_id - 1;
    CHECK(s.r[1].finished && s.r[child].finished, "parent and waiting child finished");
    CHECK(s.r[child].n_tok == 40 + 3, "child has its own tokens");
    td_sched_stats st;
    td_sched_stats_get(s.sched, &st);
    CHECK(st.prefix_hits == 32, "child reused the parent's 2 full blocks: %llu",
          (unsigned long long)st.prefix_hits);
    CHECK(s.errors == 0 && s.check_errors == 0, "fake engine: %d errors", s.errors);
    CHECK(sim_pool_whole(&s), "pool whole");
    sim_destroy(&s);
}

// ---- randomized simulation

typedef struct sim_cfg {
    uint64_t seed;
    int block_size, n_blocks, budget, max_seqs, max_waiting;
    int max_prompt, max_out;  // per request (prompt + out <= max_ctx = their sum)
    int n_requests;
    double p_arrive, p_cancel, p_fork;
    bool prefix_cache, append_last;
    int64_t max_steps;
} sim_cfg;

typedef struct sim_result {
    int64_t steps;
    int finished, cancelled, preempted_finished;
    uint64_t preemptions, hits;
    int budget_violations, order_violations, unfinished;
} sim_result;

static uint64_t rnd(uint64_t *st) {
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    return sim_mix(*st);
}
static double rndf(uint64_t *st) { return (double)(rnd(st) >> 11) / 9007199254740992.0; }

static sim_result random_sim(const sim_cfg *c) {
    sim_result res;
    memset(&res, 0, sizeof res);
    sim s;
    td_sched_params p = sp(c->budget, c->max_seqs, c->max_waiting, c->max_prompt + c->max_out);
    p.enable_prefix_cache = c->prefix_cache;
    if (!sim_init(&s, c->block_size, c->n_blocks, &p)) return res;
    s.append_last = c->append_last;
    uint64_t rng = c->seed;
    // A few shared "system prompts" so that the prefix cache sees real reuse.
    int32_t sys[3][64];
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 64; i++) sys[k][i] = (int32_t)(rnd(&rng) % 50000);
    int next = 0;
    int32_t *pr = malloc(sizeof(int32_t) * (size_t)c->max_prompt);
    uint8_t *preempted = calloc(SIM_MAX_REQ, 1);
    while (s.step < c->max_steps && (next < c->n_requests || sim_n_live(&s) > 0)) {
        // Arrivals (in id order; a full queue defers them, keeping the order).
        while (next < c->n_requests && rndf(&rng) < c->p_arrive) {
            int n = 1 + (int)(rnd(&rng) % (uint64_t)c->max_prompt);
            int out = 1 + (int)(rnd(&rng) % (uint64_t)c->max_out);
            int k = (int)(rnd(&rng) % 4), shared = k < 3 ? (int)(rnd(&rng) % 65) : 0;
            for (int i = 0; i < n; i++)
                pr[i] = i < shared ? sys[k][i] : (int32_t)(rnd(&rng) % 50000);
            s.r[next].n_fork = rndf(&rng) < c->p_fork ? 1 + (int)(rnd(&rng) % 2) : 0;
            int nf = s.r[next].n_fork;
            if (sim_add(&s, (uint64_t)next, pr, n, out) != TD_OK) break;
            s.r[next].n_fork = nf;
            next++;
        }
        // Cancellations of random live sequences in whatever state they are.
        if (rndf(&rng) < c->p_cancel) {
            uint64_t cand = rnd(&rng) % (uint64_t)(next ? next : 1);
            if (rndf(&rng) < 0.3 && s.next_fork_id > SIM_MAX_REQ / 2)  // a forked child
                cand = SIM_MAX_REQ / 2 + rnd(&rng) % (s.next_fork_id - SIM_MAX_REQ / 2);
            if (s.r[cand].live) sim_cancel(&s, cand);
        }
        td_sched_out o;
        sim_step(&s, &o);
        res.budget_violations += o.n_tokens > c->budget || o.n_entries > c->max_seqs;
        for (int i = 0; i < o.n_entries; i++) {
            bool dec = i < o.n_decode;
            res.budget_violations +=
                dec != !o.entries[i].is_prefill || (dec && o.entries[i].n_tokens != 1);
        }
        for (int i = 0; i < o.n_preempted; i++) preempted[o.preempted[i]] = 1;
        res.budget_violations +=
            o.n_preempted > 0 && o.n_admitted > 0;  // no admission after a preemption
    }
    res.steps = s.step;
    for (int i = 1; i < s.n_admit_log; i++)
        res.order_violations += s.admit_log[i] < s.admit_log[i - 1];
    for (uint64_t i = 0; i < SIM_MAX_REQ; i++) {
        if (!s.r[i].used) continue;
        res.finished += s.r[i].finished;
        res.cancelled += s.r[i].cancelled;
        res.unfinished += !s.r[i].finished && !s.r[i].cancelled;
        res.preempted_finished += preempted[i] && s.r[i].finished;
    }
    res.unfinished += c->n_requests - next;
    td_sched_stats st;
    td_sched_stats_get(s.sched, &st);
    res.preemptions = st.n_preemptions;
    res.hits = st.prefix_hits;
    CHECK(s.errors == 0, "seed %llu: fake engine found %d errors", (unsigned long long)c->seed,
          s.errors);
    CHECK(s.check_errors == 0, "seed %llu: %d invariant failures", (unsigned long long)c->seed,
          s.check_errors);
    CHECK(sim_pool_whole(&s), "seed %llu: pool whole at the end (free + evictable == total)",
          (unsigned long long)c->seed);
    free(pr);
    free(preempted);
    sim_destroy(&s);
    return res;
}

static void test_random(void) {
    // Pool barely larger than one request's need: max 48 + 32 = 80 tokens = 20 blocks of 4; 22.
    sim_cfg base = {.seed = 1,
                    .block_size = 4,
                    .n_blocks = 22,
                    .budget = 24,
                    .max_seqs = 6,
                    .max_waiting = 16,
                    .max_prompt = 48,
                    .max_out = 32,
                    .n_requests = 300,
                    .p_arrive = 0.3,
                    .p_cancel = 0.02,
                    .p_fork = 0.1,
                    .prefix_cache = true,
                    .max_steps = 20000};
    uint64_t total_pre = 0, total_hits = 0;
    int64_t total_steps = 0;
    for (int v = 0; v < 6; v++) {
        sim_cfg c = base;
        c.seed = 1000 + (uint64_t)v;
        c.prefix_cache = v != 3;
        c.append_last = v & 1;
        if (v == 4) c.p_cancel = 0, c.p_fork = 0;  // no help from cancellations
        if (v == 5)
            c.n_blocks = 20, c.block_size = 4, c.max_seqs = 8, c.budget = 8;  // exactly one request
        sim_result r = random_sim(&c);
        CHECK(r.unfinished == 0, "seed %llu: %d requests never finished",
              (unsigned long long)c.seed, r.unfinished);
        CHECK(r.budget_violations == 0, "seed %llu: %d budget/order violations",
              (unsigned long long)c.seed, r.budget_violations);
        CHECK(r.order_violations == 0, "seed %llu: %d FCFS violations", (unsigned long long)c.seed,
              r.order_violations);
        CHECK(r.preemptions > 0 && r.preempted_finished > 0,
              "seed %llu: preemptions %llu, preempted+finished %d", (unsigned long long)c.seed,
              (unsigned long long)r.preemptions, r.preempted_finished);
        CHECK(r.finished + r.cancelled >= c.n_requests,
              "seed %llu: %d finished + %d cancelled < %d", (unsigned long long)c.seed, r.finished,
              r.cancelled, c.n_requests);
        total_pre += r.preemptions;
        total_hits += r.hits;
        total_steps += r.steps;
    }
    CHECK(total_hits > 0, "shared system prompts produced cache hits");
    printf("random sims: %lld steps, %llu preemptions, %llu prefix-hit tokens\n",
           (long long)total_steps, (unsigned long long)total_pre, (unsigned long long)total_hits);

    // Random shapes: block sizes 1..16, pools from one request's need to a little more, budgets
    // from max_seqs up. Preemption is not guaranteed here; completion and invariants are.
    uint64_t cfg_rng = 99;
    for (int v = 0; v < 24; v++) {
        sim_cfg c = base;
        c.seed = 5000 + (uint64_t)v;
        c.block_size = 1 + (int)(rnd(&cfg_rng) % 16);
        c.max_prompt = 1 + (int)(rnd(&cfg_rng) % 64);
        c.max_out = 1 + (int)(rnd(&cfg_rng) % 40);
        int need = (c.max_prompt + c.max_out + c.block_size - 1) / c.block_size;
        c.n_blocks = need + (int)(rnd(&cfg_rng) % (uint64_t)(need + 2));
        c.max_seqs = 1 + (int)(rnd(&cfg_rng) % 10);
        c.budget = c.max_seqs + (int)(rnd(&cfg_rng) % 64);
        c.max_waiting = 1 + (int)(rnd(&cfg_rng) % 12);
        c.n_requests = 120;
        c.prefix_cache = rnd(&cfg_rng) % 4 != 0;
        c.append_last = rnd(&cfg_rng) & 1;
        c.p_fork = 0.15;
        sim_result r = random_sim(&c);
        CHECK(r.unfinished == 0 && r.budget_violations == 0 && r.order_violations == 0,
              "shape %d (bs %d, blocks %d, seqs %d, budget %d): unfinished %d, budget %d, order %d", v,
              c.block_size, c.n_blocks, c.max_seqs, c.budget, r.unfinished, r.budget_violations,
              r.order_violations);
        total_steps += r.steps;
    }
    printf("random shapes: %lld steps in all\n", (long long)total_steps);

    // A roomy pool: no preemption at all, big batches.
    sim_cfg roomy = base;
    roomy.seed = 77;
    roomy.n_blocks = 400;
    roomy.budget = 128;
    roomy.max_seqs = 16;
    roomy.p_cancel = 0.01;
    sim_result r = random_sim(&roomy);
    CHECK(r.unfinished == 0 && r.preemptions == 0 && r.budget_violations == 0 &&
              r.order_violations == 0,
          "roomy: unfinished %d, preemptions %llu", r.unfinished,
          (unsigned long long)r.preemptions);
}

int main(void) {
    test_params();
    test_trace_chunking();
    test_long_prompt_chunked();
    test_max_seqs();
    test_trace_preemption();
    test_victim_newest();
    test_fairness();
    test_cancel_states();
    test_fork();
    test_random();
    TEST_DONE();
}
