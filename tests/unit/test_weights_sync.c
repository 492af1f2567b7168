// Weight sync end to end over real sockets: `$TANDEM_BIN serve` of the llama2 reference model with
// --enable-weight-sync and --api-key (server A), and of the HF export of a checkpoint trained two
// steps from it (server B, no weight sync). Checks: /health open and every other route 401 without
// the key; the routes refused (404, naming the flag) on B; malformed buckets (checksum mismatch,
// truncated blob, unknown tensor, wrong shape, wrong dtype, duplicate, non-finite value), a commit
// with a missing tensor, a second begin (409) and an expired session are refused with a clear
// message while A keeps its weights (log-probabilities bit for bit, version 0); then td_pusher_push
// of the checkpoint (several buckets) makes A's log-probabilities on fixed prompts equal B's, the
// version goes 0 -> 1 and the checksum equals the client's and one computed here from the
// checkpoint; `tandem weights push` (one bucket: same checksum) and `get`; a source of another
// config refused before sending; pushes to a closed port and to a listener that never answers
// fail within the timeout; the metrics count it all; then the same with a bf16 wire into the bf16
// copy of the model (the engine's typed path). Needs .cache/ref (make_models.py).
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "base/log.h"
#include "model/export.h"
#include "rl/push.h"
#include "run_cmd.h"
#include "serve_proc.h"
#include "test_util.h"
#include "train/ckpt.h"
#include "train/train_run.h"

static const char *KEY = "test-key-7f3a";

static const char *const SERVE_BASE[] = {"--threads", "1", "--max-seqs", "8", NULL};
static bool start_server(const char *bin, const char *model, const char *const *extra, server *s) {
    return td_serve_start(bin, model, SERVE_BASE, extra, s);
}
static int stop_server(server *s) { return td_serve_stop(s); }

// ---- HTTP through libcurl -----------------------------------------------------------------------

typedef struct resp {
    long status;
    char *body;
    size_t len;
} resp;

static size_t collect(char *d, size_t sz, size_t nm, void *ud) {
    resp *r = ud;
    size_t n = sz * nm;
    char *b = realloc(r->body, r->len + n + 1);
    if (!b) return 0;
    memcpy(b + r->len, d, n);
    r->body = b;
    r->len += n;
    r->body[r->len] = 0;
    return n;
}

// method "GET" or "POST" (body may be binary); key NULL: no Authorization; checksum: X-Tandem-Checksum.
static resp http(int port, const char *method, const char *path, const char *key, const void *body, size_t len,
                 const char *checksum) {
    resp r = {0};
    CURL *c = curl_easy_init();
    char url[512], auth[256], ck[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    if (key) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", key);
        h = curl_slist_append(h, auth);
    }
    if (checksum) {
        snprintf(ck, sizeof ck, "X-Tandem-Checksum: %s", checksum);
        h = curl_slist_append(h, ck);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    if (!strcmp(method, "POST")) {
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? len : 0));
    }
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

// A bucket by shared-memory reference: POST with the X-Tandem-Shm headers (any NULL is left out)
// and an optional body.
static resp shm_bucket(int port, const char *sid, int index, const char *file, const char *off, const char *len,
                       const char *sum, const void *body, size_t blen) {
    resp r = {0};
    CURL *c = curl_easy_init();
    char url[512], h1[256], h2[300], h3[100], h4[100], h5[100];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/weights/bucket?session=%s&index=%d", port, sid, index);
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    snprintf(h1, sizeof h1, "Authorization: Bearer %s", KEY);
    h = curl_slist_append(h, h1);
    if (file) snprintf(h2, sizeof h2, "X-Tandem-Shm: %s", file), h = curl_slist_append(h, h2);
    if (off) snprintf(h3, sizeof h3, "X-Tandem-Shm-Offset: %s", off), h = curl_slist_append(h, h3);
    if (len) snprintf(h4, sizeof h4, "X-Tandem-Shm-Length: %s", len), h = curl_slist_append(h, h4);
    if (sum) snprintf(h5, sizeof h5, "X-Tandem-Checksum: %s", sum), h = curl_slist_append(h, h5);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body ? body : "");
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(body ? blen : 0));
    if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (!r.body) r.body = calloc(1, 1);
    return r;
}

static bool has(const resp *r, const char *s) { return r->body && strstr(r->body, s); }

static cJSON *json_of(const resp *r) { return cJSON_ParseWithLength(r->body, r->len); }

// GET /v1/weights' version (-1 on failure) and checksum string ("null" before the first sync).
static long weights_version(int port, char *checksum, size_t cap) {
    resp r = http(port, "GET", "/v1/weights", KEY, NULL, 0, NULL);
    cJSON *j = json_of(&r);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "version");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(j, "checksum");
    long out = r.status == 200 && cJSON_IsNumber(v) ? (long)v->valuedouble : -1;
    if (checksum) snprintf(checksum, cap, "%s", cJSON_IsString(c) ? c->valuestring : "null");
    cJSON_Delete(j);
    free(r.body);
    return out;
}

// Log-probabilities of fixed prompts (echo: every prompt token after the first, plus 4 greedy tokens)
// into lp[cap]; returns the count or -1.
static int logprobs(int port, const char *key, double *lp, int cap) {
    static const char *prompts[] = {"The jury said it did find that many of the laws",
                                    "It recommended that the legislators act"};
    int n = 0;
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        char body[512];
        snprintf(body, sizeof body,
                 "{\"prompt\": \"%s\", \"max_tokens\": 4, \"temperature\": 0, \"logprobs\": 1, \"echo\": true}",
                 prompts[i]);
        resp r = http(port, "POST", "/v1/completions", key, body, strlen(body), NULL);
        cJSON *j = json_of(&r);
        const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0);
        const cJSON *tl = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(ch, "logprobs"),
                                                           "token_logprobs");
        bool ok = r.status == 200 && cJSON_GetArraySize(tl) > 4;
        for (const cJSON *x = tl ? tl->child : NULL; ok && x; x = x->next)
            if (cJSON_IsNumber(x) && n < cap) lp[n++] = x->valuedouble;
        cJSON_Delete(j);
        free(r.body);
        if (!ok) return -1;
    }
    return n;
}

static double max_diff(const double *a, const double *b, int n) {
    double m = 0;
    for (int i = 0; i < n; i++) m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

// ---- hand-made buckets --------------------------------------------------------------------------

typedef struct blob {
    uint8_t *p;
    size_t len;
    char sum[17];
} blob;

// A safetensors blob of n tensors: names[i] with shape / dtype as given and values fill (f32 or bf16).
static blob make_blob(int n, const char *const *names, const int64_t (*shapes)[2], const int *ndims,
                      const char *dtype, float fill) {
    size_t el = !strcmp(dtype, "BF16") ? 2 : 4;
    char hdr[8192];
    size_t h = 0, off = 0;
    h += (size_t)snprintf(hdr + h, sizeof hdr - h, "{");
    for (int i = 0; i < n; i++) {
        size_t ne = (size_t)shapes[i][0] * (ndims[i] == 2 ? (size_t)shapes[i][1] : 1);
        char sh[64];
        if (ndims[i] == 2) snprintf(sh, sizeof sh, "[%lld,%lld]", (long long)shapes[i][0], (long long)shapes[i][1]);
        else snprintf(sh, sizeof sh, "[%lld]", (long long)shapes[i][0]);
        h += (size_t)snprintf(hdr + h, sizeof hdr - h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":%s,\"data_offsets\":[%zu,%zu]}",
                              i ? "," : "", names[i], dtype, sh, off, off + ne * el);
        off += ne * el;
    }
    hdr[h++] = '}';
    blob b = {0};
    b.len = 8 + h + off;
    b.p = calloc(1, b.len);
    for (int k = 0; k < 8; k++) b.p[k] = (uint8_t)((uint64_t)h >> (8 * k));
    memcpy(b.p + 8, hdr, h);
    for (size_t i = 0; i < off / el; i++) {
        if (el == 4) memcpy(b.p + 8 + h + 4 * i, &fill, 4);
        else {
            uint32_t u;
            memcpy(&u, &fill, 4);
            uint16_t v = (uint16_t)(u >> 16);
            memcpy(b.p + 8 + h + 2 * i, &v, 2);
        }
    }
    snprintf(b.sum, sizeof b.sum, "%016llx", (unsigned long long)XXH64(b.p, b.len, 0));
    return b;
}

static void blob_resum(blob *b) { snprintf(b->sum, sizeof b->sum, "%016llx", (unsigned long long)XXH64(b->p, b->len, 0)); }

// Begins a session with n buckets; returns its id in sid (empty on failure).
static void begin(int port, int n, char *sid, size_t cap) {
    char body[64];
    snprintf(body, sizeof body, "{\"n_buckets\": %d}", n);
    resp r = http(port, "POST", "/v1/weights/begin", KEY, body, strlen(body), NULL);
    cJSON *j = json_of(&r);
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(j, "session");
    snprintf(sid, cap, "%s", r.status == 200 && cJSON_IsString(s) ? s->valuestring : "");
    cJSON_Delete(j);
    free(r.body);
}

static resp send_bucket(int port, const char *sid, int index, const blob *b, size_t len, const char *sum) {
    char path[256];
    snprintf(path, sizeof path, "/v1/weights/bucket?session=%s&index=%d", sid, index);
    return http(port, "POST", path, KEY, b->p, len, sum);
}

static resp post_sid(int port, const char *what, const char *sid) {
    char path[256];
    snprintf(path, sizeof path, "/v1/weights/%s?session=%s", what, sid);
    return http(port, "POST", path, KEY, "", 0, NULL);
}

// One failing bucket case: begin, send, expect status and message, session gone afterwards.
static void bad_bucket(int port, const char *what, blob *b, size_t len, const char *sum, long want, const char *msg) {
    char sid[64];
    begin(port, 2, sid, sizeof sid);
    CHECK(sid[0], "%s: begin", what);
    resp r = send_bucket(port, sid, 0, b, len, sum);
    CHECK(r.status == want && has(&r, msg), "%s: HTTP %ld (want %ld) '%s' (want '%s')", what, r.status, want, r.body,
          msg);
    CHECK(has(&r, "nothing was applied"), "%s: says nothing was applied: %s", what, r.body);
    free(r.body);
    r = post_sid(port, "commit", sid);  // the session was aborted by the bad bucket
    CHECK(r.status == 404 && has(&r, "has ended"), "%s: the session is over: %ld %s", what, r.status, r.body);
    free(r.body);
}

// A client that shrinks and regrows its file while the server may be reading it.
typedef struct shaker {
    int fd;
    size_t len;
    const uint8_t *blob;
    volatile int stop;
    long flips;
} shaker;

static void *shake(void *arg) {
    shaker *k = arg;
    while (!k->stop) {
        if (ftruncate(k->fd, 0) != 0) break;
        if (ftruncate(k->fd, (off_t)k->len) != 0 || pwrite(k->fd, k->blob, k->len, 0) != (ssize_t)k->len) break;
        k->flips++;
    }
    return NULL;
}

// One refused shared-memory reference: begin, send, expect status and message, session gone.
static void bad_shm(int port, const char *what, const char *file, const char *off, const char *len, const char *sum,
                    const void *body, size_t blen, const char *msg) {
    char sid[64];
    begin(port, 2, sid, sizeof sid);
    CHECK(sid[0], "%s: begin", what);
    resp r = shm_bucket(port, sid, 0, file, off, len, sum, body, blen);
    CHECK(r.status == 400 && has(&r, msg) && has(&r, "nothing was applied"), "%s: HTTP %ld '%s' (want 400 '%s')", what,
          r.status, r.body, msg);
    free(r.body);
    r = post_sid(port, "commit", sid);
    CHECK(r.status == 404 && has(&r, "has ended"), "%s: the session is over: %ld %s", what, r.status, r.body);
    free(r.body);
}

// ---- the checkpoint's content checksum, computed independently of the server and the client ----

static uint64_t ckpt_checksum(const char *path, const td_model_config *cfg) {
    td_ckpt *ck = NULL;
    td_err err = {0};
    if (td_ckpt_open(path, &ck, &err)) return 0;
    int nt = td_export_tensor_list(cfg, NULL, 0);
    td_export_tensor *ts = calloc((size_t)nt, sizeof *ts);
    td_export_tensor_list(cfg, ts, nt);
    uint64_t sum = 0;
    for (int i = 0; i < nt; i++) {
        int64_t n = ts[i].ndim == 2 ? ts[i].shape[0] * ts[i].shape[1] : ts[i].shape[0];
        float *v = malloc((size_t)n * 4);
        if (td_train_ckpt_get(ck, ts[i].name, v, n, &err) == TD_OK) {
            XXH64_state_t *s = XXH64_createState();
            XXH64_reset(s, 0);
            XXH64_update(s, ts[i].name, strlen(ts[i].name));
            XXH64_update(s, v, (size_t)n * 4);
            sum += XXH64_digest(s);
            XXH64_freeState(s);
        }
        free(v);
    }
    free(ts);
    td_ckpt_close(ck);
    return sum;
}

static int sh(const char *cmd) {
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    char ref[512];
    snprintf(ref, sizeof ref, "%s/ref/llama2", td_test_data_dir());
    CHECK(access(ref, R_OK) == 0, "%s missing: run /usr/bin/python3 tests/reference/make_models.py", ref);
    if (td_test_failed) TEST_DONE();

    // Different weights of the same config: two training steps from the reference model.
    char dir[] = "/tmp/tandem_wsync_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "temporary directory");
    char cmd[4096], path[1024], ckpt[1024], exp[1024];
    snprintf(path, sizeof path, "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    for (int d = 0; f && d < 30; d++)
        fprintf(f, "the jury said it did find that many of the registration and election laws are outmoded %d\n\n", d);
    if (f) fclose(f);
    snprintf(cmd, sizeof cmd,
             "%s data prepare --tokenizer %s --out %s/sh --val-fraction 0 %s >/dev/null 2>&1 && "
             "%s train --model %s --steps 2 --batch 2 --seq-len 32 --lr 1e-2 --warmup 0 --threads 1 --out %s/ck "
             "%s/sh/data-train-000000.tdsh >/dev/null 2>&1",
             bin, ref, dir, path, bin, ref, dir, dir);
    CHECK(sh(cmd) == 0, "train two steps: %s", cmd);
    snprintf(ckpt, sizeof ckpt, "%s/ck/ckpt-000002.tdck", dir);
    snprintf(exp, sizeof exp, "%s/exp", dir);
    snprintf(cmd, sizeof cmd, "%s export %s --to hf -o %s --tokenizer %s >/dev/null 2>&1", bin, ckpt, exp, ref);
    CHECK(sh(cmd) == 0, "export the checkpoint: %s", cmd);
    if (td_test_failed) TEST_DONE();

    server A = {0}, B = {0};
    const char *a_extra[] = {"--enable-weight-sync", "--api-key", KEY, "--weight-sync-timeout", "2", "--weight-sync-shm",
                             NULL};
    CHECK(start_server(bin, ref, a_extra, &A), "server A (weight sync) started");
    CHECK(start_server(bin, exp, NULL, &B), "server B (the checkpoint) started");
    if (td_test_failed) {
        stop_server(&A);
        stop_server(&B);
        TEST_DONE();
    }

    double lpA0[64], lpB[64], lp[64];
    int n = logprobs(A.port, KEY, lpA0, 64);
    int nb = logprobs(B.port, NULL, lpB, 64);
    CHECK(n > 10 && n == nb, "logprobs of A (%d) and B (%d)", n, nb);
    CHECK(max_diff(lpA0, lpB, n) > 1e-3, "the checkpoint's weights differ from the reference's (%.3g)",
          max_diff(lpA0, lpB, n));

    // ---- auth ----
    resp r = http(A.port, "GET", "/health", NULL, NULL, 0, NULL);
    CHECK(r.status == 200, "/health needs no key: %ld", r.status);
    free(r.body);
    const char *routes[][2] = {{"GET", "/v1/models"}, {"GET", "/metrics"}, {"GET", "/v1/weights"},
                               {"POST", "/v1/completions"}, {"POST", "/v1/weights/begin"}, {"GET", "/nonexistent"}};
    for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
        r = http(A.port, routes[i][0], routes[i][1], NULL, "{}", 2, NULL);
        CHECK(r.status == 401 && has(&r, "\"AuthenticationError\"") && has(&r, "Missing API key"),
              "%s without a key: %ld %s", routes[i][1], r.status, r.body);
        free(r.body);
        r = http(A.port, routes[i][0], routes[i][1], "test-key-7f3b", "{}", 2, NULL);
        CHECK(r.status == 401 && has(&r, "Incorrect API key"), "%s with a wrong key: %ld %s", routes[i][1], r.status,
              r.body);
        free(r.body);
    }
    r = http(A.port, "GET", "/v1/models", "test-key-7f3", NULL, 0, NULL);  // a prefix of the key
    CHECK(r.status == 401, "a prefix of the key: %ld", r.status);
    free(r.body);
    r = http(A.port, "GET", "/v1/models", KEY, NULL, 0, NULL);
    CHECK(r.status == 200, "the right key: %ld %s", r.status, r.body);
    free(r.body);

    // ---- disabled ----
    r = http(B.port, "GET", "/v1/weights", NULL, NULL, 0, NULL);
    CHECK(r.status == 404 && has(&r, "--enable-weight-sync"), "disabled GET: %ld %s", r.status, r.body);
    free(r.body);
    r = http(B.port, "POST", "/v1/weights/begin", NULL, "{\"n_buckets\":1}", 15, NULL);
    CHECK(r.status == 404 && has(&r, "--enable-weight-sync"), "disabled begin: %ld %s", r.status, r.body);
    free(r.body);

    char ck[64];
    CHECK(weights_version(A.port, ck, sizeof ck) == 0 && !strcmp(ck, "null"), "version 0, no checksum: %s", ck);

    // ---- malformed buckets: each refused with its reason, the session aborted ----
    td_model *m = NULL;
    td_err err = {0};
    CHECK(td_model_load(ref, &m, &err) == TD_OK, "load %s: %s", ref, err.msg);
    if (!m) {
        stop_server(&A);
        stop_server(&B);
        TEST_DONE();
    }
    td_export_tensor ts[64];
    int nt = td_export_tensor_list(&m->cfg, ts, 64);
    const char *names[2] = {ts[0].name, ts[1].name};
    int64_t shapes[2][2] = {{ts[0].shape[0], ts[0].shape[1]}, {ts[1].shape[0], ts[1].shape[1]}};
    int ndims[2] = {ts[0].ndim, ts[1].ndim};
    blob good = make_blob(2, names, shapes, ndims, "F32", 0.5f);

    bad_bucket(A.port, "wrong checksum", &good, good.len, "0123456789abcdef", 400, "checksum mismatch");
    bad_bucket(A.port, "no checksum header", &good, good.len, NULL, 400, "X-Tandem-Checksum");
    blob cut = good;
    cut.len = good.len - 100;  // a truncated blob with the checksum of what is sent
    blob_resum(&cut);
    bad_bucket(A.port, "truncated blob", &cut, cut.len, cut.sum, 400, "truncated safetensors blob");
    cut.len = 6;  // not even the header length
    blob_resum(&cut);
    bad_bucket(A.port, "truncated header", &cut, cut.len, cut.sum, 400, "truncated safetensors blob");
    {
        const char *bad_names[1] = {"model.layers.9.mlp.up_proj.weight"};
        blob b = make_blob(1, bad_names, shapes, ndims, "F32", 0.5f);
        bad_bucket(A.port, "unknown tensor", &b, b.len, b.sum, 400, "unknown tensor 'model.layers.9.mlp.up_proj.weight'");
        free(b.p);
        int64_t wrong[1][2] = {{shapes[0][0], shapes[0][1] + 1}};
        b = make_blob(1, names, wrong, ndims, "F32", 0.5f);
        bad_bucket(A.port, "wrong shape", &b, b.len, b.sum, 400, "has shape [384,65], the served model's is [384, 64]");
        free(b.p);
        b = make_blob(1, names, shapes, ndims, "BF16", 0.5f);
        bad_bucket(A.port, "wrong dtype", &b, b.len, b.sum, 400, "is BF16; this server's weight sync takes F32");
        free(b.p);
        const char *twice[2] = {ts[0].name, ts[0].name};
        int64_t sh2[2][2] = {{shapes[0][0], shapes[0][1]}, {shapes[0][0], shapes[0][1]}};
        int nd2[2] = {2, 2};
        b = make_blob(2, twice, sh2, nd2, "F32", 0.5f);
        bad_bucket(A.port, "duplicate in a bucket", &b, b.len, b.sum, 400, "appears twice in the bucket");
        free(b.p);
        b = make_blob(1, names, shapes, ndims, "F32", NAN);
        bad_bucket(A.port, "non-finite", &b, b.len, b.sum, 400, "is not finite");
        free(b.p);
    }
    {  // a tensor sent again in a second bucket
        char sid[64];
        begin(A.port, 2, sid, sizeof sid);
        r = send_bucket(A.port, sid, 0, &good, good.len, good.sum);
        CHECK(r.status == 200, "good bucket: %ld %s", r.status, r.body);
        free(r.body);
        r = send_bucket(A.port, sid, 1, &good, good.len, good.sum);
        CHECK(r.status == 400 && has(&r, "was already sent in this session"), "duplicate tensor: %ld %s", r.status, r.body);
        free(r.body);
    }
    {  // commit with tensors missing
        char sid[64];
        begin(A.port, 1, sid, sizeof sid);
        r = send_bucket(A.port, sid, 0, &good, good.len, good.sum);
        CHECK(r.status == 200, "good bucket: %ld %s", r.status, r.body);
        free(r.body);
        r = post_sid(A.port, "commit", sid);
        char want[200];
        snprintf(want, sizeof want, "tensor %s was not sent (%d of the model's %d tensors missing)", ts[2].name, nt - 2, nt);
        CHECK(r.status == 400 && has(&r, want), "commit with missing tensors: %ld %s", r.status, r.body);
        free(r.body);
    }
    {  // one session at a time; abort; expiry
        char s1[64], s2[64];
        begin(A.port, 1, s1, sizeof s1);
        resp r2 = http(A.port, "POST", "/v1/weights/begin", KEY, "{\"n_buckets\": 1}", 16, NULL);
        CHECK(r2.status == 409 && has(&r2, "another weight-sync session is open"), "second begin: %ld %s", r2.status,
              r2.body);
        free(r2.body);
        r = post_sid(A.port, "abort", s1);
        CHECK(r.status == 200, "abort: %ld %s", r.status, r.body);
        free(r.body);
        begin(A.port, 1, s2, sizeof s2);
        CHECK(s2[0] && strcmp(s1, s2), "begin after abort");
        usleep(2600 * 1000);  // --weight-sync-timeout 2
        begin(A.port, 1, s1, sizeof s1);
        CHECK(s1[0], "begin after the idle session expired");
        r = send_bucket(A.port, s2, 0, &good, good.len, good.sum);
        CHECK(r.status == 404 && has(&r, "expired"), "a bucket for the expired session: %ld %s", r.status, r.body);
        free(r.body);
        r = post_sid(A.port, "abort", s1);
        free(r.body);
        r = http(A.port, "POST", "/v1/weights/begin", KEY, "{\"n_buckets\": 0}", 16, NULL);
        CHECK(r.status == 400 && has(&r, "n_buckets must be an integer"), "n_buckets 0: %ld %s", r.status, r.body);
        free(r.body);
    }
    {  // shared-memory references: the good one is taken, each bad one refused with its reason
        char shm[128], lens[32], offs[32];
        snprintf(shm, sizeof shm, "/dev/shm/tandem-test-%d", (int)getpid());
        FILE *sf = fopen(shm, "wb");
        CHECK(sf && fwrite("pad!", 1, 4, sf) == 4 && fwrite(good.p, 1, good.len, sf) == good.len, "write %s", shm);
        if (sf) fclose(sf);
        snprintf(lens, sizeof lens, "%zu", good.len);
        char sid[64];
        begin(A.port, 2, sid, sizeof sid);
        r = shm_bucket(A.port, sid, 0, shm, "4", lens, good.sum, NULL, 0);
        CHECK(r.status == 200 && has(&r, "\"tensors\":2"), "a good shared-memory bucket: %ld %s", r.status, r.body);
        free(r.body);
        r = post_sid(A.port, "abort", sid);
        free(r.body);
        bad_shm(A.port, "outside the prefix", "/tmp/tandem-x", "0", lens, good.sum, NULL, 0,
                "is not a file /dev/shm/tandem-NAME");
        bad_shm(A.port, "a path out of /dev/shm", "/dev/shm/tandem-../../etc/passwd", "0", "10", good.sum, NULL, 0,
                "is not a file /dev/shm/tandem-NAME");
        bad_shm(A.port, "a missing file", "/dev/shm/tandem-test-missing-file", "0", lens, good.sum, NULL, 0,
                "X-Tandem-Shm: cannot open /dev/shm/tandem-test-missing-file");
        snprintf(offs, sizeof offs, "%d", 5);  // one byte past the blob's start: the file is a byte short
        bad_shm(A.port, "a short file", shm, offs, lens, good.sum, NULL, 0, "the file is too short");
        bad_shm(A.port, "a checksum mismatch", shm, "4", lens, "0123456789abcdef", NULL, 0, "checksum mismatch");
        bad_shm(A.port, "no length", shm, "4", NULL, good.sum, NULL, 0, "needs X-Tandem-Shm-Offset and X-Tandem-Shm-Length");
        bad_shm(A.port, "a body as well", shm, "4", lens, good.sum, "xyz", 3, "a shared-memory bucket has no body");
        snprintf(lens, sizeof lens, "%zu", good.len - 100);  // the blob cut: its checksum would not even matter
        bad_shm(A.port, "a truncated blob", shm, "4", lens, good.sum, NULL, 0, "truncated safetensors blob");
        // The file shrinking under the server's reads: each bucket is taken or refused (a short
        // file, a fault caught as "shrank", or zeros where the blob was), never a crash
        int fd = open(shm, O_RDWR);
        shaker k = {.fd = fd, .len = good.len, .blob = good.p};
        pthread_t th;
        CHECK(fd >= 0 && pthread_create(&th, NULL, shake, &k) == 0, "start the shaker");
        snprintf(lens, sizeof lens, "%zu", good.len);
        int took = 0, refused = 0, odd = 0;
        for (int i = 0; fd >= 0 && i < 60; i++) {
            begin(A.port, 2, sid, sizeof sid);
            r = shm_bucket(A.port, sid, 0, shm, "0", lens, good.sum, NULL, 0);
            if (r.status == 200) took++;
            else if (r.status == 400 && has(&r, "nothing was applied")) refused++;
            else odd++, printf("shaken bucket: %ld %s\n", r.status, r.body);
            free(r.body);
            r = post_sid(A.port, "abort", sid);
            free(r.body);
        }
        k.stop = 1;
        if (fd >= 0) pthread_join(th, NULL), close(fd);
        printf("a shrinking file: %d buckets taken, %d refused, %ld truncations\n", took, refused, k.flips);
        CHECK(odd == 0 && took + refused == 60, "every shaken bucket was answered 200 or 400 (%d odd)", odd);
        r = http(A.port, "GET", "/health", NULL, NULL, 0, NULL);
        CHECK(r.status == 200, "the server survived the shrinking file: %ld", r.status);
        free(r.body);

        // The fault itself, deterministically: server E skips the size check (fault injection),
        // so a file cut after E mapped it faults inside the copy; the SIGBUS becomes a 400
        server E = {0};
        const char *e_extra[] = {"--enable-weight-sync", "--api-key", KEY, "--weight-sync-shm", NULL};
        setenv("TANDEM_WSYNC_FAULT", "shm-size", 1);
        CHECK(start_server(bin, ref, e_extra, &E), "server E (fault injection) started");
        unsetenv("TANDEM_WSYNC_FAULT");
        fd = open(shm, O_RDWR | O_TRUNC);
        CHECK(fd >= 0 && pwrite(fd, good.p, good.len, 0) == (ssize_t)good.len, "rewrite %s", shm);
        begin(E.port, 2, sid, sizeof sid);
        r = shm_bucket(E.port, sid, 0, shm, "0", lens, good.sum, NULL, 0);
        CHECK(r.status == 200, "E takes the whole file: %ld %s", r.status, r.body);
        free(r.body);
        r = post_sid(E.port, "abort", sid);
        free(r.body);
        CHECK(fd >= 0 && ftruncate(fd, 4096) == 0, "cut the file to one page");
        begin(E.port, 2, sid, sizeof sid);
        r = shm_bucket(E.port, sid, 0, shm, "0", lens, good.sum, NULL, 0);
        CHECK(r.status == 400 && has(&r, "shrank while the bucket was read") && has(&r, "nothing was applied"),
              "a file cut under the mapping: %ld %s", r.status, r.body);
        free(r.body);
        CHECK(fd >= 0 && pwrite(fd, good.p, good.len, 0) == (ssize_t)good.len, "restore %s", shm);
        begin(E.port, 2, sid, sizeof sid);
        r = shm_bucket(E.port, sid, 0, shm, "0", lens, good.sum, NULL, 0);
        CHECK(r.status == 200, "E maps the file again and takes it: %ld %s", r.status, r.body);
        free(r.body);
        r = post_sid(E.port, "abort", sid);
        free(r.body);
        CHECK(weights_version(E.port, NULL, 0) == 0, "E kept its weights");
        CHECK(stop_server(&E) == 0, "server E exits 0");
        if (fd >= 0) close(fd);
        unlink(shm);
    }
    free(good.p);
    CHECK(weights_version(A.port, ck, sizeof ck) == 0, "still version 0 after the refused syncs");
    CHECK(logprobs(A.port, KEY, lp, 64) == n && max_diff(lp, lpA0, n) == 0,
          "the old weights still serve, bit for bit (%.3g)", max_diff(lp, lpA0, n));

    // ---- dead servers: refused quickly, or timed out within the limit ----
    td_pusher_params pp = td_pusher_default_params();
    pp.timeout_ms = 1000;
    char url[128];
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    socklen_t sl = sizeof sa;
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0,
          "bind a port");
    snprintf(url, sizeof url, "http://127.0.0.1:%d", ntohs(sa.sin_port));
    pp.url = url;
    td_pusher *dead = NULL;
    CHECK(td_pusher_create(&pp, &dead, &err) == TD_OK, "pusher: %s", err.msg);
    td_push_info info;
    double t0 = td_now();
    td_status st = td_pusher_query(dead, &info, &err);  // bound, not listening: refused
    CHECK(st == TD_ERR_IO && strstr(err.msg, url) && td_now() - t0 < 1.5, "nothing listening: %s (%.2f s)", err.msg,
          td_now() - t0);
    CHECK(listen(lfd, 4) == 0, "listen");  // now a listener that never answers
    t0 = td_now();
    st = td_pusher_push(dead, &m->cfg, td_export_model_get, m, NULL, &err);
    double dt = td_now() - t0;
    CHECK(st == TD_ERR_TIMEOUT && strstr(err.msg, "timed out after 1000 ms") && dt > 0.9 && dt < 3,
          "a listener that never answers: %s (%.2f s)", err.msg, dt);
    td_pusher_free(dead);
    close(lfd);

    // ---- the good push: library, several buckets ----
    td_ckpt *cko = NULL;
    CHECK(td_ckpt_open(ckpt, &cko, &err) == TD_OK, "open %s: %s", ckpt, err.msg);
    td_model_config ccfg;
    CHECK(cko && td_train_ckpt_config(cko, &ccfg, &err) == TD_OK, "checkpoint config: %s", err.msg);
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", A.port);
    pp = td_pusher_default_params();
    pp.url = url;
    pp.timeout_ms = 20000;
    pp.api_key = "wrong";
    td_pusher *pu = NULL;
    CHECK(td_pusher_create(&pp, &pu, &err) == TD_OK, "pusher: %s", err.msg);
    st = td_pusher_push(pu, &ccfg, td_train_ckpt_get, cko, NULL, &err);
    CHECK(st == TD_ERR_IO && strstr(err.msg, "HTTP 401"), "push with a wrong key: %s", err.msg);
    td_pusher_free(pu);
    pp.api_key = KEY;
    pp.bucket_bytes = 64 << 10;  // 574 KB of weights: several buckets
    CHECK(td_pusher_create(&pp, &pu, &err) == TD_OK, "pusher: %s", err.msg);
    td_push_result res = {0};
    st = td_pusher_push(pu, &ccfg, td_train_ckpt_get, cko, &res, &err);
    CHECK(st == TD_OK, "push the checkpoint: %s", err.msg);
    CHECK(res.version == 1 && res.n_buckets > 4, "version %llu after %d buckets", (unsigned long long)res.version,
          res.n_buckets);
    uint64_t want_sum = ckpt_checksum(ckpt, &ccfg);
    char want_hex[17];
    snprintf(want_hex, sizeof want_hex, "%016llx", (unsigned long long)want_sum);
    CHECK(res.checksum == want_sum, "client checksum %016llx == %s", (unsigned long long)res.checksum, want_hex);
    CHECK(weights_version(A.port, ck, sizeof ck) == 1 && !strcmp(ck, want_hex), "GET: version 1, checksum %s (want %s)",
          ck, want_hex);
    td_push_info qi;
    CHECK(td_pusher_query(pu, &qi, &err) == TD_OK && qi.version == 1 && qi.has_checksum && qi.checksum == want_sum &&
              qi.dtype == TD_F32 && qi.n_tensors == nt,
          "td_pusher_query: %s", err.msg);
    CHECK(logprobs(A.port, KEY, lp, 64) == n, "logprobs after the push");
    CHECK(max_diff(lp, lpB, n) <= 1e-5, "A serves the pushed weights: max |A - B| = %.3g", max_diff(lp, lpB, n));
    printf("after the push: max |A - B| = %.3g over %d log-probabilities (before: %.3g)\n", max_diff(lp, lpB, n), n,
           max_diff(lpA0, lpB, n));
    td_pusher_free(pu);

    // ---- the CLI: one bucket, the same content checksum; get; another config refused ----
    snprintf(cmd, sizeof cmd, "%s weights push http://127.0.0.1:%d %s --api-key %s --timeout 20 2>/dev/null", bin,
             A.port, ckpt, KEY);
    int rc;
    char *out = td_test_run(cmd, &rc);
    CHECK(rc == 0 && out && strstr(out, "\"version\": 2") && strstr(out, want_hex) && strstr(out, "\"buckets\": 1"),
          "tandem weights push: %d %s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "TANDEM_API_KEY=%s %s weights get http://127.0.0.1:%d", KEY, bin, A.port);
    out = td_test_run(cmd, &rc);
    CHECK(rc == 0 && out && strstr(out, "\"version\": 2") && strstr(out, want_hex), "tandem weights get: %d %s", rc,
          out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s weights push http://127.0.0.1:%d %s/ref/llama3 --api-key %s 2>&1", bin, A.port,
             td_test_data_dir(), KEY);
    out = td_test_run(cmd, &rc);
    CHECK(rc == 1 && out && strstr(out, "not the served model's config"), "another config: %d %s", rc, out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s weights push http://127.0.0.1:%d %s 2>&1", bin, A.port, ckpt);
    out = td_test_run(cmd, &rc);
    CHECK(rc == 1 && out && strstr(out, "HTTP 401"), "CLI without the key: %d %s", rc, out ? out : "");
    free(out);
    CHECK(weights_version(A.port, NULL, 0) == 2, "version 2 after the refused pushes");
    CHECK(logprobs(A.port, KEY, lp, 64) == n && max_diff(lp, lpB, n) <= 1e-5, "still B's weights (%.3g)",
          max_diff(lp, lpB, n));

    // ---- the same through shared memory: the reference model back (A's first log-probabilities,
    // bit for bit), then the checkpoint again (what the body pushes gave, bit for bit) ----
    {
        double lp_body[64];
        memcpy(lp_body, lp, sizeof lp_body);
        pp = td_pusher_default_params();
        pp.url = url;
        pp.api_key = KEY;
        pp.timeout_ms = 20000;
        pp.bucket_bytes = 64 << 10;
        pp.shm = true;
        CHECK(td_pusher_create(&pp, &pu, &err) == TD_OK, "shm pusher: %s", err.msg);
        td_push_result rs = {0};
        st = td_pusher_push(pu, &m->cfg, td_export_model_get, m, &rs, &err);
        CHECK(st == TD_OK && rs.shm && rs.version == 3 && rs.n_buckets > 4, "shm push of the reference: %s (shm %d, v %llu)",
              err.msg, rs.shm, (unsigned long long)rs.version);
        CHECK(logprobs(A.port, KEY, lp, 64) == n && max_diff(lp, lpA0, n) == 0,
              "the reference's weights again, bit for bit (%.3g)", max_diff(lp, lpA0, n));
        st = td_pusher_push(pu, &ccfg, td_train_ckpt_get, cko, &rs, &err);
        CHECK(st == TD_OK && rs.shm && rs.version == 4 && rs.checksum == want_sum, "shm push of the checkpoint: %s", err.msg);
        CHECK(weights_version(A.port, ck, sizeof ck) == 4 && !strcmp(ck, want_hex), "GET after shm: version 4, %s", ck);
        CHECK(logprobs(A.port, KEY, lp, 64) == n && max_diff(lp, lp_body, n) == 0,
              "the shm push serves what the body push did, bit for bit (%.3g)", max_diff(lp, lp_body, n));
        td_ckpt_close(cko);
        td_pusher_free(pu);
        snprintf(cmd, sizeof cmd, "ls /dev/shm/ 2>/dev/null | grep -c '^tandem-push-%d-' || true", (int)getpid());
        out = td_test_run(cmd, &rc);
        CHECK(out && atoi(out) == 0, "td_pusher_free removed its shared-memory file: %s", out ? out : "");
        free(out);
    }

    // ---- metrics ----
    r = http(A.port, "GET", "/metrics", KEY, NULL, 0, NULL);
    CHECK(r.status == 200 && has(&r, "tandem_weights_version{model_name=\"llama2\"} 4\n") &&
              has(&r, "tandem_weight_syncs_total{model_name=\"llama2\",result=\"ok\"} 4\n") &&
              has(&r, "tandem_weight_sync_seconds_count{model_name=\"llama2\"} 4\n") &&
              has(&r, "# TYPE tandem_weight_sync_bytes_total counter"),
          "metrics: %s", r.body);
    const char *fl = strstr(r.body, "result=\"failed\"} ");
    CHECK(fl && atoi(fl + strlen("result=\"failed\"} ")) >= 20, "failed syncs counted: %s", fl ? fl : "(none)");
    free(r.body);

    // ---- a bf16 wire into a bf16 model (the engine's typed path: staged bytes copied as they are) ----
    char ref16[512], exp16[1024];
    snprintf(ref16, sizeof ref16, "%s/ref/llama2-hf-bf16", td_test_data_dir());
    snprintf(exp16, sizeof exp16, "%s/exp16", dir);
    snprintf(cmd, sizeof cmd, "%s export %s --to hf --type bf16 -o %s --tokenizer %s >/dev/null 2>&1", bin, ckpt, exp16,
             ref);
    CHECK(sh(cmd) == 0, "export the checkpoint in bf16: %s", cmd);
    server C = {0}, D = {0};
    const char *c_extra[] = {"--enable-weight-sync", "--weight-sync-dtype", "bf16", "--api-key", KEY, NULL};
    CHECK(start_server(bin, ref16, c_extra, &C), "server C (bf16 weight sync) started");
    CHECK(start_server(bin, exp16, NULL, &D), "server D (the checkpoint in bf16) started");
    double lpC0[64], lpD[64];
    CHECK(logprobs(C.port, KEY, lpC0, 64) == n && logprobs(D.port, NULL, lpD, 64) == n, "logprobs of C and D");
    CHECK(max_diff(lpC0, lpD, n) > 1e-3, "C and D differ before the push (%.3g)", max_diff(lpC0, lpD, n));
    {  // C runs without --weight-sync-shm: a reference is refused, naming the flag
        char sid[64];
        begin(C.port, 1, sid, sizeof sid);
        r = shm_bucket(C.port, sid, 0, "/dev/shm/tandem-anything", "0", "100", "0123456789abcdef", NULL, 0);
        CHECK(r.status == 400 && has(&r, "shared-memory buckets are disabled on this server (start it with "
                                         "--weight-sync-shm"),
              "shm on a server without it: %ld %s", r.status, r.body);
        free(r.body);
    }
    // C runs without --weight-sync-shm: --shm falls back to bodies, saying so
    snprintf(cmd, sizeof cmd, "%s weights push http://127.0.0.1:%d %s --api-key %s --bucket-mb 1 --shm 2>&1", bin,
             C.port, ckpt, KEY);
    out = td_test_run(cmd, &rc);
    CHECK(rc == 0 && out && strstr(out, "\"version\": 1") && strstr(out, "\"shm\": false") &&
              strstr(out, "does not take shared-memory buckets (start it with --weight-sync-shm)"),
          "push in bf16, --shm falling back to bodies: %d %s", rc, out ? out : "");
    free(out);
    resp w = http(C.port, "GET", "/v1/weights", KEY, NULL, 0, NULL);
    CHECK(has(&w, "\"dtype\":\"bf16\"") && has(&w, "\"bytes\":287360"), "C stages bf16: %s", w.body);
    free(w.body);
    CHECK(logprobs(C.port, KEY, lp, 64) == n && max_diff(lp, lpD, n) <= 1e-5,
          "C serves the pushed bf16 weights: max |C - D| = %.3g", max_diff(lp, lpD, n));
    CHECK(stop_server(&C) == 0 && stop_server(&D) == 0, "servers C and D exit 0");

    CHECK(stop_server(&A) == 0, "server A exits 0");
    CHECK(stop_server(&B) == 0, "server B exits 0");
    td_model_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    sh(cmd);
    curl_global_cleanup();
    TEST_DONE();
}
