// td_comm and its in-process implementation, one thread per rank. Every collective for 1..4 ranks,
// every element type and reduction, counts 0, 1, 7, 1000 (and a few large enough to be cut into
// chunks), in place and not, blocking and not, against a serial oracle computed here: the
// rank-order reduction in the element type must match bit for bit, and float sums must also lie
// near the double-precision sum. Then determinism under jittered arrival, reduce-scatter +
// all-gather = all-reduce, tagged messages out of order, overlap, deadlines, mismatches, abort
// and a rank leaving. Rank threads cannot use CHECK (not thread-safe): they count failures in
// rank_bad, which the main thread checks after each section. A hang is a failure (alarm).
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "dist/comm.h"
#include "comm_oracle.h"
#include "test_util.h"

#define MAX_RANKS 4

static atomic_int rank_bad;
static pthread_mutex_t print_mu = PTHREAD_MUTEX_INITIALIZER;

#define RCHECK(cond, ...)                                                                  \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            if (atomic_fetch_add(&rank_bad, 1) < 40) {                                     \
                pthread_mutex_lock(&print_mu);                                             \
                fprintf(stderr, "FAIL %s:%d (rank thread): %s: ", __FILE__, __LINE__, #cond); \
                fprintf(stderr, __VA_ARGS__);                                              \
                fputc('\n', stderr);                                                       \
                pthread_mutex_unlock(&print_mu);                                           \
            }                                                                              \
        }                                                                                  \
    } while (0)

// The rank threads of a section failed nowhere.
#define SECTION_DONE(name)                                                                \
    do {                                                                                  \
        int bad_ = atomic_exchange(&rank_bad, 0);                                         \
        CHECK(bad_ == 0, "%s: %d failures in rank threads (above)", (name), bad_);        \
    } while (0)

static void nap_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000 * (time_t)(ms / 1000)) * 1e6)};
    nanosleep(&ts, NULL);
}

// ---- running `size` ranks on threads

typedef void rank_fn(td_comm *c, void *arg, bool *freed);

typedef struct {
    td_comm *c;
    rank_fn *fn;
    void *arg;
    bool freed;  // the rank freed its own communicator
} thr;

static void *thr_main(void *p) {
    thr *t = p;
    t->fn(t->c, t->arg, &t->freed);
    return NULL;
}

// Creates a local communicator of size ranks (deadline timeout_ms), runs fn on one thread per
// rank, joins them and frees what they did not.
static void run_group(int size, int timeout_ms, rank_fn *fn, void *arg) {
    td_comm *comms[MAX_RANKS];
    td_err err = {0};
    td_status st = td_comm_local_create(size, comms, &err);
    CHECK(st == TD_OK, "create %d ranks: %s", size, err.msg);
    if (st) return;
    thr t[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < size; r++) {
        CHECK(td_comm_rank(comms[r]) == r && td_comm_size(comms[r]) == size, "rank %d of %d", r, size);
        td_comm_set_timeout(comms[r], timeout_ms);
        t[r] = (thr){.c = comms[r], .fn = fn, .arg = arg};
        pthread_create(&th[r], NULL, thr_main, &t[r]);
    }
    for (int r = 0; r < size; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < size; r++)
        if (!t[r].freed) td_comm_free(comms[r]);
}

// ---- inputs and the serial oracle: comm_oracle.h

// ---- every collective

typedef struct {
    bool nonblocking;
    const size_t *counts;
    int n_counts;
    unsigned dtypes, ops;  // masks of the element types and reductions to run (0: all)
} coll_cfg;

static td_status do_allreduce(bool nb, td_comm *c, const void *s, void *r, size_t n, td_comm_dtype t, td_comm_op op,
                              td_err *err) {
    if (!nb) return td_comm_allreduce(c, s, r, n, t, op, err);
    td_comm_req *q;
    td_status st = td_comm_iallreduce(c, s, r, n, t, op, &q, err);
    return st ? st : td_comm_wait(q, 0, err);
}
static td_status do_reduce_scatter(bool nb, td_comm *c, const void *s, void *r, size_t n, td_comm_dtype t,
                                   td_comm_op op, td_err *err) {
    if (!nb) return td_comm_reduce_scatter(c, s, r, n, t, op, err);
    td_comm_req *q;
    td_status st = td_comm_ireduce_scatter(c, s, r, n, t, op, &q, err);
    return st ? st : td_comm_wait(q, 0, err);
}
static td_status do_allgather(bool nb, td_comm *c, const void *s, void *r, size_t n, td_comm_dtype t, td_err *err) {
    if (!nb) return td_comm_allgather(c, s, r, n, t, err);
    td_comm_req *q;
    td_status st = td_comm_iallgather(c, s, r, n, t, &q, err);
    return st ? st : td_comm_wait(q, 0, err);
}
static td_status do_broadcast(bool nb, td_comm *c, void *b, size_t n, td_comm_dtype t, int root, td_err *err) {
    if (!nb) return td_comm_broadcast(c, b, n, t, root, err);
    td_comm_req *q;
    td_status st = td_comm_ibroadcast(c, b, n, t, root, &q, err);
    return st ? st : td_comm_wait(q, 0, err);
}

static void collectives_rank(td_comm *c, void *arg, bool *freed) {
    const coll_cfg *cfg = arg;
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    size_t max_count = 0;
    for (int i = 0; i < cfg->n_counts; i++) max_count = cfg->counts[i] > max_count ? cfg->counts[i] : max_count;
    const size_t bytes = (max_count * size + 1) * 8;
    char *send = malloc(bytes), *recv = malloc(bytes);
    uint64_t salt = 1000;
    td_err err = {0};
    for (int ci = 0; ci < cfg->n_counts; ci++) {
        const size_t n = cfg->counts[ci];
        for (int t = 0; t < TD_COMM_DTYPE_N; t++) {
            if (cfg->dtypes && !(cfg->dtypes >> t & 1)) continue;
            const size_t es = ES[t];
            for (int op = 0; op < TD_COMM_OP_N; op++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    if (cfg->ops && !(cfg->ops >> op & 1)) continue;
                    // All-reduce: recv[i] = op over ranks of element i.
                    salt++;
                    fill(t, send, n, rank, 0, salt);
                    memset(recv, 0xab, bytes);
                    void *out = in_place ? send : recv;
                    td_status st = do_allreduce(cfg->nonblocking, c, send, out, n, t, op, &err);
                    RCHECK(st == TD_OK, "allreduce: %s", err.msg);
                    int bad = check_reduced(t, op, size, out, n, 0, salt);
                    RCHECK(bad == 0, "allreduce %s %s x %zu%s on %d ranks: %d bad elements (rank %d)",
                           td_comm_dtype_name(t), td_comm_op_name(op), n, in_place ? " in place" : "", size, bad, rank);
                    if (!in_place)
                        RCHECK((unsigned char)recv[n * es] == 0xab, "allreduce wrote past its count");

                    // Reduce-scatter: block `rank` of the reduction of size blocks.
                    salt++;
                    fill(t, send, n * size, rank, 0, salt);
                    memset(recv, 0xab, bytes);
                    out = in_place ? send + (size_t)rank * n * es : recv;
                    st = do_reduce_scatter(cfg->nonblocking, c, send, out, n, t, op, &err);
                    RCHECK(st == TD_OK, "reduce_scatter: %s", err.msg);
                    bad = check_reduced(t, op, size, out, n, (size_t)rank * n, salt);
                    RCHECK(bad == 0, "reduce_scatter %s %s x %zu%s on %d ranks: %d bad elements (rank %d)",
                           td_comm_dtype_name(t), td_comm_op_name(op), n, in_place ? " in place" : "", size, bad, rank);
                    if (!in_place) RCHECK((unsigned char)recv[n * es] == 0xab, "reduce_scatter wrote past its count");
                }
            for (int in_place = 0; in_place < 2; in_place++) {
                // All-gather: block k is rank k's send.
                salt++;
                memset(recv, 0xab, bytes);
                void *in = in_place ? recv + (size_t)rank * n * es : send;
                fill(t, in, n, rank, 0, salt);
                td_status st = do_allgather(cfg->nonblocking, c, in, recv, n, t, &err);
                RCHECK(st == TD_OK, "allgather: %s", err.msg);
                int bad = 0;
                for (int k = 0; k < size; k++) bad += check_gen(t, recv + (size_t)k * n * es, n, k, 0, salt);
                RCHECK(bad == 0, "allgather %s x %zu%s on %d ranks: %d bad elements (rank %d)", td_comm_dtype_name(t),
                       n, in_place ? " in place" : "", size, bad, rank);
                RCHECK((unsigned char)recv[(size_t)size * n * es] == 0xab, "allgather wrote past its count");

                // Broadcast from the first and the last rank.
                const int root = in_place ? size - 1 : 0;
                salt++;
                memset(recv, 0xcd, bytes);
                if (rank == root) fill(t, recv, n, root, 0, salt);
                st = do_broadcast(cfg->nonblocking, c, recv, n, t, root, &err);
                RCHECK(st == TD_OK, "broadcast: %s", err.msg);
                bad = check_gen(t, recv, n, root, 0, salt);
                RCHECK(bad == 0, "broadcast %s x %zu from %d on %d ranks: %d bad elements (rank %d)",
                       td_comm_dtype_name(t), n, root, size, bad, rank);
                RCHECK((unsigned char)recv[n * es] == 0xcd, "broadcast wrote past its count");
            }
        }
    }
    free(send);
    free(recv);
}

static void test_collectives(void) {
    static const size_t counts[] = {0, 1, 7, 1000};
    for (int size = 1; size <= MAX_RANKS; size++)
        for (int nb = 0; nb < 2; nb++) {
            coll_cfg cfg = {.nonblocking = nb, .counts = counts, .n_counts = 4};
            run_group(size, 5000, collectives_rank, &cfg);
        }
    SECTION_DONE("collectives, counts 0 1 7 1000");
    // Large enough to be cut into chunks that several threads compute (f32: 65536 per chunk, u8:
    // 262144); the all-reduce and broadcast cover 2 to 5 chunks, reduce-scatter and all-gather more.
    static const size_t big[] = {150001};
    coll_cfg cfg = {.nonblocking = false, .counts = big, .n_counts = 1,
                    .dtypes = 1u << TD_COMM_F32 | 1u << TD_COMM_U8, .ops = 1u << TD_COMM_SUM | 1u << TD_COMM_MIN};
    run_group(3, 5000, collectives_rank, &cfg);
    run_group(4, 5000, collectives_rank, &cfg);
    SECTION_DONE("collectives, chunked counts");
}

// ---- NaN and infinities in max/min, integer wrap at the edges

static void special_rank(td_comm *c, void *arg, bool *freed) {
    const int rank = td_comm_rank(c);
    td_err err = {0};
    float x[4] = {1.0f, -INFINITY, 3.0f, 0.0f}, y[4];
    if (rank == 1) x[2] = NAN;
    if (rank == 2) x[1] = INFINITY;
    for (int op = TD_COMM_MAX; op <= TD_COMM_MIN; op++) {
        RCHECK(td_comm_allreduce(c, x, y, 4, TD_COMM_F32, op, &err) == TD_OK, "%s", err.msg);
        RCHECK(isnan(y[2]), "%s: a NaN on rank 1 reaches the result: %g", td_comm_op_name(op), y[2]);
        RCHECK(y[1] == (op == TD_COMM_MAX ? INFINITY : -INFINITY), "%s of infinities: %g", td_comm_op_name(op), y[1]);
    }
    int32_t a = INT32_MAX, b;
    RCHECK(td_comm_allreduce(c, &a, &b, 1, TD_COMM_I32, TD_COMM_SUM, &err) == TD_OK, "%s", err.msg);
    RCHECK(b == (int32_t)(3u * (uint32_t)INT32_MAX), "i32 sum wraps: %d", b);
    uint8_t u = 200, v;
    RCHECK(td_comm_allreduce(c, &u, &v, 1, TD_COMM_U8, TD_COMM_SUM, &err) == TD_OK, "%s", err.msg);
    RCHECK(v == (uint8_t)600, "u8 sum wraps: %d", v);
}

// ---- determinism: the same bits whatever the arrival order

typedef struct {
    int round;
    float out[MAX_RANKS][1000];
} det_arg;

static void determinism_rank(td_comm *c, void *arg, bool *freed) {
    det_arg *a = arg;
    const int rank = td_comm_rank(c);
    float in[1000];
    fill(TD_COMM_F32, in, 1000, rank, 0, 77);
    // Arrive in a different order each round (0 to 3 ms late).
    nap_ms((double)(mix((uint64_t)a->round * 31 + rank) % 4));
    td_err err = {0};
    RCHECK(td_comm_allreduce(c, in, a->out[rank], 1000, TD_COMM_F32, TD_COMM_SUM, &err) == TD_OK, "%s", err.msg);
}

static void test_determinism(void) {
    static det_arg a;
    for (int size = 2; size <= MAX_RANKS; size++) {
        float first[1000], want[1000], reversed[1000];
        for (size_t j = 0; j < 1000; j++) {
            oracle(TD_COMM_F32, TD_COMM_SUM, size, j, 77, &want[j]);
            float acc = 0;
            for (int k = size - 1; k >= 0; k--) {
                float x;
                gen(TD_COMM_F32, k, j, 77, &x);
                acc = k == size - 1 ? x : acc + x;
            }
            reversed[j] = acc;
        }
        // From 3 ranks the inputs are order-sensitive, so a wrong order would show (two ranks'
        // sum is commutative: there only run-to-run and rank-to-rank equality is tested).
        if (size > 2)
            CHECK(memcmp(want, reversed, sizeof want) != 0, "%d ranks: the test data is insensitive to the sum order",
                  size);
        int differ = 0;
        for (int round = 0; round < 20; round++) {
            a.round = round;
            run_group(size, 5000, determinism_rank, &a);
            if (round == 0) memcpy(first, a.out[0], sizeof first);
            for (int r = 0; r < size; r++) differ += memcmp(a.out[r], first, sizeof first) != 0;
        }
        CHECK(differ == 0, "%d ranks: %d of 20 rounds x ranks differ from the first", size, differ);
        CHECK(memcmp(first, want, sizeof want) == 0, "%d ranks: the result is not the rank-order sum", size);
    }
    SECTION_DONE("determinism");
}

// ---- reduce-scatter then all-gather is all-reduce, bit for bit

static void rs_ag_rank(td_comm *c, void *arg, bool *freed) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    static const size_t counts[] = {1, 7, 1000};
    td_err err = {0};
    for (int i = 0; i < 3; i++) {
        const size_t n = counts[i];
        float *in = malloc(n * size * 4), *ar = malloc(n * size * 4), *ag = malloc(n * size * 4);
        float *shard = malloc(n * 4);
        fill(TD_COMM_F32, in, n * size, rank, 0, 5 + i);
        td_status st = td_comm_allreduce(c, in, ar, n * size, TD_COMM_F32, TD_COMM_SUM, &err);
        st = st ? st : td_comm_reduce_scatter(c, in, shard, n, TD_COMM_F32, TD_COMM_SUM, &err);
        st = st ? st : td_comm_allgather(c, shard, ag, n, TD_COMM_F32, &err);
        RCHECK(st == TD_OK, "%s", err.msg);
        RCHECK(memcmp(ar, ag, n * size * 4) == 0, "%d ranks, %zu per rank: all-gather(reduce-scatter) != all-reduce",
               size, n);
        free(in);
        free(ar);
        free(shard);
        free(ag);
    }
}

static void test_rs_ag(void) {
    for (int size = 1; size <= MAX_RANKS; size++) run_group(size, 5000, rs_ag_rank, NULL);
    SECTION_DONE("reduce-scatter + all-gather = all-reduce");
}

// ---- barrier

static atomic_int barrier_arrived;

static void barrier_rank(td_comm *c, void *arg, bool *freed) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    for (int round = 0; round < 20; round++) {
        if ((rank + round) % size == 0) nap_ms(1);  // a late rank each round
        atomic_fetch_add(&barrier_arrived, 1);
        RCHECK(td_comm_barrier(c, &err) == TD_OK, "%s", err.msg);
        int seen = atomic_load(&barrier_arrived);
        RCHECK(seen >= size * (round + 1), "round %d: left the barrier with %d of %d arrived", round, seen,
               size * (round + 1));
        RCHECK(td_comm_barrier(c, &err) == TD_OK, "%s", err.msg);  // nobody runs ahead into the next count
    }
}

static void test_barrier(void) {
    for (int size = 1; size <= MAX_RANKS; size++) {
        atomic_store(&barrier_arrived, 0);
        run_group(size, 5000, barrier_rank, NULL);
    }
    SECTION_DONE("barrier");
}

// ---- messages

static void messages_rank(td_comm *c, void *arg, bool *freed) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    // A ring: receive posted first, then a synchronous send.
    {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        int64_t out[7], in[7];
        fill(TD_COMM_I64, out, 7, rank, 0, 900);
        td_comm_req *q;
        td_status st = td_comm_irecv(c, in, 7, TD_COMM_I64, prev, 3, &q, &err);
        st = st ? st : td_comm_send(c, out, 7, TD_COMM_I64, next, 3, &err);
        st = st ? st : td_comm_wait(q, 0, &err);
        RCHECK(st == TD_OK, "ring: %s", err.msg);
        RCHECK(check_gen(TD_COMM_I64, in, 7, prev, 0, 900) == 0, "ring: rank %d got the wrong data from %d", rank,
               prev);
    }
    if (size < 2) return;
    // Tags received in another order than sent; equal tags in sending order.
    if (rank == 0) {
        float a[5], b[1000], c2[3], d[3];
        fill(TD_COMM_F32, a, 5, 0, 0, 1);
        fill(TD_COMM_F32, b, 1000, 0, 0, 2);
        fill(TD_COMM_F32, c2, 3, 0, 0, 3);
        fill(TD_COMM_F32, d, 3, 0, 0, 4);
        td_comm_req *q[4];
        td_status st = td_comm_isend(c, a, 5, TD_COMM_F32, 1, 10, &q[0], &err);
        st = st ? st : td_comm_isend(c, b, 1000, TD_COMM_F32, 1, 20, &q[1], &err);
        st = st ? st : td_comm_isend(c, c2, 3, TD_COMM_F32, 1, 30, &q[2], &err);
        st = st ? st : td_comm_isend(c, d, 3, TD_COMM_F32, 1, 30, &q[3], &err);
        for (int i = 3; i >= 0 && !st; i--) st = td_comm_wait(q[i], 0, &err);
        RCHECK(st == TD_OK, "tagged sends: %s", err.msg);
    } else if (rank == 1) {
        float a[5], b[1000], c2[3], d[3];
        td_status st = td_comm_recv(c, c2, 3, TD_COMM_F32, 0, 30, &err);
        st = st ? st : td_comm_recv(c, b, 1000, TD_COMM_F32, 0, 20, &err);
        st = st ? st : td_comm_recv(c, d, 3, TD_COMM_F32, 0, 30, &err);
        st = st ? st : td_comm_recv(c, a, 5, TD_COMM_F32, 0, 10, &err);
        RCHECK(st == TD_OK, "tagged receives: %s", err.msg);
        RCHECK(check_gen(TD_COMM_F32, a, 5, 0, 0, 1) == 0 && check_gen(TD_COMM_F32, b, 1000, 0, 0, 2) == 0,
               "tags 10 and 20 received out of order carry the wrong data");
        RCHECK(check_gen(TD_COMM_F32, c2, 3, 0, 0, 3) == 0 && check_gen(TD_COMM_F32, d, 3, 0, 0, 4) == 0,
               "two messages with tag 30 overtook each other");
    }
    // A message to self, and an empty message.
    {
        uint8_t s[10], r[10];
        fill(TD_COMM_U8, s, 10, rank, 0, 55);
        td_comm_req *q;
        td_status st = td_comm_isend(c, s, 10, TD_COMM_U8, rank, 0, &q, &err);
        st = st ? st : td_comm_recv(c, r, 10, TD_COMM_U8, rank, 0, &err);
        st = st ? st : td_comm_wait(q, 0, &err);
        RCHECK(st == TD_OK && memcmp(s, r, 10) == 0, "message to self: %s", err.msg);
        if (rank < 2) {
            st = rank == 0 ? td_comm_send(c, NULL, 0, TD_COMM_F64, 1, 9, &err)
                           : td_comm_recv(c, NULL, 0, TD_COMM_F64, 0, 9, &err);
            RCHECK(st == TD_OK, "empty message: %s", err.msg);
        }
    }
    // Mismatched count: both ends fail, nothing is written, later messages still flow.
    if (rank < 2) {
        int32_t buf[6] = {1, 2, 3, 4, 5, 6}, got[6] = {0};
        td_status st = rank == 0 ? td_comm_send(c, buf, 5, TD_COMM_I32, 1, 4, &err)
                                 : td_comm_recv(c, got, 6, TD_COMM_I32, 0, 4, &err);
        RCHECK(st == TD_ERR_INVALID && strstr(err.msg, "mismatched"), "rank %d: count mismatch: %s (%s)", rank,
               td_status_name(st), err.msg);
        RCHECK(got[0] == 0, "a mismatched receive wrote its buffer");
        st = rank == 0 ? td_comm_send(c, buf, 6, TD_COMM_I32, 1, 4, &err)
                       : td_comm_recv(c, got, 6, TD_COMM_I32, 0, 4, &err);
        RCHECK(st == TD_OK && (rank == 0 || got[5] == 6), "after a mismatch: %s", err.msg);
    }
}

static void test_messages(void) {
    for (int size = 1; size <= MAX_RANKS; size++) run_group(size, 5000, messages_rank, NULL);
    SECTION_DONE("messages");
}

// ---- non-blocking forms overlapped with work, waited in any order

static void overlap_rank(td_comm *c, void *arg, bool *freed) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    enum { N = 1000 };
    float a_in[N], a_out[N], g_in[7], g_out[7 * MAX_RANKS], bc[N], rs_in[N * MAX_RANKS], rs_out[N];
    int64_t msg_out[3], msg_in[3];
    fill(TD_COMM_F32, a_in, N, rank, 0, 11);
    fill(TD_COMM_F32, g_in, 7, rank, 0, 12);
    fill(TD_COMM_F32, rs_in, (size_t)N * size, rank, 0, 14);
    if (rank == 0) fill(TD_COMM_F32, bc, N, 0, 0, 13);
    fill(TD_COMM_I64, msg_out, 3, rank, 0, 15);
    td_comm_req *q[6];
    const int to = (rank + 1) % size, from = (rank + size - 1) % size;
    td_status st = td_comm_iallreduce(c, a_in, a_out, N, TD_COMM_F32, TD_COMM_SUM, &q[0], &err);
    st = st ? st : td_comm_iallgather(c, g_in, g_out, 7, TD_COMM_F32, &q[1], &err);
    st = st ? st : td_comm_ibroadcast(c, bc, N, TD_COMM_F32, 0, &q[2], &err);
    st = st ? st : td_comm_irecv(c, msg_in, 3, TD_COMM_I64, from, 1, &q[3], &err);
    st = st ? st : td_comm_isend(c, msg_out, 3, TD_COMM_I64, to, 1, &q[4], &err);
    st = st ? st : td_comm_ireduce_scatter(c, rs_in, rs_out, N, TD_COMM_F32, TD_COMM_MAX, &q[5], &err);
    RCHECK(st == TD_OK, "posting: %s", err.msg);
    if (st) return;
    // Work while they are in flight, polling the first.
    double work = 0;
    bool done = false;
    for (int i = 1; i <= 200000 && !done; i++) {
        work += sqrt((double)i);
        if (i % 1000 == 0) {
            st = td_comm_test(q[0], &done, &err);
            RCHECK(st == TD_OK, "test: %s", err.msg);
        }
    }
    RCHECK(work > 0, "work");
    if (!done) RCHECK(td_comm_wait(q[0], 0, &err) == TD_OK, "%s", err.msg);
    // Each rank waits in its own order.
    int order[5] = {1, 2, 3, 4, 5};
    for (int i = 0; i < rank; i++) {
        int t = order[0];
        memmove(order, order + 1, 4 * sizeof *order);
        order[4] = t;
    }
    for (int i = 0; i < 5; i++) RCHECK(td_comm_wait(q[order[i]], 0, &err) == TD_OK, "wait %d: %s", order[i], err.msg);
    RCHECK(check_reduced(TD_COMM_F32, TD_COMM_SUM, size, a_out, N, 0, 11) == 0, "overlapped allreduce");
    for (int k = 0; k < size; k++)
        RCHECK(check_gen(TD_COMM_F32, g_out + 7 * k, 7, k, 0, 12) == 0, "overlapped allgather block %d", k);
    RCHECK(check_gen(TD_COMM_F32, bc, N, 0, 0, 13) == 0, "overlapped broadcast");
    RCHECK(check_reduced(TD_COMM_F32, TD_COMM_MAX, size, rs_out, N, (size_t)rank * N, 14) == 0,
           "overlapped reduce_scatter");
    RCHECK(check_gen(TD_COMM_I64, msg_in, 3, from, 0, 15) == 0, "overlapped message");

    // More collectives in flight than the window (16): posting waits for the slowest, no deadlock.
    enum { M = 40 };
    double x[M], y[M];
    td_comm_req *r[M];
    for (int i = 0; i < M; i++) {
        x[i] = rank + i;
        st = td_comm_iallreduce(c, &x[i], &y[i], 1, TD_COMM_F64, TD_COMM_SUM, &r[i], &err);
        RCHECK(st == TD_OK, "post %d: %s", i, err.msg);
        if (st) return;
        if (rank == size - 1 && i % 8 == 0) nap_ms(1);  // one slow rank
    }
    int bad = 0;
    for (int i = M - 1; i >= 0; i--) {
        st = td_comm_wait(r[i], 0, &err);
        bad += st != TD_OK || y[i] != (double)(size * (size - 1) / 2 + size * i);
    }
    RCHECK(bad == 0, "%d of %d collectives in flight wrong (%s)", bad, M, err.msg);
}

static void test_overlap(void) {
    for (int size = 1; size <= MAX_RANKS; size++) run_group(size, 5000, overlap_rank, NULL);
    SECTION_DONE("non-blocking overlap");
    // The request limit: nothing posted beyond it, and freeing releases what is pending.
    td_comm *self;
    td_err err = {0};
    CHECK(td_comm_self_create(&self, &err) == TD_OK, "%s", err.msg);
    int32_t sink[200];
    td_comm_req *q = NULL;
    int posted = 0;
    td_status st = TD_OK;
    for (int i = 0; i < 200 && st == TD_OK; i++) {
        st = td_comm_irecv(self, &sink[i], 1, TD_COMM_I32, 0, 7, &q, &err);
        posted += st == TD_OK;
    }
    CHECK(st == TD_ERR_LIMIT && q == NULL && posted == 128, "request limit: %s after %d (%s)", td_status_name(st),
          posted, err.msg);
    td_comm_free(self);
}

// ---- deadlines

typedef struct {
    td_status st[MAX_RANKS];
    double secs[MAX_RANKS];
    char msg[MAX_RANKS][TD_ERR_MSG_MAX];
    td_status late_st;
    double late_secs;
    char late_msg[TD_ERR_MSG_MAX];
} fail_arg;

// Ranks 0 and 1 all-reduce under a 200 ms deadline; rank 2 never joins in time.
static void timeout_rank(td_comm *c, void *arg, bool *freed) {
    fail_arg *a = arg;
    const int rank = td_comm_rank(c);
    td_err err = {0};
    float x[7] = {0}, y[7];
    if (rank == 2) {
        nap_ms(300);
        double t0 = td_now();
        a->late_st = td_comm_allreduce(c, x, y, 7, TD_COMM_F32, TD_COMM_SUM, &err);
        a->late_secs = td_now() - t0;
        memcpy(a->late_msg, err.msg, sizeof err.msg);
        return;
    }
    double t0 = td_now();
    a->st[rank] = td_comm_allreduce(c, x, y, 7, TD_COMM_F32, TD_COMM_SUM, &err);
    a->secs[rank] = td_now() - t0;
    memcpy(a->msg[rank], err.msg, sizeof err.msg);
}

// Rank 0 waits for a message rank 1 never sends, with a per-wait deadline shorter than the
// communicator's.
static void p2p_timeout_rank(td_comm *c, void *arg, bool *freed) {
    fail_arg *a = arg;
    const int rank = td_comm_rank(c);
    td_err err = {0};
    if (rank == 1) {
        nap_ms(200);
        return;
    }
    int32_t v;
    td_comm_req *q;
    double t0 = td_now();
    a->st[0] = td_comm_irecv(c, &v, 1, TD_COMM_I32, 1, 42, &q, &err);
    if (a->st[0] == TD_OK) a->st[0] = td_comm_wait(q, 100, &err);
    a->secs[0] = td_now() - t0;
    memcpy(a->msg[0], err.msg, sizeof err.msg);
}

// Rank 0 runs more collectives ahead than the window (16) while rank 1 never arrives: the post
// that needs a slot rank 1 still holds fails at the deadline, and the pending requests with it.
static void window_timeout_rank(td_comm *c, void *arg, bool *freed) {
    fail_arg *a = arg;
    td_err err = {0};
    double x[17] = {0}, y[17];
    if (td_comm_rank(c) == 1) {
        nap_ms(200);
        a->late_st = td_comm_barrier(c, &err);
        return;
    }
    td_comm_req *q[17];
    int posted = 0;
    double t0 = td_now();
    td_status st = TD_OK;
    for (; posted < 17 && st == TD_OK; posted++)
        st = td_comm_iallreduce(c, &x[posted], &y[posted], 1, TD_COMM_F64, TD_COMM_SUM, &q[posted], &err);
    a->secs[0] = td_now() - t0;
    a->st[0] = st;
    memcpy(a->msg[0], err.msg, sizeof err.msg);
    a->st[1] = posted == 17 ? TD_OK : TD_ERR_INVALID;  // the 17th is the one that failed
    int pending_failed = 0;
    for (int i = 0; i < 16; i++) pending_failed += td_comm_wait(q[i], 0, &err) == TD_ERR_TIMEOUT;
    a->st[2] = pending_failed == 16 ? TD_OK : TD_ERR_INVALID;
}

static void test_timeouts(void) {
    static fail_arg a;
    memset(&a, 0, sizeof a);
    run_group(3, 200, timeout_rank, &a);
    for (int r = 0; r < 2; r++) {
        CHECK(a.st[r] == TD_ERR_TIMEOUT, "rank %d: %s (%s)", r, td_status_name(a.st[r]), a.msg[r]);
        CHECK(a.secs[r] >= 0.19 && a.secs[r] < 1.5, "rank %d: failed after %.3f s with a 0.2 s deadline", r, a.secs[r]);
        CHECK(strstr(a.msg[r], "rank 2") && strstr(a.msg[r], "allreduce"),
              "rank %d: the message names the missing rank: %s", r, a.msg[r]);
    }
    CHECK(a.late_st == TD_ERR_TIMEOUT && a.late_secs < 0.1 && strstr(a.late_msg, "aborted by rank"),
          "the late rank fails at once: %s after %.3f s (%s)", td_status_name(a.late_st), a.late_secs, a.late_msg);

    memset(&a, 0, sizeof a);
    run_group(2, 5000, p2p_timeout_rank, &a);
    CHECK(a.st[0] == TD_ERR_TIMEOUT && a.secs[0] >= 0.09 && a.secs[0] < 1.0 && strstr(a.msg[0], "rank 1"),
          "per-wait deadline on a receive: %s after %.3f s (%s)", td_status_name(a.st[0]), a.secs[0], a.msg[0]);

    memset(&a, 0, sizeof a);
    run_group(2, 100, window_timeout_rank, &a);
    CHECK(a.st[0] == TD_ERR_TIMEOUT && a.st[1] == TD_OK && a.secs[0] >= 0.09 && a.secs[0] < 1.0 &&
              strstr(a.msg[0], "waits for rank 1"),
          "posting past the window: %s after %.3f s (%s)", td_status_name(a.st[0]), a.secs[0], a.msg[0]);
    CHECK(a.st[2] == TD_OK, "the 16 pending collectives fail with the timeout");
    CHECK(a.late_st == TD_ERR_TIMEOUT, "the rank that never came: %s", td_status_name(a.late_st));
    SECTION_DONE("timeouts");
}

// ---- mismatched collectives

static void mismatch_rank(td_comm *c, void *arg, bool *freed) {
    const int rank = td_comm_rank(c);
    td_err err = {0};
    float in[8], out[8 * MAX_RANKS];
    for (int cs = 0; cs < 5; cs++) {
        fill(TD_COMM_F32, in, 8, rank, 0, 3);
        for (int i = 0; i < 8 * MAX_RANKS; i++) out[i] = -7.0f;
        td_status st;
        const bool odd = rank == 1;  // the rank that differs
        switch (cs) {
        case 0: st = td_comm_allreduce(c, in, out, odd ? 8 : 7, TD_COMM_F32, TD_COMM_SUM, &err); break;
        case 1: st = td_comm_allreduce(c, in, out, 4, odd ? TD_COMM_I32 : TD_COMM_F32, TD_COMM_SUM, &err); break;
        case 2: st = td_comm_allreduce(c, in, out, 4, TD_COMM_F32, odd ? TD_COMM_MAX : TD_COMM_SUM, &err); break;
        case 3:
            st = odd ? td_comm_allgather(c, in, out, 2, TD_COMM_F32, &err)
                     : td_comm_allreduce(c, in, out, 2, TD_COMM_F32, TD_COMM_SUM, &err);
            break;
        default: st = td_comm_broadcast(c, out, 4, TD_COMM_F32, odd ? 2 : 0, &err); break;
        }
        RCHECK(st == TD_ERR_INVALID && strstr(err.msg, "mismatched") && strstr(err.msg, "rank 1"),
               "case %d, rank %d: %s (%s)", cs, rank, td_status_name(st), err.msg);
        RCHECK(out[0] == -7.0f, "case %d: a mismatched collective wrote the receive buffer", cs);
        // Still usable.
        st = td_comm_allreduce(c, in, out, 8, TD_COMM_F32, TD_COMM_SUM, &err);
        RCHECK(st == TD_OK && check_reduced(TD_COMM_F32, TD_COMM_SUM, td_comm_size(c), out, 8, 0, 3) == 0,
               "case %d: after a mismatch: %s", cs, err.msg);
    }
}

static void test_mismatch(void) {
    run_group(3, 2000, mismatch_rank, NULL);
    SECTION_DONE("mismatched collectives");
}

// ---- abort and a rank leaving

typedef struct {
    bool by_free;
    fail_arg f;
    td_status after_st[MAX_RANKS], p2p_st;
} abort_arg;

static void abort_rank(td_comm *c, void *arg, bool *freed) {
    abort_arg *a = arg;
    const int rank = td_comm_rank(c);
    td_err err = {0};
    float x[100] = {0}, y[100];
    if (rank == 2) {
        nap_ms(50);
        if (a->by_free) {
            td_comm_free(c);
            *freed = true;
        } else {
            td_comm_abort(c, "test abort");
            a->after_st[2] = td_comm_barrier(c, &err);
        }
        return;
    }
    td_comm_req *q = NULL;
    if (rank == 1) RCHECK(td_comm_irecv(c, y, 1, TD_COMM_F32, 2, 0, &q, &err) == TD_OK, "%s", err.msg);
    double t0 = td_now();
    a->f.st[rank] = td_comm_allreduce(c, x, y, 100, TD_COMM_F32, TD_COMM_SUM, &err);
    a->f.secs[rank] = td_now() - t0;
    memcpy(a->f.msg[rank], err.msg, sizeof err.msg);
    if (rank == 1) a->p2p_st = td_comm_wait(q, 0, &err);  // a message from the dead rank
    a->after_st[rank] = td_comm_allreduce(c, x, y, 100, TD_COMM_F32, TD_COMM_SUM, &err);
    if (a->by_free) {
        // The survivors still talk to each other.
        int32_t v = 5, w = 0;
        td_comm_req *s;
        td_status st = rank == 0 ? td_comm_isend(c, &v, 1, TD_COMM_I32, 1, 8, &s, &err)
                                 : td_comm_recv(c, &w, 1, TD_COMM_I32, 0, 8, &err);
        if (rank == 0 && st == TD_OK) st = td_comm_wait(s, 0, &err);
        RCHECK(st == TD_OK && (rank == 0 || w == 5), "survivors' message: %s", err.msg);
    }
}

static void test_abort(void) {
    for (int by_free = 0; by_free < 2; by_free++) {
        static abort_arg a;
        memset(&a, 0, sizeof a);
        a.by_free = by_free;
        run_group(3, 10000, abort_rank, &a);  // a deadline far beyond the 50 ms the failure takes
        const char *how = by_free ? "free" : "abort";
        for (int r = 0; r < 2; r++) {
            CHECK(a.f.st[r] == TD_ERR_IO, "%s: rank %d: %s (%s)", how, r, td_status_name(a.f.st[r]), a.f.msg[r]);
            CHECK(a.f.secs[r] < 1.0, "%s: rank %d failed only after %.3f s", how, r, a.f.secs[r]);
            CHECK(strstr(a.f.msg[r], "rank 2") && strstr(a.f.msg[r], by_free ? "left" : "test abort"),
                  "%s: rank %d: the message names rank 2: %s", how, r, a.f.msg[r]);
            CHECK(a.after_st[r] == TD_ERR_IO, "%s: rank %d: a later collective: %s", how, r,
                  td_status_name(a.after_st[r]));
        }
        CHECK(a.p2p_st == TD_ERR_IO, "%s: a pending receive from rank 2: %s", how, td_status_name(a.p2p_st));
        if (!by_free)
            CHECK(a.after_st[2] == TD_ERR_IO, "abort: the aborting rank's later call: %s",
                  td_status_name(a.after_st[2]));
    }
    SECTION_DONE("abort");
}

// ---- argument checks and the self communicator

static void test_arguments(void) {
    td_comm *c;
    td_err err = {0};
    td_comm *many[2];
    CHECK(td_comm_local_create(0, many, &err) == TD_ERR_INVALID, "size 0");
    CHECK(td_comm_self_create(&c, &err) == TD_OK, "%s", err.msg);
    CHECK(td_comm_size(c) == 1 && td_comm_rank(c) == 0 && strcmp(td_comm_name(c), "local") == 0, "self");
    float buf[16] = {1, 2, 3, 4, 5, 6, 7, 8}, out[16];
    td_comm_req *q = (td_comm_req *)&err;  // overwritten with NULL on failure
    CHECK(td_comm_iallreduce(c, NULL, out, 4, TD_COMM_F32, TD_COMM_SUM, &q, &err) == TD_ERR_INVALID && q == NULL,
          "NULL send: %s", err.msg);
    CHECK(td_comm_allreduce(c, buf, buf + 1, 4, TD_COMM_F32, TD_COMM_SUM, &err) == TD_ERR_INVALID, "overlap");
    CHECK(td_comm_allreduce(c, buf, out, 4, (td_comm_dtype)9, TD_COMM_SUM, &err) == TD_ERR_INVALID, "dtype");
    CHECK(td_comm_allreduce(c, buf, out, 4, TD_COMM_F32, (td_comm_op)7, &err) == TD_ERR_INVALID, "op");
    CHECK(td_comm_allreduce(c, (char *)buf + 1, out, 2, TD_COMM_F32, TD_COMM_SUM, &err) == TD_ERR_INVALID,
          "misaligned");
    CHECK(td_comm_allreduce(c, buf, out, SIZE_MAX / 2, TD_COMM_F32, TD_COMM_SUM, &err) == TD_ERR_INVALID, "overflow");
    CHECK(td_comm_broadcast(c, buf, 4, TD_COMM_F32, 1, &err) == TD_ERR_INVALID, "root out of range");
    CHECK(td_comm_send(c, buf, 4, TD_COMM_F32, 0, TD_COMM_TAG_MAX + 1, &err) == TD_ERR_INVALID, "tag");
    CHECK(td_comm_send(c, buf, 4, TD_COMM_F32, -1, 0, &err) == TD_ERR_INVALID, "destination");
    CHECK(td_comm_allgather(c, buf + 1, buf, 2, TD_COMM_F32, &err) == TD_ERR_INVALID, "allgather overlap not in place");
    CHECK(td_comm_wait(NULL, 0, &err) == TD_OK, "waiting for NULL");
    // After all those, the communicator is intact: collectives are copies.
    CHECK(td_comm_allreduce(c, buf, out, 8, TD_COMM_F32, TD_COMM_SUM, &err) == TD_OK && memcmp(buf, out, 32) == 0,
          "self allreduce: %s", err.msg);
    CHECK(td_comm_allgather(c, buf, buf, 8, TD_COMM_F32, &err) == TD_OK && buf[7] == 8, "self allgather in place");
    CHECK(td_comm_reduce_scatter(c, buf, out, 8, TD_COMM_F32, TD_COMM_MIN, &err) == TD_OK && out[3] == 4, "self rs");
    CHECK(td_comm_barrier(c, &err) == TD_OK, "self barrier");
    td_comm_set_timeout(c, 50);
    CHECK(td_comm_timeout(c) == 50, "timeout");
    double t0 = td_now();
    td_status st = td_comm_recv(c, out, 1, TD_COMM_F32, 0, 1, &err);
    CHECK(st == TD_ERR_TIMEOUT && td_now() - t0 < 1.0, "self recv with no send: %s (%s)", td_status_name(st), err.msg);
    CHECK(td_comm_barrier(c, &err) == TD_ERR_TIMEOUT, "after a timeout the communicator stays broken");
    td_comm_free(c);
    td_comm_free(NULL);
}

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "FAIL test_comm: hung\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

// Runs one section, printing its time when TEST_COMM_TIMES is set.
static void section(const char *name, void (*fn)(void)) {
    double t0 = td_now();
    fn();
    if (getenv("TEST_COMM_TIMES")) printf("%-14s %.3f s\n", name, td_now() - t0);
}

static void test_special(void) {
    run_group(3, 5000, special_rank, NULL);
    SECTION_DONE("special values");
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(120);
    section("arguments", test_arguments);
    section("collectives", test_collectives);
    section("special", test_special);
    section("determinism", test_determinism);
    section("rs+ag", test_rs_ag);
    section("barrier", test_barrier);
    section("messages", test_messages);
    section("overlap", test_overlap);
    section("timeouts", test_timeouts);
    section("mismatch", test_mismatch);
    section("abort", test_abort);
    TEST_DONE();
}
