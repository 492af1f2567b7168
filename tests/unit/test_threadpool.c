// The thread pool's hand-off between spinning and sleeping: every task runs exactly once per
// worker with the right (ith, nth), its writes are visible to the caller when td_pool_run returns,
// and no wake-up is lost whichever side sleeps. Delays between and inside tasks straddle the spin
// limit (set small through TANDEM_POOL_SPIN_NS) so both the spin and the condition-variable paths and
// the races between them are hit. A lost wake-up hangs: alarm() turns that into a failure.
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/rng.h"
#include "base/threadpool.h"
#include "test_util.h"

#define MAX_T 8

typedef struct {
    int calls[MAX_T];        // written by worker ith only
    int bad_nth;
    long value[MAX_T];       // plain (non-atomic) writes the caller must see
    long round;
    int sleep_ith;           // this worker sleeps sleep_ns inside the task (-1: none)
    long sleep_ns;
} job;

static void nap(long ns) {
    if (ns <= 0) return;
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    nanosleep(&ts, NULL);
}

static void task(void *ctx, int ith, int nth) {
    job *j = ctx;
    if (nth < 1 || nth > MAX_T || ith < 0 || ith >= nth) {
        j->bad_nth = 1;
        return;
    }
    j->calls[ith]++;
    j->value[ith] = j->round * 1000 + ith;
    if (ith == j->sleep_ith) nap(j->sleep_ns);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test_threadpool: hung (a lost wake-up)\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static void run_rounds(int n_threads, const char *spin_ns, int rounds, uint64_t seed) {
    setenv("TANDEM_POOL_SPIN_NS", spin_ns, 1);
    td_pool *p = td_pool_create(n_threads);
    CHECK(p != NULL, "create %d", n_threads);
    if (!p) return;
    CHECK(td_pool_size(p) == n_threads, "size %d", td_pool_size(p));
    td_rng rng;
    td_rng_seed(&rng, seed);
    job j;
    memset(&j, 0, sizeof j);
    int bad_values = 0;
    for (int r = 1; r <= rounds; r++) {
        j.round = r;
        uint32_t u = (uint32_t)td_rng_next(&rng);
        // Delays from 0 to ~4x the spin limit, in and between tasks, on a random worker.
        j.sleep_ith = (u & 3) == 0 ? (int)((u >> 2) % (uint32_t)n_threads) : -1;
        j.sleep_ns = (long)((u >> 8) % 20000);
        td_pool_run(p, task, &j);
        for (int t = 0; t < n_threads; t++)
            if (j.value[t] != r * 1000L + t) bad_values++;
        if ((u >> 28) == 0) nap((long)((u >> 4) % 20000));
    }
    int bad_calls = 0;
    for (int t = 0; t < n_threads; t++) bad_calls += j.calls[t] != rounds;
    CHECK(!j.bad_nth, "(ith, nth) out of range with %d threads", n_threads);
    CHECK(bad_calls == 0, "%d workers not called exactly %d times (spin %s ns)", bad_calls, rounds, spin_ns);
    CHECK(bad_values == 0, "%d stale results seen by the caller (spin %s ns)", bad_values, spin_ns);
    td_pool_free(p);
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(120);

    // NULL and one-thread pools run inline.
    job j;
    memset(&j, 0, sizeof j);
    j.sleep_ith = -1;
    td_pool_run(NULL, task, &j);
    CHECK(j.calls[0] == 1 && !j.bad_nth, "NULL pool runs inline once");
    td_pool *one = td_pool_create(1);
    td_pool_run(one, task, &j);
    CHECK(j.calls[0] == 2 && td_pool_size(one) == 1, "one-thread pool runs inline");
    td_pool_free(one);

    long split_total = 0;
    for (int nth = 1; nth <= 7; nth++)
        for (long n = 0; n < 40; n++) {
            long prev_hi = 0;
            for (int ith = 0; ith < nth; ith++) {
                long lo, hi;
                td_split(n, ith, nth, &lo, &hi);
                if (lo != prev_hi || hi < lo || hi - lo > n / nth + 1) split_total = -1000000;
                prev_hi = hi;
            }
            if (prev_hi != n) split_total = -1000000;
            split_total++;
        }
    CHECK(split_total == 7 * 40, "td_split covers [0, n) in order, evenly");

    // Spin limit 5 us: the random delays cross it constantly (both sleep paths and their races).
    run_rounds(2, "5000", 20000, 1);
    run_rounds(4, "5000", 5000, 2);   // more threads than this machine's cores
    run_rounds(3, "0", 5000, 3);      // never spin
    run_rounds(2, "200000", 20000, 4);  // the default regime: almost always spinning
    // Idle longer than the spin limit, then work: workers must wake from the condition variable.
    setenv("TANDEM_POOL_SPIN_NS", "1000", 1);
    td_pool *p = td_pool_create(2);
    memset(&j, 0, sizeof j);
    j.sleep_ith = -1;
    for (int r = 1; r <= 20; r++) {
        nap(2000000);
        j.round = r;
        td_pool_run(p, task, &j);
    }
    CHECK(j.calls[0] == 20 && j.calls[1] == 20, "wakes after idling: %d %d", j.calls[0], j.calls[1]);
    td_pool_free(p);
    TEST_DONE();
}
