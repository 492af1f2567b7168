// Weight sync state (see wsync.h): one staging area in the wire dtype, carved per tensor at
// create; at most one session; buckets parsed as they stream in (8-byte header length, JSON
// header, then the data copied straight to each tensor's place in staging and hashed there), or
// read the same way from a shared-memory mapping (same host). A tensor counts only
// once its bucket closed with a good checksum, so a bad bucket leaves nothing usable: the session
// is aborted and the engine keeps its weights.
#include "server/wsync.h"

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <errno.h>

#include "base/log.h"

#define HDR_FIXED_CAP (1u << 20)  // bytes of safetensors header allowed beyond 256 per tensor
#define LAND_CHUNK (128u << 10)    // bytes copied into staging before they are hashed (stay in L2)

static const double sync_buckets[] = {0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0};
#define N_SYNC_BUCKETS ((int)(sizeof sync_buckets / sizeof sync_buckets[0]))

typedef struct wt {
    char name[128];
    int ndim;
    int64_t shape[2];
    int64_t nelem;
    size_t off, bytes;  // in staging
} wt;

enum { S_IDLE, S_ACTIVE, S_COMMITTING };
enum { T_NONE, T_ARRIVING, T_RECEIVED };  // per tensor and per bucket index, in a session

struct td_wsync {
    td_wsync_params p;
    td_model_config cfg;
    wt *t;  // [nt]
    int nt;
    size_t elsize;  // bytes per element on the wire
    size_t total;   // bytes of staging
    uint8_t *staging;
    size_t hdr_cap;
    // The last shared-memory file a bucket referenced, mapped read-only and kept mapped between
    // buckets and sessions (mapping 1 GB costs ~0.1 s of page-table work); MHD thread only. fd
    // stays open so the inode cannot be reused while it is cached; dropped at a begin once the
    // client removed the file, when another file is referenced, and at free.
    struct { int fd; uint8_t *map; size_t len; } shm;
    bool fault_shm_size;  // TANDEM_WSYNC_FAULT=shm-size (tests): skip the file-size check, so a
                          //   file cut after it was mapped reaches the SIGBUS path

    pthread_mutex_t mu;  // everything below
    int state;
    char sid[33];
    uint64_t gen;  // +1 per session end: open buckets of an ended session stop writing
    double t_begin, t_last;
    int n_buckets;
    uint8_t *tstate;   // [nt]
    uint64_t *thash;   // [nt] content hash of each received tensor
    uint8_t *bstate;   // [nt] per bucket index (n_buckets <= nt)
    int n_open;        // bucket uploads of this session not yet closed
    uint64_t sess_bytes;  // body bytes of the session's good buckets
    int sess_shm;         // of them, buckets read from shared memory
    uint64_t commit_sum;
    char end_reason[300];  // why the last session ended (for a late bucket of it)
    char last_sid[33];

    uint64_t version;      // the engine's weights version as last seen
    bool has_checksum;
    uint64_t checksum, checksum_version;
    bool fence_needed;     // an apply timed out: it may still read staging
    int get_hint;          // next tensor index the engine likely asks for

    uint64_t n_ok, n_failed, bytes_total;
    uint64_t hist[N_SYNC_BUCKETS + 1], hist_count;
    double hist_sum, last_seconds, last_apply_seconds, last_transfer_seconds;
};

td_wsync_params td_wsync_default_params(void) {
    return (td_wsync_params){
        .cfg = NULL, .dtype = TD_F32, .max_bucket_bytes = 256u << 20, .session_timeout_s = 60, .shm = false};
}

static const char *wire_name(td_dtype t) { return t == TD_BF16 ? "BF16" : "F32"; }

static int find_tensor(const td_wsync *ws, const char *name, int hint) {
    if (hint >= 0 && hint < ws->nt && !strcmp(ws->t[hint].name, name)) return hint;
    for (int i = 0; i < ws->nt; i++)
        if (!strcmp(ws->t[i].name, name)) return i;
    return -1;
}

td_status td_wsync_create(const td_wsync_params *p, td_wsync **out, td_err *err) {
    *out = NULL;
    if (!p || !p->cfg) return td_err_set(err, TD_ERR_INVALID, "weight sync: no model config");
    if (p->dtype != TD_F32 && p->dtype != TD_BF16)
        return td_err_set(err, TD_ERR_INVALID, "weight sync: the wire dtype must be f32 or bf16, not %s",
                          td_dtype_name(p->dtype));
    if (!p->engine.apply || !p->engine.fence)
        return td_err_set(err, TD_ERR_INVALID, "weight sync: no engine callbacks");
    if (p->max_bucket_bytes < 1024 || p->session_timeout_s <= 0)
        return td_err_set(err, TD_ERR_INVALID, "weight sync: bad limits (bucket %zu bytes, timeout %d s)",
                          p->max_bucket_bytes, p->session_timeout_s);
    td_wsync *ws = calloc(1, sizeof *ws);
    if (!ws) return td_err_set(err, TD_ERR_NOMEM, "weight sync: out of memory");
    ws->p = *p;
    ws->cfg = *p->cfg;
    ws->p.cfg = &ws->cfg;
    ws->elsize = p->dtype == TD_BF16 ? 2 : 4;
    int nt = td_export_tensor_list(&ws->cfg, NULL, 0);
    td_export_tensor *list = nt > 0 ? calloc((size_t)nt, sizeof *list) : NULL;
    ws->t = nt > 0 ? calloc((size_t)nt, sizeof *ws->t) : NULL;
    ws->tstate = nt > 0 ? calloc((size_t)nt, 1) : NULL;
    ws->bstate = nt > 0 ? calloc((size_t)nt, 1) : NULL;
    ws->thash = nt > 0 ? calloc((size_t)nt, sizeof *ws->thash) : NULL;
    if (!list || !ws->t || !ws->tstate || !ws->bstate || !ws->thash) {
        free(list);
        td_wsync_free(ws);
        return td_err_set(err, TD_ERR_NOMEM, "weight sync: out of memory");
    }
    td_export_tensor_list(&ws->cfg, list, nt);
    ws->nt = nt;
    size_t off = 0;
    for (int i = 0; i < nt; i++) {
        wt *t = &ws->t[i];
        memcpy(t->name, list[i].name, sizeof t->name);
        t->ndim = list[i].ndim;
        t->shape[0] = list[i].shape[0];
        t->shape[1] = list[i].shape[1];
        t->nelem = t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0];
        t->off = off;
        t->bytes = (size_t)t->nelem * ws->elsize;
        off += (t->bytes + 63) & ~(size_t)63;  // each tensor 64-byte aligned
    }
    free(list);
    ws->total = off;
    ws->hdr_cap = HDR_FIXED_CAP + (size_t)nt * 256;
    // The whole budget at once: a sync never allocates beyond small bookkeeping.
    if (posix_memalign((void **)&ws->staging, 64, off ? off : 64) != 0) {
        ws->staging = NULL;
        td_wsync_free(ws);
        return td_err_set(err, TD_ERR_NOMEM, "weight sync: cannot allocate the %zu MiB staging area", off >> 20);
    }
    memset(ws->staging, 0, off);  // touched now: the memory is really there, and the first sync pays no page faults
    ws->shm.fd = -1;
    const char *fault = getenv("TANDEM_WSYNC_FAULT");
    ws->fault_shm_size = fault && !strcmp(fault, "shm-size");
    if (ws->fault_shm_size) TD_LOGW("weight sync: TANDEM_WSYNC_FAULT=shm-size: shared-memory file sizes are not checked");
    pthread_mutex_init(&ws->mu, NULL);
    snprintf(ws->end_reason, sizeof ws->end_reason, "no session was begun");
    *out = ws;
    return TD_OK;
}

static void shm_drop(td_wsync *ws) {
    if (ws->shm.map) munmap(ws->shm.map, ws->shm.len);
    if (ws->shm.fd >= 0) close(ws->shm.fd);
    ws->shm.map = NULL, ws->shm.len = 0, ws->shm.fd = -1;
}

void td_wsync_free(td_wsync *ws) {
    if (!ws) return;
    shm_drop(ws);
    if (ws->staging) pthread_mutex_destroy(&ws->mu);
    free(ws->staging);
    free(ws->t);
    free(ws->tstate);
    free(ws->bstate);
    free(ws->thash);
    free(ws);
}

size_t td_wsync_max_bucket_bytes(const td_wsync *ws) { return ws->p.max_bucket_bytes; }

// ---- sessions (under mu) ----------------------------------------------------------------------

static void hist_add(td_wsync *ws, double v) {
    int i = 0;
    while (i < N_SYNC_BUCKETS && v > sync_buckets[i]) i++;
    ws->hist[i]++;
    ws->hist_count++;
    ws->hist_sum += v;
}

// Ends the live session: ok (committed) or failed with the reason recorded for late requests.
static void end_session_locked(td_wsync *ws, bool ok, const char *fmt, ...) {
    if (ws->state == S_IDLE) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ws->end_reason, sizeof ws->end_reason, fmt, ap);
    va_end(ap);
    if (ok) ws->n_ok++;
    else {
        ws->n_failed++;
        TD_LOGW("weight sync: session %s failed: %s", ws->sid, ws->end_reason);
    }
    memcpy(ws->last_sid, ws->sid, sizeof ws->sid);
    ws->sid[0] = 0;
    ws->state = S_IDLE;
    ws->gen++;
    ws->n_open = 0;
}

static void expire_locked(td_wsync *ws) {
    if (ws->state == S_ACTIVE && td_now() - ws->t_last > ws->p.session_timeout_s)
        end_session_locked(ws, false, "it expired after %d s without traffic (--weight-sync-timeout)",
                           ws->p.session_timeout_s);
}

// 404 for a session id that is not the live one, saying what became of it.
static bool no_session(td_wsync *ws, const char *sid, td_api_error *e) {
    if (!sid || !*sid) return td_api_fail(e, 400, "session", "the query parameter session=ID is missing");
    if (ws->last_sid[0] && !strcmp(sid, ws->last_sid))
        return td_api_fail(e, 404, "session", "weight-sync session %s has ended: %s", sid, ws->end_reason);
    return td_api_fail(e, 404, "session", "no weight-sync session %s (begin one with POST /v1/weights/begin)", sid);
}

static bool live_session(td_wsync *ws, const char *sid) {
    return ws->state != S_IDLE && sid && !strcmp(sid, ws->sid);
}

static void new_sid(char out[33]) {
    uint8_t r[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, r, sizeof r) : -1;
    if (fd >= 0) close(fd);
    if (k != (ssize_t)sizeof r) {  // no urandom: unique enough for a session id, not a secret
        static uint64_t ctr;
        uint64_t a = XXH64(&ctr, sizeof ctr, (uint64_t)(td_now() * 1e9)), b = XXH64(&a, sizeof a, ++ctr);
        memcpy(r, &a, 8);
        memcpy(r + 8, &b, 8);
    }
    for (int i = 0; i < 16; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
}

static void hex16(uint64_t v, char out[17]) { snprintf(out, 17, "%016llx", (unsigned long long)v); }

cJSON *td_wsync_info_json(td_wsync *ws) {
    pthread_mutex_lock(&ws->mu);
    expire_locked(ws);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", (double)ws->version);
    if (ws->has_checksum && ws->checksum_version == ws->version) {
        char h[17];
        hex16(ws->checksum, h);
        cJSON_AddStringToObject(j, "checksum", h);
    } else {
        cJSON_AddNullToObject(j, "checksum");
    }
    cJSON_AddStringToObject(j, "dtype", ws->p.dtype == TD_BF16 ? "bf16" : "f32");
    cJSON_AddNumberToObject(j, "tensors", ws->nt);
    size_t bytes = 0;
    for (int i = 0; i < ws->nt; i++) bytes += ws->t[i].bytes;
    cJSON_AddNumberToObject(j, "bytes", (double)bytes);
    cJSON_AddNumberToObject(j, "max_bucket_bytes", (double)ws->p.max_bucket_bytes);
    cJSON_AddBoolToObject(j, "syncing", ws->state != S_IDLE);
    cJSON_AddBoolToObject(j, "shm", ws->p.shm);
    pthread_mutex_unlock(&ws->mu);
    return j;
}

cJSON *td_wsync_tensors_json(td_wsync *ws) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "dtype", ws->p.dtype == TD_BF16 ? "bf16" : "f32");
    cJSON *a = cJSON_AddArrayToObject(j, "tensors");
    for (int i = 0; a && i < ws->nt; i++) {
        cJSON *t = cJSON_CreateObject(), *s = cJSON_CreateArray();
        cJSON_AddStringToObject(t, "name", ws->t[i].name);
        for (int d = 0; d < ws->t[i].ndim; d++) cJSON_AddItemToArray(s, cJSON_CreateNumber((double)ws->t[i].shape[d]));
        cJSON_AddItemToObject(t, "shape", s);
        cJSON_AddItemToArray(a, t);
    }
    return j;
}

cJSON *td_wsync_begin(td_wsync *ws, const char *body, size_t len, td_api_error *e) {
    struct stat st;  // the cached shared-memory file, once its client removed it, is let go
    if (ws->shm.fd >= 0 && (fstat(ws->shm.fd, &st) != 0 || st.st_nlink == 0)) shm_drop(ws);
    cJSON *req = body && len ? cJSON_ParseWithLength(body, len) : NULL;
    const cJSON *nb = cJSON_GetObjectItemCaseSensitive(req, "n_buckets");
    bool is_num = cJSON_IsNumber(nb);
    double k = is_num ? nb->valuedouble : -1;
    cJSON_Delete(req);
    if (!is_num) {
        td_api_fail(e, 400, "n_buckets", "the body must be a JSON object {\"n_buckets\": K}");
        return NULL;
    }
    if (!(k >= 1 && k <= ws->nt && k == floor(k))) {
        td_api_fail(e, 400, "n_buckets", "n_buckets must be an integer in [1, %d] (each bucket holds whole tensors)",
                    ws->nt);
        return NULL;
    }
    pthread_mutex_lock(&ws->mu);
    expire_locked(ws);
    if (ws->state != S_IDLE) {
        td_api_fail(e, 409, NULL,
                    "another weight-sync session is %s (begun %.1f s ago); abort it or wait: an idle one expires "
                    "after %d s",
                    ws->state == S_COMMITTING ? "committing" : "open", td_now() - ws->t_begin, ws->p.session_timeout_s);
        e->type = "ConflictError";
        pthread_mutex_unlock(&ws->mu);
        return NULL;
    }
    new_sid(ws->sid);
    ws->state = S_ACTIVE;
    ws->t_begin = ws->t_last = td_now();
    ws->n_buckets = (int)k;
    ws->n_open = 0;
    ws->sess_bytes = 0;
    ws->sess_shm = 0;
    memset(ws->tstate, 0, (size_t)ws->nt);
    memset(ws->bstate, 0, (size_t)ws->nt);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "session", ws->sid);
    cJSON_AddNumberToObject(j, "n_buckets", ws->n_buckets);
    cJSON_AddStringToObject(j, "dtype", ws->p.dtype == TD_BF16 ? "bf16" : "f32");
    cJSON_AddNumberToObject(j, "timeout_s", ws->p.session_timeout_s);
    pthread_mutex_unlock(&ws->mu);
    return j;
}

cJSON *td_wsync_abort(td_wsync *ws, const char *session, td_api_error *e) {
    pthread_mutex_lock(&ws->mu);
    expire_locked(ws);
    if (!live_session(ws, session)) {
        no_session(ws, session, e);
        pthread_mutex_unlock(&ws->mu);
        return NULL;
    }
    if (ws->state == S_COMMITTING) {
        td_api_fail(e, 409, "session", "session %s is committing and can no longer be aborted", session);
        e->type = "ConflictError";
        pthread_mutex_unlock(&ws->mu);
        return NULL;
    }
    end_session_locked(ws, false, "the client aborted it");
    pthread_mutex_unlock(&ws->mu);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddBoolToObject(j, "aborted", true);
    return j;
}

// ---- buckets ----------------------------------------------------------------------------------

enum { P_LEN, P_HDR, P_DATA };

typedef struct ent {
    int ti;
    uint64_t b, e;  // data_offsets
} ent;

struct td_wsync_bucket {
    td_wsync *ws;
    uint64_t gen;
    int index;
    uint64_t want_sum;
    long long clen;
    XXH64_state_t *xs;
    int phase;
    uint8_t lenbuf[8];
    uint64_t have;  // bytes of the current phase's part so far
    uint64_t hdr_len;
    char *hdr;
    ent *ents;
    int n_ents, cur;
    uint64_t data_len, pos;
    uint64_t body_bytes;
    XXH64_state_t *ts;  // the current tensor's content hash (name, then its bytes as staged)
    uint64_t *hs;       // [n_ents] content hash of each tensor, once its last byte landed
    uint64_t fin_done;  // bytes of the current tensor checked for finiteness
    bool shm;           // read from a shared-memory file
    bool failed;
    td_api_error err;
};

static int64_t first_nonfinite(const uint8_t *p, int64_t n, size_t elsize);
static void land(td_wsync_bucket *b, const uint8_t *src, size_t k);

// Records the bucket's first error and aborts its session (when it is still the live one).
static void bfail(td_wsync_bucket *b, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void bfail(td_wsync_bucket *b, int status, const char *fmt, ...) {
    if (b->failed) return;
    b->failed = true;
    va_list ap;
    va_start(ap, fmt);
    char msg[360];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    td_api_fail(&b->err, status, NULL, "bucket %d: %s; the session is aborted and nothing was applied", b->index, msg);
    td_wsync *ws = b->ws;
    pthread_mutex_lock(&ws->mu);
    if (ws->gen == b->gen && ws->state == S_ACTIVE) end_session_locked(ws, false, "bucket %d: %s", b->index, msg);
    pthread_mutex_unlock(&ws->mu);
}

static bool parse_hex64(const char *s, uint64_t *out) {
    if (!s) return false;
    while (*s == ' ') s++;
    uint64_t v = 0;
    int n = 0;
    for (; *s && *s != ' '; s++, n++) {
        int d = *s >= '0' && *s <= '9' ? *s - '0' : *s >= 'a' && *s <= 'f' ? *s - 'a' + 10
                                                  : *s >= 'A' && *s <= 'F' ? *s - 'A' + 10 : -1;
        if (d < 0 || n >= 16) return false;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return n > 0;
}

td_wsync_bucket *td_wsync_bucket_open(td_wsync *ws, const char *session, const char *index, const char *checksum,
                                      long long content_length, td_api_error *e) {
    pthread_mutex_lock(&ws->mu);
    expire_locked(ws);
    if (!live_session(ws, session)) {
        no_session(ws, session, e);
        pthread_mutex_unlock(&ws->mu);
        return NULL;
    }
    if (ws->state == S_COMMITTING) {
        td_api_fail(e, 409, "session", "session %s is committing: no more buckets", session);
        e->type = "ConflictError";
        pthread_mutex_unlock(&ws->mu);
        return NULL;
    }
    char *end = NULL;
    long idx = index ? strtol(index, &end, 10) : -1;
    uint64_t sum = 0;
    char msg[300] = "";
    int status = 400;
    const char *param = NULL;
    if (!index || !*index || *end || idx < 0 || idx >= ws->n_buckets) {
        snprintf(msg, sizeof msg, "index must be an integer in [0, %d), got '%s'", ws->n_buckets, index ? index : "");
        param = "index";
    } else if (ws->bstate[idx] != T_NONE) {
        snprintf(msg, sizeof msg, "bucket %ld was already sent in this session", idx);
        param = "index";
    } else if (!parse_hex64(checksum, &sum)) {
        snprintf(msg, sizeof msg, "the header X-Tandem-Checksum (the XXH64 of the body, 16 hex digits) is %s",
                 checksum ? "malformed" : "missing");
        param = "X-Tandem-Checksum";
    } else if (content_length > (long long)ws->p.max_bucket_bytes) {
        snprintf(msg, sizeof msg, "bucket of %lld bytes is larger than the limit of %zu (--weight-sync-max-bucket-mb)",
                 content_length, ws->p.max_bucket_bytes);
        status = 413;
    }
    td_wsync_bucket *b = msg[0] ? NULL : calloc(1, sizeof *b);
    if (b) b->xs = XXH64_createState(), b->ts = XXH64_createState();
    if (!msg[0] && (!b || !b->xs || !b->ts)) snprintf(msg, sizeof msg, "out of memory"), status = 500;
    if (msg[0]) {
        if (b) XXH64_freeState(b->xs), XXH64_freeState(b->ts), free(b);
        td_api_fail(e, status, param, "%s; the session is aborted and nothing was applied", msg);
        end_session_locked(ws, false, "%s", msg);
        pthread_mutex_unlock(&ws->mu);
        return NULL;
    }
    ws->bstate[idx] = T_ARRIVING;
    ws->n_open++;
    ws->t_last = td_now();
    b->ws = ws;
    b->gen = ws->gen;
    pthread_mutex_unlock(&ws->mu);
    b->index = (int)idx;
    b->want_sum = sum;
    b->clen = content_length;
    XXH64_reset(b->xs, 0);
    return b;
}

static int cmp_ent(const void *a, const void *b) {
    const ent *x = a, *y = b;
    return x->b < y->b ? -1 : x->b > y->b;
}

static void shape_str(const int64_t *s, int nd, char *out, size_t cap) {
    if (nd == 1) snprintf(out, cap, "[%lld]", (long long)s[0]);
    else snprintf(out, cap, "[%lld, %lld]", (long long)s[0], (long long)s[1]);
}

// Parses and checks the JSON header against the served model; claims its tensors.
static void parse_header(td_wsync_bucket *b) {
    td_wsync *ws = b->ws;
    cJSON *h = cJSON_ParseWithLength(b->hdr, (size_t)b->hdr_len);
    if (!cJSON_IsObject(h)) {
        cJSON_Delete(h);
        {
        bfail(b, 400, "the safetensors header is not a JSON object");
        return;
    }
    }
    int n = 0;
    for (cJSON *it = h->child; it; it = it->next) n += strcmp(it->string, "__metadata__") != 0;
    if (n == 0 || n > ws->nt) {
        cJSON_Delete(h);
        {
        bfail(b, 400, "the safetensors header holds %d tensors (the model has %d)", n, ws->nt);
        return;
    }
    }
    b->ents = calloc((size_t)n, sizeof *b->ents);
    b->hs = calloc((size_t)n, sizeof *b->hs);
    if (!b->ents || !b->hs) {
        cJSON_Delete(h);
        {
        bfail(b, 500, "out of memory");
        return;
    }
    }
    for (cJSON *it = h->child; it && !b->failed; it = it->next) {
        const char *name = it->string;
        if (!strcmp(name, "__metadata__")) continue;
        int ti = find_tensor(ws, name, -1);
        if (ti < 0) {
            bfail(b, 400, "unknown tensor '%.128s': the served model has no tensor of that name", name);
            break;
        }
        const wt *t = &ws->t[ti];
        const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
        const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsObject(it) || !cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of) ||
            cJSON_GetArraySize(of) != 2) {
            bfail(b, 400, "tensor %s: the safetensors entry needs dtype, shape and data_offsets [begin, end]", name);
            break;
        }
        if (strcmp(dt->valuestring, wire_name(ws->p.dtype))) {
            bfail(b, 400, "tensor %s is %.16s; this server's weight sync takes %s (see GET /v1/weights)", name,
                  dt->valuestring, wire_name(ws->p.dtype));
            break;
        }
        int64_t s[2] = {0, 0};
        int nd = cJSON_GetArraySize(sh);
        bool ok = nd == t->ndim;
        for (int d = 0; ok && d < nd; d++) {
            const cJSON *v = cJSON_GetArrayItem(sh, d);
            ok = cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble < 9e15;
            s[d] = ok ? (int64_t)v->valuedouble : 0;
            ok = ok && s[d] == t->shape[d];
        }
        if (!ok) {
            char want[64];
            shape_str(t->shape, t->ndim, want, sizeof want);
            char *got = cJSON_PrintUnformatted(sh);
            bfail(b, 400, "tensor %s has shape %.40s, the served model's is %s", name, got ? got : "?", want);
            free(got);
            break;
        }
        const cJSON *o0 = cJSON_GetArrayItem(of, 0), *o1 = cJSON_GetArrayItem(of, 1);
        if (!cJSON_IsNumber(o0) || !cJSON_IsNumber(o1) || o0->valuedouble < 0 || o1->valuedouble < o0->valuedouble ||
            o1->valuedouble > 9e15 || o0->valuedouble != floor(o0->valuedouble) ||
            o1->valuedouble != floor(o1->valuedouble)) {
            bfail(b, 400, "tensor %s: bad data_offsets", name);
            break;
        }
        uint64_t ob = (uint64_t)o0->valuedouble, oe = (uint64_t)o1->valuedouble;
        if (oe - ob != t->bytes) {
            bfail(b, 400, "tensor %s: data_offsets span %llu bytes, its shape and dtype need %zu", name,
                  (unsigned long long)(oe - ob), t->bytes);
            break;
        }
        for (int k = 0; k < b->n_ents; k++)
            if (b->ents[k].ti == ti) bfail(b, 400, "tensor %s appears twice in the bucket", name);
        b->ents[b->n_ents++] = (ent){ti, ob, oe};
    }
    cJSON_Delete(h);
    if (b->failed) return;
    qsort(b->ents, (size_t)b->n_ents, sizeof *b->ents, cmp_ent);
    uint64_t at = 0;
    for (int k = 0; k < b->n_ents; k++) {
        if (b->ents[k].b != at)
            {
        bfail(b, 400, "the tensors' data_offsets leave a %s at byte %llu of the data",
                         b->ents[k].b > at ? "gap" : "overlap", (unsigned long long)at);
        return;
    }
        at = b->ents[k].e;
    }
    b->data_len = at;
    uint64_t want = 8 + b->hdr_len + b->data_len;
    if (b->clen >= 0 && (uint64_t)b->clen != want)
        {
        bfail(b, 400, "%s: the body is %lld bytes, its safetensors header describes %llu",
                     (uint64_t)b->clen < want ? "truncated safetensors blob" : "trailing bytes after the safetensors data",
                     b->clen, (unsigned long long)want);
        return;
    }
    pthread_mutex_lock(&ws->mu);
    bool live = ws->gen == b->gen && ws->state == S_ACTIVE;
    int dup = -1;
    for (int k = 0; live && k < b->n_ents && dup < 0; k++)
        if (ws->tstate[b->ents[k].ti] != T_NONE) dup = b->ents[k].ti;
    for (int k = 0; live && dup < 0 && k < b->n_ents; k++) ws->tstate[b->ents[k].ti] = T_ARRIVING;
    pthread_mutex_unlock(&ws->mu);
    if (!live) {
        bfail(b, 409, "the session ended meanwhile");
        return;
    }
    if (dup >= 0) {
        bfail(b, 400, "tensor %s was already sent in this session", ws->t[dup].name);
        return;
    }
    b->phase = P_DATA;
}

void td_wsync_bucket_write(td_wsync_bucket *b, const void *data, size_t n) {
    if (!n) return;
    b->body_bytes += n;
    if (b->failed) return;
    td_wsync *ws = b->ws;
    pthread_mutex_lock(&ws->mu);
    expire_locked(ws);
    bool live = ws->gen == b->gen && ws->state == S_ACTIVE;
    char why[300] = "";
    if (live) ws->t_last = td_now();
    else memcpy(why, ws->end_reason, sizeof why);
    pthread_mutex_unlock(&ws->mu);
    if (!live) {
        bfail(b, 409, "the session ended while the bucket was arriving: %s", why);
        return;
    }
    const uint8_t *p = data;
    while (n && !b->failed) {
        if (b->phase == P_LEN) {
            size_t k = 8 - (size_t)b->have < n ? 8 - (size_t)b->have : n;
            memcpy(b->lenbuf + b->have, p, k);
            XXH64_update(b->xs, b->lenbuf + b->have, k);
            b->have += k, p += k, n -= k;
            if (b->have < 8) break;
            uint64_t hl = 0;
            for (int i = 7; i >= 0; i--) hl = hl << 8 | b->lenbuf[i];
            if (hl < 2 || hl > ws->hdr_cap)
                {
        bfail(b, 400, "not a safetensors blob: header length %llu (at most %zu)", (unsigned long long)hl,
                             ws->hdr_cap);
        return;
    }
            b->hdr_len = hl;
            b->hdr = malloc((size_t)hl);
            if (!b->hdr) {
        bfail(b, 500, "out of memory");
        return;
    }
            b->phase = P_HDR;
            b->have = 0;
        } else if (b->phase == P_HDR) {
            size_t k = b->hdr_len - b->have < n ? (size_t)(b->hdr_len - b->have) : n;
            memcpy(b->hdr + b->have, p, k);
            XXH64_update(b->xs, b->hdr + b->have, k);
            b->have += k, p += k, n -= k;
            if (b->have < b->hdr_len) break;
            parse_header(b);
        } else {
            if (b->cur >= b->n_ents)
                {
        bfail(b, 400, "trailing bytes after the safetensors data (%llu data bytes described)",
                             (unsigned long long)b->data_len);
        return;
    }
            const ent *e = &b->ents[b->cur];
            size_t k = e->e - b->pos < n ? (size_t)(e->e - b->pos) : n;
            if (k > LAND_CHUNK) k = LAND_CHUNK;
            land(b, p, k);
            p += k, n -= k;
        }
    }
}

// Copies k bytes of the current tensor's data to its place in staging, then, while they are in
// cache, adds them to the bucket's XXH64 and the tensor's content hash and checks whole values for
// finiteness: one pass over memory per byte. The hashes are of the staged bytes, so what is
// committed is what was checked even if the source changes meanwhile (a shared-memory file).
static void land(td_wsync_bucket *b, const uint8_t *src, size_t k) {
    td_wsync *ws = b->ws;
    const ent *e = &b->ents[b->cur];
    const wt *t = &ws->t[e->ti];
    const uint64_t at = b->pos - e->b;  // bytes of this tensor before these
    uint8_t *dst = ws->staging + t->off + at;
    if (at == 0) {
        XXH64_reset(b->ts, 0);
        XXH64_update(b->ts, t->name, strlen(t->name));
        b->fin_done = 0;
    }
    memcpy(dst, src, k);
    XXH64_update(b->xs, dst, k);
    XXH64_update(b->ts, dst, k);
    const uint64_t whole = (at + k) / ws->elsize * ws->elsize;  // a body chunk may end mid-value
    if (whole > b->fin_done) {
        int64_t bad = first_nonfinite(ws->staging + t->off + b->fin_done, (int64_t)((whole - b->fin_done) / ws->elsize),
                                      ws->elsize);
        if (bad >= 0) {
            bfail(b, 400, "value %lld of tensor %s is not finite", (long long)(bad + (int64_t)(b->fin_done / ws->elsize)),
                  t->name);
            return;
        }
        b->fin_done = whole;
    }
    b->pos += k;
    if (b->pos == e->e) b->hs[b->cur++] = XXH64_digest(b->ts);
}

static void bucket_free(td_wsync_bucket *b) {
    td_wsync *ws = b->ws;
    pthread_mutex_lock(&ws->mu);
    if (ws->gen == b->gen && ws->n_open > 0) ws->n_open--;
    pthread_mutex_unlock(&ws->mu);
    XXH64_freeState(b->xs);
    XXH64_freeState(b->ts);
    free(b->hdr);
    free(b->ents);
    free(b->hs);
    free(b);
}

// Index of the first non-finite value of n wire elements, or -1. Blocks of 4096 are OR-reduced
// without an early exit, so the compiler vectorizes them; only a bad block is searched.
static int64_t first_nonfinite(const uint8_t *p, int64_t n, size_t elsize) {
    enum { BLK = 4096 };
    for (int64_t b = 0; b < n; b += BLK) {
        const int64_t e = b + BLK < n ? b + BLK : n;
        unsigned bad = 0;
        if (elsize == 2) {
            const uint16_t *h = (const uint16_t *)p;
            for (int64_t i = b; i < e; i++) bad |= (h[i] & 0x7f80u) == 0x7f80u;
        } else {
            const uint32_t *w = (const uint32_t *)p;
            for (int64_t i = b; i < e; i++) bad |= (w[i] & 0x7f800000u) == 0x7f800000u;
        }
        if (!bad) continue;
        for (int64_t i = b; i < e; i++) {
            uint32_t v = elsize == 2 ? (uint32_t)((const uint16_t *)p)[i] << 16 : ((const uint32_t *)p)[i];
            if ((v & 0x7f800000u) == 0x7f800000u) return i;
        }
    }
    return -1;
}

cJSON *td_wsync_bucket_close(td_wsync_bucket *b, td_api_error *e) {
    td_wsync *ws = b->ws;
    if (!b->failed && (b->phase != P_DATA || b->cur < b->n_ents))
        bfail(b, 400, "truncated safetensors blob: the body ended after %llu bytes, in its %s",
              (unsigned long long)b->body_bytes, b->phase == P_DATA ? "tensor data" : "header");
    uint64_t got = XXH64_digest(b->xs);
    if (!b->failed && got != b->want_sum)
        bfail(b, 400, "checksum mismatch: X-Tandem-Checksum is %016llx, the XXH64 of the %llu-byte body is %016llx",
              (unsigned long long)b->want_sum, (unsigned long long)b->body_bytes, (unsigned long long)got);
    const uint64_t *hs = b->hs;  // each tensor's, computed as its bytes landed
    cJSON *j = NULL;
    if (!b->failed) {
        pthread_mutex_lock(&ws->mu);
        bool live = ws->gen == b->gen && ws->state == S_ACTIVE;
        if (live) {
            for (int k = 0; k < b->n_ents; k++) {
                ws->tstate[b->ents[k].ti] = T_RECEIVED;
                ws->thash[b->ents[k].ti] = hs[k];
            }
            ws->bstate[b->index] = T_RECEIVED;
            ws->sess_bytes += b->body_bytes;
            ws->sess_shm += b->shm;
            ws->t_last = td_now();
        }
        pthread_mutex_unlock(&ws->mu);
        if (!live) bfail(b, 409, "the session ended meanwhile: %s", ws->end_reason);
    }
    if (b->failed) {
        *e = b->err;
        if (e->http_status == 409) e->type = "ConflictError";
    } else {
        j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "index", b->index);
        cJSON_AddNumberToObject(j, "tensors", b->n_ents);
        cJSON_AddNumberToObject(j, "bytes", (double)b->body_bytes);
    }
    bucket_free(b);
    return j;
}

// ---- shared-memory buckets -------------------------------------------------------------------

// A client that shrinks its file while the server reads the mapping would raise SIGBUS: the
// handler turns a fault inside the range being read, on the thread reading it, into a failed
// bucket; any other SIGBUS gets the previous disposition.
static __thread sigjmp_buf *bus_jmp;
static __thread const uint8_t *bus_lo, *bus_hi;
static struct sigaction bus_old;
static pthread_once_t bus_once = PTHREAD_ONCE_INIT;

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
    const uint8_t *a = si ? (const uint8_t *)si->si_addr : NULL;
    if (bus_jmp && a >= bus_lo && a < bus_hi) siglongjmp(*bus_jmp, 1);
    sigaction(SIGBUS, &bus_old, NULL);  // not ours: returning re-faults under the old disposition
    if (bus_old.sa_flags & SA_SIGINFO) {
        if (bus_old.sa_sigaction) bus_old.sa_sigaction(sig, si, uc);
    } else if (bus_old.sa_handler != SIG_DFL && bus_old.sa_handler != SIG_IGN) {
        bus_old.sa_handler(sig);
    }
}

static void bus_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &bus_old);
}

static bool shm_name_ok(const char *path) {
    const size_t pl = strlen(TD_WSYNC_SHM_PREFIX);
    if (strncmp(path, TD_WSYNC_SHM_PREFIX, pl) != 0 || !path[pl] || strlen(path) > 200) return false;
    for (const char *c = path + pl; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == '.'))
            return false;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!s || !*s) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (UINT64_MAX - 9) / 10) return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    *out = v;
    return true;
}

// Maps path (cached: see td_wsync.shm) and checks that [off, off + len) lies in the file.
static bool shm_map(td_wsync_bucket *b, const char *path, uint64_t off, uint64_t len) {
    td_wsync *ws = b->ws;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        bfail(b, 400, "X-Tandem-Shm: cannot open %s: %s (is the client on this host?)", path, strerror(errno));
        return false;
    }
    struct stat st, cst;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        bfail(b, 400, "X-Tandem-Shm: %s is not a regular file", path);
        close(fd);
        return false;
    }
    if (!ws->fault_shm_size && ((uint64_t)st.st_size < off || (uint64_t)st.st_size - off < len)) {
        bfail(b, 400, "X-Tandem-Shm: %s is %lld bytes, the bucket is bytes [%llu, %llu) of it: the file is too short",
              path, (long long)st.st_size, (unsigned long long)off, (unsigned long long)(off + len));
        close(fd);
        return false;
    }
    bool same = ws->shm.fd >= 0 && fstat(ws->shm.fd, &cst) == 0 && cst.st_dev == st.st_dev && cst.st_ino == st.st_ino &&
                ws->shm.len >= off + len;
    if (same) {
        close(fd);
        return true;
    }
    shm_drop(ws);
    void *m = st.st_size ? mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (m == MAP_FAILED) {
        bfail(b, 400, "X-Tandem-Shm: cannot map %s (%lld bytes): %s", path, (long long)st.st_size, strerror(errno));
        close(fd);
        return false;
    }
    ws->shm.fd = fd, ws->shm.map = m, ws->shm.len = (size_t)st.st_size;
    return true;
}

// Feeds the mapped blob to the parser; false when the mapping faulted (the file shrank).
static __attribute__((noinline)) bool shm_read(td_wsync_bucket *b, const uint8_t *src, size_t len) {
    sigjmp_buf jb;
    if (sigsetjmp(jb, 1) != 0) {
        bus_jmp = NULL;
        return false;
    }
    bus_lo = src, bus_hi = src + len;
    bus_jmp = &jb;
    td_wsync_bucket_write(b, src, len);
    bus_jmp = NULL;
    return true;
}

td_wsync_bucket *td_wsync_bucket_open_shm(td_wsync *ws, const char *session, const char *index, const char *checksum,
                                          const char *path, const char *offset, const char *length,
                                          long long content_length, td_api_error *e) {
    uint64_t off = 0, len = 0;
    bool nums = parse_u64(offset, &off) && parse_u64(length, &len);
    td_wsync_bucket *b = td_wsync_bucket_open(ws, session, index, checksum, nums ? (long long)len : -1, e);
    if (!b) return NULL;
    if (!ws->p.shm)
        bfail(b, 400, "X-Tandem-Shm: shared-memory buckets are disabled on this server (start it with "
                      "--weight-sync-shm, or send the bucket as the body)");
    else if (!nums)
        bfail(b, 400, "X-Tandem-Shm needs X-Tandem-Shm-Offset and X-Tandem-Shm-Length (decimal bytes), got '%.30s' "
                      "and '%.30s'",
              offset ? offset : "", length ? length : "");
    else if (content_length > 0)
        bfail(b, 400, "X-Tandem-Shm: a shared-memory bucket has no body (this request has %lld bytes)", content_length);
    else if (!shm_name_ok(path))
        bfail(b, 400, "X-Tandem-Shm: '%.200s' is not a file " TD_WSYNC_SHM_PREFIX "NAME (NAME: letters, digits, "
                      "'-', '_', '.')",
              path);
    if (b->failed || !shm_map(b, path, off, len)) return b;
    pthread_once(&bus_once, bus_install);
    b->shm = true;
    if (!shm_read(b, ws->shm.map + off, (size_t)len)) {
        shm_drop(ws);
        bfail(b, 400, "X-Tandem-Shm: %s shrank while the bucket was read", path);
    }
    return b;
}

void td_wsync_bucket_cancel(td_wsync_bucket *b) {
    bfail(b, 400, "the upload ended before its body did");
    bucket_free(b);
}

// ---- commit -----------------------------------------------------------------------------------

bool td_wsync_commit_begin(td_wsync *ws, const char *session, td_api_error *e) {
    pthread_mutex_lock(&ws->mu);
    expire_locked(ws);
    bool ok = false;
    if (!live_session(ws, session)) {
        no_session(ws, session, e);
    } else if (ws->state == S_COMMITTING) {
        td_api_fail(e, 409, "session", "session %s is already committing", session);
        e->type = "ConflictError";
    } else {
        char msg[300] = "";
        int missing = 0, first = -1;
        for (int i = 0; i < ws->n_buckets && !msg[0]; i++)
            if (ws->bstate[i] != T_RECEIVED)
                snprintf(msg, sizeof msg, "bucket %d of %d %s", i, ws->n_buckets,
                         ws->bstate[i] == T_ARRIVING ? "is still arriving" : "has not arrived");
        for (int i = 0; i < ws->nt; i++)
            if (ws->tstate[i] != T_RECEIVED) missing++, first = first < 0 ? i : first;
        if (!msg[0] && missing)
            snprintf(msg, sizeof msg, "tensor %s was not sent (%d of the model's %d tensors missing)", ws->t[first].name,
                     missing, ws->nt);
        if (msg[0]) {
            td_api_fail(e, 400, NULL, "commit refused: %s; the session is aborted and nothing was applied", msg);
            end_session_locked(ws, false, "commit refused: %s", msg);
        } else {
            uint64_t sum = 0;
            for (int i = 0; i < ws->nt; i++) sum += ws->thash[i];
            ws->commit_sum = sum;
            ws->state = S_COMMITTING;
            ok = true;
        }
    }
    pthread_mutex_unlock(&ws->mu);
    return ok;
}

// The td_export_get_fn the engine calls for each tensor: staged wire values -> f32.
static td_status staged_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    td_wsync *ws = ctx;
    int i = find_tensor(ws, name, ws->get_hint);
    if (i < 0) return td_err_set(err, TD_ERR_NOT_FOUND, "weight sync: the engine asked for %s, not staged", name);
    ws->get_hint = i + 1;
    const wt *t = &ws->t[i];
    if (n != t->nelem)
        return td_err_set(err, TD_ERR_INVALID, "weight sync: %s has %lld values staged, the engine needs %lld", name,
                          (long long)t->nelem, (long long)n);
    td_to_f32(ws->p.dtype, ws->staging + t->off, dst, n);
    return TD_OK;
}

// Its typed form: the staged bytes as they are when the engine stores the wire dtype (a memcpy).
static td_status staged_get_typed(void *ctx, const char *name, td_dtype type, void *dst, int64_t n, td_err *err) {
    td_wsync *ws = ctx;
    if (type != ws->p.dtype && type != TD_F32) return TD_ERR_UNSUPPORTED;
    if (type == TD_F32) return staged_get(ctx, name, dst, n, err);
    int i = find_tensor(ws, name, ws->get_hint);
    if (i < 0) return td_err_set(err, TD_ERR_NOT_FOUND, "weight sync: the engine asked for %s, not staged", name);
    ws->get_hint = i + 1;
    const wt *t = &ws->t[i];
    if (n != t->nelem)
        return td_err_set(err, TD_ERR_INVALID, "weight sync: %s has %lld values staged, the engine needs %lld", name,
                          (long long)t->nelem, (long long)n);
    memcpy(dst, ws->staging + t->off, t->bytes);
    return TD_OK;
}

cJSON *td_wsync_commit_run(td_wsync *ws, td_api_error *e) {
    const int timeout_ms = ws->p.session_timeout_s * 1000;
    double t0 = td_now();
    td_err err = {0};
    uint64_t version = 0;
    td_status st = TD_OK;
    if (ws->fence_needed) {  // an earlier apply timed out: it must be over before staging is read
        st = ws->p.engine.fence(ws->p.engine.ctx, timeout_ms, &version, &err);
        if (!st) {
            pthread_mutex_lock(&ws->mu);
            ws->version = version;
            ws->fence_needed = false;
            pthread_mutex_unlock(&ws->mu);
        }
    }
    ws->get_hint = 0;
    if (!st) st = ws->p.engine.apply(ws->p.engine.ctx, staged_get, staged_get_typed, ws, timeout_ms, &version, &err);
    double t1 = td_now();
    pthread_mutex_lock(&ws->mu);
    cJSON *j = NULL;
    double total = t1 - ws->t_begin;
    if (st == TD_OK) {
        ws->version = version;
        ws->has_checksum = true;
        ws->checksum = ws->commit_sum;
        ws->checksum_version = version;
        ws->bytes_total += ws->sess_bytes;
        ws->last_seconds = total;
        ws->last_apply_seconds = t1 - t0;
        ws->last_transfer_seconds = t0 - ws->t_begin;
        hist_add(ws, total);
        j = cJSON_CreateObject();
        char h[17];
        hex16(ws->commit_sum, h);
        cJSON_AddNumberToObject(j, "version", (double)version);
        cJSON_AddStringToObject(j, "checksum", h);
        cJSON_AddNumberToObject(j, "seconds", t1 - t0);
        cJSON_AddNumberToObject(j, "session_seconds", total);
        cJSON_AddNumberToObject(j, "bytes", (double)ws->sess_bytes);
        end_session_locked(ws, true, "committed as version %llu", (unsigned long long)version);
        TD_LOGI("weight sync: version %llu applied (%.1f MB in %d buckets, %d through shared memory, in %.3f s, the "
                "update %.3f s)",
                (unsigned long long)version, ws->sess_bytes / 1e6, ws->n_buckets, ws->sess_shm, total, t1 - t0);
    } else {
        if (st == TD_ERR_TIMEOUT) ws->fence_needed = true;
        td_api_fail(e, st == TD_ERR_TIMEOUT ? 504 : st == TD_ERR_LIMIT ? 503 : 500, NULL,
                    "the engine did not apply the weights: %s%s", err.msg,
                    st == TD_ERR_TIMEOUT ? " (the update may still complete: check GET /v1/weights)" : "");
        end_session_locked(ws, false, "the engine did not apply the weights: %s", err.msg);
    }
    pthread_mutex_unlock(&ws->mu);
    return j;
}

// ---- metrics ----------------------------------------------------------------------------------

bool td_wsync_metrics_render(td_wsync *ws, const char *lab, td_srv_buf *b) {
    pthread_mutex_lock(&ws->mu);
    uint64_t version = ws->version, ok_n = ws->n_ok, failed = ws->n_failed, bytes = ws->bytes_total;
    uint64_t hist[N_SYNC_BUCKETS + 1], count = ws->hist_count;
    memcpy(hist, ws->hist, sizeof hist);
    double sum = ws->hist_sum, last = ws->last_seconds, last_apply = ws->last_apply_seconds,
           last_xfer = ws->last_transfer_seconds;
    pthread_mutex_unlock(&ws->mu);
    bool ok = td_srv_buf_printf(b,
                                "# HELP tandem_weights_version Weights version served: 0 at start, +1 per weight sync.\n"
                                "# TYPE tandem_weights_version gauge\n"
                                "tandem_weights_version{model_name=\"%s\"} %llu\n"
                                "# HELP tandem_weight_syncs_total Weight-sync sessions by outcome.\n"
                                "# TYPE tandem_weight_syncs_total counter\n"
                                "tandem_weight_syncs_total{model_name=\"%s\",result=\"ok\"} %llu\n"
                                "tandem_weight_syncs_total{model_name=\"%s\",result=\"failed\"} %llu\n"
                                "# HELP tandem_weight_sync_bytes_total Bucket bytes of successful weight syncs.\n"
                                "# TYPE tandem_weight_sync_bytes_total counter\n"
                                "tandem_weight_sync_bytes_total{model_name=\"%s\"} %llu\n",
                                lab, (unsigned long long)version, lab, (unsigned long long)ok_n, lab,
                                (unsigned long long)failed, lab, (unsigned long long)bytes);
    ok = ok && td_srv_buf_printf(b, "# HELP tandem_weight_sync_seconds Successful weight syncs, begin to applied.\n"
                                    "# TYPE tandem_weight_sync_seconds histogram\n");
    uint64_t cum = 0;
    for (int i = 0; i < N_SYNC_BUCKETS; i++) {
        cum += hist[i];
        ok = ok && td_srv_buf_printf(b, "tandem_weight_sync_seconds_bucket{le=\"%g\",model_name=\"%s\"} %llu\n",
                                     sync_buckets[i], lab, (unsigned long long)cum);
    }
    cum += hist[N_SYNC_BUCKETS];
    ok = ok && td_srv_buf_printf(b,
                                 "tandem_weight_sync_seconds_bucket{le=\"+Inf\",model_name=\"%s\"} %llu\n"
                                 "tandem_weight_sync_seconds_count{model_name=\"%s\"} %llu\n"
                                 "tandem_weight_sync_seconds_sum{model_name=\"%s\"} %.9g\n"
                                 "# HELP tandem_weight_sync_last_seconds The last successful weight sync, by phase.\n"
                                 "# TYPE tandem_weight_sync_last_seconds gauge\n"
                                 "tandem_weight_sync_last_seconds{model_name=\"%s\",phase=\"total\"} %.9g\n"
                                 "tandem_weight_sync_last_seconds{model_name=\"%s\",phase=\"transfer\"} %.9g\n"
                                 "tandem_weight_sync_last_seconds{model_name=\"%s\",phase=\"apply\"} %.9g\n",
                                 lab, (unsigned long long)cum, lab, (unsigned long long)count, lab, sum, lab, last, lab,
                                 last_xfer, lab, last_apply);
    return ok;
}
