// Persistent thread pool: workers sleep on a condition variable between tasks.
#include "base/threadpool.h"

#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

struct td_pool {
    int n;
    pthread_t *threads;  // [n - 1]
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    td_task_fn fn;
    void *ctx;
    unsigned long generation;  // bumped for every task
    int pending;               // workers still running the current task
    int quit;
};

typedef struct {
    td_pool *p;
    int ith;
} worker_arg;

static void *worker_main(void *arg_) {
    worker_arg *arg = arg_;
    td_pool *p = arg->p;
    int ith = arg->ith;
    free(arg);
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen) pthread_cond_wait(&p->start, &p->mu);
        if (p->quit) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = p->generation;
        td_task_fn fn = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
        pthread_mutex_unlock(&p->mu);
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
    p->quit = 1;
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
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->start);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
