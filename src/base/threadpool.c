// Persistent thread pool. A forward pass issues a couple of hundred small parallel tasks per
// token, so waking sleeping threads for each (a futex round trip, tens of microseconds) would cost
// more than the work. Workers and the caller therefore spin on an atomic counter for a bounded
// time (TANDEM_POOL_SPIN_NS, default 200 us, like ggml's polling) and only then fall back to a
// condition variable, so an idle pool (a server between requests) sleeps and an oversubscribed
// machine is not burned for long.
//
// Wake-up protocol (no lost wake-ups): a sleeper increments its `sleeping` counter, then re-checks
// the condition, both under the mutex; the publisher stores the new state, then reads `sleeping`
// and, if non-zero, broadcasts under the mutex. All these atomics are sequentially consistent, so
// at least one side sees the other's store.
#include "base/threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define cpu_relax() _mm_pause()
#else
#define cpu_relax() ((void)0)
#endif

struct td_pool {
    int n;
    long spin_ns;
    pthread_t *threads;  // [n - 1]
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    td_task_fn fn;
    void *ctx;
    atomic_ulong generation;   // bumped for every task
    atomic_int pending;        // workers still running the current task
    atomic_int workers_asleep; // workers blocked (or about to block) on `start`
    atomic_int caller_asleep;  // 1 while the caller blocks on `done`
    atomic_int quit;
};

typedef struct {
    td_pool *p;
    int ith;
} worker_arg;

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

// Spins until *gen != seen (or quit) for at most spin_ns; returns 1 if it changed.
static int spin_for_generation(td_pool *p, unsigned long seen) {
    long deadline = 0;
    for (unsigned i = 1;; i++) {
        if (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
            atomic_load_explicit(&p->quit, memory_order_relaxed))
            return 1;
        cpu_relax();
        if ((i & 255) == 0) {  // read the clock rarely: it costs more than a pause
            long t = now_ns();
            if (!deadline) deadline = t + p->spin_ns;
            else if (t >= deadline) return 0;
        }
    }
}

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    td_pool *p = arg->p;
    int ith = arg->ith;
    free(arg);
    unsigned long seen = 0;
    for (;;) {
        if (!spin_for_generation(p, seen)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->workers_asleep, 1);
            while (!atomic_load(&p->quit) && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->start, &p->mu);
            atomic_fetch_sub(&p->workers_asleep, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit)) return NULL;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        p->fn(p->ctx, ith, p->n);  // fn/ctx were published before the generation bump
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

td_pool *td_pool_create(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    td_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = n_threads;
    p->spin_ns = 200000;
    const char *s = getenv("TANDEM_POOL_SPIN_NS");
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end == '\0' && v >= 0)
            p->spin_ns = v;
        else
            TD_LOGW("TANDEM_POOL_SPIN_NS=%s ignored: expected nanoseconds >= 0", s);
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->start, NULL);
    pthread_cond_init(&p->done, NULL);
    p->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!p->threads) {
        free(p);
        return NULL;
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) {
            p->n = i;
            td_pool_free(p);
            return NULL;
        }
        a->p = p;
        a->ith = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
            free(a);
            p->n = i;
            td_pool_free(p);
            return NULL;
        }
    }
    return p;
}

void td_pool_free(td_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, 1);
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->start);
    pthread_cond_destroy(&p->done);
    free(p->threads);
    free(p);
}

int td_pool_size(const td_pool *p) { return p ? p->n : 1; }

void td_pool_run(td_pool *p, td_task_fn fn, void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store(&p->pending, p->n - 1);
    atomic_fetch_add(&p->generation, 1);  // publishes fn, ctx and pending
    if (atomic_load(&p->workers_asleep)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->start);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    long deadline = 0;
    for (unsigned i = 1; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++) {
        cpu_relax();
        if ((i & 255) == 0) {
            long t = now_ns();
            if (!deadline) deadline = t + p->spin_ns;
            else if (t >= deadline) break;
        }
    }
    if (atomic_load(&p->pending) > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, 1);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->done, &p->mu);
        atomic_store(&p->caller_asleep, 0);
        pthread_mutex_unlock(&p->mu);
    }
}
