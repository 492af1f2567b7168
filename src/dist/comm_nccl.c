// The NCCL communicator (comm_nccl.h). Every operation is enqueued on this rank's stream and
// followed by an event; wait polls the event and ncclCommGetAsyncError against the deadline, and a
// missed deadline (or an asynchronous NCCL error) ends in ncclCommAbort. Reductions are
// deterministic as docs/dist.md requires: an all-to-all of blocks by grouped ncclSend/ncclRecv,
// a fold in rank order on this GPU (backend/cuda/fold.cu), then ncclAllGather (reduce-scatter
// stops before it); all-gather and broadcast are NCCL's own (pure data movement).
// Not here (documented in docs/backends.md): the cross-rank agreement on each collective's
// descriptor (a mismatch is a hang that the deadline turns into TD_ERR_TIMEOUT, not
// TD_ERR_INVALID); message envelopes (NCCL matches a pair's sends and receives in posting order
// whatever their tags, and a count mismatch is not detected); departure notices to peers.
// Temporaries come from cudaMallocAsync on the stream (the driver's pool), so operations allocate.
#include "dist/comm_nccl.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/kernels.h"

typedef struct nccl_ctx {
    td_comm comm;  // handed out
    int dev;
    ncclComm_t nc;
    cudaStream_t stream;
    int *barrier_buf;   // one device int for the barrier
    bool aborted;       // by this rank (abort, timeout, async error): every later call fails
    td_status abort_status;
    char abort_msg[TD_ERR_MSG_MAX];
    unsigned long n_coll;  // collectives posted, for messages
} nccl_ctx;

typedef struct nreq {
    td_comm_req base;
    cudaEvent_t done;
    void *tmp;  // stream-ordered temporary, freed when the request completes
    td_comm_desc d;
    unsigned long seq;
} nreq;

static const ncclDataType_t NCCL_TYPES[TD_COMM_DTYPE_N] = {ncclFloat32, ncclFloat64, ncclInt32, ncclInt64, ncclUint8};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void do_abort(nccl_ctx *c, td_status st, const char *fmt, const char *what) {
    if (c->aborted) return;
    c->aborted = true;
    c->abort_status = st;
    snprintf(c->abort_msg, sizeof c->abort_msg, fmt, c->comm.rank, what);
    ncclCommAbort(c->nc);  // peers' pending operations fail with a remote error
}

static td_status fail_nccl(nccl_ctx *c, ncclResult_t r, const char *what, td_err *err) {
    return td_err_set(err, r == ncclInvalidArgument || r == ncclInvalidUsage ? TD_ERR_INVALID : TD_ERR_IO,
                      "rank %d: %s: NCCL: %s", c->comm.rank, what, ncclGetErrorString(r));
}

#define NC(call)                                        \
    do {                                                \
        ncclResult_t r_ = (call);                       \
        if (r_ != ncclSuccess) {                        \
            st = fail_nccl(c, r_, what, err);           \
            goto fail;                                  \
        }                                               \
    } while (0)
#define CU(call)                                                                          \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            st = td_err_set(err, TD_ERR_IO, "rank %d: %s: CUDA: %s", c->comm.rank, what,  \
                            cudaGetErrorString(e_));                                      \
            goto fail;                                                                    \
        }                                                                                 \
    } while (0)

// Elements [k * blk, min(count, (k + 1) * blk)): block k of an all-reduce.
static size_t block_len(size_t count, size_t blk, int k) {
    const size_t lo = (size_t)k * blk;
    return lo >= count ? 0 : (count - lo < blk ? count - lo : blk);
}

// Every rank's block `rank` of the n_per x size layout at send (stride `stride` elements between
// blocks, `len` elements each) lands in stage[size][len], then is folded into out.
static td_status exchange_fold(nccl_ctx *c, const td_comm_desc *d, const char *what, size_t stride,
                               size_t (*len_of)(size_t, size_t, int), size_t per, char *stage, void *out,
                               td_err *err) {
    td_status st = TD_OK;
    const size_t es = td_comm_dtype_size(d->dtype);
    const ncclDataType_t t = NCCL_TYPES[d->dtype];
    const int n = c->comm.size, me = c->comm.rank;
    const size_t mine = len_of(d->count, per, me);
    NC(ncclGroupStart());
    for (int k = 0; k < n; k++) {
        const size_t lk = len_of(d->count, per, k);
        if (lk) {
            ncclResult_t r = ncclSend((const char *)d->send + (size_t)k * stride * es, lk, t, k, c->nc, c->stream);
            if (r != ncclSuccess) {
                ncclGroupEnd();
                return fail_nccl(c, r, what, err);
            }
        }
        if (mine) {
            ncclResult_t r = ncclRecv(stage + (size_t)k * mine * es, mine, t, k, c->nc, c->stream);
            if (r != ncclSuccess) {
                ncclGroupEnd();
                return fail_nccl(c, r, what, err);
            }
        }
    }
    NC(ncclGroupEnd());
    CU(tdc_fold((int)d->dtype, (int)d->op, stage, mine, n, out, c->stream));
    return TD_OK;
fail:
    return st;
}

static size_t rs_len(size_t count, size_t per, int k) {
    (void)per, (void)k;
    return count;
}

static td_status nccl_post(void *ctx, const td_comm_desc *d, td_comm_req **req, td_err *err) {
    nccl_ctx *c = ctx;
    *req = NULL;
    const char *what = td_comm_kind_name(d->kind);
    if (c->aborted) return td_err_set(err, c->abort_status == TD_ERR_TIMEOUT ? TD_ERR_IO : c->abort_status, "%s", c->abort_msg);
    td_status st = TD_OK;
    nreq *q = calloc(1, sizeof *q);
    if (!q) return td_err_set(err, TD_ERR_NOMEM, "rank %d: %s: out of memory", c->comm.rank, what);
    q->base.comm = &c->comm;
    q->d = *d;
    const bool coll = d->kind != TD_COMM_SEND && d->kind != TD_COMM_RECV;
    q->seq = coll ? ++c->n_coll : 0;
    CU(cudaSetDevice(c->dev));
    CU(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming));
    const size_t es = td_comm_dtype_size(d->dtype);
    const ncclDataType_t t = NCCL_TYPES[d->dtype];
    const int n = c->comm.size, me = c->comm.rank;
    switch (d->kind) {
    case TD_COMM_ALLREDUCE: {
        if (!d->count) break;
        const size_t blk = (d->count + n - 1) / n, mine = block_len(d->count, blk, me);
        // stage: [n][blk] received copies | [blk] this rank's folded block | [n][blk] gathered
        CU(cudaMallocAsync(&q->tmp, (2 * (size_t)n + 1) * blk * es, c->stream));
        char *stage = q->tmp, *own = stage + (size_t)n * blk * es, *all = own + blk * es;
        if ((st = exchange_fold(c, d, what, blk, block_len, blk, stage, own, err))) goto fail;
        if (mine < blk) CU(cudaMemsetAsync(own + mine * es, 0, (blk - mine) * es, c->stream));
        NC(ncclAllGather(own, all, blk, t, c->nc, c->stream));
        CU(cudaMemcpyAsync(d->recv, all, d->count * es, cudaMemcpyDeviceToDevice, c->stream));
        break;
    }
    case TD_COMM_REDUCE_SCATTER:
        if (!d->count) break;
        CU(cudaMallocAsync(&q->tmp, (size_t)n * d->count * es, c->stream));
        if ((st = exchange_fold(c, d, what, d->count, rs_len, d->count, q->tmp, d->recv, err))) goto fail;
        break;
    case TD_COMM_ALLGATHER:
        if (d->count) NC(ncclAllGather(d->send, d->recv, d->count, t, c->nc, c->stream));
        break;
    case TD_COMM_BROADCAST:
        if (d->count) NC(ncclBroadcast(d->recv, d->recv, d->count, t, d->peer, c->nc, c->stream));
        break;
    case TD_COMM_BARRIER:
        NC(ncclAllReduce(c->barrier_buf, c->barrier_buf, 1, ncclInt32, ncclSum, c->nc, c->stream));
        break;
    case TD_COMM_SEND:
        if (d->count) NC(ncclSend(d->send, d->count, t, d->peer, c->nc, c->stream));
        break;
    case TD_COMM_RECV:
        if (d->count) NC(ncclRecv(d->recv, d->count, t, d->peer, c->nc, c->stream));
        break;
    default:
        st = td_err_set(err, TD_ERR_INVALID, "rank %d: unknown operation %d", me, (int)d->kind);
        goto fail;
    }
    if (q->tmp) {  // released in stream order, after the operation
        CU(cudaFreeAsync(q->tmp, c->stream));
        q->tmp = NULL;
    }
    CU(cudaEventRecord(q->done, c->stream));
    *req = &q->base;
    return TD_OK;
fail:
    // Part of the operation may be queued already: the communicator cannot be trusted to match
    // the next collective, so a failure after enqueueing breaks it (as a timeout does).
    do_abort(c, TD_ERR_IO, "rank %d: communicator broken by a failed %s", what);
    if (q->tmp) cudaFreeAsync(q->tmp, c->stream);
    if (q->done) cudaEventDestroy(q->done);
    free(q);
    return st;
}

static void req_release(nreq *q) {
    cudaEventDestroy(q->done);
    free(q);
}

// One poll: 1 done, 0 pending, -1 failed (status in err).
static int poll_once(nccl_ctx *c, nreq *q, td_status *st, td_err *err) {
    const cudaError_t e = cudaEventQuery(q->done);
    if (e == cudaSuccess) return 1;
    if (e != cudaErrorNotReady) {
        *st = td_err_set(err, TD_ERR_IO, "rank %d: %s: CUDA: %s", c->comm.rank, td_comm_kind_name(q->d.kind),
                         cudaGetErrorString(e));
        return -1;
    }
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(c->nc, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
        do_abort(c, TD_ERR_IO, "rank %d: communicator failed during %s", td_comm_kind_name(q->d.kind));
        *st = td_err_set(err, TD_ERR_IO, "rank %d: %s: NCCL: %s (a peer aborted or failed)", c->comm.rank,
                         td_comm_kind_name(q->d.kind), ncclGetErrorString(async));
        return -1;
    }
    return 0;
}

static td_status nccl_wait(void *ctx, td_comm_req *req, int timeout_ms, td_err *err) {
    nccl_ctx *c = ctx;
    nreq *q = (nreq *)req;
    cudaSetDevice(c->dev);
    const double deadline = now_ms() + timeout_ms;
    td_status st = TD_OK;
    for (unsigned spin = 0;; spin++) {
        const int r = poll_once(c, q, &st, err);
        if (r) break;
        if (c->aborted) {
            st = td_err_set(err, TD_ERR_IO, "%s", c->abort_msg);
            break;
        }
        if (now_ms() > deadline) {
            char what[96];
            snprintf(what, sizeof what, "%s #%lu", td_comm_kind_name(q->d.kind), q->seq);
            do_abort(c, TD_ERR_TIMEOUT, "rank %d: communicator aborted after a timeout in %s", what);
            st = td_err_set(err, TD_ERR_TIMEOUT, "rank %d: %s: timed out after %d ms waiting for its peers",
                            c->comm.rank, what, timeout_ms);
            break;
        }
        if (spin > 1000) {  // past the first microseconds, poll every 50 us
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    req_release(q);
    return st;
}

static td_status nccl_test(void *ctx, td_comm_req *req, bool *done, td_err *err) {
    nccl_ctx *c = ctx;
    nreq *q = (nreq *)req;
    cudaSetDevice(c->dev);
    td_status st = TD_OK;
    const int r = poll_once(c, q, &st, err);
    if (r == 0 && c->aborted) {
        st = td_err_set(err, TD_ERR_IO, "%s", c->abort_msg);
        *done = true;
    } else {
        *done = r != 0;
    }
    if (*done) req_release(q);
    return st;
}

static void nccl_abort(void *ctx, td_status status, const char *reason) {
    nccl_ctx *c = ctx;
    do_abort(c, status, "rank %d: communicator aborted: %s", reason);
}

static void nccl_free(void *ctx) {
    nccl_ctx *c = ctx;
    if (!c) return;
    cudaSetDevice(c->dev);
    if (c->nc) {
        if (c->aborted) {
            // ncclCommAbort already released it
        } else {
            cudaStreamSynchronize(c->stream);
            ncclCommDestroy(c->nc);
        }
    }
    if (c->barrier_buf) cudaFree(c->barrier_buf);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c);
}

static const td_comm_iface nccl_iface = {
    .name = "nccl", .post = nccl_post, .wait = nccl_wait, .test = nccl_test, .abort = nccl_abort, .free = nccl_free};

td_status td_comm_nccl_create(td_comm *boot, int device, td_comm **out, td_err *err) {
    *out = NULL;
    const int rank = td_comm_rank(boot), size = td_comm_size(boot);
    int n_dev = 0;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    // Rank 0 makes the id; a failure there is sent as an all-zero id so no rank waits for NCCL.
    if (rank == 0 && (cudaGetDeviceCount(&n_dev) != cudaSuccess || ncclGetUniqueId(&id) != ncclSuccess)) {
        cudaGetLastError();
        memset(&id, 0, sizeof id);
    }
    td_status st = td_comm_broadcast(boot, &id, sizeof id, TD_COMM_U8, 0, err);
    if (st) return st;
    static const ncclUniqueId zero;
    if (!memcmp(&id, &zero, sizeof id))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "nccl: rank 0 could not make a NCCL id (no GPU or no NCCL)");
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || device < 0 || device >= n_dev) {
        cudaGetLastError();
        return td_err_set(err, TD_ERR_UNSUPPORTED, "nccl: rank %d: no CUDA device %d (%d found)", rank, device,
                          e == cudaSuccess ? n_dev : 0);
    }
    nccl_ctx *c = calloc(1, sizeof *c);
    if (!c) return td_err_set(err, TD_ERR_NOMEM, "nccl: out of memory");
    c->dev = device;
    c->comm = (td_comm){.iface = &nccl_iface, .ctx = c, .rank = rank, .size = size,
                        .timeout_ms = td_comm_timeout(boot)};
    if ((e = cudaSetDevice(device)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess ||
        (e = cudaMalloc((void **)&c->barrier_buf, sizeof(int))) != cudaSuccess ||
        (e = cudaMemset(c->barrier_buf, 0, sizeof(int))) != cudaSuccess) {
        cudaGetLastError();
        nccl_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "nccl: rank %d: device %d: %s", rank, device, cudaGetErrorString(e));
    }
    const ncclResult_t r = ncclCommInitRank(&c->nc, size, id, rank);
    if (r != ncclSuccess) {
        c->nc = NULL;
        nccl_free(c);
        return td_err_set(err, TD_ERR_UNSUPPORTED, "nccl: rank %d: ncclCommInitRank: %s", rank, ncclGetErrorString(r));
    }
    *out = &c->comm;
    return TD_OK;
}
