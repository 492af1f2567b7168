// The implementation-generic half of comm.h: argument checks (types, ranges, overflow, alignment,
// the in-place rules), blocking calls as post + wait under the communicator's deadline, and the
// name tables. Nothing here knows a particular implementation; comm_local.c is one table.
#include "dist/comm.h"

#include <math.h>
#include <stdint.h>

static const char *const KIND_NAMES[TD_COMM_KIND_N] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                                       "barrier",   "send",           "recv"};
static const char *const DTYPE_NAMES[TD_COMM_DTYPE_N] = {"f32", "f64", "i32", "i64", "u8"};
static const size_t DTYPE_SIZES[TD_COMM_DTYPE_N] = {4, 8, 4, 8, 1};
static const char *const OP_NAMES[TD_COMM_OP_N] = {"sum", "max", "min"};

const char *td_comm_kind_name(td_comm_kind k) { return (unsigned)k < TD_COMM_KIND_N ? KIND_NAMES[k] : "?"; }
const char *td_comm_dtype_name(td_comm_dtype t) { return (unsigned)t < TD_COMM_DTYPE_N ? DTYPE_NAMES[t] : "?"; }
const char *td_comm_op_name(td_comm_op op) { return (unsigned)op < TD_COMM_OP_N ? OP_NAMES[op] : "?"; }
size_t td_comm_dtype_size(td_comm_dtype t) { return (unsigned)t < TD_COMM_DTYPE_N ? DTYPE_SIZES[t] : 0; }

const char *td_comm_name(const td_comm *c) { return c->iface->name; }
int td_comm_timeout(const td_comm *c) { return c->timeout_ms; }
void td_comm_set_timeout(td_comm *c, int timeout_ms) {
    TD_ASSERT(timeout_ms > 0);
    c->timeout_ms = timeout_ms;
}

void td_comm_free(td_comm *c) {
    if (c) c->iface->free(c->ctx);
}

void td_comm_abort(td_comm *c, const char *reason) {
    c->iface->abort(c->ctx, TD_ERR_IO, reason ? reason : "(no reason)");
}

// [a, a + na) and [b, b + nb) share a byte.
static bool overlaps(const void *a, size_t na, const void *b, size_t nb) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return na && nb && x < y + nb && y < x + na;
}

// Checks one buffer of n elements of es bytes: present when n > 0, aligned to its element.
static td_status check_buf(const char *what, const char *name, const void *p, size_t n, size_t es, td_err *err) {
    if (n == 0) return TD_OK;
    if (!p) return td_err_set(err, TD_ERR_INVALID, "%s: %s is NULL with %zu elements", what, name, n);
    if ((uintptr_t)p % es)
        return td_err_set(err, TD_ERR_INVALID, "%s: %s %p is not aligned to its %zu-byte elements", what, name, p, es);
    return TD_OK;
}

// Checks d against the rules of comm.h, then posts it.
static td_status post(td_comm *c, const td_comm_desc *d, td_comm_req **req, td_err *err) {
    TD_ASSERT(c && req);
    *req = NULL;
    const char *what = td_comm_kind_name(d->kind);
    const size_t es = td_comm_dtype_size(d->dtype);
    if (!es) return td_err_set(err, TD_ERR_INVALID, "%s: unknown element type %d", what, (int)d->dtype);
    if ((unsigned)d->op >= TD_COMM_OP_N)
        return td_err_set(err, TD_ERR_INVALID, "%s: unknown reduction %d", what, (int)d->op);
    const size_t n = (size_t)c->size;
    // Elements in the send and receive buffers.
    size_t n_send = d->count, n_recv = d->count;
    if (d->kind == TD_COMM_REDUCE_SCATTER || d->kind == TD_COMM_ALLGATHER) {
        if (d->count > SIZE_MAX / es / n)
            return td_err_set(err, TD_ERR_INVALID, "%s: %zu elements per rank x %d ranks overflow", what, d->count,
                              c->size);
        if (d->kind == TD_COMM_REDUCE_SCATTER) n_send = d->count * n;
        else n_recv = d->count * n;
    } else if (d->count > SIZE_MAX / es) {
        return td_err_set(err, TD_ERR_INVALID, "%s: %zu elements overflow", what, d->count);
    }
    td_status st = TD_OK;
    switch (d->kind) {
    case TD_COMM_ALLREDUCE:
    case TD_COMM_REDUCE_SCATTER:
    case TD_COMM_ALLGATHER:
        if ((st = check_buf(what, "send buffer", d->send, n_send, es, err))) return st;
        if ((st = check_buf(what, "receive buffer", d->recv, n_recv, es, err))) return st;
        if (n_send && n_recv) {
            // The one in-place layout each allows; any other overlap is an error.
            const size_t own = (size_t)c->rank * d->count * es;  // bytes before this rank's block
            const char *s = d->send, *r = d->recv;
            bool ok = d->kind == TD_COMM_ALLREDUCE        ? r == s
                      : d->kind == TD_COMM_REDUCE_SCATTER ? r == s + own
                                                          : s == r + own;
            if (!ok && overlaps(d->send, n_send * es, d->recv, n_recv * es))
                return td_err_set(err, TD_ERR_INVALID,
                                  "%s: send and receive buffers overlap (in place is %s only)", what,
                                  d->kind == TD_COMM_ALLREDUCE        ? "send == recv"
                                  : d->kind == TD_COMM_REDUCE_SCATTER ? "recv == send + rank * count"
                                                                      : "send == recv + rank * count");
        }
        break;
    case TD_COMM_BROADCAST:
        if (d->peer < 0 || d->peer >= c->size)
            return td_err_set(err, TD_ERR_INVALID, "%s: root %d is not a rank of %d", what, d->peer, c->size);
        if ((st = check_buf(what, "buffer", d->recv, d->count, es, err))) return st;
        break;
    case TD_COMM_BARRIER:
        break;
    case TD_COMM_SEND:
    case TD_COMM_RECV:
        if (d->peer < 0 || d->peer >= c->size)
            return td_err_set(err, TD_ERR_INVALID, "%s: rank %d is not a rank of %d", what, d->peer, c->size);
        if (d->tag < 0 || d->tag > TD_COMM_TAG_MAX)
            return td_err_set(err, TD_ERR_INVALID, "%s: tag %d is outside 0..%d", what, d->tag, TD_COMM_TAG_MAX);
        if ((st = check_buf(what, "buffer", d->kind == TD_COMM_SEND ? d->send : d->recv, d->count, es, err)))
            return st;
        break;
    default:
        return td_err_set(err, TD_ERR_INVALID, "unknown operation %d", (int)d->kind);
    }
    st = c->iface->post(c->ctx, d, req, err);
    TD_ASSERT((st == TD_OK) == (*req != NULL));
    return st;
}

static td_status post_wait(td_comm *c, const td_comm_desc *d, td_err *err) {
    td_comm_req *req;
    td_status st = post(c, d, &req, err);
    return st ? st : c->iface->wait(c->ctx, req, c->timeout_ms, err);
}

td_status td_comm_wait(td_comm_req *req, int timeout_ms, td_err *err) {
    if (!req) return TD_OK;
    td_comm *c = req->comm;
    return c->iface->wait(c->ctx, req, timeout_ms > 0 ? timeout_ms : c->timeout_ms, err);
}

td_status td_comm_test(td_comm_req *req, bool *done, td_err *err) {
    if (!req) {
        *done = true;
        return TD_OK;
    }
    td_comm *c = req->comm;
    return c->iface->test(c->ctx, req, done, err);
}

// ---- descriptors

#define DESC(k, s, r, n, t, o, p, g) \
    (td_comm_desc) {                                                                                     \
        .kind = (k), .send = (s), .recv = (r), .count = (n), .dtype = (t), .op = (o), .peer = (p), .tag = (g) \
    }

td_status td_comm_iallreduce(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                             td_comm_op op, td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_ALLREDUCE, send, recv, count, dtype, op, -1, 0), req, err);
}
td_status td_comm_ireduce_scatter(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                                  td_comm_op op, td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_REDUCE_SCATTER, send, recv, count, dtype, op, -1, 0), req, err);
}
td_status td_comm_iallgather(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                             td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_ALLGATHER, send, recv, count, dtype, TD_COMM_SUM, -1, 0), req, err);
}
td_status td_comm_ibroadcast(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int root,
                             td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_BROADCAST, buf, buf, count, dtype, TD_COMM_SUM, root, 0), req, err);
}
td_status td_comm_ibarrier(td_comm *c, td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_BARRIER, NULL, NULL, 0, TD_COMM_U8, TD_COMM_SUM, -1, 0), req, err);
}
td_status td_comm_isend(td_comm *c, const void *buf, size_t count, td_comm_dtype dtype, int dst, int tag,
                        td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_SEND, buf, NULL, count, dtype, TD_COMM_SUM, dst, tag), req, err);
}
td_status td_comm_irecv(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int src, int tag,
                        td_comm_req **req, td_err *err) {
    return post(c, &DESC(TD_COMM_RECV, NULL, buf, count, dtype, TD_COMM_SUM, src, tag), req, err);
}

td_status td_comm_allreduce(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                            td_comm_op op, td_err *err) {
    return post_wait(c, &DESC(TD_COMM_ALLREDUCE, send, recv, count, dtype, op, -1, 0), err);
}
td_status td_comm_reduce_scatter(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                                 td_comm_op op, td_err *err) {
    return post_wait(c, &DESC(TD_COMM_REDUCE_SCATTER, send, recv, count, dtype, op, -1, 0), err);
}
td_status td_comm_allgather(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                            td_err *err) {
    return post_wait(c, &DESC(TD_COMM_ALLGATHER, send, recv, count, dtype, TD_COMM_SUM, -1, 0), err);
}
td_status td_comm_broadcast(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int root, td_err *err) {
    return post_wait(c, &DESC(TD_COMM_BROADCAST, buf, buf, count, dtype, TD_COMM_SUM, root, 0), err);
}
td_status td_comm_barrier(td_comm *c, td_err *err) {
    return post_wait(c, &DESC(TD_COMM_BARRIER, NULL, NULL, 0, TD_COMM_U8, TD_COMM_SUM, -1, 0), err);
}
td_status td_comm_send(td_comm *c, const void *buf, size_t count, td_comm_dtype dtype, int dst, int tag,
                       td_err *err) {
    return post_wait(c, &DESC(TD_COMM_SEND, buf, NULL, count, dtype, TD_COMM_SUM, dst, tag), err);
}
td_status td_comm_recv(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int src, int tag, td_err *err) {
    return post_wait(c, &DESC(TD_COMM_RECV, NULL, buf, count, dtype, TD_COMM_SUM, src, tag), err);
}

// The one reduction arithmetic every implementation folds with (comm.h's determinism contract).
void td_comm_fold(td_comm_dtype t, td_comm_op op, void *acc, const void *src, size_t n) {
// a[i] = a[i] op b[i]; MAX and MIN take b[i] when TAKE(b[i], a[i]) says so.
#define RED(T, SUM, TAKE_MAX, TAKE_MIN)                                             \
    do {                                                                            \
        T *a = acc;                                                                 \
        const T *b = src;                                                           \
        if (op == TD_COMM_SUM)                                                      \
            for (size_t i = 0; i < n; i++) a[i] = SUM(a[i], b[i]);                  \
        else if (op == TD_COMM_MAX)                                                 \
            for (size_t i = 0; i < n; i++) a[i] = TAKE_MAX(b[i], a[i]) ? b[i] : a[i]; \
        else                                                                        \
            for (size_t i = 0; i < n; i++) a[i] = TAKE_MIN(b[i], a[i]) ? b[i] : a[i]; \
    } while (0)
#define ADD(x, y) ((x) + (y))
#define ADD_U32(x, y) ((int32_t)((uint32_t)(x) + (uint32_t)(y)))  // wraps, no signed overflow
#define ADD_U64(x, y) ((int64_t)((uint64_t)(x) + (uint64_t)(y)))
#define ADD_U8(x, y) ((uint8_t)((x) + (y)))
#define GT(x, y) ((x) > (y))
#define LT(x, y) ((x) < (y))
// Floats: a NaN is taken and then kept, so any rank's NaN reaches the result.
#define GT_F(x, y) (!isnan(y) && (isnan(x) || (x) > (y)))
#define LT_F(x, y) (!isnan(y) && (isnan(x) || (x) < (y)))
    switch (t) {
    case TD_COMM_F32: RED(float, ADD, GT_F, LT_F); break;
    case TD_COMM_F64: RED(double, ADD, GT_F, LT_F); break;
    case TD_COMM_I32: RED(int32_t, ADD_U32, GT, LT); break;
    case TD_COMM_I64: RED(int64_t, ADD_U64, GT, LT); break;
    case TD_COMM_U8: RED(uint8_t, ADD_U8, GT, LT); break;
    default: TD_ASSERT(0);
    }
#undef RED
#undef ADD
#undef ADD_U32
#undef ADD_U64
#undef ADD_U8
#undef GT
#undef LT
#undef GT_F
#undef LT_F
}
