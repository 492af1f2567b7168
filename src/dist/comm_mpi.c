// The MPI communicator (comm_mpi.h). Every operation is built from non-blocking point-to-point
// messages (MPI_Isend, MPI_Issend, MPI_Irecv) on five communicators duplicated from
// MPI_COMM_WORLD, one per kind of traffic, and advanced by a progress function that runs inside
// post, wait and test (no thread of its own, as in comm_local.c). No MPI collective runs after
// creation: MPI's reductions do not fold in rank order, and a started MPI collective can be
// neither cancelled nor abandoned, while a pending receive can be cancelled and every wait here
// is a poll against a deadline. Not here: MPI's own algorithms (trees, rings), any-source
// receives, a progress thread, MPI_Abort (a dead process is mpirun's business: docs/dist.md).
//
// A collective starts with a header (kind, type, reduction, count, root, collective number) sent
// by every rank to every other; all of them are checked before any payload moves, so a mismatch
// is TD_ERR_INVALID on every rank with receive buffers untouched, and the header exchange is also
// the barrier. A reduction then moves blocks (each rank receives every rank's copy of the block it
// owns), folds them here in rank order, and an all-reduce sends its folded block to every rank.
// A message is an envelope (count, type) from the sender, a reply from the receiver (accept, after
// posting the payload's receive, or reject), then the payload by MPI_Issend, so both ends see a
// mismatch and td_comm_send returns when the receive has the data.
//
// Memory: the requests (128 per rank, each with room for 4 x size MPI requests and size headers)
// are allocated at creation; a reduction's staging buffer (size blocks) is kept by its request and
// grown when a larger one is needed, so steady training steps allocate nothing. A freed
// communicator's MPI communicators (and, rarely, its memory) stay until MPI_Finalize: see
// g_retired below for why. docs/dist.md has the costs and measurements.
#include "dist/comm_mpi.h"

#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
    MPI_MAX_REQS = 128,   // pending requests per rank (TD_ERR_LIMIT beyond)
    BLOCK_BYTES = 4096,   // the fold's accumulator
    REC_WORDS = 10,       // int64 words of a header, envelope, reply or notice
    PHASES = 3,           // collective tags: (number % tag_range) * PHASES + phase
    DRAIN_MS = 2000,      // td_comm_free: the longest wait for cancelled requests to settle
};
#define MIB ((size_t)1 << 20)  // messages over INT_MAX bytes travel as a count of MiB, then the rest

// Every record starts with a magic, the protocol version and the communicator's generation (the
// creation number, equal on every rank; a record from an earlier communicator is never believed).
#define REC_VERSION 1
#define MAGIC_HDR 0x54444348  // "TDCH": collective header
#define MAGIC_ENV 0x54444345  // "TDCE": message envelope
#define MAGIC_ACK 0x54444341  // "TDCA": reply to an envelope
#define MAGIC_CTL 0x5444434b  // "TDCK": abort or departure notice

// One channel per kind of traffic, so tags never collide between kinds.
enum { CH_COLL, CH_ENV, CH_ACK, CH_DATA, CH_CTL, CH_N };
enum { CTL_ABORT = 1, CTL_LEFT = 2 };
// The words of a record. All: magic, version, generation. Collective header: number, kind, type,
// reduction, count, root. Envelope: count, type. Reply: accepted, count, type. Notice: what,
// status, rank, and for a departure the first collective number the rank did not complete (then
// the text; the word was 0 before it was defined, which reads as "completed none": the old rule).
enum { W_MAGIC, W_VERSION, W_GEN, W_SEQ, W_KIND, W_DTYPE, W_OP, W_COUNT, W_ROOT };
enum { W_WHAT = 3, W_STATUS = 4, W_RANK = 5, W_DONE = 6 };  // a notice's words
enum { Q_FREE, Q_ACTIVE, Q_DONE, Q_DRAIN };  // not in use, running, finished (not released), settling
// Collectives: headers, then reduce-scatter blocks and/or gathered blocks (broadcast uses AG's
// tag). Messages: envelope and reply, then (reject) the reply going out, or (accept) the payload.
enum { P_HDR = 0, P_RS = 1, P_AG = 2, P_ENV, P_NACK, P_DATA };

typedef struct mreq {
    td_comm_req base;    // base.comm: the owner
    struct mreq *next;   // free list
    td_comm_desc d;
    int state, phase;
    bool coll;
    bool moving;         // every peer has arrived: data is moving (bounded by the work, not the wait)
    uint64_t seq;        // collectives: the collective number
    uint64_t post_no;    // order of posting on this rank (messages of one peer and tag go in it)
    double t_moving;     // ms: when moving began
    int n_mpi;
    MPI_Request *mpi;    // [4 * size]: this phase's requests (MPI_REQUEST_NULL once complete)
    int *who;            // [4 * size]: peer * 2 + 1 for a receive, peer * 2 for a send
    int64_t *hdr;        // [size][REC_WORDS]: every rank's header of a collective (own at rank)
    int64_t rec[2][REC_WORDS];  // messages: [0] what this rank sends, [1] what the peer sent
    unsigned char *stage;       // reductions: every rank's copy of this rank's block
    size_t stage_cap;           // bytes
    td_status status;
    char msg[TD_ERR_MSG_MAX];
} mreq;

typedef struct {
    int64_t w[REC_WORDS];
    char text[TD_ERR_MSG_MAX];
} ctl_rec;

typedef struct mctx {
    td_comm comm;  // handed out
    MPI_Comm ch[CH_N];
    MPI_Datatype piece;  // `piece_bytes` contiguous bytes
    size_t piece_bytes, max_msg;  // a message over max_msg bytes is a count of pieces, then the rest
    int tag_range;
    int64_t gen;
    uint64_t coll_seq, post_seq;
    uint64_t n_completed;  // MPI requests seen complete (news, for the polling rhythm)
    mreq *reqs;        // [MPI_MAX_REQS]
    mreq *free_reqs;
    MPI_Request ctl_recv;   // always posted (any source) until aborted or freed
    ctl_rec ctl_in, ctl_out;
    MPI_Request *ctl_send;  // [size]: the one notice this rank ever sends (abort or departure)
    bool notified;
    td_status abort_status;  // TD_OK until aborted (here or by a peer)
    char abort_msg[TD_ERR_MSG_MAX];
    // [size]: HERE while rank k has not left (td_comm_free); then the first collective number it
    // did not complete. Collectives below it still finish here: the departed rank sent all of its
    // part (its sends were complete), though the data may arrive after the notice, which travels
    // on another channel. A collective at or above it fails at once.
    uint64_t *left_at;
} mctx;
#define HERE UINT64_MAX

// The process's MPI state: whether this file initialized MPI, how many communicators are live,
// the creation counter (the same on every rank, as creation is collective), and what freed
// communicators leave behind until MPI_Finalize:
// - their channels, never MPI_Comm_free'd: a peer may still send a notice on them (its departure,
//   after this rank left), and OpenMPI delivers a message for a freed communicator to the next one
//   that reuses its context id, with a sequence number that then blocks that communicator's own
//   first message from the same peer for good;
// - the memory of a communicator whose requests MPI may still read or write (a notice not yet
//   sent, a receive matched but not complete when td_comm_free gave up waiting).
// Both are released after MPI_Finalize when this file called MPI_Init; otherwise they stay for the
// life of the process (the caller's MPI_Finalize frees the channels).
static bool g_we_init;
static int g_live;
static int64_t g_gen;
static MPI_Comm *g_retired;
static size_t g_n_retired, g_cap_retired;
static void **g_kept;
static size_t g_n_kept, g_cap_kept;

static bool grow(void **arr, size_t *cap, size_t n, size_t elem) {
    if (n < *cap) return true;
    size_t c = *cap ? 2 * *cap : 16;
    void *r = realloc(*arr, c * elem);
    if (!r) return false;
    *arr = r;
    *cap = c;
    return true;
}

static void retire(MPI_Comm *m) {
    if (*m == MPI_COMM_NULL) return;
    if (grow((void **)&g_retired, &g_cap_retired, g_n_retired, sizeof *g_retired)) g_retired[g_n_retired++] = *m;
    // else: out of memory; the handle is dropped (MPI_Finalize still frees the communicator)
    *m = MPI_COMM_NULL;
}

static void keep(void *p) {
    if (p && grow((void **)&g_kept, &g_cap_kept, g_n_kept, sizeof *g_kept)) g_kept[g_n_kept++] = p;
}

// The last communicator is gone: the kept channels, MPI if this file started it, then the memory
// MPI may have held.
static void last_one_out(void) {
    if (!g_we_init) return;
    for (size_t i = 0; i < g_n_retired; i++) MPI_Comm_free(&g_retired[i]);
    free(g_retired);
    g_retired = NULL;
    g_n_retired = g_cap_retired = 0;
    MPI_Finalize();
    for (size_t i = 0; i < g_n_kept; i++) free(g_kept[i]);
    free(g_kept);
    g_kept = NULL;
    g_n_kept = g_cap_kept = 0;
}

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Between polls: yield for the first 100 us without news (a nanosleep costs ~60 us of timer
// slack, too much for a small collective), then sleep a sixteenth of the time without news
// (20 us .. 1 ms), so long waits leave the CPU to the ranks doing the work (the tests
// oversubscribe two cores).
static void nap(double idle_ms) {
    if (idle_ms < 0.1) {
        sched_yield();
        return;
    }
    double us = idle_ms * 1000.0 / 16;
    us = us < 20 ? 20 : us > 1000 ? 1000 : us;
    struct timespec ts = {0, (long)(us * 1000)};
    nanosleep(&ts, NULL);
}

static void mpi_errstr(int rc, char *buf, size_t n) {
    char s[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS) snprintf(s, sizeof s, "error %d", rc);
    snprintf(buf, n, "%s", s);
}

// "allreduce #3 (f32 x 7, sum)", "send to rank 1 (tag 5, u8 x 10)": as comm_local.c names them.
static void describe(const td_comm_desc *d, uint64_t seq, char *buf, size_t n) {
    const char *k = td_comm_kind_name(d->kind), *t = td_comm_dtype_name(d->dtype);
    switch (d->kind) {
    case TD_COMM_ALLREDUCE:
    case TD_COMM_REDUCE_SCATTER:
        snprintf(buf, n, "%s #%llu (%s x %zu, %s)", k, (unsigned long long)seq, t, d->count, td_comm_op_name(d->op));
        break;
    case TD_COMM_ALLGATHER: snprintf(buf, n, "%s #%llu (%s x %zu)", k, (unsigned long long)seq, t, d->count); break;
    case TD_COMM_BROADCAST:
        snprintf(buf, n, "%s #%llu (%s x %zu, root %d)", k, (unsigned long long)seq, t, d->count, d->peer);
        break;
    case TD_COMM_BARRIER: snprintf(buf, n, "%s #%llu", k, (unsigned long long)seq); break;
    case TD_COMM_SEND: snprintf(buf, n, "send to rank %d (tag %d, %s x %zu)", d->peer, d->tag, t, d->count); break;
    case TD_COMM_RECV: snprintf(buf, n, "recv from rank %d (tag %d, %s x %zu)", d->peer, d->tag, t, d->count); break;
    default: snprintf(buf, n, "?"); break;
    }
}

static bool is_recv_slot(const mreq *q, int i) { return q->who[i] & 1; }

// Failed: receives still pending are cancelled (they settle in progress, or td_comm_free); sends
// are left to finish (a small one already has; MPI cannot cancel the rest).
static void cancel_pending(mreq *q) {
    for (int i = 0; i < q->n_mpi; i++)
        if (q->mpi[i] != MPI_REQUEST_NULL && is_recv_slot(q, i)) MPI_Cancel(&q->mpi[i]);
}

// Finishes q with st and "rank R: <operation>: <why>" (why NULL: the status alone).
static void finish(mctx *c, mreq *q, td_status st, const char *why) {
    const bool was_active = q->state == Q_ACTIVE;
    q->state = Q_DONE;
    q->status = st;
    q->msg[0] = 0;
    if (st == TD_OK) return;
    if (was_active) cancel_pending(q);
    char what[160];
    describe(&q->d, q->seq, what, sizeof what);
    snprintf(q->msg, sizeof q->msg, "rank %d: %s: %.320s", c->comm.rank, what, why ? why : td_status_name(st));
}

// Sends this rank's one notice (abort or departure) to every peer. Best effort: a peer that
// cannot be reached is gone already. done: W_DONE (departures).
static void notify(mctx *c, int what, td_status st, uint64_t done, const char *text) {
    if (c->notified) return;
    c->notified = true;
    memset(&c->ctl_out, 0, sizeof c->ctl_out);
    const int64_t w[REC_WORDS] = {MAGIC_CTL, REC_VERSION, c->gen, what, st, c->comm.rank, (int64_t)done, 0};
    memcpy(c->ctl_out.w, w, sizeof w);
    snprintf(c->ctl_out.text, sizeof c->ctl_out.text, "%s", text);
    for (int k = 0; k < c->comm.size; k++)
        if (k != c->comm.rank &&
            MPI_Isend(&c->ctl_out, (int)sizeof c->ctl_out, MPI_BYTE, k, 0, c->ch[CH_CTL], &c->ctl_send[k]) !=
                MPI_SUCCESS)
            c->ctl_send[k] = MPI_REQUEST_NULL;
}

// Breaks the communicator: every running request fails with st and msg (already prefixed
// "communicator aborted by rank R: "); later calls fail at once. The first abort wins; by_me
// sends the notice to the peers.
static void abort_with(mctx *c, td_status st, const char *msg, bool by_me) {
    if (c->abort_status != TD_OK) return;
    c->abort_status = st;
    snprintf(c->abort_msg, sizeof c->abort_msg, "%s", msg);
    if (by_me) notify(c, CTL_ABORT, st, 0, c->abort_msg);
    for (int i = 0; i < MPI_MAX_REQS; i++)
        if (c->reqs[i].state == Q_ACTIVE) finish(c, &c->reqs[i], st, c->abort_msg);
    if (c->ctl_recv != MPI_REQUEST_NULL) MPI_Cancel(&c->ctl_recv);
}

static void abort_self(mctx *c, td_status st, const char *reason) {
    char msg[TD_ERR_MSG_MAX];
    snprintf(msg, sizeof msg, "communicator aborted by rank %d: %.400s", c->comm.rank, reason);
    abort_with(c, st, msg, true);
}

// An MPI call failed: nothing can be trusted to match any more.
static void mpi_broken(mctx *c, int rc, const char *call) {
    char s[MPI_MAX_ERROR_STRING], why[TD_ERR_MSG_MAX];
    mpi_errstr(rc, s, sizeof s);
    snprintf(why, sizeof why, "MPI: %s failed: %.300s", call, s);
    abort_self(c, TD_ERR_IO, why);
}

// Reads the notices that have arrived: an abort breaks the communicator, a departure marks the
// rank. Records of another generation or version are ignored.
static void poll_ctl(mctx *c) {
    while (c->ctl_recv != MPI_REQUEST_NULL) {
        int flag = 0;
        MPI_Status s;
        int rc = MPI_Test(&c->ctl_recv, &flag, &s);
        if (rc != MPI_SUCCESS) {
            c->ctl_recv = MPI_REQUEST_NULL;
            mpi_broken(c, rc, "MPI_Test (notices)");
            return;
        }
        if (!flag) return;
        int cancelled = 0;
        MPI_Test_cancelled(&s, &cancelled);
        if (cancelled) return;  // aborted or freed
        const int64_t *w = c->ctl_in.w;
        c->ctl_in.text[sizeof c->ctl_in.text - 1] = 0;
        if (w[W_MAGIC] == MAGIC_CTL && w[W_VERSION] == REC_VERSION && w[W_GEN] == c->gen && w[W_RANK] >= 0 &&
            w[W_RANK] < c->comm.size) {
            if (w[W_WHAT] == CTL_ABORT) {
                abort_with(c, w[W_STATUS] == TD_ERR_TIMEOUT ? TD_ERR_TIMEOUT : TD_ERR_IO, c->ctl_in.text, false);
                return;
            }
            if (w[W_WHAT] == CTL_LEFT) c->left_at[w[W_RANK]] = w[W_DONE] > 0 ? (uint64_t)w[W_DONE] : 0;
        }
        if (c->abort_status != TD_OK) return;
        rc = MPI_Irecv(&c->ctl_in, (int)sizeof c->ctl_in, MPI_BYTE, MPI_ANY_SOURCE, 0, c->ch[CH_CTL], &c->ctl_recv);
        if (rc != MPI_SUCCESS) {
            c->ctl_recv = MPI_REQUEST_NULL;
            mpi_broken(c, rc, "MPI_Irecv (notices)");
        }
    }
}

// ---- posting the MPI parts of a phase

// Appends the MPI requests for `bytes` at p to or from peer: one message of bytes, or (over
// max_msg, as MPI counts are int) a count of pieces then the rest. Both ends derive the same
// split from the same size, and messages of one tag match in order.
static int xfer(mctx *c, mreq *q, bool recv, bool sync, void *p, size_t bytes, int peer, int ch, int tag) {
    if (bytes == 0) return MPI_SUCCESS;
    const size_t n_pieces = bytes > c->max_msg ? bytes / c->piece_bytes : 0, rest = bytes - n_pieces * c->piece_bytes;
    for (int part = 0; part < 2; part++) {
        const int n = part == 0 ? (int)n_pieces : (int)rest;
        if (n == 0) continue;
        MPI_Datatype t = part == 0 ? c->piece : MPI_BYTE;
        void *at = part == 0 ? p : (char *)p + n_pieces * c->piece_bytes;
        MPI_Request *r = &q->mpi[q->n_mpi];
        int rc = recv   ? MPI_Irecv(at, n, t, peer, tag, c->ch[ch], r)
                 : sync ? MPI_Issend(at, n, t, peer, tag, c->ch[ch], r)
                        : MPI_Isend(at, n, t, peer, tag, c->ch[ch], r);
        if (rc != MPI_SUCCESS) {
            *r = MPI_REQUEST_NULL;
            return rc;
        }
        q->who[q->n_mpi++] = peer * 2 + (recv ? 1 : 0);
    }
    return MPI_SUCCESS;
}

static int coll_tag(const mctx *c, const mreq *q, int phase) {
    return (int)(q->seq % (uint64_t)c->tag_range) * PHASES + phase;
}

// Elements [k * blk, min(count, (k + 1) * blk)): block k of an all-reduce.
static size_t block_len(size_t count, size_t blk, int k) {
    const size_t lo = (size_t)k * blk;
    return lo >= count ? 0 : (count - lo < blk ? count - lo : blk);
}

// All-reduce: ceil(count / size) elements per block; reduce-scatter: count.
static size_t block_stride(const mctx *c, const td_comm_desc *d) {
    return d->kind == TD_COMM_ALLREDUCE ? (d->count + (size_t)c->comm.size - 1) / (size_t)c->comm.size : d->count;
}

static size_t my_len(const mctx *c, const td_comm_desc *d) {
    return d->kind == TD_COMM_ALLREDUCE ? block_len(d->count, block_stride(c, d), c->comm.rank) : d->count;
}

static int post_phase(mctx *c, mreq *q, int phase) {
    const td_comm_desc *d = &q->d;
    const int n = c->comm.size, me = c->comm.rank;
    const size_t es = td_comm_dtype_size(d->dtype);
    int rc = MPI_SUCCESS;
    q->phase = phase;
    q->n_mpi = 0;
    switch (phase) {
    case P_HDR: {
        int64_t *mine = q->hdr + (size_t)me * REC_WORDS;
        const int64_t w[REC_WORDS] = {MAGIC_HDR, REC_VERSION, c->gen,         (int64_t)q->seq, d->kind,
                                      d->dtype,  d->op,       (int64_t)d->count, d->peer};  // root: -1 but for broadcast
        memcpy(mine, w, sizeof w);
        for (int k = 0; k < n && rc == MPI_SUCCESS; k++) {
            if (k == me) continue;
            rc = xfer(c, q, true, false, q->hdr + (size_t)k * REC_WORDS, REC_WORDS * 8, k, CH_COLL, coll_tag(c, q, P_HDR));
            if (rc == MPI_SUCCESS) rc = xfer(c, q, false, false, mine, REC_WORDS * 8, k, CH_COLL, coll_tag(c, q, P_HDR));
        }
        break;
    }
    case P_RS: {
        // Block k of the send buffer goes to rank k; every rank's copy of block `me` lands in stage.
        const size_t stride = block_stride(c, d), mine = my_len(c, d);
        for (int k = 0; k < n && rc == MPI_SUCCESS; k++) {
            if (k == me) continue;
            const size_t lk = d->kind == TD_COMM_ALLREDUCE ? block_len(d->count, stride, k) : d->count;
            rc = xfer(c, q, true, false, q->stage + (size_t)k * stride * es, mine * es, k, CH_COLL, coll_tag(c, q, P_RS));
            if (rc == MPI_SUCCESS)
                rc = xfer(c, q, false, false, (char *)d->send + (size_t)k * stride * es, lk * es, k, CH_COLL,
                          coll_tag(c, q, P_RS));
        }
        break;
    }
    case P_AG: {
        const int tag = coll_tag(c, q, P_AG);
        if (d->kind == TD_COMM_BROADCAST) {
            for (int k = 0; k < n && rc == MPI_SUCCESS; k++)
                if (me == d->peer && k != me) rc = xfer(c, q, false, false, d->recv, d->count * es, k, CH_COLL, tag);
            if (me != d->peer) rc = xfer(c, q, true, false, d->recv, d->count * es, d->peer, CH_COLL, tag);
            break;
        }
        // All-gather (block = count) or the all-reduce's folded blocks (in recv already).
        const bool ar = d->kind == TD_COMM_ALLREDUCE;
        const size_t stride = ar ? block_stride(c, d) : d->count;
        char *own = (char *)d->recv + (size_t)me * stride * es;
        if (!ar && d->count && (const char *)d->send != own) memcpy(own, d->send, d->count * es);
        const size_t mine = ar ? my_len(c, d) : d->count;
        for (int k = 0; k < n && rc == MPI_SUCCESS; k++) {
            if (k == me) continue;
            const size_t lk = ar ? block_len(d->count, stride, k) : d->count;
            rc = xfer(c, q, true, false, (char *)d->recv + (size_t)k * stride * es, lk * es, k, CH_COLL, tag);
            if (rc == MPI_SUCCESS) rc = xfer(c, q, false, false, own, mine * es, k, CH_COLL, tag);
        }
        break;
    }
    case P_ENV:
        if (d->kind == TD_COMM_SEND) {
            const int64_t w[REC_WORDS] = {MAGIC_ENV, REC_VERSION, c->gen, (int64_t)d->count, d->dtype};
            memcpy(q->rec[0], w, sizeof w);
            rc = xfer(c, q, true, false, q->rec[1], sizeof q->rec[1], d->peer, CH_ACK, d->tag);
            if (rc == MPI_SUCCESS) rc = xfer(c, q, false, false, q->rec[0], sizeof q->rec[0], d->peer, CH_ENV, d->tag);
        } else {
            rc = xfer(c, q, true, false, q->rec[1], sizeof q->rec[1], d->peer, CH_ENV, d->tag);
        }
        break;
    case P_NACK:
    case P_DATA: {
        const bool ok = phase == P_DATA;
        if (d->kind == TD_COMM_SEND) {
            rc = xfer(c, q, false, true, (void *)d->send, d->count * es, d->peer, CH_DATA, d->tag);
            break;
        }
        // The receive is posted before the reply, so the payload never arrives unexpected.
        if (ok) rc = xfer(c, q, true, false, d->recv, d->count * es, d->peer, CH_DATA, d->tag);
        const int64_t w[REC_WORDS] = {MAGIC_ACK, REC_VERSION, c->gen, ok, (int64_t)d->count, d->dtype};
        memcpy(q->rec[0], w, sizeof w);
        if (rc == MPI_SUCCESS) rc = xfer(c, q, false, false, q->rec[0], sizeof q->rec[0], d->peer, CH_ACK, d->tag);
        break;
    }
    default: TD_ASSERT(0);
    }
    return rc;
}


// This rank's block: ((x_0 op x_1) op x_2) ... over ranks, x_me read from the send buffer and the
// others from stage, 4 KiB at a time; a chunk's inputs are all read before its output is written,
// so the in-place layouts (output over the own block) are safe.
static void fold(const mctx *c, const mreq *q) {
    const td_comm_desc *d = &q->d;
    const size_t es = td_comm_dtype_size(d->dtype), stride = block_stride(c, d), len = my_len(c, d);
    const size_t blk = BLOCK_BYTES / es;
    const int me = c->comm.rank;
    const char *own = (const char *)d->send + (size_t)me * stride * es;
    char *out = d->kind == TD_COMM_ALLREDUCE ? (char *)d->recv + (size_t)me * stride * es : d->recv;
    _Alignas(64) unsigned char acc[BLOCK_BYTES];
    for (size_t i = 0; i < len; i += blk) {
        const size_t m = len - i < blk ? len - i : blk;
        for (int k = 0; k < c->comm.size; k++) {
            const char *src = k == me ? own + i * es : (const char *)q->stage + ((size_t)k * stride + i) * es;
            if (k == 0) memcpy(acc, src, m * es);
            else td_comm_fold(d->dtype, d->op, acc, src, m);
        }
        memcpy(out + i * es, acc, m * es);
    }
}

// ---- advancing a request

static bool same_collective(const int64_t *a, const int64_t *b) {
    if (a[W_KIND] != b[W_KIND] || a[W_DTYPE] != b[W_DTYPE] || a[W_COUNT] != b[W_COUNT]) return false;
    if ((a[W_KIND] == TD_COMM_ALLREDUCE || a[W_KIND] == TD_COMM_REDUCE_SCATTER) && a[W_OP] != b[W_OP]) return false;
    return a[W_KIND] != TD_COMM_BROADCAST || a[W_ROOT] == b[W_ROOT];
}

static void describe_hdr(const int64_t *h, char *buf, size_t n) {
    td_comm_desc d = {.kind = (td_comm_kind)h[W_KIND], .dtype = (td_comm_dtype)h[W_DTYPE], .op = (td_comm_op)h[W_OP],
                      .count = (size_t)h[W_COUNT], .peer = (int)h[W_ROOT]};
    describe(&d, (uint64_t)h[W_SEQ], buf, n);
}

// Every header is in: a stranger is a protocol error, a disagreement TD_ERR_INVALID on every rank
// (they all hold the same headers, so they all say the same).
static bool headers_agree(mctx *c, mreq *q) {
    const int n = c->comm.size;
    for (int k = 0; k < n; k++) {
        const int64_t *h = q->hdr + (size_t)k * REC_WORDS;
        if (h[W_MAGIC] != MAGIC_HDR || h[W_VERSION] != REC_VERSION || h[W_GEN] != c->gen ||
            h[W_SEQ] != (int64_t)q->seq) {
            char why[TD_ERR_MSG_MAX];
            snprintf(why, sizeof why,
                     "rank %d sent a header this rank cannot read (magic %llx, version %lld, generation %lld, "
                     "collective #%lld): another tandem build?",
                     k, (unsigned long long)h[W_MAGIC], (long long)h[W_VERSION], (long long)h[W_GEN],
                     (long long)h[W_SEQ]);
            abort_self(c, TD_ERR_IO, why);
            return false;
        }
    }
    for (int k = 1; k < n; k++)
        if (!same_collective(q->hdr, q->hdr + (size_t)k * REC_WORDS)) {
            char a[160], b[160], why[TD_ERR_MSG_MAX];
            describe_hdr(q->hdr, a, sizeof a);
            describe_hdr(q->hdr + (size_t)k * REC_WORDS, b, sizeof b);
            snprintf(why, sizeof why, "mismatched collective: rank 0 called %s, rank %d called %s", a, k, b);
            finish(c, q, TD_ERR_INVALID, why);
            return false;
        }
    return true;
}

// A message whose envelope step is complete may go on only after every earlier message of the
// same direction, peer and tag has: replies and payloads then pair up in posting order.
static bool earlier_pending(const mctx *c, const mreq *q) {
    for (int i = 0; i < MPI_MAX_REQS; i++) {
        const mreq *r = &c->reqs[i];
        if (r != q && r->state == Q_ACTIVE && !r->coll && r->phase == P_ENV && r->post_no < q->post_no &&
            r->d.kind == q->d.kind && r->d.peer == q->d.peer && r->d.tag == q->d.tag)
            return true;
    }
    return false;
}

static void mismatch_msg(const mreq *q, const int64_t *other, char *why, size_t n, int me) {
    const bool send = q->d.kind == TD_COMM_SEND;
    const size_t oc = (size_t)other[3];
    const td_comm_dtype ot = (td_comm_dtype)(send ? other[5] : other[4]);
    const size_t ocount = send ? (size_t)other[4] : oc;
    snprintf(why, n, "mismatched message (tag %d): rank %d sends %s x %zu, rank %d receives %s x %zu", q->d.tag,
             send ? me : q->d.peer, td_comm_dtype_name(send ? q->d.dtype : ot), send ? q->d.count : ocount,
             send ? q->d.peer : me, td_comm_dtype_name(send ? ot : q->d.dtype), send ? ocount : q->d.count);
}

static void start_moving(mreq *q) {
    q->moving = true;
    q->t_moving = now_ms();
}

// The current phase is complete: post the next or finish. False: deferred (try again later).
static bool advance(mctx *c, mreq *q) {
    const td_comm_desc *d = &q->d;
    int rc = MPI_SUCCESS;
    switch (q->phase) {
    case P_HDR:
        if (!headers_agree(c, q)) return true;
        start_moving(q);
        if (d->kind == TD_COMM_BARRIER || d->count == 0) finish(c, q, TD_OK, NULL);
        else if (d->kind == TD_COMM_ALLREDUCE || d->kind == TD_COMM_REDUCE_SCATTER) rc = post_phase(c, q, P_RS);
        else rc = post_phase(c, q, P_AG);  // all-gather, broadcast
        break;
    case P_RS:
        fold(c, q);
        if (d->kind == TD_COMM_ALLREDUCE) rc = post_phase(c, q, P_AG);
        else finish(c, q, TD_OK, NULL);
        break;
    case P_ENV: {
        if (earlier_pending(c, q)) return false;
        const int64_t *o = q->rec[1];
        const int64_t magic = d->kind == TD_COMM_SEND ? MAGIC_ACK : MAGIC_ENV;
        if (o[0] != magic || o[1] != REC_VERSION || o[2] != c->gen) {
            char why[TD_ERR_MSG_MAX];
            snprintf(why, sizeof why, "rank %d sent a record this rank cannot read (magic %llx, version %lld): another "
                     "tandem build?", d->peer, (unsigned long long)o[0], (long long)o[1]);
            abort_self(c, TD_ERR_IO, why);
            return true;
        }
        char why[TD_ERR_MSG_MAX];
        if (d->kind == TD_COMM_SEND) {  // o: the receiver's reply
            if (!o[3]) {
                mismatch_msg(q, o, why, sizeof why, c->comm.rank);
                finish(c, q, TD_ERR_INVALID, why);
            } else if (d->count == 0) {
                finish(c, q, TD_OK, NULL);
            } else {
                start_moving(q);
                rc = post_phase(c, q, P_DATA);
            }
        } else {  // o: the sender's envelope
            const bool ok = (size_t)o[3] == d->count && o[4] == d->dtype;
            if (ok) start_moving(q);
            rc = post_phase(c, q, ok ? P_DATA : P_NACK);
        }
        break;
    }
    case P_NACK: {
        char why[TD_ERR_MSG_MAX];
        mismatch_msg(q, q->rec[1], why, sizeof why, c->comm.rank);
        finish(c, q, TD_ERR_INVALID, why);
        break;
    }
    case P_AG:
    case P_DATA: finish(c, q, TD_OK, NULL); break;
    default: TD_ASSERT(0);
    }
    if (rc != MPI_SUCCESS) mpi_broken(c, rc, "posting a message");
    return true;
}

// Tests q's MPI requests: the number still pending, or -1 when MPI failed (communicator broken).
static int test_all(mctx *c, mreq *q) {
    int pending = 0;
    for (int i = 0; i < q->n_mpi; i++) {
        if (q->mpi[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        int rc = MPI_Test(&q->mpi[i], &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            q->mpi[i] = MPI_REQUEST_NULL;  // what MPI holds is lost to us; nothing else can be done
            if (q->state == Q_ACTIVE) {
                mpi_broken(c, rc, "MPI_Test");
                return -1;
            }
            continue;
        }
        pending += !flag;
        c->n_completed += flag != 0;
    }
    return pending;
}

// A rank that left without completing collective number seq, or -1.
static int coll_gone(const mctx *c, uint64_t seq) {
    for (int k = 0; k < c->comm.size; k++)
        if (c->left_at[k] <= seq) return k;
    return -1;
}

static void step(mctx *c, mreq *q) {
    while (q->state == Q_ACTIVE) {
        if (c->abort_status != TD_OK) {
            finish(c, q, c->abort_status, c->abort_msg);
            return;
        }
        const int pending = test_all(c, q);
        if (pending < 0) return;
        if (pending > 0) {
            // A rank that left will never do its part.
            const int gone = q->coll ? coll_gone(c, q->seq) : c->left_at[q->d.peer] != HERE ? q->d.peer : -1;
            if (gone >= 0) {
                char why[128];
                snprintf(why, sizeof why, "rank %d has left the communicator (td_comm_free)", gone);
                finish(c, q, TD_ERR_IO, why);
            }
            return;
        }
        if (!advance(c, q)) return;
    }
}

static void req_release(mctx *c, mreq *q) {
    q->state = Q_FREE;
    q->next = c->free_reqs;
    c->free_reqs = q;
}

// One pass over everything pending on this rank: notices, running requests, settling ones.
static void progress(mctx *c) {
    poll_ctl(c);
    for (int i = 0; i < MPI_MAX_REQS; i++) {
        mreq *q = &c->reqs[i];
        if (q->state == Q_ACTIVE) step(c, q);
        else if (q->state == Q_DRAIN && test_all(c, q) == 0) req_release(c, q);
    }
}

// ---- the table

// Why this rank cannot post d now (TD_OK: it can).
static td_status broken(const mctx *c, const td_comm_desc *d, td_err *err) {
    const char *k = td_comm_kind_name(d->kind);
    const int me = c->comm.rank;
    if (c->abort_status != TD_OK) return td_err_set(err, c->abort_status, "rank %d: %s: %s", me, k, c->abort_msg);
    const int gone = d->kind == TD_COMM_SEND || d->kind == TD_COMM_RECV
                         ? (c->left_at[d->peer] != HERE ? d->peer : -1)
                         : coll_gone(c, c->coll_seq);  // the number this one would get
    if (gone >= 0)
        return td_err_set(err, TD_ERR_IO, "rank %d: %s: rank %d has left the communicator (td_comm_free)", me, k, gone);
    return TD_OK;
}

static td_status mpi_post(void *ctx, const td_comm_desc *d, td_comm_req **out, td_err *err) {
    mctx *c = ctx;
    progress(c);  // learn of aborts and departures first
    td_status st = broken(c, d, err);
    if (st) return st;
    mreq *q = c->free_reqs;
    if (!q)
        return td_err_set(err, TD_ERR_LIMIT, "rank %d: %s: %d requests already pending", c->comm.rank,
                          td_comm_kind_name(d->kind), MPI_MAX_REQS);
    const bool coll = d->kind != TD_COMM_SEND && d->kind != TD_COMM_RECV;
    if (d->kind == TD_COMM_ALLREDUCE || d->kind == TD_COMM_REDUCE_SCATTER) {
        const size_t need = (size_t)c->comm.size * block_stride(c, d) * td_comm_dtype_size(d->dtype);
        if (need > q->stage_cap) {
            unsigned char *s = realloc(q->stage, need);
            if (!s)
                return td_err_set(err, TD_ERR_NOMEM, "rank %d: %s: out of memory for %zu bytes of staging",
                                  c->comm.rank, td_comm_kind_name(d->kind), need);
            q->stage = s;
            q->stage_cap = need;
        }
    }
    c->free_reqs = q->next;
    q->next = NULL;
    q->d = *d;
    q->state = Q_ACTIVE;
    q->coll = coll;
    q->moving = false;
    q->seq = coll ? c->coll_seq++ : 0;
    q->post_no = c->post_seq++;
    q->status = TD_OK;
    q->msg[0] = 0;
    int rc = post_phase(c, q, coll ? P_HDR : P_ENV);
    if (rc != MPI_SUCCESS) {
        mpi_broken(c, rc, "posting a message");  // fails q with the rest; it settles in progress
        st = td_err_set(err, q->status, "%s", q->msg);
        q->state = Q_DRAIN;
        return st;
    }
    step(c, q);
    *out = &q->base;
    return TD_OK;
}

static td_status release(mctx *c, mreq *q, td_err *err) {
    td_status st = q->status;
    if (st) td_err_set(err, st, "%s", q->msg);
    bool busy = false;
    for (int i = 0; i < q->n_mpi; i++) busy |= q->mpi[i] != MPI_REQUEST_NULL;
    if (busy) q->state = Q_DRAIN;  // cancelled receives and unfinished sends settle in progress
    else req_release(c, q);
    return st;
}

// "rank 2", "ranks 1, 3": the peers q still waits for (pending receives first, then sends).
static void missing_ranks(const mctx *c, const mreq *q, char *buf, size_t n) {
    int found = 0;
    size_t len = 0;
    buf[0] = 0;
    for (int want_recv = 1; want_recv >= 0 && !found; want_recv--)
        for (int k = 0; k < c->comm.size; k++) {
            bool pend = false;
            for (int i = 0; i < q->n_mpi && !pend; i++)
                pend = q->mpi[i] != MPI_REQUEST_NULL && q->who[i] == k * 2 + want_recv;
            if (!pend) continue;
            len += (size_t)snprintf(buf + len, len < n ? n - len : 0, "%s%d", found ? ", " : "", k);
            found++;
        }
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s %s", found == 1 ? "rank" : "ranks", found ? buf : "(none)");
    snprintf(buf, n, "%s", tmp);
}

static td_status mpi_wait(void *ctx, td_comm_req *req, int timeout_ms, td_err *err) {
    mctx *c = ctx;
    mreq *q = (mreq *)req;
    TD_ASSERT(req->comm == &c->comm && (q->state == Q_ACTIVE || q->state == Q_DONE));  // released: a caller's bug
    const double t0 = now_ms();
    double news = t0;  // when a request last moved
    for (;;) {
        const uint64_t seen = c->n_completed;
        progress(c);
        if (q->state == Q_DONE) break;
        const double t = now_ms();
        if (c->n_completed != seen) news = t;
        // Once every peer has arrived, the data gets the communicator's deadline of its own.
        double limit = t0 + timeout_ms;
        if (q->moving && q->t_moving + c->comm.timeout_ms > limit) limit = q->t_moving + c->comm.timeout_ms;
        if (t >= limit) {
            char who[128], what[160], why[TD_ERR_MSG_MAX];
            missing_ranks(c, q, who, sizeof who);
            describe(&q->d, q->seq, what, sizeof what);
            snprintf(why, sizeof why, "timed out after %d ms in %s waiting for %s", timeout_ms, what, who);
            abort_self(c, TD_ERR_TIMEOUT, why);
            snprintf(why, sizeof why, "timed out after %d ms waiting for %s", timeout_ms, who);
            finish(c, q, TD_ERR_TIMEOUT, why);
            break;
        }
        nap(t - news);
    }
    return release(c, q, err);
}

static td_status mpi_test(void *ctx, td_comm_req *req, bool *done, td_err *err) {
    mctx *c = ctx;
    mreq *q = (mreq *)req;
    TD_ASSERT(req->comm == &c->comm && (q->state == Q_ACTIVE || q->state == Q_DONE));
    progress(c);
    *done = q->state == Q_DONE;
    return *done ? release(c, q, err) : TD_OK;
}

static void mpi_abort(void *ctx, td_status status, const char *reason) { abort_self(ctx, status, reason); }

// Frees everything this rank holds; in_use: MPI may still touch the requests or the notice, so
// the memory is kept until MPI_Finalize instead.
static void ctx_destroy(mctx *c, bool in_use) {
    for (int i = 0; i < CH_N; i++) retire(&c->ch[i]);
    if (c->piece != MPI_DATATYPE_NULL) MPI_Type_free(&c->piece);
    void (*release_mem)(void *) = in_use ? keep : free;
    if (c->reqs) {
        for (int i = 0; i < MPI_MAX_REQS; i++) release_mem(c->reqs[i].stage);
        release_mem(c->reqs[0].mpi);
        release_mem(c->reqs[0].who);
        release_mem(c->reqs[0].hdr);
    }
    release_mem(c->reqs);
    release_mem(c->ctl_send);
    release_mem(c->left_at);
    release_mem(c);
}

static void mpi_free(void *ctx) {
    mctx *c = ctx;
    char why[128];
    snprintf(why, sizeof why, "rank %d has left the communicator (td_comm_free)", c->comm.rank);
    progress(c);
    // Every collective below the first one still running here is complete on this rank.
    uint64_t done = c->coll_seq;
    for (int i = 0; i < MPI_MAX_REQS; i++)
        if (c->reqs[i].state == Q_ACTIVE && c->reqs[i].coll && c->reqs[i].seq < done) done = c->reqs[i].seq;
    if (c->abort_status == TD_OK) notify(c, CTL_LEFT, TD_ERR_IO, done, why);
    for (int i = 0; i < MPI_MAX_REQS; i++)
        if (c->reqs[i].state == Q_ACTIVE) finish(c, &c->reqs[i], TD_ERR_IO, "the communicator was freed");
    if (c->ctl_recv != MPI_REQUEST_NULL) MPI_Cancel(&c->ctl_recv);
    // Let cancelled receives and the notices settle, for a bounded time.
    const double t0 = now_ms(), limit = t0 + (c->comm.timeout_ms < DRAIN_MS ? c->comm.timeout_ms : DRAIN_MS);
    for (;;) {
        int pending = 0;
        for (int i = 0; i < MPI_MAX_REQS; i++)
            if (c->reqs[i].state != Q_FREE) pending += test_all(c, &c->reqs[i]);
        for (int k = 0; k < c->comm.size; k++)
            if (c->ctl_send[k] != MPI_REQUEST_NULL) {
                int flag = 0;
                if (MPI_Test(&c->ctl_send[k], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) c->ctl_send[k] = MPI_REQUEST_NULL;
                pending += !flag;
            }
        if (c->ctl_recv != MPI_REQUEST_NULL) {
            int flag = 0;
            if (MPI_Test(&c->ctl_recv, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) c->ctl_recv = MPI_REQUEST_NULL;
            pending += !flag;
        }
        const double t = now_ms();
        if (pending == 0 || t >= limit) break;
        nap(t - t0);
    }
    // Sends still pending are handed to MPI (a synchronous send to a rank that never receives
    // stays there); a receive still pending may yet be written, so its memory is kept.
    bool in_use = c->ctl_recv != MPI_REQUEST_NULL;
    for (int i = 0; i < MPI_MAX_REQS; i++) {
        mreq *q = &c->reqs[i];
        for (int j = 0; j < q->n_mpi; j++) {
            if (q->mpi[j] == MPI_REQUEST_NULL) continue;
            if (is_recv_slot(q, j)) in_use = true;
            else MPI_Request_free(&q->mpi[j]);
        }
    }
    for (int k = 0; k < c->comm.size; k++)
        if (c->ctl_send[k] != MPI_REQUEST_NULL) {
            in_use = true;  // MPI may still read the notice
            MPI_Request_free(&c->ctl_send[k]);
        }
    ctx_destroy(c, in_use);
    if (--g_live == 0) last_one_out();
}

static const td_comm_iface MPI_IFACE = {
    .name = "mpi",
    .post = mpi_post,    // headers (collectives) or the envelope (messages) posted; progress does the rest
    .wait = mpi_wait,    // progress + a short sleep until done or the deadline, which aborts
    .test = mpi_test,    // one progress pass, never blocks
    .abort = mpi_abort,  // fails what is running here, sends the notice to every peer
    .free = mpi_free,    // the departure notice, then cancels and settles what is pending
};

// Waits for an MPI request (a communicator duplication) until deadline_ms.
static int wait_until(MPI_Request *r, double deadline_ms) {
    const double t0 = now_ms();
    for (;;) {
        int flag = 0;
        int rc = MPI_Test(r, &flag, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS || flag) return rc;
        const double t = now_ms();
        if (t >= deadline_ms) return -1;
        nap(t - t0);
    }
}

td_status td_comm_mpi_create(td_comm **out, td_err *err) {
    *out = NULL;
    int inited = 0, finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "mpi: MPI was finalized in this process (the last MPI "
                          "communicator was freed); it cannot be started again");
    MPI_Initialized(&inited);
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
            return td_err_set(err, TD_ERR_IO, "mpi: MPI_Init_thread failed");
        g_we_init = true;
        // Errors come back as codes (the default aborts the job) on what this file duplicates.
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    int rank = 0, size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    mctx *c = calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "mpi: out of memory");
    for (int i = 0; i < CH_N; i++) c->ch[i] = MPI_COMM_NULL;
    c->piece = MPI_DATATYPE_NULL;
    // TANDEM_MPI_MAX_MSG (bytes): a test knob that makes small messages take the pieces path.
    c->max_msg = INT_MAX;
    const char *mm = getenv("TANDEM_MPI_MAX_MSG");
    if (mm && atol(mm) >= 16 && atol(mm) < INT_MAX) c->max_msg = (size_t)atol(mm);
    c->piece_bytes = c->max_msg < MIB ? c->max_msg : MIB;
    c->ctl_recv = MPI_REQUEST_NULL;
    const size_t per = 4 * (size_t)size;
    c->reqs = calloc(MPI_MAX_REQS, sizeof *c->reqs);
    MPI_Request *mpi = malloc(MPI_MAX_REQS * per * sizeof *mpi);
    int *who = malloc(MPI_MAX_REQS * per * sizeof *who);
    int64_t *hdr = calloc(MPI_MAX_REQS * (size_t)size * REC_WORDS, sizeof *hdr);
    c->ctl_send = malloc((size_t)size * sizeof *c->ctl_send);
    c->left_at = malloc((size_t)size * sizeof *c->left_at);
    if (!c->reqs || !mpi || !who || !hdr || !c->ctl_send || !c->left_at) {
        free(mpi);
        free(who);
        free(hdr);
        free(c->reqs);
        free(c->ctl_send);
        free(c->left_at);
        free(c);
        return td_err_set(err, TD_ERR_NOMEM, "mpi: out of memory for %d ranks", size);
    }
    for (int k = 0; k < size; k++) c->ctl_send[k] = MPI_REQUEST_NULL, c->left_at[k] = HERE;
    for (int i = MPI_MAX_REQS - 1; i >= 0; i--) {
        mreq *q = &c->reqs[i];
        q->base.comm = &c->comm;
        q->mpi = mpi + (size_t)i * per;
        q->who = who + (size_t)i * per;
        q->hdr = hdr + (size_t)i * size * REC_WORDS;
        q->next = c->free_reqs;
        c->free_reqs = q;
    }
    c->comm = (td_comm){.iface = &MPI_IFACE, .ctx = c, .rank = rank, .size = size,
                        .timeout_ms = TD_COMM_DEFAULT_TIMEOUT_MS};
    // The channels: non-blocking duplications, so a process that never comes is a timeout.
    const double deadline = now_ms() + TD_COMM_DEFAULT_TIMEOUT_MS;
    td_status st = TD_OK;
    for (int i = 0; i < CH_N && !st; i++) {
        MPI_Request r = MPI_REQUEST_NULL;
        int rc = MPI_Comm_idup(MPI_COMM_WORLD, &c->ch[i], &r);
        if (rc == MPI_SUCCESS) rc = wait_until(&r, deadline);
        if (rc == -1) {
            // The duplication stays pending in MPI (it cannot be cancelled): its handle is lost.
            c->ch[i] = MPI_COMM_NULL;
            st = td_err_set(err, TD_ERR_TIMEOUT, "mpi: rank %d: not every process of the %d created the communicator "
                            "within %d ms", rank, size, TD_COMM_DEFAULT_TIMEOUT_MS);
        } else if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            mpi_errstr(rc, s, sizeof s);
            c->ch[i] = MPI_COMM_NULL;
            st = td_err_set(err, TD_ERR_IO, "mpi: rank %d: MPI_Comm_idup: %s", rank, s);
        } else {
            MPI_Comm_set_errhandler(c->ch[i], MPI_ERRORS_RETURN);
        }
    }
    int *tag_ub = NULL, flag = 0;
    if (!st) {
        MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &tag_ub, &flag);
        const int ub = flag && tag_ub ? *tag_ub : TD_COMM_TAG_MAX;
        c->tag_range = (ub < TD_COMM_TAG_MAX ? TD_COMM_TAG_MAX : ub) / PHASES;
        if (MPI_Type_contiguous((int)c->piece_bytes, MPI_BYTE, &c->piece) != MPI_SUCCESS ||
            MPI_Type_commit(&c->piece) != MPI_SUCCESS)
            st = td_err_set(err, TD_ERR_IO, "mpi: rank %d: MPI_Type_contiguous failed", rank);
    }
    if (!st) {
        c->gen = ++g_gen;
        if (MPI_Irecv(&c->ctl_in, (int)sizeof c->ctl_in, MPI_BYTE, MPI_ANY_SOURCE, 0, c->ch[CH_CTL], &c->ctl_recv) !=
            MPI_SUCCESS)
            st = td_err_set(err, TD_ERR_IO, "mpi: rank %d: MPI_Irecv failed", rank);
    }
    if (st) {
        c->ctl_recv = MPI_REQUEST_NULL;
        ctx_destroy(c, false);
        return st;
    }
    g_live++;
    *out = &c->comm;
    return TD_OK;
}
