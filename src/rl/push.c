// The weight-sync client (push.h) on one libcurl easy handle (its connection kept alive between
// requests). A bucket is built in place in one of two slots (malloc'd buffers, or the two halves
// of the shared-memory file): the safetensors header is written first from the plan (names,
// shapes, offsets), then each tensor's values are fetched and converted straight into the data
// area behind it, in L2-sized chunks hashed (bucket XXH64, tensor content hash) while in cache.
// A sender thread posts bucket k while this thread packs bucket k+1 into the other slot.
#include "rl/push.h"

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "server/wsync.h"

#define HDR_ROOM (1u << 20)     // header bytes reserved in the bucket buffer besides the data
#define MAX_ANSWER (16u << 20)  // bytes of one JSON answer

struct td_pusher {
    td_pusher_params p;
    char *url, *key;
    CURL *curl;
    struct curl_slist *hdr_json, *hdr_auth_only;
    char curl_msg[CURL_ERROR_SIZE];
    uint8_t *slot[2];  // bucket k is built in slot[k % 2]: 8-byte length, header, data
    size_t cap;        // bytes of each slot (0: none yet)
    bool slot_shm;     // the slots are the two halves of the shared-memory file
    uint8_t *buf[2];   // body mode: malloc'd slots
    size_t buf_cap;
    int shm_fd;        // shm mode: /dev/shm/tandem-push-..., mapped read-write at shm_map
    uint8_t *shm_map;
    size_t shm_len;
    char shm_path[96];
    float *f32;    // one tensor's f32 values when the wire is bf16
    size_t f32_cap;  // elements
    char *ans;     // the last answer's body
    size_t ans_len, ans_cap;
};

td_pusher_params td_pusher_default_params(void) {
    return (td_pusher_params){.url = NULL, .api_key = NULL, .bucket_bytes = 64u << 20, .timeout_ms = 60000};
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

void td_pusher_free(td_pusher *p) {
    if (!p) return;
    if (p->curl) curl_easy_cleanup(p->curl);
    curl_slist_free_all(p->hdr_json);
    curl_slist_free_all(p->hdr_auth_only);
    free(p->url);
    free(p->key);
    free(p->buf[0]);
    free(p->buf[1]);
    if (p->shm_map) munmap(p->shm_map, p->shm_len);
    if (p->shm_fd >= 0) {
        close(p->shm_fd);
        unlink(p->shm_path);
    }
    free(p->f32);
    free(p->ans);
    free(p);
}

td_status td_pusher_create(const td_pusher_params *pp, td_pusher **out, td_err *err) {
    *out = NULL;
    td_pusher_params d = td_pusher_default_params();
    if (!pp || !pp->url || !*pp->url) return td_err_set(err, TD_ERR_INVALID, "weights push: no server URL");
    td_pusher_params p = *pp;
    if (!p.bucket_bytes) p.bucket_bytes = d.bucket_bytes;
    if (p.timeout_ms <= 0) p.timeout_ms = d.timeout_ms;
    if (p.bucket_bytes < 4096 || p.bucket_bytes > ((size_t)1 << 40))
        return td_err_set(err, TD_ERR_INVALID, "weights push: bucket size %zu bytes out of range", p.bucket_bytes);
    pthread_once(&curl_once, curl_init);
    td_pusher *q = calloc(1, sizeof *q);
    if (!q) return td_err_set(err, TD_ERR_NOMEM, "weights push: out of memory");
    q->p = p;
    size_t ul = strlen(p.url);
    while (ul > 1 && p.url[ul - 1] == '/') ul--;  // "http://h:p/" and "http://h:p" alike
    q->url = strndup(p.url, ul);
    q->key = p.api_key && *p.api_key ? strdup(p.api_key) : NULL;
    q->p.url = q->url;
    q->p.api_key = q->key;
    q->shm_fd = -1;
    q->curl = curl_easy_init();
    char auth[1100] = "";
    if (q->key) snprintf(auth, sizeof auth, "Authorization: Bearer %s", q->key);
    q->hdr_auth_only = curl_slist_append(NULL, "Expect:");  // no 100-continue round trip
    if (q->key) q->hdr_auth_only = curl_slist_append(q->hdr_auth_only, auth);
    q->hdr_json = curl_slist_append(NULL, "Expect:");
    q->hdr_json = curl_slist_append(q->hdr_json, "Content-Type: application/json");
    if (q->key) q->hdr_json = curl_slist_append(q->hdr_json, auth);
    if (!q->url || (p.api_key && *p.api_key && !q->key) || !q->curl || !q->hdr_json || !q->hdr_auth_only) {
        td_pusher_free(q);
        return td_err_set(err, TD_ERR_NOMEM, "weights push: out of memory");
    }
    *out = q;
    return TD_OK;
}

// ---- HTTP -------------------------------------------------------------------------------------

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud) {
    td_pusher *p = ud;
    size_t n = size * nmemb;
    if (p->ans_len + n + 1 > MAX_ANSWER) return 0;  // aborts the transfer
    if (p->ans_len + n + 1 > p->ans_cap) {
        size_t nc = (p->ans_len + n + 1) * 2;
        char *a = realloc(p->ans, nc);
        if (!a) return 0;
        p->ans = a;
        p->ans_cap = nc;
    }
    memcpy(p->ans + p->ans_len, data, n);
    p->ans_len += n;
    p->ans[p->ans_len] = 0;
    return n;
}

// One request. body NULL: GET; else POST with the body (binary: the checksum header is added).
// Returns TD_OK with *json the parsed 2xx answer (caller frees), or an error naming the URL and,
// for an HTTP error, the server's message.
static td_status request(td_pusher *p, const char *path, const void *body, size_t len, bool binary,
                         const char *const *bucket_hdrs, cJSON **json, td_err *err) {
    *json = NULL;
    char url[2048];
    snprintf(url, sizeof url, "%s%s", p->url, path);
    CURL *c = p->curl;
    curl_easy_reset(c);
    p->ans_len = 0;
    if (p->ans) p->ans[0] = 0;
    p->curl_msg[0] = 0;
    struct curl_slist *extra = NULL, *hdrs = body && !binary ? p->hdr_json : p->hdr_auth_only;
    if (binary) {  // a private copy of the base list with the two per-bucket headers
        for (struct curl_slist *h = p->hdr_auth_only; h; h = h->next) extra = curl_slist_append(extra, h->data);
        extra = curl_slist_append(extra, "Content-Type: application/octet-stream");
        for (int k = 0; bucket_hdrs && bucket_hdrs[k]; k++) extra = curl_slist_append(extra, bucket_hdrs[k]);
        if (!extra) return td_err_set(err, TD_ERR_NOMEM, "weights push: out of memory");
        hdrs = extra;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)p->p.timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)p->p.timeout_ms);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, p->curl_msg);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, p);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(extra);
    if (rc != CURLE_OK) {
        const char *why = p->curl_msg[0] ? p->curl_msg : curl_easy_strerror(rc);
        if (rc == CURLE_OPERATION_TIMEDOUT)
            return td_err_set(err, TD_ERR_TIMEOUT, "weights push: %s %s: timed out after %d ms (%s)", body ? "POST" : "GET",
                              url, p->p.timeout_ms, why);
        return td_err_set(err, TD_ERR_IO, "weights push: %s %s: %s", body ? "POST" : "GET", url, why);
    }
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    cJSON *j = p->ans_len ? cJSON_ParseWithLength(p->ans, p->ans_len) : NULL;
    if (code < 200 || code >= 300) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(e, "message");
        char msg[600];
        snprintf(msg, sizeof msg, "%s", cJSON_IsString(m) ? m->valuestring : p->ans_len ? p->ans : "(no body)");
        cJSON_Delete(j);
        td_status st = code == 409 || code == 503 ? TD_ERR_LIMIT : code == 504 ? TD_ERR_TIMEOUT : TD_ERR_IO;
        return td_err_set(err, st, "weights push: %s %s: HTTP %ld: %s", body ? "POST" : "GET", url, code, msg);
    }
    if (!j) return td_err_set(err, TD_ERR_IO, "weights push: %s: the answer is not JSON", url);
    *json = j;
    return TD_OK;
}

static double num(const cJSON *j, const char *k, double dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
    return cJSON_IsNumber(v) ? v->valuedouble : dflt;
}

static bool hex64(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return false;
    char *end;
    unsigned long long v = strtoull(s, &end, 16);
    *out = v;
    return *end == 0;
}

td_status td_pusher_query(td_pusher *p, td_push_info *out, td_err *err) {
    memset(out, 0, sizeof *out);
    cJSON *j;
    td_status st = request(p, "/v1/weights", NULL, 0, false, NULL, &j, err);
    if (st) return st;
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(j, "checksum");
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sy = cJSON_GetObjectItemCaseSensitive(j, "syncing");
    out->version = (uint64_t)num(j, "version", 0);
    out->has_checksum = cJSON_IsString(ck) && hex64(ck->valuestring, &out->checksum);
    out->n_tensors = (int)num(j, "tensors", 0);
    out->bytes = (uint64_t)num(j, "bytes", 0);
    out->max_bucket_bytes = (uint64_t)num(j, "max_bucket_bytes", 0);
    out->syncing = cJSON_IsTrue(sy);
    out->shm = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "shm"));
    bool ok = cJSON_IsString(dt) && (!strcmp(dt->valuestring, "f32") || !strcmp(dt->valuestring, "bf16"));
    out->dtype = ok && !strcmp(dt->valuestring, "bf16") ? TD_BF16 : TD_F32;
    cJSON_Delete(j);
    if (!ok) return td_err_set(err, TD_ERR_IO, "weights push: %s/v1/weights: no dtype f32|bf16 in the answer", p->url);
    return TD_OK;
}

// ---- push -------------------------------------------------------------------------------------

static void shape_str(const td_export_tensor *t, char *out, size_t cap) {
    if (t->ndim == 1) snprintf(out, cap, "[%lld]", (long long)t->shape[0]);
    else snprintf(out, cap, "[%lld, %lld]", (long long)t->shape[0], (long long)t->shape[1]);
}

// The server's tensor list must be this source's: same names and shapes.
static td_status check_layout(td_pusher *p, const td_export_tensor *ts, int nt, td_err *err) {
    cJSON *j;
    td_status st = request(p, "/v1/weights/tensors", NULL, 0, false, NULL, &j, err);
    if (st) return st;
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(j, "tensors");
    int ns = cJSON_GetArraySize(arr);
    char a[64], b[80];
    st = TD_OK;
    const cJSON *it = arr ? arr->child : NULL;
    for (int i = 0; i < nt && !st; i++) {
        const cJSON *found = NULL;
        for (const cJSON *x = it; x && !found; x = x->next) {  // the same order is the common case
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
            if (cJSON_IsString(n) && !strcmp(n->valuestring, ts[i].name)) found = x;
        }
        for (const cJSON *x = arr ? arr->child : NULL; x && !found; x = x->next) {
            const cJSON *n = cJSON_GetObjectItemCaseSensitive(x, "name");
            if (cJSON_IsString(n) && !strcmp(n->valuestring, ts[i].name)) found = x;
        }
        if (!found) {
            st = td_err_set(err, TD_ERR_INVALID,
                            "weights push: the server's model has no tensor %s (this source's model differs: %d "
                            "tensors here, %d there)",
                            ts[i].name, nt, ns);
            break;
        }
        it = found->next;
        const cJSON *sh = cJSON_GetObjectItemCaseSensitive(found, "shape");
        bool same = cJSON_GetArraySize(sh) == ts[i].ndim;
        for (int d = 0; same && d < ts[i].ndim; d++) {
            const cJSON *v = cJSON_GetArrayItem(sh, d);
            same = cJSON_IsNumber(v) && (int64_t)v->valuedouble == ts[i].shape[d];
        }
        if (!same) {
            shape_str(&ts[i], a, sizeof a);
            char *got = cJSON_PrintUnformatted(sh);
            snprintf(b, sizeof b, "%s", got ? got : "?");
            free(got);
            st = td_err_set(err, TD_ERR_INVALID,
                            "weights push: tensor %s is %s in this source, %s on the server: not the served model's "
                            "config",
                            ts[i].name, a, b);
        }
    }
    if (!st && ns != nt)
        st = td_err_set(err, TD_ERR_INVALID,
                        "weights push: the server's model has %d tensors, this source %d: not the served model's config",
                        ns, nt);
    cJSON_Delete(j);
    return st;
}

static int64_t nelem(const td_export_tensor *t) { return t->ndim == 2 ? t->shape[0] * t->shape[1] : t->shape[0]; }

// Writes the safetensors header for tensors [i0, i1) at buf; returns the data offset (8 + header
// length, a multiple of 8) or 0 when it does not fit in HDR_ROOM.
static size_t write_header(uint8_t *buf, const td_export_tensor *ts, int i0, int i1, size_t el, const char *dt) {
    char *h = (char *)buf + 8;
    size_t cap = HDR_ROOM - 16, n = 0;
    uint64_t off = 0;
    n += (size_t)snprintf(h + n, cap - n, "{");
    for (int i = i0; i < i1 && n < cap; i++) {
        uint64_t bytes = (uint64_t)nelem(&ts[i]) * el;
        char shape[64];
        if (ts[i].ndim == 1) snprintf(shape, sizeof shape, "[%lld]", (long long)ts[i].shape[0]);
        else snprintf(shape, sizeof shape, "[%lld,%lld]", (long long)ts[i].shape[0], (long long)ts[i].shape[1]);
        n += (size_t)snprintf(h + n, cap - n, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%llu,%llu]}",
                              i > i0 ? "," : "", ts[i].name, dt, shape, (unsigned long long)off,
                              (unsigned long long)(off + bytes));
        off += bytes;
    }
    if (n + 9 >= cap) return 0;
    h[n++] = '}';
    while ((8 + n) % 8) h[n++] = ' ';  // the data starts 8-byte aligned (safetensors pads with spaces)
    uint64_t hl = n;
    for (int k = 0; k < 8; k++) buf[k] = (uint8_t)(hl >> (8 * k));
    return 8 + n;
}

static void abort_session(td_pusher *p, const char *sid) {
    char path[128];
    snprintf(path, sizeof path, "/v1/weights/abort?session=%s", sid);
    cJSON *j = NULL;
    td_err e = {0};
    if (request(p, path, "", 0, false, NULL, &j, &e) == TD_OK) cJSON_Delete(j);
}

// Two slots of at least need bytes each: malloc'd buffers, or the two halves of the shared-memory
// file (created at the first shm push, grown in place when a push needs more).
static td_status slots_ensure(td_pusher *p, size_t need, bool shm, td_err *err) {
    need = (need + 4095) & ~(size_t)4095;  // slot 1 starts page-aligned
    if (!shm) {
        if (need > p->buf_cap) {
            for (int k = 0; k < 2; k++) {
                free(p->buf[k]);
                p->buf[k] = malloc(need);
            }
            p->buf_cap = p->buf[0] && p->buf[1] ? need : 0;
            if (!p->buf_cap)
                return td_err_set(err, TD_ERR_NOMEM, "weights push: out of memory for two %zu MiB buckets", need >> 20);
        }
        p->slot[0] = p->buf[0], p->slot[1] = p->buf[1], p->cap = p->buf_cap, p->slot_shm = false;
        return TD_OK;
    }
    if (p->shm_fd < 0) {
        static unsigned counter;
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        snprintf(p->shm_path, sizeof p->shm_path, TD_WSYNC_SHM_PREFIX "push-%d-%u-%lx", (int)getpid(),
                 __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED), (unsigned long)t.tv_nsec);
        p->shm_fd = open(p->shm_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (p->shm_fd < 0)
            return td_err_set(err, TD_ERR_IO, "weights push: cannot create %s: %s", p->shm_path, strerror(errno));
    }
    if (2 * need > p->shm_len) {
        if (p->shm_map) munmap(p->shm_map, p->shm_len);
        p->shm_map = NULL, p->shm_len = 0;
        void *m = MAP_FAILED;
        if (ftruncate(p->shm_fd, (off_t)(2 * need)) == 0)
            m = mmap(NULL, 2 * need, PROT_READ | PROT_WRITE, MAP_SHARED, p->shm_fd, 0);
        if (m == MAP_FAILED)
            return td_err_set(err, TD_ERR_NOMEM, "weights push: cannot size %s to %zu MiB: %s", p->shm_path,
                              (2 * need) >> 20, strerror(errno));
        p->shm_map = m, p->shm_len = 2 * need;
    }
    p->cap = p->shm_len / 2;
    p->slot[0] = p->shm_map, p->slot[1] = p->shm_map + p->cap, p->slot_shm = true;
    return TD_OK;
}

// ---- the sender thread: posts the packed buckets in order, one at a time ------------------------

typedef struct sender {
    td_pusher *p;
    const char *sid;
    int nb;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int queued, done;      // buckets handed over / answered (or failed)
    size_t len[2];         // bytes of the bucket in each slot
    uint64_t sum[2];       // its XXH64
    bool stop;             // the packer gave up: send nothing more
    td_status st;          // the first failure
    td_err err;
    bool shm_refused;      // the server refused a shared-memory reference (HTTP 400 on X-Tandem-Shm)
    double seconds;        // summed request times
    uint64_t bytes;
} sender;

static void *sender_main(void *arg) {
    sender *s = arg;
    td_pusher *p = s->p;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->done == s->queued && !s->stop) pthread_cond_wait(&s->cv, &s->mu);  // the packer is ours, not a peer
        bool quit = s->stop;  // normal end (all answered) or the packer failed: nothing more to send
        int b = s->done;
        size_t len = s->len[b % 2];
        uint64_t sum = s->sum[b % 2];
        pthread_mutex_unlock(&s->mu);
        if (quit || s->st) break;
        char ck[64], path[160], sh[160], so[64], sl[64];
        snprintf(ck, sizeof ck, "X-Tandem-Checksum: %016llx", (unsigned long long)sum);
        snprintf(path, sizeof path, "/v1/weights/bucket?session=%s&index=%d", s->sid, b);
        const char *hdrs[5] = {ck, NULL};
        if (p->slot_shm) {
            snprintf(sh, sizeof sh, "X-Tandem-Shm: %s", p->shm_path);
            snprintf(so, sizeof so, "X-Tandem-Shm-Offset: %zu", (size_t)(p->slot[b % 2] - p->shm_map));
            snprintf(sl, sizeof sl, "X-Tandem-Shm-Length: %zu", len);
            hdrs[1] = sh, hdrs[2] = so, hdrs[3] = sl;
        }
        double t0 = td_now();
        cJSON *j = NULL;
        td_err e = {0};
        td_status st = p->slot_shm ? request(p, path, "", 0, true, hdrs, &j, &e)
                                   : request(p, path, p->slot[b % 2], len, true, hdrs, &j, &e);
        cJSON_Delete(j);
        pthread_mutex_lock(&s->mu);
        s->seconds += td_now() - t0;
        if (st) {
            s->st = st;
            s->err = e;
            s->shm_refused = p->slot_shm && strstr(e.msg, "HTTP 400") && strstr(e.msg, "X-Tandem-Shm");
        } else {
            s->bytes += len;
        }
        s->done++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        if (st) break;
    }
    return NULL;
}

// Waits until fewer than `depth` handed-over buckets are unanswered. Bounded: each bucket request
// is bounded by timeout_ms on the sender, so a longer wait means the sender is stuck.
static td_status sender_wait(sender *s, int depth, td_err *err) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    const long ms = s->p->p.timeout_ms + 10000L;
    dl.tv_sec += ms / 1000;
    dl.tv_nsec += (ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    while (s->queued - s->done >= depth && !s->st && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&s->cv, &s->mu, &dl);
    td_status st = s->st;
    if (st) *err = s->err;
    else if (s->queued - s->done >= depth)
        st = td_err_set(err, TD_ERR_TIMEOUT, "weights push: the bucket sender did not finish within %ld ms", ms);
    pthread_mutex_unlock(&s->mu);
    return st;
}

// Builds bucket [i0, i1) at dst: header, then each tensor fetched and converted in chunks of
// CHUNK values, each chunk hashed twice (the bucket's XXH64, the tensor's content hash) while it
// is in cache. Adds the tensors' content hashes to *content.
#define CHUNK (32 * 1024)  // values
static td_status pack_bucket(td_pusher *p, const td_export_tensor *ts, int i0, int i1, td_dtype wire,
                             td_export_get_fn get, td_export_get_typed_fn typed, void *ctx, uint8_t *dst, size_t *len, uint64_t *bsum,
                             uint64_t *content, XXH64_state_t *bs, XXH64_state_t *tsh, td_err *err) {
    const size_t el = wire == TD_BF16 ? 2 : 4;
    size_t at = write_header(dst, ts, i0, i1, el, wire == TD_BF16 ? "BF16" : "F32");
    if (!at) return td_err_set(err, TD_ERR_LIMIT, "weights push: a bucket's safetensors header is too large");
    XXH64_reset(bs, 0);
    XXH64_update(bs, dst, at);
    for (int i = i0; i < i1; i++) {
        const int64_t n = nelem(&ts[i]);
        uint8_t *out = dst + at;
        td_status st = typed ? typed(ctx, ts[i].name, wire, out, n, err) : TD_ERR_UNSUPPORTED;
        const bool convert = st == TD_ERR_UNSUPPORTED && wire == TD_BF16;  // else the values are in wire form
        if (st == TD_ERR_UNSUPPORTED) st = get(ctx, ts[i].name, wire == TD_BF16 ? p->f32 : (float *)out, n, err);
        if (st) return st;
        XXH64_reset(tsh, 0);
        XXH64_update(tsh, ts[i].name, strlen(ts[i].name));
        for (int64_t o = 0; o < n; o += CHUNK) {
            const int64_t k = n - o < CHUNK ? n - o : CHUNK;
            if (convert) td_from_f32(TD_BF16, p->f32 + o, out + o * 2, k);
            XXH64_update(tsh, out + o * (int64_t)el, (size_t)k * el);
            XXH64_update(bs, out + o * (int64_t)el, (size_t)k * el);
        }
        *content += XXH64_digest(tsh);
        at += (size_t)n * el;
    }
    *len = at;
    *bsum = XXH64_digest(bs);
    return TD_OK;
}

// One push over the given transport. *shm_refused: the server refused the shared-memory reference
// (the session is then over; the caller may retry with bodies).
static td_status push_once(td_pusher *p, const td_model_config *cfg, td_export_get_fn get,
                           td_export_get_typed_fn typed, void *ctx, bool shm,
                           td_push_result *res, bool *shm_refused, td_err *err) {
    td_push_result r = {0};
    *shm_refused = false;
    double t0 = td_now();
    int nt = td_export_tensor_list(cfg, NULL, 0);
    td_export_tensor *ts = nt > 0 ? calloc((size_t)nt, sizeof *ts) : NULL;
    int *bucket_end = nt > 0 ? calloc((size_t)nt, sizeof *bucket_end) : NULL;
    XXH64_state_t *bs = XXH64_createState(), *tsh = XXH64_createState();
    if (!ts || !bucket_end || !bs || !tsh) {
        free(ts);
        free(bucket_end);
        XXH64_freeState(bs);
        XXH64_freeState(tsh);
        return td_err_set(err, TD_ERR_NOMEM, "weights push: out of memory");
    }
    td_export_tensor_list(cfg, ts, nt);
    td_push_info info;
    char sid[64] = "";
    td_status st = td_pusher_query(p, &info, err);
    if (!st) st = check_layout(p, ts, nt, err);
    if (!st && shm && !info.shm) {
        TD_LOGW("weights push: %s does not take shared-memory buckets (start it with --weight-sync-shm): sending the "
                "buckets as HTTP bodies",
                p->url);
        shm = false;
    }
    const size_t el = info.dtype == TD_BF16 ? 2 : 4;
    const char *dt = info.dtype == TD_BF16 ? "BF16" : "F32";
    // Plan: whole tensors in order, up to bucket_bytes of data per bucket (and the server's limit).
    size_t limit = p->p.bucket_bytes;
    if (!st && info.max_bucket_bytes && limit + HDR_ROOM > info.max_bucket_bytes)
        limit = info.max_bucket_bytes > HDR_ROOM ? info.max_bucket_bytes - HDR_ROOM : info.max_bucket_bytes / 2;
    int nb = 0;
    size_t largest = 0, largest_el = 0, cur = 0;  // bytes of the largest bucket; its largest tensor
    for (int i = 0; !st && i < nt; i++) {
        size_t bytes = (size_t)nelem(&ts[i]) * el;
        if ((size_t)nelem(&ts[i]) > largest_el) largest_el = (size_t)nelem(&ts[i]);
        if (info.max_bucket_bytes && bytes + 4096 > info.max_bucket_bytes)
            st = td_err_set(err, TD_ERR_INVALID,
                            "weights push: tensor %s is %zu bytes in %s, more than the server's largest bucket (%llu "
                            "bytes): start the server with a larger --weight-sync-max-bucket-mb",
                            ts[i].name, bytes, dt, (unsigned long long)info.max_bucket_bytes);
        if (cur > 0 && cur + bytes > limit) {  // bucket full: tensor i opens the next one
            bucket_end[nb++] = i;
            cur = 0;
        }
        cur += bytes;
        if (cur > largest) largest = cur;
    }
    if (!st) bucket_end[nb++] = nt;
    if (!st) st = slots_ensure(p, largest + HDR_ROOM, shm, err);
    if (!st && info.dtype == TD_BF16 && largest_el > p->f32_cap) {
        float *f = realloc(p->f32, largest_el * sizeof *f);
        if (!f) st = td_err_set(err, TD_ERR_NOMEM, "weights push: out of memory");
        else p->f32 = f, p->f32_cap = largest_el;
    }
    double t_begin;
    if (!st) {
        char body[64];
        snprintf(body, sizeof body, "{\"n_buckets\":%d}", nb);
        cJSON *j;
        st = request(p, "/v1/weights/begin", body, strlen(body), false, NULL, &j, err);
        if (!st) {
            const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "session");
            if (cJSON_IsString(s) && strlen(s->valuestring) < sizeof sid) snprintf(sid, sizeof sid, "%s", s->valuestring);
            else st = td_err_set(err, TD_ERR_IO, "weights push: begin: no session in the answer");
            cJSON_Delete(j);
        }
    }
    t_begin = td_now();
    uint64_t sum = 0;
    sender sd = {.p = p, .sid = sid, .nb = nb};
    pthread_mutex_init(&sd.mu, NULL);
    pthread_cond_init(&sd.cv, NULL);
    pthread_t th;
    bool have_thread = false;
    if (!st) {
        have_thread = pthread_create(&th, NULL, sender_main, &sd) == 0;
        if (!have_thread) st = td_err_set(err, TD_ERR_NOMEM, "weights push: cannot start the bucket sender thread");
    }
    for (int b = 0, i0 = 0; !st && b < nb; i0 = bucket_end[b], b++) {
        st = sender_wait(&sd, 2, err);  // bucket b - 2, the last user of this slot, is answered
        if (st) break;
        double tp = td_now();
        size_t len = 0;
        uint64_t bsum = 0;
        st = pack_bucket(p, ts, i0, bucket_end[b], info.dtype, get, typed, ctx, p->slot[b % 2], &len, &bsum, &sum, bs, tsh,
                         err);
        r.pack_seconds += td_now() - tp;
        if (st) break;
        pthread_mutex_lock(&sd.mu);
        sd.len[b % 2] = len;
        sd.sum[b % 2] = bsum;
        sd.queued++;
        pthread_cond_broadcast(&sd.cv);
        pthread_mutex_unlock(&sd.mu);
    }
    if (!st) st = sender_wait(&sd, 1, err);  // every bucket answered
    if (have_thread) {
        pthread_mutex_lock(&sd.mu);
        sd.stop = true;
        pthread_cond_broadcast(&sd.cv);
        pthread_mutex_unlock(&sd.mu);
        pthread_join(th, NULL);  // its request in flight is bounded by timeout_ms
        if (!st && sd.st) st = sd.st, *err = sd.err;
    }
    *shm_refused = sd.shm_refused;
    pthread_mutex_destroy(&sd.mu);
    pthread_cond_destroy(&sd.cv);
    r.transfer_seconds = sd.seconds;
    r.bytes = sd.bytes;
    double t_commit = td_now();
    r.bucket_seconds = t_commit - t_begin;
    if (!st) {
        char path[160];
        snprintf(path, sizeof path, "/v1/weights/commit?session=%s", sid);
        cJSON *j;
        st = request(p, path, "", 0, false, NULL, &j, err);
        if (!st) {
            const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "checksum");
            uint64_t theirs = 0;
            r.version = (uint64_t)num(j, "version", 0);
            r.apply_seconds = num(j, "seconds", 0);
            if (!cJSON_IsString(c) || !hex64(c->valuestring, &theirs))
                st = td_err_set(err, TD_ERR_IO, "weights push: commit: no checksum in the answer");
            else if (theirs != sum)
                st = td_err_set(err, TD_ERR_IO,
                                "weights push: the server applied weights with checksum %016llx, this side sent "
                                "%016llx",
                                (unsigned long long)theirs, (unsigned long long)sum);
            cJSON_Delete(j);
        }
        sid[0] = 0;  // committed or refused: the session is over either way
    }
    if (st && sid[0]) abort_session(p, sid);
    r.commit_seconds = td_now() - t_commit;
    r.seconds = td_now() - t0;
    r.checksum = sum;
    r.n_buckets = nb;
    r.shm = shm;
    free(ts);
    free(bucket_end);
    XXH64_freeState(bs);
    XXH64_freeState(tsh);
    if (res) *res = r;
    return st;
}

td_status td_pusher_push(td_pusher *p, const td_model_config *cfg, td_export_get_fn get, void *ctx,
                         td_push_result *res, td_err *err) {
    return td_pusher_push_typed(p, cfg, get, NULL, ctx, res, err);
}

td_status td_pusher_push_typed(td_pusher *p, const td_model_config *cfg, td_export_get_fn get,
                               td_export_get_typed_fn typed, void *ctx, td_push_result *res, td_err *err) {
    bool refused = false;
    td_status st = push_once(p, cfg, get, typed, ctx, p->p.shm, res, &refused, err);
    if (st && refused) {
        TD_LOGW("weights push: the server refused the shared-memory bucket (%s): pushing again with HTTP bodies",
                err->msg);
        st = push_once(p, cfg, get, typed, ctx, false, res, &refused, err);
    }
    return st;
}
