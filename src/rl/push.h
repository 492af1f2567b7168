// The weight-sync client: pushes a full set of weights into a running `tandem serve
// --enable-weight-sync` over HTTP (libcurl), in checksummed safetensors buckets, and reads its
// weights version (protocol: docs/server.md, "Weight sync"). Used by the RL loop with the
// trainer's parameters as source, and by `tandem weights push`. Not here: the server side
// (server/wsync.h), reading checkpoints or models (the caller gives a td_export_get_fn).
//
// Every HTTP request, connect included, is bounded by timeout_ms: a dead or hung server is an
// error (TD_ERR_TIMEOUT or TD_ERR_IO, the message names the URL), never a hang. A pusher is not
// thread-safe: one push or query at a time per pusher.
#ifndef TD_RL_PUSH_H
#define TD_RL_PUSH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/status.h"
#include "model/config.h"
#include "model/export.h"
#include "tensor/dtype.h"

typedef struct td_pusher_params {
    const char *url;      // the server's base URL, e.g. "http://127.0.0.1:8000" (copied)
    const char *api_key;  // sent as "Authorization: Bearer <key>"; NULL or "": none (copied)
    size_t bucket_bytes;  // bytes of tensor data per bucket (default 64 MiB); whole tensors only,
                          //   so a tensor larger than this travels alone in its bucket
    int timeout_ms;       // limit of every request, connect included (default 60000)
    bool shm;             // same host: write buckets into a shared-memory file and send references
                          //   (X-Tandem-Shm) instead of bodies (default false; see td_pusher_push)
} td_pusher_params;

td_pusher_params td_pusher_default_params(void);

typedef struct td_pusher td_pusher;

// Allocates a libcurl handle. The first push allocates two bucket slots, each its largest bucket
// plus 1 MiB for the header: malloc'd buffers for bodies, or (shm) one file
// /dev/shm/tandem-push-PID-N-X of twice that, created 0600 and mapped read-write; a later push
// that needs more grows them once. td_pusher_free unmaps and removes the file. Errors:
// TD_ERR_INVALID (no URL, bad sizes), TD_ERR_NOMEM. On failure *out is NULL.
td_status td_pusher_create(const td_pusher_params *p, td_pusher **out, td_err *err);
void td_pusher_free(td_pusher *p);  // NULL is fine

// GET /v1/weights.
typedef struct td_push_info {
    uint64_t version;           // the server's weights version (0: the weights it started with)
    bool has_checksum;          // false before the first sync
    uint64_t checksum;          // content checksum of that version (see server/wsync.h)
    td_dtype dtype;             // TD_F32 or TD_BF16: what the server takes on the wire
    int n_tensors;
    uint64_t bytes;             // of all tensors in dtype
    uint64_t max_bucket_bytes;  // largest bucket body the server accepts
    bool syncing;               // a session is open
    bool shm;                   // the server takes shared-memory buckets (--weight-sync-shm)
} td_push_info;
td_status td_pusher_query(td_pusher *p, td_push_info *out, td_err *err);

typedef struct td_push_result {
    uint64_t version;         // the server's weights version after the push
    uint64_t checksum;        // content checksum of what was sent (the server's equals it)
    uint64_t bytes;           // bucket bytes sent
    int n_buckets;
    bool shm;                 // the buckets went through shared memory
    double seconds;           // the whole push, wall clock
    double bucket_seconds;    // of which: begin answered to the last bucket answered, wall clock
    double pack_seconds;      // summed time building buckets here (get, conversion, hashes)
    double transfer_seconds;  // summed time of the bucket requests (the server reads, checks and
                              //   stages each); it overlaps packing: a sender thread posts bucket
                              //   k while bucket k + 1 is packed, so bucket_seconds is about
                              //   max(pack, transfer) plus the first bucket's packing
    double commit_seconds;    // of seconds: the commit request
    double apply_seconds;     // of commit_seconds: the server's engine update
} td_push_result;

// Pushes every tensor of cfg (td_export_tensor_list order), each fetched once with get(ctx, ...),
// converted to the server's wire dtype: GET the dtype and tensor list (a different model is
// TD_ERR_INVALID naming the first differing tensor, before anything is sent), begin a session,
// send the buckets, commit, and check that the server's checksum equals the one computed here
// (TD_ERR_IO otherwise). On any failure after begin the session is aborted (best effort) and the
// server keeps its weights, except after a commit that timed out here: the server may still apply
// it (td_pusher_query tells). Statuses: the source's own error; TD_ERR_TIMEOUT; TD_ERR_IO
// (connection, HTTP errors: the message carries the server's); TD_ERR_LIMIT (409: another
// session is open; 503); TD_ERR_NOMEM. res may be NULL.
// With params.shm: when GET /v1/weights says the server takes no shared-memory buckets, or it
// refuses a reference (HTTP 400 naming X-Tandem-Shm: another host, another user, the
// file unreadable), a warning is logged and the push is made again with HTTP bodies.
td_status td_pusher_push(td_pusher *p, const td_model_config *cfg, td_export_get_fn get, void *ctx,
                         td_push_result *res, td_err *err);
// The same with the source's typed form (model/export.h), asked first for each tensor in the
// wire dtype: a source that holds bf16 (a bf16 model) or converts its f32 straight into the bucket
// saves the f32 copy (one pass over 4 bytes a value); TD_ERR_UNSUPPORTED from it falls back to get.
td_status td_pusher_push_typed(td_pusher *p, const td_model_config *cfg, td_export_get_fn get,
                               td_export_get_typed_fn typed, void *ctx, td_push_result *res, td_err *err);

#endif
