// The in-process communicator: `size` ranks of one process, one thread each, meeting in a shared
// context under one mutex and one condition variable. A collective is a slot that every rank posts
// its buffers into; when the last arrives the work is cut into chunks that the last arrival and
// every rank waiting on it compute outside the lock. Each chunk reads every rank's input in rank
// order, so the bits never depend on who computed it. A message waits in a per-destination queue
// until its partner is posted; whichever of the two comes second copies. Not a transport: nothing
// here crosses a process, and no thread of its own runs (progress happens inside the calls).
//
// Memory: everything (requests, slots, queues) is allocated by td_comm_local_create; an operation
// allocates nothing. Reductions accumulate through a 4 KiB buffer on the computing thread's stack.
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist/comm.h"

enum {
    LOCAL_MAX_SIZE = 1024,
    LOCAL_WINDOW = 16,          // collective slots: how far a rank may run ahead of the slowest
    LOCAL_MAX_REQS = 128,       // pending requests per rank
    CHUNK_BYTES = 256 << 10,    // work unit a helper claims (bytes of output)
    BLOCK_BYTES = 4096,         // reduction accumulator (bytes)
};

enum { R_FREE, R_QUEUED, R_RUNNING, R_DONE };  // request: not in use, waiting for peers, data moving, finished
enum { S_FREE, S_OPEN, S_RUNNING, S_DEAD };    // slot: unused, collecting arrivals, computing, failed

typedef struct lreq lreq;
struct lreq {
    td_comm_req base;   // base.comm: the owner's communicator
    lreq *next, *prev;  // the owner's free list, or a message queue
    td_comm_desc d;
    int owner;          // rank
    int state;          // R_*
    bool coll;          // a collective (in slots[slot] as collective number seq)
    int slot;
    uint64_t seq;
    td_status status;   // R_DONE: the outcome
    char msg[TD_ERR_MSG_MAX];
};

typedef struct {
    lreq *head, *tail;
} lqueue;

typedef struct {
    int state;                 // S_*
    uint64_t seq;              // the collective number it holds
    int arrived;               // ranks posted
    lreq **posts;              // [size]: each rank's request, NULL until it arrives
    // S_RUNNING: the output index space, cut into chunks; fixed while running.
    size_t space, chunk_elems; // elements
    long n_chunks, next_chunk, done_chunks;
} lslot;

typedef struct shared shared;

typedef struct {
    td_comm comm;     // handed out as comms[rank]
    shared *sh;
    int rank;
    bool live;        // not yet freed
    uint64_t coll_seq;  // collectives posted so far
    int n_running;    // own requests whose data is moving (possibly on another thread)
    lreq *free_reqs;
    lqueue sendq;     // unmatched messages to this rank
    lqueue recvq;     // unmatched receives posted by this rank
} lrank;

struct shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;  // broadcast on every state change anyone may wait for
    int size, n_live;
    lrank *ranks;       // [size]
    lreq *reqs;         // [size * LOCAL_MAX_REQS]
    lreq **posts;       // [LOCAL_WINDOW * size]
    lslot slots[LOCAL_WINDOW];
    int left_rank;      // first rank freed, -1 while all live: collectives are impossible after it
    td_status abort_status;  // TD_OK until aborted
    char abort_msg[TD_ERR_MSG_MAX];
};

// ---- small helpers (all called with sh->mu held)

static void q_push(lqueue *q, lreq *r) {
    r->next = NULL;
    r->prev = q->tail;
    if (q->tail) q->tail->next = r;
    else q->head = r;
    q->tail = r;
}

static void q_remove(lqueue *q, lreq *r) {
    if (r->prev) r->prev->next = r->next;
    else q->head = r->next;
    if (r->next) r->next->prev = r->prev;
    else q->tail = r->prev;
    r->next = r->prev = NULL;
}

// The queue a queued message sits in.
static lqueue *queue_of(shared *sh, lreq *r) {
    return r->d.kind == TD_COMM_SEND ? &sh->ranks[r->d.peer].sendq : &sh->ranks[r->owner].recvq;
}

// "allreduce #3 (f32 x 7, sum)", "send to rank 1 (tag 5, u8 x 10)": how messages name an operation.
static void describe(const lreq *r, char *buf, size_t n) {
    const td_comm_desc *d = &r->d;
    const char *k = td_comm_kind_name(d->kind), *t = td_comm_dtype_name(d->dtype);
    switch (d->kind) {
    case TD_COMM_ALLREDUCE:
    case TD_COMM_REDUCE_SCATTER:
        snprintf(buf, n, "%s #%llu (%s x %zu, %s)", k, (unsigned long long)r->seq, t, d->count, td_comm_op_name(d->op));
        break;
    case TD_COMM_ALLGATHER: snprintf(buf, n, "%s #%llu (%s x %zu)", k, (unsigned long long)r->seq, t, d->count); break;
    case TD_COMM_BROADCAST:
        snprintf(buf, n, "%s #%llu (%s x %zu, root %d)", k, (unsigned long long)r->seq, t, d->count, d->peer);
        break;
    case TD_COMM_BARRIER: snprintf(buf, n, "%s #%llu", k, (unsigned long long)r->seq); break;
    case TD_COMM_SEND: snprintf(buf, n, "send to rank %d (tag %d, %s x %zu)", d->peer, d->tag, t, d->count); break;
    case TD_COMM_RECV: snprintf(buf, n, "recv from rank %d (tag %d, %s x %zu)", d->peer, d->tag, t, d->count); break;
    default: snprintf(buf, n, "?"); break;
    }
}

// Finishes r with status and "rank R: <operation>: <why>" (why NULL: status alone).
static void finish(shared *sh, lreq *r, td_status st, const char *why) {
    if (r->state == R_RUNNING) sh->ranks[r->owner].n_running--;
    r->state = R_DONE;
    r->status = st;
    r->msg[0] = 0;
    if (st != TD_OK) {
        char what[160];
        describe(r, what, sizeof what);
        snprintf(r->msg, sizeof r->msg, "rank %d: %s: %.320s", r->owner, what, why ? why : td_status_name(st));
    }
}

static void start_running(shared *sh, lreq *r) {
    r->state = R_RUNNING;
    sh->ranks[r->owner].n_running++;
}

// "rank 2", "ranks 1, 3": the ranks of a collective slot that have not arrived.
static void missing_ranks(const shared *sh, const lslot *s, char *buf, size_t n) {
    int n_missing = 0;
    for (int r = 0; r < sh->size; r++) n_missing += s->posts[r] == NULL;
    size_t len = (size_t)snprintf(buf, n, n_missing == 1 ? "rank" : "ranks");
    for (int r = 0, first = 1; r < sh->size && len < n; r++)
        if (!s->posts[r]) {
            len += (size_t)snprintf(buf + len, n - len, "%s %d", first ? "" : ",", r);
            first = 0;
        }
}

static void deadline_after(struct timespec *ts, int ms) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

static bool passed(const struct timespec *deadline) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > deadline->tv_sec || (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

// Breaks the communicator: every request still waiting for peers fails; data already moving
// finishes. The first abort wins.
static void abort_locked(shared *sh, int by, td_status st, const char *reason) {
    if (sh->abort_status != TD_OK) return;
    sh->abort_status = st;
    snprintf(sh->abort_msg, sizeof sh->abort_msg, "communicator aborted by rank %d: %s", by, reason);
    for (int i = 0; i < LOCAL_WINDOW; i++) {
        lslot *s = &sh->slots[i];
        if (s->state != S_OPEN) continue;
        for (int r = 0; r < sh->size; r++)
            if (s->posts[r]) finish(sh, s->posts[r], st, sh->abort_msg);
        s->state = S_DEAD;
    }
    for (int r = 0; r < sh->size; r++) {
        lqueue *qs[2] = {&sh->ranks[r].sendq, &sh->ranks[r].recvq};
        for (int k = 0; k < 2; k++)
            while (qs[k]->head) {
                lreq *q = qs[k]->head;
                q_remove(qs[k], q);
                finish(sh, q, st, sh->abort_msg);
            }
    }
    pthread_cond_broadcast(&sh->cv);
}

// Why this rank cannot post d now (TD_OK: it can).
static td_status broken(shared *sh, const lrank *me, const td_comm_desc *d, td_err *err) {
    const char *k = td_comm_kind_name(d->kind);
    if (sh->abort_status != TD_OK)
        return td_err_set(err, sh->abort_status, "rank %d: %s: %s", me->rank, k, sh->abort_msg);
    if (d->kind == TD_COMM_SEND || d->kind == TD_COMM_RECV) {
        if (!sh->ranks[d->peer].live)
            return td_err_set(err, TD_ERR_IO, "rank %d: %s: rank %d has left the communicator (td_comm_free)", me->rank,
                              k, d->peer);
    } else if (sh->left_rank >= 0) {
        return td_err_set(err, TD_ERR_IO, "rank %d: %s: rank %d has left the communicator (td_comm_free)", me->rank, k,
                          sh->left_rank);
    }
    return TD_OK;
}

// ---- the arithmetic


#define AT(p, i, es) ((char *)(p) + (size_t)(i) * (es))
#define CAT(p, i, es) ((const char *)(p) + (size_t)(i) * (es))

// Output elements [lo, hi) of a running collective. Reads every input element of a block before
// writing any output, so the in-place layouts (an output over its own rank's input) are safe.
static void run_chunk(const shared *sh, const lslot *s, long c) {
    lreq *const *p = s->posts;
    const td_comm_desc *d = &p[0]->d;
    const int size = sh->size;
    const size_t es = td_comm_dtype_size(d->dtype), blk = BLOCK_BYTES / es, count = d->count;
    const size_t lo = (size_t)c * s->chunk_elems, hi = lo + s->chunk_elems < s->space ? lo + s->chunk_elems : s->space;
    _Alignas(64) unsigned char acc[BLOCK_BYTES];
    size_t i = lo;
    switch (d->kind) {
    case TD_COMM_ALLREDUCE:
        for (; i < hi; i += blk) {
            size_t m = hi - i < blk ? hi - i : blk;
            memcpy(acc, CAT(p[0]->d.send, i, es), m * es);
            for (int k = 1; k < size; k++) td_comm_fold(d->dtype, d->op, acc, CAT(p[k]->d.send, i, es), m);
            for (int k = 0; k < size; k++)
                if (size > 1 || p[k]->d.recv != p[k]->d.send) memcpy(AT(p[k]->d.recv, i, es), acc, m * es);
        }
        break;
    case TD_COMM_REDUCE_SCATTER:
        // Global index i is element i - o * count of rank o's block.
        while (i < hi) {
            size_t o = i / count, end = (o + 1) * count < hi ? (o + 1) * count : hi;
            size_t m = end - i < blk ? end - i : blk;
            memcpy(acc, CAT(p[0]->d.send, i, es), m * es);
            for (int k = 1; k < size; k++) td_comm_fold(d->dtype, d->op, acc, CAT(p[k]->d.send, i, es), m);
            void *dst = AT(p[o]->d.recv, i - o * count, es);
            if (dst != CAT(p[o]->d.send, i, es) || size > 1) memcpy(dst, acc, m * es);
            i += m;
        }
        break;
    case TD_COMM_ALLGATHER:
        while (i < hi) {
            size_t o = i / count, end = (o + 1) * count < hi ? (o + 1) * count : hi;
            const void *src = CAT(p[o]->d.send, i - o * count, es);
            for (int k = 0; k < size; k++) {
                void *dst = AT(p[k]->d.recv, i, es);
                if (dst != src) memcpy(dst, src, (end - i) * es);
            }
            i = end;
        }
        break;
    case TD_COMM_BROADCAST: {
        const void *src = CAT(p[d->peer]->d.send, lo, es);
        for (int k = 0; k < size; k++)
            if (k != d->peer) memcpy(AT(p[k]->d.recv, lo, es), src, (hi - lo) * es);
        break;
    }
    default: TD_ASSERT(0);
    }
}

// ---- collectives

static void slot_complete(shared *sh, lslot *s, td_status st, const char *why) {
    for (int r = 0; r < sh->size; r++) {
        finish(sh, s->posts[r], st, why);
        s->posts[r] = NULL;
    }
    s->state = S_FREE;
    pthread_cond_broadcast(&sh->cv);
}

// Computes unclaimed chunks of a running slot until none is left (drops the lock around each).
static void help(shared *sh, lslot *s) {
    while (s->state == S_RUNNING && s->next_chunk < s->n_chunks) {
        long c = s->next_chunk++;
        pthread_mutex_unlock(&sh->mu);
        run_chunk(sh, s, c);
        pthread_mutex_lock(&sh->mu);
        if (++s->done_chunks == s->n_chunks) slot_complete(sh, s, TD_OK, NULL);
    }
}

static bool same_collective(const td_comm_desc *a, const td_comm_desc *b) {
    if (a->kind != b->kind || a->dtype != b->dtype || a->count != b->count) return false;
    if ((a->kind == TD_COMM_ALLREDUCE || a->kind == TD_COMM_REDUCE_SCATTER) && a->op != b->op) return false;
    return a->kind != TD_COMM_BROADCAST || a->peer == b->peer;
}

// Every rank has arrived: check that they agree, then compute (this thread and any waiter).
static void slot_start(shared *sh, lslot *s) {
    for (int r = 1; r < sh->size; r++)
        if (!same_collective(&s->posts[0]->d, &s->posts[r]->d)) {
            char a[160], b[160], why[TD_ERR_MSG_MAX];
            describe(s->posts[0], a, sizeof a);
            describe(s->posts[r], b, sizeof b);
            snprintf(why, sizeof why, "mismatched collective: rank 0 called %s, rank %d called %s", a, r, b);
            slot_complete(sh, s, TD_ERR_INVALID, why);
            return;
        }
    const td_comm_desc *d = &s->posts[0]->d;
    const size_t es = td_comm_dtype_size(d->dtype);
    s->space = d->kind == TD_COMM_REDUCE_SCATTER || d->kind == TD_COMM_ALLGATHER ? d->count * (size_t)sh->size
               : d->kind == TD_COMM_BARRIER                                    ? 0
                                                                               : d->count;
    s->chunk_elems = CHUNK_BYTES / es;
    s->n_chunks = (long)((s->space + s->chunk_elems - 1) / s->chunk_elems);
    s->next_chunk = s->done_chunks = 0;
    if (s->n_chunks == 0) {
        slot_complete(sh, s, TD_OK, NULL);
        return;
    }
    for (int r = 0; r < sh->size; r++) start_running(sh, s->posts[r]);
    s->state = S_RUNNING;
    pthread_cond_broadcast(&sh->cv);  // waiters help
    help(sh, s);
}

static td_status post_collective(shared *sh, lrank *me, lreq *q, td_err *err) {
    const uint64_t n = me->coll_seq;
    const int idx = (int)(n % LOCAL_WINDOW);
    lslot *s = &sh->slots[idx];
    struct timespec deadline;
    deadline_after(&deadline, me->comm.timeout_ms);
    q->coll = true;
    q->slot = idx;
    q->seq = n;
    // The slot may still hold collective n - WINDOW, which a slow rank has not reached.
    for (;;) {
        td_status st = broken(sh, me, &q->d, err);  // again after every wait
        if (st) return st;
        if (s->state == S_FREE || (s->state == S_OPEN && s->seq == n)) break;
        if (s->state == S_RUNNING) {
            if (s->next_chunk < s->n_chunks) help(sh, s);
            else pthread_cond_wait(&sh->cv, &sh->mu);
            continue;
        }
        if (passed(&deadline)) {
            char who[128], why[TD_ERR_MSG_MAX];
            missing_ranks(sh, s, who, sizeof who);
            snprintf(why, sizeof why,
                     "timed out after %d ms: %d collectives ahead, collective #%llu still waits for %s",
                     me->comm.timeout_ms, LOCAL_WINDOW, (unsigned long long)s->seq, who);
            abort_locked(sh, me->rank, TD_ERR_TIMEOUT, why);
            char what[160];
            describe(q, what, sizeof what);
            return td_err_set(err, TD_ERR_TIMEOUT, "rank %d: %s: %s", me->rank, what, why);
        }
        pthread_cond_timedwait(&sh->cv, &sh->mu, &deadline);
    }
    if (s->state == S_FREE) {
        s->state = S_OPEN;
        s->seq = n;
        s->arrived = 0;
    }
    s->posts[me->rank] = q;
    me->coll_seq++;
    if (++s->arrived == sh->size) slot_start(sh, s);
    return TD_OK;
}

// ---- messages

// s (a send) meets r (its receive): check they agree, then copy on this thread.
static void match(shared *sh, lreq *s, lreq *r) {
    if (s->d.dtype != r->d.dtype || s->d.count != r->d.count) {
        char why[TD_ERR_MSG_MAX];
        snprintf(why, sizeof why, "mismatched message (tag %d): rank %d sends %s x %zu, rank %d receives %s x %zu",
                 s->d.tag, s->owner, td_comm_dtype_name(s->d.dtype), s->d.count, r->owner,
                 td_comm_dtype_name(r->d.dtype), r->d.count);
        finish(sh, s, TD_ERR_INVALID, why);
        finish(sh, r, TD_ERR_INVALID, why);
        pthread_cond_broadcast(&sh->cv);
        return;
    }
    if (s->d.count) {
        start_running(sh, s);
        start_running(sh, r);
        pthread_mutex_unlock(&sh->mu);
        memmove(r->d.recv, s->d.send, s->d.count * td_comm_dtype_size(s->d.dtype));
        pthread_mutex_lock(&sh->mu);
    }
    finish(sh, s, TD_OK, NULL);
    finish(sh, r, TD_OK, NULL);
    pthread_cond_broadcast(&sh->cv);
}

static void post_message(shared *sh, lrank *me, lreq *q) {
    q->coll = false;
    q->seq = 0;
    lqueue *look = q->d.kind == TD_COMM_SEND ? &sh->ranks[q->d.peer].recvq : &me->sendq;
    lreq *m = look->head;
    if (q->d.kind == TD_COMM_SEND) {
        while (m && !(m->d.peer == me->rank && m->d.tag == q->d.tag)) m = m->next;
    } else {
        while (m && !(m->owner == q->d.peer && m->d.tag == q->d.tag)) m = m->next;
    }
    if (!m) {
        q_push(queue_of(sh, q), q);
        return;
    }
    q_remove(look, m);
    if (q->d.kind == TD_COMM_SEND) match(sh, q, m);
    else match(sh, m, q);
}

// ---- the table

static td_status local_post(void *ctx, const td_comm_desc *d, td_comm_req **out, td_err *err) {
    lrank *me = ctx;
    shared *sh = me->sh;
    pthread_mutex_lock(&sh->mu);
    td_status st = broken(sh, me, d, err);
    lreq *q = me->free_reqs;
    if (!st && !q)
        st = td_err_set(err, TD_ERR_LIMIT, "rank %d: %s: %d requests already pending", me->rank,
                        td_comm_kind_name(d->kind), LOCAL_MAX_REQS);
    if (st) {
        pthread_mutex_unlock(&sh->mu);
        return st;
    }
    me->free_reqs = q->next;
    q->next = q->prev = NULL;
    q->d = *d;
    q->state = R_QUEUED;
    q->status = TD_OK;
    q->msg[0] = 0;
    if (d->kind == TD_COMM_SEND || d->kind == TD_COMM_RECV) {
        post_message(sh, me, q);
    } else if ((st = post_collective(sh, me, q, err)) != TD_OK) {
        q->state = R_FREE;
        q->next = me->free_reqs;
        me->free_reqs = q;
        pthread_mutex_unlock(&sh->mu);
        return st;
    }
    pthread_mutex_unlock(&sh->mu);
    *out = &q->base;
    return TD_OK;
}

static td_status release(lrank *me, lreq *q, td_err *err) {
    td_status st = q->status;
    if (st) td_err_set(err, st, "%s", q->msg);
    q->state = R_FREE;
    q->next = me->free_reqs;
    me->free_reqs = q;
    return st;
}

static td_status local_wait(void *ctx, td_comm_req *req, int timeout_ms, td_err *err) {
    lrank *me = ctx;
    shared *sh = me->sh;
    lreq *q = (lreq *)req;
    pthread_mutex_lock(&sh->mu);
    TD_ASSERT(req->comm == &me->comm && q->state != R_FREE);  // a released request is a caller's bug
    struct timespec deadline;
    deadline_after(&deadline, timeout_ms);
    while (q->state != R_DONE) {
        if (q->state == R_RUNNING) {
            // Every peer has arrived: help or wait for the data, whatever the deadline.
            lslot *s = &sh->slots[q->slot];
            if (q->coll && s->next_chunk < s->n_chunks) help(sh, s);
            else pthread_cond_wait(&sh->cv, &sh->mu);
            continue;
        }
        if (passed(&deadline)) {
            char who[128], why[TD_ERR_MSG_MAX], what[160];
            if (q->coll) missing_ranks(sh, &sh->slots[q->slot], who, sizeof who);
            else snprintf(who, sizeof who, "rank %d", q->d.peer);
            describe(q, what, sizeof what);
            snprintf(why, sizeof why, "timed out after %d ms in %s waiting for %s", timeout_ms, what, who);
            abort_locked(sh, me->rank, TD_ERR_TIMEOUT, why);
            if (q->state == R_DONE && q->status == TD_ERR_TIMEOUT) {
                snprintf(why, sizeof why, "timed out after %d ms waiting for %s", timeout_ms, who);
                finish(sh, q, TD_ERR_TIMEOUT, why);
            }
            continue;  // q was failed by the abort (ours or an earlier one)
        }
        int rc = pthread_cond_timedwait(&sh->cv, &sh->mu, &deadline);
        TD_ASSERT(rc == 0 || rc == ETIMEDOUT);
    }
    td_status st = release(me, q, err);
    pthread_mutex_unlock(&sh->mu);
    return st;
}

static td_status local_test(void *ctx, td_comm_req *req, bool *done, td_err *err) {
    lrank *me = ctx;
    shared *sh = me->sh;
    lreq *q = (lreq *)req;
    pthread_mutex_lock(&sh->mu);
    TD_ASSERT(req->comm == &me->comm && q->state != R_FREE);  // a released request is a caller's bug
    *done = q->state == R_DONE;
    td_status st = *done ? release(me, q, err) : TD_OK;
    pthread_mutex_unlock(&sh->mu);
    return st;
}

static void local_abort(void *ctx, td_status status, const char *reason) {
    lrank *me = ctx;
    pthread_mutex_lock(&me->sh->mu);
    abort_locked(me->sh, me->rank, status, reason);
    pthread_mutex_unlock(&me->sh->mu);
}

static void shared_destroy(shared *sh) {
    pthread_mutex_destroy(&sh->mu);
    pthread_cond_destroy(&sh->cv);
    free(sh->ranks);
    free(sh->reqs);
    free(sh->posts);
    free(sh);
}

static void local_free(void *ctx) {
    lrank *me = ctx;
    shared *sh = me->sh;
    pthread_mutex_lock(&sh->mu);
    TD_ASSERT(me->live);
    me->live = false;
    if (sh->abort_status == TD_OK) {
        char why[128];
        snprintf(why, sizeof why, "rank %d has left the communicator (td_comm_free)", me->rank);
        if (sh->left_rank < 0) sh->left_rank = me->rank;
        // Collectives collecting arrivals can never complete now.
        for (int i = 0; i < LOCAL_WINDOW; i++) {
            lslot *s = &sh->slots[i];
            if (s->state != S_OPEN) continue;
            for (int r = 0; r < sh->size; r++)
                if (s->posts[r]) finish(sh, s->posts[r], TD_ERR_IO, why);
            s->state = S_DEAD;
        }
        // Messages to or from this rank: peers' fail, ours are dropped.
        for (int r = 0; r < sh->size; r++) {
            lqueue *qs[2] = {&sh->ranks[r].sendq, &sh->ranks[r].recvq};
            for (int k = 0; k < 2; k++)
                for (lreq *q = qs[k]->head, *next; q; q = next) {
                    next = q->next;
                    if (q->owner != me->rank && q->d.peer != me->rank) continue;
                    q_remove(qs[k], q);
                    finish(sh, q, TD_ERR_IO, why);
                }
        }
        pthread_cond_broadcast(&sh->cv);
    }
    // Data moving into or out of this rank's buffers finishes before they are given back.
    while (me->n_running > 0) pthread_cond_wait(&sh->cv, &sh->mu);
    bool last = --sh->n_live == 0;
    pthread_mutex_unlock(&sh->mu);
    if (last) shared_destroy(sh);
}

static const td_comm_iface LOCAL_IFACE = {
    .name = "local",
    .post = local_post,    // collectives: join the slot, the last arrival computes; messages: match or queue
    .wait = local_wait,    // help compute, or sleep on the condition variable until done or the deadline
    .test = local_test,    // looks, never blocks
    .abort = local_abort,  // fails every request still waiting for peers
    .free = local_free,    // leaves the group (peers that need this rank fail)
};

td_status td_comm_local_create(int size, td_comm **comms, td_err *err) {
    if (size < 1 || size > LOCAL_MAX_SIZE)
        return td_err_set(err, TD_ERR_INVALID, "local communicator: size %d is outside 1..%d", size, LOCAL_MAX_SIZE);
    for (int r = 0; r < size; r++) comms[r] = NULL;
    shared *sh = calloc(1, sizeof *sh);
    if (sh) {
        sh->ranks = calloc((size_t)size, sizeof *sh->ranks);
        sh->reqs = calloc((size_t)size * LOCAL_MAX_REQS, sizeof *sh->reqs);
        sh->posts = calloc((size_t)size * LOCAL_WINDOW, sizeof *sh->posts);
    }
    if (!sh || !sh->ranks || !sh->reqs || !sh->posts) {
        if (sh) {
            free(sh->ranks);
            free(sh->reqs);
            free(sh->posts);
            free(sh);
        }
        return td_err_set(err, TD_ERR_NOMEM, "local communicator: out of memory for %d ranks", size);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);  // deadlines ignore wall-clock jumps
    pthread_cond_init(&sh->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&sh->mu, NULL);
    sh->size = sh->n_live = size;
    sh->left_rank = -1;
    for (int i = 0; i < LOCAL_WINDOW; i++) sh->slots[i].posts = sh->posts + (size_t)i * size;
    for (int r = 0; r < size; r++) {
        lrank *me = &sh->ranks[r];
        me->comm = (td_comm){.iface = &LOCAL_IFACE, .ctx = me, .rank = r, .size = size,
                             .timeout_ms = TD_COMM_DEFAULT_TIMEOUT_MS};
        me->sh = sh;
        me->rank = r;
        me->live = true;
        for (int i = LOCAL_MAX_REQS - 1; i >= 0; i--) {
            lreq *q = &sh->reqs[(size_t)r * LOCAL_MAX_REQS + i];
            q->base.comm = &me->comm;
            q->owner = r;
            q->next = me->free_reqs;
            me->free_reqs = q;
        }
        comms[r] = &me->comm;
    }
    return TD_OK;
}

td_status td_comm_self_create(td_comm **out, td_err *err) { return td_comm_local_create(1, out, err); }
