// The communicator interface: collectives (all-reduce, reduce-scatter, all-gather, broadcast,
// barrier) and tagged point-to-point messages among the `size` ranks of a group, blocking and
// non-blocking, every wait bounded by a deadline. A communicator is a table of function pointers
// plus a context (the house pattern of backend.h); comm_local.c is the in-process implementation
// (one rank per thread) that the MPI and NCCL ones are tested against. Stands on base/ only, so
// model/ and train/ can use it. Not here: communicator splitting, any-source receives, sharding
// policy (the callers own their layouts). docs/dist.md has the whole contract.
#ifndef TD_DIST_COMM_H
#define TD_DIST_COMM_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

// Element types. Integer sums wrap (two's complement, as in MPI and NCCL); u8 is also the type
// for moving raw bytes.
typedef enum td_comm_dtype {
    TD_COMM_F32 = 0,
    TD_COMM_F64,
    TD_COMM_I32,
    TD_COMM_I64,
    TD_COMM_U8,
    TD_COMM_DTYPE_N,
} td_comm_dtype;

// Reductions. MAX and MIN propagate NaN (any rank's NaN gives NaN at that element).
typedef enum td_comm_op {
    TD_COMM_SUM = 0,
    TD_COMM_MAX,
    TD_COMM_MIN,
    TD_COMM_OP_N,
} td_comm_op;

// What an implementation is asked to do. The wrappers below fill it and have checked it (ranges,
// overflow, buffers, in-place rules) before a slot sees it.
typedef enum td_comm_kind {
    TD_COMM_ALLREDUCE = 0,
    TD_COMM_REDUCE_SCATTER,
    TD_COMM_ALLGATHER,
    TD_COMM_BROADCAST,
    TD_COMM_BARRIER,
    TD_COMM_SEND,
    TD_COMM_RECV,
    TD_COMM_KIND_N,
} td_comm_kind;

enum {
    TD_COMM_TAG_MAX = 32767,                // tags are 0..TAG_MAX (MPI guarantees MPI_TAG_UB >= 32767)
    TD_COMM_DEFAULT_TIMEOUT_MS = 300000,    // a new communicator's deadline: 5 minutes
};

typedef struct td_comm_desc {
    td_comm_kind kind;
    td_comm_dtype dtype;
    td_comm_op op;      // ALLREDUCE and REDUCE_SCATTER; TD_COMM_SUM otherwise
    size_t count;       // elements: all-reduce and broadcast: the whole buffer; reduce-scatter: received
                        // per rank; all-gather: sent per rank; send/recv: the message; barrier: 0
    const void *send;   // broadcast: the buffer (same as recv); recv, barrier: NULL
    void *recv;         // send, barrier: NULL
    int peer;           // broadcast: the root; send: the destination; recv: the source; else -1
    int tag;            // send/recv; else 0
} td_comm_desc;

typedef struct td_comm td_comm;
// A pending operation. Owned by the implementation from the i-call that returns it until
// td_comm_wait returns or td_comm_test reports it done: then it is released and the handle is
// invalid. Until then the buffers it names must stay valid and (receive buffers) unread.
typedef struct td_comm_req td_comm_req;

// ---- For implementations. A slot receives the context of the td_comm it was called on.
typedef struct td_comm_iface {
    const char *name;
    // Starts d on this rank. On TD_OK *req is pending (never NULL). On failure *req is NULL,
    // nothing is pending and no buffer was touched; the status says whether the communicator is
    // still usable (see "Errors" below).
    td_status (*post)(void *ctx, const td_comm_desc *d, td_comm_req **req, td_err *err);
    // Waits for req up to timeout_ms (> 0) for its peers, then releases it and returns its status.
    // A missed deadline aborts the communicator (TD_ERR_TIMEOUT naming the missing ranks).
    td_status (*wait)(void *ctx, td_comm_req *req, int timeout_ms, td_err *err);
    // Never blocks on a peer: *done false leaves req pending; *done true releases it as wait does.
    td_status (*test)(void *ctx, td_comm_req *req, bool *done, td_err *err);
    // Breaks the communicator for every rank: their pending and later operations fail with
    // status and a message naming this rank and reason. Returns at once; idempotent.
    void (*abort)(void *ctx, td_status status, const char *reason);
    // Releases this rank: its pending requests are failed and released (after any data movement
    // already under way has finished), and peers' operations that need this rank fail.
    void (*free)(void *ctx);
} td_comm_iface;

// acc[i] = acc[i] op src[i] for i < n in the element type (integer sums wrap; MAX/MIN keep any
// NaN): the arithmetic of every reduction, which implementations apply in rank order so that the
// in-process, MPI and other implementations give the same bits.
void td_comm_fold(td_comm_dtype t, td_comm_op op, void *acc, const void *src, size_t n);

struct td_comm {
    const td_comm_iface *iface;
    void *ctx;        // the implementation's, for this rank
    int rank, size;   // 0 <= rank < size
    int timeout_ms;   // deadline of blocking calls and default waits (td_comm_set_timeout)
};

// Every implementation's request starts with this, so td_comm_wait(req) finds its communicator.
struct td_comm_req {
    td_comm *comm;
};

// ---- Constructors. One td_comm is one rank: use it from one thread at a time (different ranks'
// communicators from different threads at once). The caller frees each with td_comm_free.

// size communicators (1 <= size <= 1024) sharing one context, one per rank, for size threads of
// this process: comms[r] is rank r. Everything is allocated here (no operation allocates). On
// failure every comms[r] is NULL. The shared context lives until the last rank is freed.
td_status td_comm_local_create(int size, td_comm **comms, td_err *err);
// A size-1 communicator (the local implementation with one rank): collectives are copies,
// messages to self match as between ranks.
td_status td_comm_self_create(td_comm **out, td_err *err);

// Releases this rank (NULL is fine). Its own pending requests are failed and released. Freeing
// is the end of this rank for the group: peers' pending and later collectives, and their messages
// to or from this rank, fail with TD_ERR_IO naming it (call td_comm_barrier first when peers
// still need it). Operations among the other ranks continue.
void td_comm_free(td_comm *c);

const char *td_comm_name(const td_comm *c);
static inline int td_comm_rank(const td_comm *c) { return c->rank; }
static inline int td_comm_size(const td_comm *c) { return c->size; }
// Deadline (ms > 0) for this rank's blocking calls and for waits given no timeout of their own.
void td_comm_set_timeout(td_comm *c, int timeout_ms);
int td_comm_timeout(const td_comm *c);

const char *td_comm_dtype_name(td_comm_dtype t);
const char *td_comm_op_name(td_comm_op op);
const char *td_comm_kind_name(td_comm_kind k);
size_t td_comm_dtype_size(td_comm_dtype t);  // bytes per element; 0 for an invalid type

// ---- Operations. Collectives are matched by their order on each rank: the n-th collective
// called on every rank is one operation, and all ranks must call it with the same kind, count,
// dtype, op and root. Messages match by (source, destination, tag) in posting order (no
// overtaking); the receive's count and dtype must equal the send's.
//
// Results are deterministic: a reduction at every element is ((x_0 op x_1) op x_2) ... op x_{n-1}
// in rank order, evaluated in the element type, whatever the thread or network timing, so the
// same inputs give the same bits on every run and every rank.
//
// In place (the MPI_IN_PLACE cases) is allowed exactly as noted per call; otherwise a call's
// buffers must not overlap, and no two ranks' buffers may overlap.
//
// Errors: every call returns a status and, on failure, writes a message naming the operation
// and the rank(s) involved into err (which may be NULL).
//   TD_ERR_INVALID  a bad argument on this rank (checked before anything is posted: nothing
//                   happened, the communicator is usable; peers of a collective will time out
//                   unless this rank calls it again correctly), or a mismatch between ranks
//                   (reported on every rank of the collective, or on both ends of a message; the
//                   operation was not performed, receive buffers untouched, still usable).
//   TD_ERR_LIMIT    this rank has too many requests pending (the local implementation: 128); nothing
//                   was posted, still usable.
//   TD_ERR_TIMEOUT  a peer did not arrive before the deadline; this rank has aborted the
//                   communicator, and every rank's pending and later operations fail.
//   TD_ERR_IO       a peer aborted the communicator (td_comm_abort): as after a timeout, every
//                   operation fails; or a peer left (td_comm_free): the collectives it had not
//                   completed and all later ones fail (those it completed still finish: it did
//                   its part), and so do messages to or from that rank, while messages among the
//                   others flow.
// After TIMEOUT or IO the contents of receive buffers of failed operations are unspecified, and a
// transport may still be using those buffers until td_comm_free returns (the local one never
// is). Once aborted, the only useful call left is td_comm_free (others fail at once).

// recv[i] = send_0[i] op send_1[i] op ... for i < count, on every rank. In place: send == recv.
td_status td_comm_allreduce(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                            td_comm_op op, td_err *err);
// Each rank sends size * count elements (size blocks of count) and receives block `rank` of the
// reduction: recv[i] = op over ranks k of send_k[rank * count + i], i < count (NCCL's
// reduceScatter, MPI_Reduce_scatter_block). In place: recv == send + rank * count elements.
td_status td_comm_reduce_scatter(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                                 td_comm_op op, td_err *err);
// Each rank sends count elements; every rank receives size * count: block k is rank k's send.
// In place: send == recv + rank * count elements.
td_status td_comm_allgather(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                            td_err *err);
// buf (count elements) of rank root is copied into buf of every other rank (one buffer: read on
// the root, written elsewhere).
td_status td_comm_broadcast(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int root, td_err *err);
// Returns when every rank has called it.
td_status td_comm_barrier(td_comm *c, td_err *err);
// A message of count elements to rank dst (may be this rank). Synchronous: td_comm_send
// returns when the matching receive has the data (use td_comm_isend to send ahead of receives).
td_status td_comm_send(td_comm *c, const void *buf, size_t count, td_comm_dtype dtype, int dst, int tag,
                       td_err *err);
td_status td_comm_recv(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int src, int tag, td_err *err);

// Non-blocking forms: the same arguments and rules, plus *req, the pending operation (NULL after
// a failed call). Posting never waits on a peer, except that the local implementation lets a
// rank run at most 16 collectives ahead of the slowest rank (beyond that posting waits, bounded
// by the communicator's deadline). Collectives still match in calling order, whatever order
// their requests are waited in.
td_status td_comm_iallreduce(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                             td_comm_op op, td_comm_req **req, td_err *err);
td_status td_comm_ireduce_scatter(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                                  td_comm_op op, td_comm_req **req, td_err *err);
td_status td_comm_iallgather(td_comm *c, const void *send, void *recv, size_t count, td_comm_dtype dtype,
                             td_comm_req **req, td_err *err);
td_status td_comm_ibroadcast(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int root,
                             td_comm_req **req, td_err *err);
td_status td_comm_ibarrier(td_comm *c, td_comm_req **req, td_err *err);
td_status td_comm_isend(td_comm *c, const void *buf, size_t count, td_comm_dtype dtype, int dst, int tag,
                        td_comm_req **req, td_err *err);
td_status td_comm_irecv(td_comm *c, void *buf, size_t count, td_comm_dtype dtype, int src, int tag,
                        td_comm_req **req, td_err *err);

// Waits for req and releases it, returning the operation's status. timeout_ms > 0 bounds the wait
// for peers; <= 0 uses the communicator's deadline. Data movement already under way (every peer
// has arrived) is finished, not cut off by the deadline. req NULL: TD_OK.
td_status td_comm_wait(td_comm_req *req, int timeout_ms, td_err *err);
// Never waits on a peer (and has no deadline): *done false leaves req pending and returns TD_OK;
// *done true releases req and returns the operation's status, as td_comm_wait would.
td_status td_comm_test(td_comm_req *req, bool *done, td_err *err);

// Breaks the communicator for every rank: all pending and later operations of every rank fail
// with TD_ERR_IO and a message naming this rank and reason (within bounded time: no peer waits
// for its deadline). This rank's own requests must still be waited (they fail) or are released
// by td_comm_free.
void td_comm_abort(td_comm *c, const char *reason);

#endif
