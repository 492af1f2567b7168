// A fake engine for scheduler tests: it drives td_sched_step like the real step loop and plays
// the model with a KV cache whose "key" at position p is a hash of the sequence's tokens [0, p]
// (what real KV depends on). Each forward first verifies that every position the entry attends
// to (0 .. start_pos-1, read through the entry's block table) holds this sequence's value, then
// writes the new positions. So a prefix-cache hit, a fork or a recompute that hands a sequence
// the wrong KV is caught, independently of the scheduler's own bookkeeping.
#ifndef TD_TEST_SCHED_SIM_H
#define TD_TEST_SCHED_SIM_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/kv_pool.h"
#include "engine/sched.h"
#include "test_util.h"

#define SIM_MAX_REQ 8192

typedef struct sim_req {
    bool used, live, finished, cancelled;
    int n_prompt, target_out, n_out, cap;
    int32_t *tok;  // [cap] the test's own copy of the sequence
    uint64_t *ph;  // [cap] ph[p] = hash of tok[0..p]
    int n_tok;
    int64_t add_step, admit_step, finish_step;  // -1 until it happens
    int n_cached_tokens;                        // from the first admission entry
    int n_fork;                                 // children to fork at the first sample
} sim_req;

typedef struct sim {
    td_kv_pool *pool;
    td_sched *sched;
    int bs;
    sim_req *r;  // [SIM_MAX_REQ], indexed by sequence id
    int64_t step;
    int errors;        // KV / token / protocol mismatches found by the fake forward
    int check_errors;  // td_sched_check failures
    bool check_each_step;
    bool append_last;  // append the final sampled token before finishing
    uint64_t next_fork_id;
    uint64_t admit_log[SIM_MAX_REQ];  // ids in order of first admission
    int n_admit_log;
    int max_tokens_seen, max_entries_seen;
} sim;

static inline uint64_t sim_mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

// The "sampled" token of sequence id at position pos: deterministic, differs between ids.
static inline int32_t sim_token(uint64_t id, int pos) {
    return (int32_t)(sim_mix(id * 1000003ULL + (uint64_t)pos) % 50000);
}

// Pool with 1 layer, 1 KV head of 2 floats = 8 bytes per position: one uint64 "key".
static inline bool sim_init(sim *s, int block_size, int n_blocks, const td_sched_params *sp) {
    memset(s, 0, sizeof *s);
    s->r = calloc(SIM_MAX_REQ, sizeof *s->r);
    td_kv_pool_params pp = td_kv_pool_default_params();
    pp.block_size = block_size;
    pp.n_layers = 1;
    pp.n_kv_heads = 1;
    pp.head_dim = 2;
    pp.n_blocks = n_blocks;
    td_err err = {0};
    if (!s->r || td_kv_pool_create(&pp, &s->pool, &err) != TD_OK) {
        CHECK(0, "sim pool: %s", err.msg);
        return false;
    }
    if (td_sched_create(sp, s->pool, &s->sched, &err) != TD_OK) {
        CHECK(0, "sim sched: %s", err.msg);
        return false;
    }
    s->bs = block_size;
    s->check_each_step = true;
    s->next_fork_id = SIM_MAX_REQ / 2;
    return true;
}

static inline void sim_free_req(sim_req *q) {
    free(q->tok);
    free(q->ph);
    q->tok = NULL;
    q->ph = NULL;
}

static inline void sim_destroy(sim *s) {
    td_sched_free(s->sched);
    td_kv_pool_free(s->pool);
    for (int i = 0; i < SIM_MAX_REQ && s->r; i++) sim_free_req(&s->r[i]);
    free(s->r);
}

static inline void sim_push_token(sim_req *q, int32_t t) {
    q->tok[q->n_tok] = t;
    uint64_t prev = q->n_tok ? q->ph[q->n_tok - 1] : 0x1234;
    q->ph[q->n_tok] = sim_mix(prev ^ ((uint64_t)(uint32_t)t * 0x100000001b3ULL));
    q->n_tok++;
}

static inline td_status sim_add(sim *s, uint64_t id, const int32_t *prompt, int n, int target_out) {
    sim_req *q = &s->r[id];
    td_err err = {0};
    td_status st = td_sched_add(s->sched, id, prompt, n, target_out, &err);
    if (st != TD_OK) return st;
    memset(q, 0, sizeof *q);
    q->used = q->live = true;
    q->n_prompt = n;
    q->target_out = target_out;
    q->cap = n + target_out;
    q->tok = malloc(sizeof(int32_t) * (size_t)q->cap);
    q->ph = malloc(sizeof(uint64_t) * (size_t)q->cap);
    for (int i = 0; i < n; i++) sim_push_token(q, prompt[i]);
    q->add_step = s->step;
    q->admit_step = q->finish_step = -1;
    return TD_OK;
}

// Adds a request with tokens sim_token(seed, i), i < n.
static inline td_status sim_add_gen(sim *s, uint64_t id, uint64_t seed, int n, int target_out) {
    int32_t *p = malloc(sizeof(int32_t) * (size_t)n);
    for (int i = 0; i < n; i++) p[i] = sim_token(seed, i);
    td_status st = sim_add(s, id, p, n, target_out);
    free(p);
    return st;
}

static inline uint64_t sim_kv_read(const sim *s, const td_block_table *t, int pos) {
    const float *k = td_kv_pool_k(s->pool, t->ids[pos / s->bs], 0) + (pos % s->bs) * 2;
    uint64_t v;
    memcpy(&v, k, 8);
    return v;
}

static inline void sim_kv_write(sim *s, const td_block_table *t, int pos, uint64_t v) {
    float *k = td_kv_pool_k(s->pool, t->ids[pos / s->bs], 0) + (pos % s->bs) * 2;
    memcpy(k, &v, 8);
}

static inline void sim_error(sim *s, const char *fmt, uint64_t id, int a, int b) {
    if (s->errors++ < 10) {
        fprintf(stderr, "sim step %lld seq %llu: ", (long long)s->step, (unsigned long long)id);
        fprintf(stderr, fmt, a, b);
        fputc('\n', stderr);
    }
}

static inline void sim_cancel(sim *s, uint64_t id) {
    sim_req *q = &s->r[id];
    CHECK(td_sched_cancel(s->sched, id) == TD_OK, "cancel %llu", (unsigned long long)id);
    q->live = false;
    q->cancelled = true;
    q->finish_step = s->step;
}

// Creates a child of `id` as the engine does for n > 1 (fork, then the caller appends).
static inline uint64_t sim_fork(sim *s, uint64_t id) {
    uint64_t cid = s->next_fork_id++;
    sim_req *p = &s->r[id], *c = &s->r[cid];
    td_err err = {0};
    td_status st = td_sched_fork(s->sched, id, cid, &err);
    if (st == TD_ERR_LIMIT)
        return UINT64_MAX;  // no free slot: the engine would serve fewer samples
    CHECK(st == TD_OK, "fork %llu: %s", (unsigned long long)id, err.msg);
    if (st != TD_OK) return UINT64_MAX;
    memset(c, 0, sizeof *c);
    c->used = c->live = true;
    c->n_prompt = p->n_prompt;
    c->target_out = p->target_out;
    c->n_out = p->n_out;
    c->cap = p->cap;
    c->tok = malloc(sizeof(int32_t) * (size_t)c->cap);
    c->ph = malloc(sizeof(uint64_t) * (size_t)c->cap);
    for (int i = 0; i < p->n_tok; i++) sim_push_token(c, p->tok[i]);
    c->add_step = c->admit_step = s->step;
    c->finish_step = -1;
    return cid;
}

// The engine's reaction to a sample for q: finish at its target, else append the token.
static inline void sim_sample(sim *s, uint64_t id) {
    sim_req *q = &s->r[id];
    q->n_out++;
    int32_t t = sim_token(id, q->n_tok);
    if (q->n_out >= q->target_out) {
        if (s->append_last) {
            CHECK(td_sched_append_token(s->sched, id, t, NULL) == TD_OK, "append last");
            sim_push_token(q, t);
        }
        CHECK(td_sched_finish(s->sched, id) == TD_OK, "finish %llu", (unsigned long long)id);
        q->live = false;
        q->finished = true;
        q->finish_step = s->step;
        return;
    }
    td_err err = {0};
    td_status st = td_sched_append_token(s->sched, id, t, &err);
    if (st != TD_OK) sim_error(s, "append failed (%d) %d", id, (int)st, 0);
    sim_push_token(q, t);
}

// One engine step: schedule, verify and run the fake forward, sample. Returns the batch size.
static inline int sim_step(sim *s, td_sched_out *out_copy) {
    td_sched_out out;
    s->step++;
    td_sched_step(s->sched, &out);
    td_kv_pool_run_copies(s->pool, out.copies, out.n_copies);  // as the engine does, first
    if (out_copy) *out_copy = out;
    if (out.n_tokens > s->max_tokens_seen) s->max_tokens_seen = out.n_tokens;
    if (out.n_entries > s->max_entries_seen) s->max_entries_seen = out.n_entries;
    uint64_t to_sample[1024];
    int n_sample = 0;
    for (int i = 0; i < out.n_entries; i++) {
        const td_sched_entry *e = &out.entries[i];
        sim_req *q = &s->r[e->seq_id];
        if (!q->live) {
            sim_error(s, "scheduled but not live %d %d", e->seq_id, 0, 0);
            continue;
        }
        if (q->admit_step < 0) {
            q->admit_step = s->step;
            q->n_cached_tokens = e->n_cached_tokens;
            s->admit_log[s->n_admit_log++] = e->seq_id;
        }
        if (e->start_pos + e->n_tokens > q->n_tok) {
            sim_error(s, "entry reaches %d of %d known tokens", e->seq_id,
                      e->start_pos + e->n_tokens, q->n_tok);
            continue;
        }
        if (e->table.n_tokens != e->start_pos + e->n_tokens ||
            e->table.n_blocks != (e->table.n_tokens + s->bs - 1) / s->bs)
            sim_error(s, "table covers %d tokens in %d blocks", e->seq_id, e->table.n_tokens,
                      e->table.n_blocks);
        for (int j = 0; j < e->n_tokens; j++)
            if (e->tokens[j] != q->tok[e->start_pos + j]) {
                sim_error(s, "token at %d differs (%d)", e->seq_id, e->start_pos + j, e->tokens[j]);
                break;
            }
        for (int p = 0; p < e->start_pos; p++)
            if (sim_kv_read(s, &e->table, p) != q->ph[p]) {
                sim_error(s, "KV at position %d of %d is not this sequence's", e->seq_id, p,
                          e->start_pos);
                break;
            }
        for (int j = 0; j < e->n_tokens; j++)
            sim_kv_write(s, &e->table, e->start_pos + j, q->ph[e->start_pos + j]);
        if (e->needs_logits != (e->start_pos + e->n_tokens == q->n_tok))
            sim_error(s, "needs_logits %d at end %d", e->seq_id, e->needs_logits,
                      e->start_pos + e->n_tokens);
        if (e->needs_logits && n_sample < 1024) to_sample[n_sample++] = e->seq_id;
    }
    for (int i = 0; i < n_sample; i++) {
        uint64_t id = to_sample[i];
        sim_req *q = &s->r[id];
        // n > 1: at the first sample, fork the children, which then sample their own tokens.
        if (q->n_out == 0 && q->n_fork > 0 && q->target_out > 1) {
            for (int k = 0; k < q->n_fork; k++) {
                uint64_t c = sim_fork(s, id);
                if (c != UINT64_MAX) sim_sample(s, c);
            }
        }
        sim_sample(s, id);
    }
    if (s->check_each_step) {
        td_err err = {0};
        if (td_sched_check(s->sched, &err) != TD_OK && s->check_errors++ < 5)
            fprintf(stderr, "step %lld: invariant: %s\n", (long long)s->step, err.msg);
    }
    return out.n_entries;
}

static inline int sim_n_live(const sim *s) {
    td_sched_stats st;
    td_sched_stats_get(s->sched, &st);
    return st.n_running + st.n_waiting;
}

// Steps until no sequence is live (or max_steps). Returns steps taken.
static inline int64_t sim_run(sim *s, int64_t max_steps) {
    int64_t n = 0;
    while (sim_n_live(s) > 0 && n < max_steps) {
        sim_step(s, NULL);
        n++;
    }
    return n;
}

// Pool is whole: nothing referenced, every block free or cached-evictable.
static inline bool sim_pool_whole(const sim *s) {
    td_sched_stats st;
    td_sched_stats_get(s->sched, &st);
    return st.n_blocks_used == 0 && st.n_blocks_free + st.n_blocks_evictable == st.n_blocks;
}

#endif
