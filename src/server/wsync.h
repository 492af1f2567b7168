// Weight sync into a running server (docs/server.md, "Weight sync"): the staging area for one full
// set of weights in the wire dtype, allocated once; the session state machine (begin, buckets,
// commit, abort, idle expiry); the streaming parser of a bucket (one safetensors blob, from an
// HTTP body or a shared-memory file, written straight into staging while its XXH64 is computed);
// and the commit, which hands the staged tensors to the engine through a callback. Not here: HTTP
// (server.c routes requests to these calls), the engine (cmd_serve.c supplies the callbacks),
// the client (rl/push.h).
//
// Threads: every call but td_wsync_commit_run comes from the server's one MHD thread;
// td_wsync_commit_run runs on a thread of its own while the session is COMMITTING (buckets are
// then refused, so staging is only read). Shared fields are under a mutex.
#ifndef TD_SERVER_WSYNC_H
#define TD_SERVER_WSYNC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cjson/cJSON.h>
#include <xxhash.h>

#include "base/status.h"
#include "model/config.h"
#include "model/export.h"
#include "server/openai.h"
#include "server/srv_mem.h"
#include "tensor/dtype.h"

// The content checksum of a set of weights, independent of how they were bucketed: the sum mod
// 2^64 over every tensor of XXH64(name bytes, then the tensor's wire bytes; seed 0). The client
// (rl/push.c) computes the same over what it sends.
static inline uint64_t td_wsync_tensor_hash(const char *name, const void *bytes, size_t n) {
    XXH64_state_t *st = XXH64_createState();
    if (!st) return 0;
    XXH64_reset(st, 0);
    XXH64_update(st, name, strlen(name));
    XXH64_update(st, bytes, n);
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

// The engine as weight sync sees it (cmd_serve.c: td_eng_command). Both are called on the commit
// thread, never on the MHD thread.
typedef struct td_wsync_engine {
    void *ctx;
    // Replaces every weight, between two engine steps, from get/get_ctx (HF names, f32 values),
    // waiting at most timeout_ms; on success *version is the engine's new weights version.
    // TD_ERR_TIMEOUT: the update may still be running (and reading get_ctx) and may succeed.
    // typed: the same source's typed form (model/export.h), for types the engine stores as is.
    td_status (*apply)(void *ctx, td_export_get_fn get, td_export_get_typed_fn typed, void *get_ctx, int timeout_ms,
                       uint64_t *version, td_err *err);
    // Returns once every earlier apply has ended (timed out ones included), with the engine's
    // weights version; TD_ERR_TIMEOUT after timeout_ms.
    td_status (*fence)(void *ctx, int timeout_ms, uint64_t *version, td_err *err);
} td_wsync_engine;

typedef struct td_wsync_params {
    const td_model_config *cfg;  // the served model's config (its tensor list; copied)
    td_dtype dtype;              // wire and staging dtype: TD_F32 (default) or TD_BF16
    size_t max_bucket_bytes;     // one bucket's body, bytes (default 256 MiB)
    int session_timeout_s;       // a session with no traffic this long expires (default 60); also
                                 //   the deadline of the engine update at commit
    bool shm;                    // accept buckets by reference to a shared-memory file
                                 //   (td_wsync_bucket_open_shm; default false)
    td_wsync_engine engine;
} td_wsync_params;

td_wsync_params td_wsync_default_params(void);

typedef struct td_wsync td_wsync;

// Allocates the staging area (every tensor of cfg in dtype, once) and the bookkeeping. Errors:
// TD_ERR_INVALID (dtype, callbacks), TD_ERR_NOMEM naming the bytes. On failure *out is NULL.
td_status td_wsync_create(const td_wsync_params *p, td_wsync **out, td_err *err);
// Frees everything. No commit may be running (the server joins its commit thread first).
void td_wsync_free(td_wsync *ws);

size_t td_wsync_max_bucket_bytes(const td_wsync *ws);

// GET /v1/weights: {version, checksum (16 hex, or null before the first sync), dtype, tensors,
// bytes, max_bucket_bytes, syncing, shm (shared-memory buckets accepted)}. NULL when out of memory.
cJSON *td_wsync_info_json(td_wsync *ws);
// GET /v1/weights/tensors: {dtype, tensors: [{name, shape}]} in the order clients should send.
cJSON *td_wsync_tensors_json(td_wsync *ws);

// POST /v1/weights/begin with body {"n_buckets": K}: a new session, answered {session}. 409 while
// another live session exists. Returns NULL with *e set on failure.
cJSON *td_wsync_begin(td_wsync *ws, const char *body, size_t len, td_api_error *e);
// POST /v1/weights/abort?session=S: ends the session (nothing applied).
cJSON *td_wsync_abort(td_wsync *ws, const char *session, td_api_error *e);

// One bucket upload in progress (POST /v1/weights/bucket?session=S&index=i, the body a
// safetensors blob, header X-Tandem-Checksum: XXH64 of the body in hex). Opened when the request
// arrives (content_length: the Content-Length header's value, or -1 when chunked), fed with the
// body as it comes (written straight into staging), then closed. Any failure aborts the session:
// the error is kept and reported at close. The handle is owned by the request and ends with
// exactly one td_wsync_bucket_close or td_wsync_bucket_cancel.
typedef struct td_wsync_bucket td_wsync_bucket;
// NULL with *e set when the request is refused before any byte (no session, bad index or
// checksum header, too large); the session is then aborted too, except for an unknown session.
td_wsync_bucket *td_wsync_bucket_open(td_wsync *ws, const char *session, const char *index, const char *checksum,
                                      long long content_length, td_api_error *e);
void td_wsync_bucket_write(td_wsync_bucket *b, const void *data, size_t n);

// Same host: the request has no body; headers X-Tandem-Shm: PATH, X-Tandem-Shm-Offset and
// X-Tandem-Shm-Length (decimal bytes) say where the same safetensors blob lies. PATH must be
// TD_WSYNC_SHM_PREFIX followed by letters, digits, '-', '_', '.' (no '/'), a regular file long
// enough, opened without following links. The blob is read from a read-only mapping into staging
// and checked exactly as a body (checksum: its XXH64, as X-Tandem-Checksum); a bad reference or a
// file that shrinks meanwhile (SIGBUS, caught on this thread) fails the bucket, 400 naming
// X-Tandem-Shm, and aborts the session. Refused (400) unless params.shm. Returns what
// td_wsync_bucket_open does; a returned bucket has already been read (it may carry an error):
// close it as usual. The file stays mapped for the next bucket (see wsync.c).
#define TD_WSYNC_SHM_PREFIX "/dev/shm/tandem-"
td_wsync_bucket *td_wsync_bucket_open_shm(td_wsync *ws, const char *session, const char *index, const char *checksum,
                                          const char *path, const char *offset, const char *length,
                                          long long content_length, td_api_error *e);
// The body has ended: checks it (length, checksum) and records its tensors. Frees b. Returns the
// answer {received, tensors, bytes} or NULL with *e set.
cJSON *td_wsync_bucket_close(td_wsync_bucket *b, td_api_error *e);
// The upload did not end (client gone, server stopping): aborts the session and frees b.
void td_wsync_bucket_cancel(td_wsync_bucket *b);

// POST /v1/weights/commit?session=S, in two halves. commit_begin (MHD thread) checks that every
// bucket and every tensor arrived exactly once (400 naming the first missing tensor; the session
// is aborted) and moves the session to COMMITTING. commit_run (its own thread) applies the staged
// weights through the engine callback and ends the session either way: answer {version, checksum,
// seconds, bytes, ...} or NULL with *e set (500; 504 on the deadline).
bool td_wsync_commit_begin(td_wsync *ws, const char *session, td_api_error *e);
cJSON *td_wsync_commit_run(td_wsync *ws, td_api_error *e);

// Appends the tandem_weight* metrics (Prometheus text) with label model_name="lab" (escaped).
bool td_wsync_metrics_render(td_wsync *ws, const char *lab, td_srv_buf *out);

#endif
