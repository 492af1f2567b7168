// A persistent pool of worker threads that run one parallel task at a time, split by (ith, nth):
// the caller's thread is worker 0, so a pool of n threads creates n-1 OS threads once, at start-up.
// Not for nesting: a task must not call tp_run on the same pool.
#ifndef TD_BASE_THREADPOOL_H
#define TD_BASE_THREADPOOL_H

typedef struct td_pool td_pool;

// fn is called once per worker with ith in [0, nth); tp_run returns when all have returned.
typedef void (*td_task_fn)(void *ctx, int ith, int nth);

// n_threads <= 0 means the number of online CPUs. Returns NULL on failure.
td_pool *td_pool_create(int n_threads);
void td_pool_free(td_pool *p);
int td_pool_size(const td_pool *p);
// p may be NULL: then fn runs once, inline, with (0, 1).
void td_pool_run(td_pool *p, td_task_fn fn, void *ctx);

// Splits [0, n) evenly: worker ith gets [*lo, *hi).
static inline void td_split(long n, int ith, int nth, long *lo, long *hi) {
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif
