// td_comm over MPI (comm_mpi.c). Run by ctest as one process, this starts itself under mpirun
// (-np 2, 3 and 4; `--worker all`), where every rank runs the cases below on fresh communicators:
// every collective, element type and reduction, in place and not, blocking and not, bit for bit
// against the serial rank-order oracle; all-reduce and reduce-scatter bit for bit against
// comm_local (this process runs the same operation on `size` threads) on adversarial floats whose
// sum depends on the order; messages (tags out of order, to self, empty, mismatched); overlap;
// mismatched collectives; the request limit; deadlines (a rank skips a collective); abort and a
// rank leaving, and a rank leaving right after a collective the others are still finishing (it
// must not fail them). Then a job of 3 where one rank is SIGKILLed mid-collective (`--worker kill`): the
// survivors must fail or be ended by mpirun within a bound, never hang. Every mpirun runs under
// an outer deadline (its process group is killed at it). Exits 77 (skipped) when built without MPI
// or when mpirun is not on PATH.
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "dist/comm.h"
#include "dist/world.h"
#include "test_util.h"

#ifdef TANDEM_HAVE_MPI
#include <mpi.h>

#include "dist/comm_mpi.h"

#define MAX_RANKS 8

// OpenMPI unloads its components (dlclose) in MPI_Finalize, so LeakSanitizer reports what they
// keep for the life of the process from "<unknown module>", which tests/lsan.supp cannot name.
// This executable keeps every shared object loaded instead: its dlclose wins over libc's.
int dlclose(void *handle);
int dlclose(void *handle) {
    (void)handle;
    return 0;
}

static int g_rank = -1;

// CHECK with the rank in front (ranks are processes: their lines interleave through mpirun).
#define RCHECK(cond, ...)                                                                  \
    do {                                                                                   \
        if (cond) {                                                                        \
            td_test_passed++;                                                              \
        } else {                                                                           \
            td_test_failed++;                                                              \
            fprintf(stderr, "FAIL rank %d %s:%d: %s: ", g_rank, __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                                  \
            fputc('\n', stderr);                                                           \
        }                                                                                  \
    } while (0)

static void nap_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000 * (time_t)(ms / 1000)) * 1e6)};
    nanosleep(&ts, NULL);
}

// A fresh MPI communicator of every process, deadline timeout_ms.
static td_comm *fresh(int timeout_ms) {
    td_comm *c = NULL;
    td_err err = {0};
    td_status st = td_comm_mpi_create(&c, &err);
    RCHECK(st == TD_OK, "td_comm_mpi_create: %s", err.msg);
    if (st) return NULL;
    td_comm_set_timeout(c, timeout_ms);
    return c;
}

// ---- inputs and the serial oracle (as test_comm.c)

#include "comm_oracle.h"  // mix, gen, fill, oracle, check_reduced, check_gen

// ---- every collective

// qp, not *qp: the i-call that fills it is another argument of the same call.
static td_status finish_nb(td_status st, td_comm_req **qp, bool poll, td_err *err) {
    if (st) return st;
    td_comm_req *q = *qp;
    if (!poll) return td_comm_wait(q, 0, err);
    bool done = false;
    for (int i = 0; i < 1000000 && !done; i++) {
        st = td_comm_test(q, &done, err);
        if (st) return st;
        if (!done) nap_ms(0.02);
    }
    return done ? TD_OK : td_comm_wait(q, 0, err);
}

// nb: 0 blocking, 1 non-blocking + wait, 2 non-blocking + test polling.
static void test_collectives(td_comm *c, int nb, const size_t *counts, int n_counts) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    size_t max_count = 0;
    for (int i = 0; i < n_counts; i++) max_count = counts[i] > max_count ? counts[i] : max_count;
    const size_t bytes = (max_count * size + 1) * 8;
    char *send = malloc(bytes), *recv = malloc(bytes);
    uint64_t salt = 1000 + 97 * (uint64_t)nb;
    td_err err = {0};
    td_comm_req *q;
    for (int ci = 0; ci < n_counts; ci++) {
        const size_t n = counts[ci];
        for (int t = 0; t < TD_COMM_DTYPE_N; t++) {
            const size_t es = ES[t];
            for (int op = 0; op < TD_COMM_OP_N; op++)
                for (int in_place = 0; in_place < 2; in_place++) {
                    salt++;
                    fill(t, send, n, rank, 0, salt);
                    memset(recv, 0xab, bytes);
                    void *out = in_place ? send : recv;
                    td_status st = nb ? finish_nb(td_comm_iallreduce(c, send, out, n, t, op, &q, &err), &q, nb == 2, &err)
                                      : td_comm_allreduce(c, send, out, n, t, op, &err);
                    RCHECK(st == TD_OK, "allreduce: %s", err.msg);
                    int bad = check_reduced(t, op, size, out, n, 0, salt);
                    RCHECK(bad == 0, "allreduce %s %s x %zu%s nb %d: %d bad elements", td_comm_dtype_name(t),
                           td_comm_op_name(op), n, in_place ? " in place" : "", nb, bad);
                    if (!in_place) RCHECK((unsigned char)recv[n * es] == 0xab, "allreduce wrote past its count");

                    salt++;
                    fill(t, send, n * size, rank, 0, salt);
                    memset(recv, 0xab, bytes);
                    out = in_place ? send + (size_t)rank * n * es : recv;
                    st = nb ? finish_nb(td_comm_ireduce_scatter(c, send, out, n, t, op, &q, &err), &q, nb == 2, &err)
                            : td_comm_reduce_scatter(c, send, out, n, t, op, &err);
                    RCHECK(st == TD_OK, "reduce_scatter: %s", err.msg);
                    bad = check_reduced(t, op, size, out, n, (size_t)rank * n, salt);
                    RCHECK(bad == 0, "reduce_scatter %s %s x %zu%s nb %d: %d bad elements", td_comm_dtype_name(t),
                           td_comm_op_name(op), n, in_place ? " in place" : "", nb, bad);
                    if (!in_place) RCHECK((unsigned char)recv[n * es] == 0xab, "reduce_scatter wrote past its count");
                }
            for (int in_place = 0; in_place < 2; in_place++) {
                salt++;
                memset(recv, 0xab, bytes);
                void *in = in_place ? recv + (size_t)rank * n * es : send;
                fill(t, in, n, rank, 0, salt);
                td_status st = nb ? finish_nb(td_comm_iallgather(c, in, recv, n, t, &q, &err), &q, nb == 2, &err)
                                  : td_comm_allgather(c, in, recv, n, t, &err);
                RCHECK(st == TD_OK, "allgather: %s", err.msg);
                int bad = 0;
                for (int k = 0; k < size; k++) bad += check_gen(t, recv + (size_t)k * n * es, n, k, 0, salt);
                RCHECK(bad == 0, "allgather %s x %zu%s: %d bad elements", td_comm_dtype_name(t), n,
                       in_place ? " in place" : "", bad);
                RCHECK((unsigned char)recv[(size_t)size * n * es] == 0xab, "allgather wrote past its count");

                const int root = in_place ? size - 1 : 0;
                salt++;
                memset(recv, 0xcd, bytes);
                if (rank == root) fill(t, recv, n, root, 0, salt);
                st = nb ? finish_nb(td_comm_ibroadcast(c, recv, n, t, root, &q, &err), &q, nb == 2, &err)
                        : td_comm_broadcast(c, recv, n, t, root, &err);
                RCHECK(st == TD_OK, "broadcast: %s", err.msg);
                bad = check_gen(t, recv, n, root, 0, salt);
                RCHECK(bad == 0, "broadcast %s x %zu from %d: %d bad elements", td_comm_dtype_name(t), n, root, bad);
                RCHECK((unsigned char)recv[n * es] == 0xcd, "broadcast wrote past its count");
            }
        }
    }
    free(send);
    free(recv);
}

// ---- bit for bit against comm_local on adversarial floats

typedef struct {
    td_comm *c;
    td_comm_kind kind;
    td_comm_dtype t;
    size_t n;  // all-reduce: elements; reduce-scatter: per rank
    uint64_t salt;
    void *out;
    td_status st;
} local_job;

static void *local_rank(void *p) {
    local_job *j = p;
    const int k = td_comm_rank(j->c), size = td_comm_size(j->c);
    const size_t n_in = j->kind == TD_COMM_ALLREDUCE ? j->n : j->n * size;
    void *in = malloc(n_in * ES[j->t] + 8);
    fill_w(j->t, in, n_in, k, 0, j->salt, true);
    td_err err = {0};
    j->st = j->kind == TD_COMM_ALLREDUCE ? td_comm_allreduce(j->c, in, j->out, j->n, j->t, TD_COMM_SUM, &err)
                                         : td_comm_reduce_scatter(j->c, in, j->out, j->n, j->t, TD_COMM_SUM, &err);
    free(in);
    return NULL;
}

// What comm_local gives rank `me` for the same operation on the same inputs (size threads here).
static td_status local_result(int size, int me, td_comm_kind kind, td_comm_dtype t, size_t n, uint64_t salt,
                              void *out) {
    td_comm *comms[MAX_RANKS];
    td_err err = {0};
    if (td_comm_local_create(size, comms, &err)) return TD_ERR_IO;
    local_job jobs[MAX_RANKS];
    pthread_t th[MAX_RANKS];
    const size_t n_out = n;  // all-reduce: n; reduce-scatter: n per rank
    void *outs[MAX_RANKS] = {0};
    for (int k = 0; k < size; k++) {
        outs[k] = malloc(n_out * ES[t] + 8);
        jobs[k] = (local_job){.c = comms[k], .kind = kind, .t = t, .n = n, .salt = salt, .out = outs[k]};
        pthread_create(&th[k], NULL, local_rank, &jobs[k]);
    }
    td_status st = TD_OK;
    for (int k = 0; k < size; k++) {
        pthread_join(th[k], NULL);
        if (jobs[k].st) st = jobs[k].st;
        td_comm_free(comms[k]);
    }
    memcpy(out, outs[me], n_out * ES[t]);
    for (int k = 0; k < size; k++) free(outs[k]);
    return st;
}

static void test_vs_local(td_comm *c) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    const size_t n = 1003;  // not a multiple of any size: uneven all-reduce blocks
    td_err err = {0};
    for (int t = TD_COMM_F32; t <= TD_COMM_F64; t++)
        for (int kind = TD_COMM_ALLREDUCE; kind <= TD_COMM_REDUCE_SCATTER; kind++) {
            const uint64_t salt = 4242 + 10 * t + kind;
            const size_t n_in = kind == TD_COMM_ALLREDUCE ? n : n * size;
            void *in = malloc(n_in * ES[t]), *got = malloc(n * ES[t]), *want = malloc(n * ES[t]);
            fill_w(t, in, n_in, rank, 0, salt, true);
            td_status st = kind == TD_COMM_ALLREDUCE ? td_comm_allreduce(c, in, got, n, t, TD_COMM_SUM, &err)
                                                     : td_comm_reduce_scatter(c, in, got, n, t, TD_COMM_SUM, &err);
            RCHECK(st == TD_OK, "%s: %s", td_comm_kind_name(kind), err.msg);
            RCHECK(local_result(size, rank, kind, t, n, salt, want) == TD_OK, "comm_local failed");
            int differ = 0, order_matters = 0;
            const size_t j0 = kind == TD_COMM_ALLREDUCE ? 0 : (size_t)rank * n;
            for (size_t i = 0; i < n; i++) {
                differ += memcmp((char *)got + i * ES[t], (char *)want + i * ES[t], ES[t]) != 0;
                // The same terms summed from the last rank down.
                double xs[MAX_RANKS] = {0};
                for (int k = 0; k < size; k++) {
                    union { float f; double d; } x;
                    gen_w(t, k, j0 + i, salt, true, &x);
                    xs[k] = t == TD_COMM_F32 ? x.f : x.d;
                }
                if (t == TD_COMM_F32) {
                    float f = (float)xs[size - 1];
                    for (int k = size - 2; k >= 0; k--) f += (float)xs[k];
                    order_matters += memcmp(&f, (char *)want + i * 4, 4) != 0;
                } else {
                    double d = xs[size - 1];
                    for (int k = size - 2; k >= 0; k--) d += xs[k];
                    order_matters += memcmp(&d, (char *)want + i * 8, 8) != 0;
                }
            }
            RCHECK(differ == 0, "%s %s x %zu: %d elements differ from comm_local's", td_comm_kind_name(kind),
                   td_comm_dtype_name(t), n, differ);
            // Two terms commute; from three on, the reversed order must change at least a tenth of
            // the elements (3 ranks: about 27% of f32 sums, 15% of f64), or the data could not tell
            // the orders apart.
            if (size >= 3)
                RCHECK(order_matters > (int)n / 10, "%s %s: only %d of %zu elements depend on the order",
                       td_comm_kind_name(kind), td_comm_dtype_name(t), order_matters, n);
            if (rank == 0 && kind == TD_COMM_ALLREDUCE)
                printf("vs comm_local: %d ranks, %s: bit-identical; %d of %zu elements differ in reversed order\n",
                       size, td_comm_dtype_name(t), order_matters, n);
            free(in);
            free(got);
            free(want);
        }
    // For the record: MPI's own MPI_Allreduce on the same data (its order is its own).
    float *in = malloc(n * 4), *mine = malloc(n * 4), *theirs = malloc(n * 4);
    fill_w(TD_COMM_F32, in, n, rank, 0, 99, true);
    td_status st = td_comm_allreduce(c, in, mine, n, TD_COMM_F32, TD_COMM_SUM, &err);
    RCHECK(st == TD_OK, "%s", err.msg);
    MPI_Allreduce(in, theirs, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    int differ = 0;
    for (size_t i = 0; i < n; i++) differ += memcmp(&mine[i], &theirs[i], 4) != 0;
    if (rank == 0) printf("MPI_Allreduce itself, %d ranks: %d of %zu f32 sums differ from rank order\n", size, differ, n);
    free(in);
    free(mine);
    free(theirs);
}

// ---- NaN and infinities in max/min, integer wrap; rs + ag = ar

static void test_special(td_comm *c) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    float x[4] = {1.0f, -INFINITY, 3.0f, 0.0f}, y[4];
    if (rank == 1) x[2] = NAN;
    if (rank == size - 1) x[1] = INFINITY;
    for (int op = TD_COMM_MAX; op <= TD_COMM_MIN; op++) {
        RCHECK(td_comm_allreduce(c, x, y, 4, TD_COMM_F32, op, &err) == TD_OK, "%s", err.msg);
        RCHECK(isnan(y[2]), "%s: a NaN on rank 1 reaches the result: %g", td_comm_op_name(op), y[2]);
        RCHECK(y[1] == (op == TD_COMM_MAX ? INFINITY : -INFINITY), "%s of infinities: %g", td_comm_op_name(op), y[1]);
    }
    int32_t a = INT32_MAX, b;
    RCHECK(td_comm_allreduce(c, &a, &b, 1, TD_COMM_I32, TD_COMM_SUM, &err) == TD_OK, "%s", err.msg);
    RCHECK(b == (int32_t)((uint32_t)size * (uint32_t)INT32_MAX), "i32 sum wraps: %d", b);
    uint8_t u = 200, v;
    RCHECK(td_comm_allreduce(c, &u, &v, 1, TD_COMM_U8, TD_COMM_SUM, &err) == TD_OK, "%s", err.msg);
    RCHECK(v == (uint8_t)(200 * size), "u8 sum wraps: %d", v);

    static const size_t counts[] = {1, 7, 1000};
    for (int i = 0; i < 3; i++) {
        const size_t n = counts[i];
        float *in = malloc(n * size * 4), *ar = malloc(n * size * 4), *ag = malloc(n * size * 4), *shard = malloc(n * 4);
        fill(TD_COMM_F32, in, n * size, rank, 0, 5 + i);
        td_status st = td_comm_allreduce(c, in, ar, n * size, TD_COMM_F32, TD_COMM_SUM, &err);
        st = st ? st : td_comm_reduce_scatter(c, in, shard, n, TD_COMM_F32, TD_COMM_SUM, &err);
        st = st ? st : td_comm_allgather(c, shard, ag, n, TD_COMM_F32, &err);
        RCHECK(st == TD_OK, "%s", err.msg);
        RCHECK(memcmp(ar, ag, n * size * 4) == 0, "%zu per rank: all-gather(reduce-scatter) != all-reduce", n);
        free(in);
        free(ar);
        free(ag);
        free(shard);
    }
}

// ---- barrier: nobody leaves before the last has arrived (one host: CLOCK_MONOTONIC is shared)

static void test_barrier(td_comm *c) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    enum { ROUNDS = 4 };
    double t[ROUNDS][2], all[MAX_RANKS * ROUNDS * 2];
    for (int r = 0; r < ROUNDS; r++) {
        if (rank == r % size) nap_ms(20);  // a late rank each round
        t[r][0] = td_now();
        RCHECK(td_comm_barrier(c, &err) == TD_OK, "%s", err.msg);
        t[r][1] = td_now();
    }
    RCHECK(td_comm_allgather(c, t, all, ROUNDS * 2, TD_COMM_F64, &err) == TD_OK, "%s", err.msg);
    for (int r = 0; r < ROUNDS; r++) {
        double last_in = 0, first_out = 1e300;
        for (int k = 0; k < size; k++) {
            last_in = fmax(last_in, all[(k * ROUNDS + r) * 2]);
            first_out = fmin(first_out, all[(k * ROUNDS + r) * 2 + 1]);
        }
        RCHECK(first_out >= last_in, "round %d: a rank left the barrier %.6f s before the last arrived", r,
               last_in - first_out);
    }
}

// ---- messages

static void test_messages(td_comm *c) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    {
        const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
        int64_t out[7], in[7];
        fill(TD_COMM_I64, out, 7, rank, 0, 900);
        td_comm_req *q;
        td_status st = td_comm_irecv(c, in, 7, TD_COMM_I64, prev, 3, &q, &err);
        st = st ? st : td_comm_send(c, out, 7, TD_COMM_I64, next, 3, &err);
        st = st ? st : td_comm_wait(q, 0, &err);
        RCHECK(st == TD_OK, "ring: %s", err.msg);
        RCHECK(check_gen(TD_COMM_I64, in, 7, prev, 0, 900) == 0, "ring: wrong data from %d", prev);
    }
    // Tags received in another order than sent; equal tags in sending order; a large one.
    enum { BIG = 300000 };
    float *big = malloc(BIG * 4);
    if (rank == 0) {
        float a[5], c2[3], d[3];
        fill(TD_COMM_F32, a, 5, 0, 0, 1);
        fill(TD_COMM_F32, big, BIG, 0, 0, 2);
        fill(TD_COMM_F32, c2, 3, 0, 0, 3);
        fill(TD_COMM_F32, d, 3, 0, 0, 4);
        td_comm_req *q[4];
        td_status st = td_comm_isend(c, a, 5, TD_COMM_F32, 1, 10, &q[0], &err);
        st = st ? st : td_comm_isend(c, big, BIG, TD_COMM_F32, 1, 20, &q[1], &err);
        st = st ? st : td_comm_isend(c, c2, 3, TD_COMM_F32, 1, 30, &q[2], &err);
        st = st ? st : td_comm_isend(c, d, 3, TD_COMM_F32, 1, 30, &q[3], &err);
        for (int i = 3; i >= 0 && !st; i--) st = td_comm_wait(q[i], 0, &err);
        RCHECK(st == TD_OK, "tagged sends: %s", err.msg);
    } else if (rank == 1) {
        float a[5], c2[3], d[3];
        td_status st = td_comm_recv(c, c2, 3, TD_COMM_F32, 0, 30, &err);
        st = st ? st : td_comm_recv(c, big, BIG, TD_COMM_F32, 0, 20, &err);
        st = st ? st : td_comm_recv(c, d, 3, TD_COMM_F32, 0, 30, &err);
        st = st ? st : td_comm_recv(c, a, 5, TD_COMM_F32, 0, 10, &err);
        RCHECK(st == TD_OK, "tagged receives: %s", err.msg);
        RCHECK(check_gen(TD_COMM_F32, a, 5, 0, 0, 1) == 0 && check_gen(TD_COMM_F32, big, BIG, 0, 0, 2) == 0,
               "tags 10 and 20 received out of order carry the wrong data");
        RCHECK(check_gen(TD_COMM_F32, c2, 3, 0, 0, 3) == 0 && check_gen(TD_COMM_F32, d, 3, 0, 0, 4) == 0,
               "two messages with tag 30 overtook each other");
    }
    free(big);
    // To self, and empty.
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
    // Mismatched count, then type: both ends fail, nothing is written, later messages flow.
    if (rank < 2)
        for (int cs = 0; cs < 2; cs++) {
            int32_t buf[6] = {1, 2, 3, 4, 5, 6}, got[6] = {0};
            td_status st = rank == 0 ? td_comm_send(c, buf, cs ? 6 : 5, TD_COMM_I32, 1, 4, &err)
                                     : td_comm_recv(c, got, 6, cs ? TD_COMM_F32 : TD_COMM_I32, 0, 4, &err);
            RCHECK(st == TD_ERR_INVALID && strstr(err.msg, "mismatched"), "case %d: %s (%s)", cs, td_status_name(st),
                   err.msg);
            RCHECK(got[0] == 0, "a mismatched receive wrote its buffer");
            st = rank == 0 ? td_comm_send(c, buf, 6, TD_COMM_I32, 1, 4, &err)
                           : td_comm_recv(c, got, 6, TD_COMM_I32, 0, 4, &err);
            RCHECK(st == TD_OK && (rank == 0 || got[5] == 6), "after a mismatch: %s", err.msg);
        }
    // td_comm_send is synchronous: it returns only once the receive (posted 50 ms late) has the data.
    if (rank < 2) {
        int32_t v = 77, w = 0;
        double t0 = td_now();
        if (rank == 1) nap_ms(50);
        td_status st = rank == 0 ? td_comm_send(c, &v, 1, TD_COMM_I32, 1, 5, &err)
                                 : td_comm_recv(c, &w, 1, TD_COMM_I32, 0, 5, &err);
        RCHECK(st == TD_OK && (rank == 0 ? td_now() - t0 > 0.04 : w == 77), "synchronous send: %.3f s (%s)",
               td_now() - t0, err.msg);
    }
}

// ---- non-blocking forms overlapped with work, waited in any order

static void test_overlap(td_comm *c) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    enum { N = 1000 };
    static float a_in[N], a_out[N], g_in[7], g_out[7 * MAX_RANKS], bc[N], rs_in[N * MAX_RANKS], rs_out[N];
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
    double work = 0;
    bool done = false;
    for (int i = 1; i <= 2000000 && !done; i++) {
        work += sqrt((double)i);
        if (i % 1000 == 0) RCHECK(td_comm_test(q[0], &done, &err) == TD_OK, "test: %s", err.msg);
    }
    RCHECK(work > 0, "work");
    if (!done) RCHECK(td_comm_wait(q[0], 0, &err) == TD_OK, "%s", err.msg);
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

    // Many collectives in flight, one slow rank, waited newest first.
    enum { M = 40 };
    double x[M], y[M];
    td_comm_req *r[M];
    for (int i = 0; i < M; i++) {
        x[i] = rank + i;
        st = td_comm_iallreduce(c, &x[i], &y[i], 1, TD_COMM_F64, TD_COMM_SUM, &r[i], &err);
        RCHECK(st == TD_OK, "post %d: %s", i, err.msg);
        if (st) return;
        if (rank == size - 1 && i % 8 == 0) nap_ms(1);
    }
    int bad = 0;
    for (int i = M - 1; i >= 0; i--) {
        st = td_comm_wait(r[i], 0, &err);
        bad += st != TD_OK || y[i] != (double)(size * (size - 1) / 2 + size * i);
    }
    RCHECK(bad == 0, "%d of %d collectives in flight wrong (%s)", bad, M, err.msg);
}

// ---- mismatched collectives

static void test_mismatch(td_comm *c) {
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    td_err err = {0};
    float in[8], out[8 * MAX_RANKS];
    for (int cs = 0; cs < 5; cs++) {
        fill(TD_COMM_F32, in, 8, rank, 0, 3);
        for (int i = 0; i < 8 * MAX_RANKS; i++) out[i] = -7.0f;
        td_status st;
        const bool odd = rank == 1;
        switch (cs) {
        case 0: st = td_comm_allreduce(c, in, out, odd ? 8 : 7, TD_COMM_F32, TD_COMM_SUM, &err); break;
        case 1: st = td_comm_allreduce(c, in, out, 4, odd ? TD_COMM_I32 : TD_COMM_F32, TD_COMM_SUM, &err); break;
        case 2: st = td_comm_allreduce(c, in, out, 4, TD_COMM_F32, odd ? TD_COMM_MAX : TD_COMM_SUM, &err); break;
        case 3:
            st = odd ? td_comm_allgather(c, in, out, 2, TD_COMM_F32, &err)
                     : td_comm_allreduce(c, in, out, 2, TD_COMM_F32, TD_COMM_SUM, &err);
            break;
        default: st = td_comm_broadcast(c, out, 4, TD_COMM_F32, odd ? size - 1 : 0, &err); break;
        }
        RCHECK(st == TD_ERR_INVALID && strstr(err.msg, "mismatched") && strstr(err.msg, "rank 1"), "case %d: %s (%s)",
               cs, td_status_name(st), err.msg);
        RCHECK(out[0] == -7.0f, "case %d: a mismatched collective wrote the receive buffer", cs);
        st = td_comm_allreduce(c, in, out, 8, TD_COMM_F32, TD_COMM_SUM, &err);
        RCHECK(st == TD_OK && check_reduced(TD_COMM_F32, TD_COMM_SUM, size, out, 8, 0, 3) == 0,
               "case %d: after a mismatch: %s", cs, err.msg);
    }
}

// ---- the request limit (nothing posted beyond it; freeing releases what is pending)

static void test_limit(void) {
    td_comm *c = fresh(5000);
    if (!c) return;
    td_err err = {0};
    int32_t sink[200];
    td_comm_req *q = NULL;
    int posted = 0;
    td_status st = TD_OK;
    for (int i = 0; i < 200 && st == TD_OK; i++) {
        st = td_comm_irecv(c, &sink[i], 1, TD_COMM_I32, td_comm_rank(c), 7, &q, &err);
        posted += st == TD_OK;
    }
    RCHECK(st == TD_ERR_LIMIT && q == NULL && posted == 128, "request limit: %s after %d (%s)", td_status_name(st),
           posted, err.msg);
    td_comm_free(c);
}

// ---- deadlines

// The last rank skips an all-reduce (arrives 600 ms late) under a 300 ms deadline.
static void test_timeout(void) {
    td_comm *c = fresh(300);
    if (!c) return;
    const int rank = td_comm_rank(c), size = td_comm_size(c), late = size - 1;
    td_err err = {0};
    float x[7] = {0}, y[7];
    double t0;
    if (rank == late) {
        nap_ms(600);
        t0 = td_now();
        td_status st = td_comm_allreduce(c, x, y, 7, TD_COMM_F32, TD_COMM_SUM, &err);
        double secs = td_now() - t0;
        RCHECK(st == TD_ERR_TIMEOUT && secs < 0.1 && strstr(err.msg, "aborted by rank"),
               "the late rank fails at once: %s after %.3f s (%s)", td_status_name(st), secs, err.msg);
    } else {
        t0 = td_now();
        td_status st = td_comm_allreduce(c, x, y, 7, TD_COMM_F32, TD_COMM_SUM, &err);
        double secs = td_now() - t0;
        char want[32];
        snprintf(want, sizeof want, "rank %d", late);
        RCHECK(st == TD_ERR_TIMEOUT, "%s (%s)", td_status_name(st), err.msg);
        RCHECK(secs >= 0.29 && secs < 2.0, "failed after %.3f s with a 0.3 s deadline", secs);
        RCHECK(strstr(err.msg, want) && strstr(err.msg, "allreduce"), "the message names %s: %s", want, err.msg);
        if (rank == 0) printf("timeout: rank 0 failed after %.3f s (deadline 0.3 s): %s\n", secs, err.msg);
        st = td_comm_barrier(c, &err);
        RCHECK(st == TD_ERR_TIMEOUT, "after a timeout the communicator stays broken: %s", td_status_name(st));
    }
    td_comm_free(c);

    // A per-wait deadline on a receive that rank 1 never sends.
    c = fresh(5000);
    if (!c) return;
    if (rank == 0) {
        int32_t v;
        td_comm_req *q;
        t0 = td_now();
        td_status st = td_comm_irecv(c, &v, 1, TD_COMM_I32, 1, 42, &q, &err);
        if (st == TD_OK) st = td_comm_wait(q, 100, &err);
        double secs = td_now() - t0;
        RCHECK(st == TD_ERR_TIMEOUT && secs >= 0.09 && secs < 1.0 && strstr(err.msg, "rank 1"),
               "per-wait deadline on a receive: %s after %.3f s (%s)", td_status_name(st), secs, err.msg);
    } else {
        nap_ms(300);
        t0 = td_now();
        td_status st = td_comm_barrier(c, &err);
        RCHECK(st == TD_ERR_TIMEOUT && td_now() - t0 < 0.1 && strstr(err.msg, "aborted by rank 0"),
               "rank 0's timeout reaches the others: %s (%s)", td_status_name(st), err.msg);
    }
    td_comm_free(c);
}

// ---- abort and a rank leaving

// world: where everyone meets before the survivors free (a survivor's own departure would
// otherwise race the quitter's in the others' messages).
static void test_abort(td_comm *world, bool by_free) {
    td_comm *c = fresh(10000);  // far beyond the 50 ms the failure takes
    if (!c) return;
    const int rank = td_comm_rank(c), size = td_comm_size(c), quitter = size - 1;
    const char *how = by_free ? "free" : "abort";
    td_err err = {0};
    float x[100] = {0}, y[100];
    if (rank == quitter) {
        nap_ms(50);
        if (by_free) {
            td_comm_free(c);
            RCHECK(td_comm_barrier(world, &err) == TD_OK, "%s", err.msg);
            return;
        }
        td_comm_abort(c, "test abort");
        RCHECK(td_comm_barrier(c, &err) == TD_ERR_IO, "abort: the aborting rank's later call: %s", err.msg);
        RCHECK(td_comm_barrier(world, &err) == TD_OK, "%s", err.msg);
        td_comm_free(c);
        return;
    }
    td_comm_req *q = NULL;
    if (rank == 0) RCHECK(td_comm_irecv(c, y, 1, TD_COMM_F32, quitter, 0, &q, &err) == TD_OK, "%s", err.msg);
    double t0 = td_now();
    td_status st = td_comm_allreduce(c, x, y, 100, TD_COMM_F32, TD_COMM_SUM, &err);
    double secs = td_now() - t0;
    char want[32];
    snprintf(want, sizeof want, "rank %d", quitter);
    RCHECK(st == TD_ERR_IO, "%s: %s (%s)", how, td_status_name(st), err.msg);
    RCHECK(secs < 1.0, "%s: failed only after %.3f s", how, secs);
    RCHECK(strstr(err.msg, want) && strstr(err.msg, by_free ? "left" : "test abort"), "%s: the message names %s: %s",
           how, want, err.msg);
    if (rank == 0) printf("%s: rank 0 failed after %.3f s: %s\n", how, secs, err.msg);
    if (rank == 0) {
        st = td_comm_wait(q, 0, &err);
        RCHECK(st == TD_ERR_IO, "%s: a pending receive from the quitter: %s (%s)", how, td_status_name(st), err.msg);
    }
    st = td_comm_allreduce(c, x, y, 100, TD_COMM_F32, TD_COMM_SUM, &err);
    RCHECK(st == TD_ERR_IO, "%s: a later collective: %s", how, td_status_name(st));
    if (by_free && size >= 3 && rank < 2) {
        // The survivors still talk to each other.
        int32_t v = 5, w = 0;
        st = rank == 0 ? td_comm_send(c, &v, 1, TD_COMM_I32, 1, 8, &err)
                       : td_comm_recv(c, &w, 1, TD_COMM_I32, 0, 8, &err);
        RCHECK(st == TD_OK && (rank == 0 || w == 5), "survivors' message: %s", err.msg);
    }
    RCHECK(td_comm_barrier(world, &err) == TD_OK, "%s", err.msg);
    td_comm_free(c);
}

// A rank that completed a collective and left does not fail it for the others, whose data from
// third ranks may still be on its way; the next collective fails at once, naming it. The last
// rank broadcasts 1 MiB (a rendezvous: the data waits for the receiver), rank 0 receives it and
// leaves, rank 1 sleeps through that before it receives, so it learns of the departure first
// (the notice travels on another channel). Before departures carried the collectives they
// completed (comm_mpi.c W_DONE), rank 1 and the root failed with "rank 0 has left": the flake of
// test_train_mpi on a loaded machine.
static void test_leave_after(td_comm *world) {
    td_comm *c = fresh(10000);
    if (!c) return;
    const int rank = td_comm_rank(c), size = td_comm_size(c), root = size - 1;
    enum { N = 1 << 20 };
    unsigned char *buf = malloc(N);
    for (int i = 0; i < N; i++) buf[i] = rank == root ? (unsigned char)(i * 7 + 3) : 0;
    td_err err = {0};
    td_comm_req *q = NULL;
    td_status st = td_comm_ibroadcast(c, buf, N, TD_COMM_U8, root, &q, &err);
    RCHECK(st == TD_OK, "leave after: post: %s", err.msg);
    if (rank == 1) nap_ms(300);  // rank 0 completes and leaves meanwhile
    if (!st) st = td_comm_wait(q, 0, &err);
    RCHECK(st == TD_OK, "leave after: the broadcast rank 0 completed before it left: %s (%s)", td_status_name(st),
           err.msg);
    int bad = 0;
    for (int i = 0; st == TD_OK && i < N; i++) bad += buf[i] != (unsigned char)(i * 7 + 3);
    RCHECK(bad == 0, "leave after: %d bytes differ", bad);
    if (rank == 0) {
        td_comm_free(c);
    } else {
        const double t0 = td_now();
        st = td_comm_barrier(c, &err);
        const double secs = td_now() - t0;
        RCHECK(st == TD_ERR_IO && strstr(err.msg, "rank 0 has left"), "leave after: the next collective: %s (%s)",
               td_status_name(st), err.msg);
        RCHECK(secs < 1.0, "leave after: the next collective failed only after %.3f s", secs);
    }
    free(buf);
    RCHECK(td_comm_barrier(world, &err) == TD_OK, "%s", err.msg);
    if (rank != 0) td_comm_free(c);
}

// ---- a rank killed mid-collective (its own job: mpirun ends it)

static int worker_kill(td_comm *world) {
    (void)world;  // kept open, so freeing nothing finalizes
    td_comm *c = fresh(3000);
    if (!c) return 1;
    const int rank = td_comm_rank(c), size = td_comm_size(c);
    const char *stamp = getenv("TEST_COMM_MPI_KILL_STAMP");
    float x[1000], y[1000];
    fill(TD_COMM_F32, x, 1000, rank, 0, 1);
    td_err err = {0};
    const double t0 = td_now();
    for (long i = 0;; i++) {
        if (rank == size - 1 && td_now() - t0 > 0.3) {
            // The time of death, for the parent (CLOCK_MONOTONIC is the same clock there).
            if (stamp) {
                FILE *f = fopen(stamp, "w");
                if (f) {
                    fprintf(f, "%.6f\n", td_now());
                    fclose(f);
                }
            }
            raise(SIGKILL);
        }
        td_status st = td_comm_allreduce(c, x, y, 1000, TD_COMM_F32, TD_COMM_SUM, &err);
        if (st) {
            // Reached only if mpirun has not ended this process first.
            printf("kill: survivor rank %d: %s after %ld all-reduces, at %.6f: %s\n", rank, td_status_name(st), i,
                   td_now(), err.msg);
            fflush(stdout);
            return st == TD_ERR_TIMEOUT || st == TD_ERR_IO ? 3 : 1;
        }
    }
}

static int worker(const char *what) {
    td_comm *world = NULL;
    td_err err = {0};
    setvbuf(stdout, NULL, _IOLBF, 0);
    CHECK(td_comm_mpi_launched(), "started by mpirun, but td_comm_mpi_launched says no");
    td_status st = td_comm_world_create(&world, &err);
    CHECK(st == TD_OK, "td_comm_world_create: %s", err.msg);
    if (st) return 1;
    g_rank = td_comm_rank(world);
    const int size = td_comm_size(world);
    const char *env_rank = getenv("OMPI_COMM_WORLD_RANK"), *env_size = getenv("OMPI_COMM_WORLD_SIZE");
    RCHECK(strcmp(td_comm_name(world), "mpi") == 0, "world is %s", td_comm_name(world));
    RCHECK(env_rank && env_size && atoi(env_rank) == g_rank && atoi(env_size) == size, "rank %d of %d vs env %s of %s",
           g_rank, size, env_rank, env_size);
    if (strcmp(what, "kill") == 0) return worker_kill(world);
    RCHECK(size >= 2 && size <= MAX_RANKS, "size %d", size);
    if (size < 2 || size > MAX_RANKS) return 1;

    struct {
        const char *name;
        double secs;
    } times[16];
    int n_times = 0;
#define TIMED(label, stmt)                        \
    do {                                          \
        double t0_ = td_now();                    \
        stmt;                                     \
        times[n_times].name = (label);            \
        times[n_times++].secs = td_now() - t0_;   \
    } while (0)

    td_comm *c = fresh(10000);
    if (!c) return 1;
    static const size_t counts[] = {0, 1, 7, 1000};
    TIMED("collectives", test_collectives(c, 0, counts, 4));
    TIMED("collectives nb", test_collectives(c, 1, counts, 4));
    static const size_t polled[] = {5, 3001};
    TIMED("collectives test()", test_collectives(c, 2, polled, 2));
    TIMED("vs comm_local", test_vs_local(c));
    TIMED("special", test_special(c));
    TIMED("barrier", test_barrier(c));
    TIMED("messages", test_messages(c));
    TIMED("overlap", test_overlap(c));
    TIMED("mismatch", test_mismatch(c));
    td_comm_free(c);
    // Messages over the size limit in pieces (as a message over INT_MAX bytes would be).
    setenv("TANDEM_MPI_MAX_MSG", "1000", 1);
    c = fresh(10000);
    unsetenv("TANDEM_MPI_MAX_MSG");
    if (c) {
        static const size_t piece_counts[] = {7, 1000};
        TIMED("pieces", (test_collectives(c, 1, piece_counts, 2), test_messages(c)));
        td_comm_free(c);
    }
    TIMED("limit", test_limit());
    TIMED("timeout", test_timeout());
    TIMED("abort", test_abort(world, false));
    TIMED("leave", test_abort(world, true));
    if (size >= 3) TIMED("leave after", test_leave_after(world));

    // Everyone's verdict, over the world communicator (still intact).
    int64_t mine[2] = {td_test_passed, td_test_failed}, sum[2] = {0, 0};
    st = td_comm_allreduce(world, mine, sum, 2, TD_COMM_I64, TD_COMM_SUM, &err);
    RCHECK(st == TD_OK, "the verdict: %s", err.msg);
    if (g_rank == 0) {
        for (int i = 0; i < n_times; i++) printf("  %-20s %.3f s\n", times[i].name, times[i].secs);
        printf("%d ranks: %lld passed, %lld failed\n", size, (long long)sum[0], (long long)sum[1]);
    }
    td_comm_barrier(world, &err);
    td_comm_free(world);  // the last MPI communicator: finalizes MPI
    return td_test_failed ? 1 : 0;
}
#endif  // TANDEM_HAVE_MPI

// ---- the parent: mpirun jobs under an outer deadline

#ifdef TANDEM_HAVE_MPI
static const char *find_mpirun(char *buf, size_t n) {
    const char *env = getenv("TANDEM_MPIRUN");
    if (env && *env) return access(env, X_OK) == 0 ? env : NULL;
    const char *path = getenv("PATH");
    while (path && *path) {
        const char *end = strchr(path, ':');
        size_t len = end ? (size_t)(end - path) : strlen(path);
        snprintf(buf, n, "%.*s/mpirun", (int)len, path);
        if (len && access(buf, X_OK) == 0) return buf;
        path = end ? end + 1 : NULL;
    }
    return NULL;
}

// Runs `mpirun ... -np np <this binary> --worker what`, in its own process group, killed at
// deadline_s. Returns the wait status (-1: hung and killed); *secs: its wall time.
static int run_job(const char *mpirun, const char *self, int np, const char *what, double deadline_s, double *secs) {
    char np_s[16];
    snprintf(np_s, sizeof np_s, "%d", np);
    double t0 = td_now();
    pid_t pid = fork();
    if (pid < 0) return -2;
    if (pid == 0) {
        setpgid(0, 0);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        // Under ASan: OpenMPI's frames lack frame pointers, and the fast unwinder stops there
        // before reaching the library that tests/lsan.supp names.
        const char *lsan = getenv("LSAN_OPTIONS");
        char opts[4096];
        snprintf(opts, sizeof opts, "%s%sfast_unwind_on_malloc=0", lsan ? lsan : "", lsan && *lsan ? ":" : "");
        setenv("LSAN_OPTIONS", opts, 1);
        // Containers: no cross-memory attach for shared memory; oversubscribed cores yield.
        setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 1);
        setenv("OMPI_MCA_mpi_yield_when_idle", "1", 1);
        execl(mpirun, mpirun, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", np_s, self,
              "--worker", what, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    int status = 0;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (r < 0 && errno != EINTR) {
            status = -2;
            break;
        }
        if (td_now() - t0 > deadline_s) {
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            status = -1;
            break;
        }
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    *secs = td_now() - t0;
    return status;
}
#endif

int main(int argc, char **argv) {
#ifdef TANDEM_HAVE_MPI
    if (argc >= 3 && strcmp(argv[1], "--worker") == 0) return worker(argv[2]);
#else
    (void)argc, (void)argv;
#endif
    setvbuf(stdout, NULL, _IOLBF, 0);  // our lines in order with the jobs'
    // Not under mpirun: the world is this one process.
    td_comm *w = NULL;
    td_err err = {0};
    if (!td_comm_mpi_launched()) {
        CHECK(td_comm_world_create(&w, &err) == TD_OK && td_comm_size(w) == 1 && strcmp(td_comm_name(w), "local") == 0,
              "world without mpirun: %s", err.msg);
        td_comm_free(w);
    }
#ifndef TANDEM_HAVE_MPI
    if (td_test_failed) TEST_DONE();
    return td_test_skip("built without MPI (TANDEM_MPI, libopenmpi-dev)");
#else
    char buf[4096], self[4096];
    const char *mpirun = find_mpirun(buf, sizeof buf);
    if (!mpirun) {
        return td_test_skip("mpirun is not on PATH (openmpi-bin)");
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    CHECK(len > 0, "readlink /proc/self/exe");
    if (len <= 0) TEST_DONE();
    self[len] = 0;
    // Sizes: even, odd and the most the tests use; a hang is a failure at the outer deadline.
    static const int sizes[] = {2, 3, 4};
    for (int i = 0; i < 3; i++) {
        double secs = 0;
        int status = run_job(mpirun, self, sizes[i], "all", 90, &secs);
        printf("mpirun -np %d: %.1f s\n", sizes[i], secs);
        CHECK(status == 0, "mpirun -np %d --worker all: %s (status %d)", sizes[i], status == -1 ? "hung" : "failed",
              status);
    }
    // A rank SIGKILLed mid-collective: the job must end (mpirun kills it, non-zero status), or the
    // survivors must fail with TIMEOUT/IO (exit 3), well within the bound; never hang.
    char stamp[64];
    snprintf(stamp, sizeof stamp, "/tmp/test_comm_mpi.%d.stamp", (int)getpid());
    setenv("TEST_COMM_MPI_KILL_STAMP", stamp, 1);
    unlink(stamp);
    double secs = 0;
    const double bound = 10.0;
    int status = run_job(mpirun, self, 3, "kill", 60, &secs);
    const double t_end = td_now();
    double t_kill = 0;
    FILE *f = fopen(stamp, "r");
    if (f) {
        if (fscanf(f, "%lf", &t_kill) != 1) t_kill = 0;
        fclose(f);
    }
    unlink(stamp);
    CHECK(status != -1, "killed rank: the job hung (killed after %.1f s)", secs);
    CHECK(t_kill > 0, "killed rank: the victim never wrote its time of death");
    CHECK(status > 0 && (WIFSIGNALED(status) || WEXITSTATUS(status) != 0), "killed rank: the job ended with status %d",
          status);
    if (t_kill > 0) {
        printf("killed rank: mpirun exited %s %d, %.2f s after the SIGKILL (job %.1f s)\n",
               WIFSIGNALED(status) ? "on signal" : "with status", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status),
               t_end - t_kill, secs);
        CHECK(t_end - t_kill < bound, "killed rank: the job took %.2f s to end after the kill (bound %.0f s)",
              t_end - t_kill, bound);
    }
    TEST_DONE();
#endif
}
