// Benchmark of the scheduler's decision cost alone (no model): a serving-like load of 256
// concurrent sequences with shared prefixes over a bookkeeping-only pool. Prints one JSON line:
// microseconds per td_sched_step (with the engine's appends and finishes), steps, tokens.
// Usage: bench_sched [n_requests=4000] [n_blocks=16384] (a smaller pool forces preemptions).
// Not a test; numbers depend on the machine.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/log.h"
#include "engine/kv_pool.h"
#include "engine/sched.h"

static uint64_t rng_state = 42;
static uint64_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    uint64_t x = rng_state;
    x ^= x >> 31;
    x *= 0x94d049bb133111ebULL;
    return x ^ (x >> 29);
}

int main(int argc, char **argv) {
    int n_requests = argc > 1 ? atoi(argv[1]) : 4000;
    td_kv_pool_params pp = td_kv_pool_default_params();
    pp.alloc_data = false;
    pp.n_blocks = argc > 2 ? atoi(argv[2]) : 16384;  // default: 262144 tokens of KV
    td_kv_pool *pool;
    td_err err = {0};
    if (td_kv_pool_create(&pp, &pool, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;
    td_sched_params sp = td_sched_default_params();
    sp.max_seqs = 256;
    sp.max_batched_tokens = 8192;
    sp.max_waiting = 4096;
    sp.max_ctx = 8192;
    td_sched *s;
    if (td_sched_create(&sp, pool, &s, &err) != TD_OK) return fprintf(stderr, "%s\n", err.msg), 1;

    int32_t sys[4][1024], prompt[4096];
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < 1024; i++) sys[k][i] = (int32_t)(rnd() % 100000);
    int *target = calloc((size_t)n_requests, sizeof(int)), *done = calloc((size_t)n_requests, sizeof(int));
    int next = 0, finished = 0;
    uint64_t steps = 0, tokens = 0;
    double t_sched = 0;
    while (finished < n_requests) {
        while (next < n_requests) {  // keep the waiting queue fed
            int n = 256 + (int)(rnd() % 1792), k = (int)(rnd() % 4), shared = (int)(rnd() % 1024);
            for (int i = 0; i < n; i++) prompt[i] = i < shared ? sys[k][i] : (int32_t)(rnd() % 100000);
            target[next] = 64 + (int)(rnd() % 448);
            if (td_sched_add(s, (uint64_t)next, prompt, n, target[next], NULL) != TD_OK) break;
            next++;
        }
        td_sched_out out;
        double t0 = td_now();
        td_sched_step(s, &out);
        t_sched += td_now() - t0;
        steps++;
        tokens += (uint64_t)out.n_tokens;
        for (int i = 0; i < out.n_entries; i++) {
            if (!out.entries[i].needs_logits) continue;
            uint64_t id = out.entries[i].seq_id;
            t0 = td_now();
            if (++done[id] >= target[id]) {
                td_sched_finish(s, id);
                finished++;
            } else {
                td_sched_append_token(s, id, (int32_t)(rnd() % 100000), NULL);
            }
            t_sched += td_now() - t0;
        }
    }
    td_sched_stats st;
    td_sched_stats_get(s, &st);
    printf("{\"bench\":\"sched_step\",\"requests\":%d,\"blocks\":%d,\"steps\":%llu,\"tokens\":%llu,"
           "\"us_per_step\":%.2f,\"ns_per_token\":%.1f,\"preemptions\":%llu,"
           "\"prefix_hit_rate\":%.3f}\n",
           n_requests, pp.n_blocks, (unsigned long long)steps, (unsigned long long)tokens, 1e6 * t_sched / (double)steps,
           1e9 * t_sched / (double)tokens, (unsigned long long)st.n_preemptions,
           st.prefix_queries ? (double)st.prefix_hits / (double)st.prefix_queries : 0.0);
    td_sched_free(s);
    td_kv_pool_free(pool);
    free(target);
    free(done);
    return 0;
}
