// POST /v1/embeddings end to end: `$TANDEM_BIN serve` on the llama2 and qwen3 reference models
// against the PyTorch oracle (tests/reference/embed_oracle.py: the final hidden state after the
// final RMSNorm, pooled last / mean, normalised or raw, in float64): every float within 1e-5 and
// cosine > 0.9999, with --max-batched-tokens 64 and --max-seqs 4 so that a 160-token input runs in
// chunks and 7 inputs share forwards and queue for rows. Also: base64 decodes to exactly the float
// form; batch order is kept (reversed batch); token-id inputs equal the same text's; usage counts;
// every bad body is a 400 naming its field; a streamed greedy completion with embedding requests
// running during it gives the same text as alone, and no KV block stays used; /metrics counts; the
// mock engine (no embed method) answers 400; and the official `openai` client's
// embeddings.create (base64 by default, decoded by the client) in tests/e2e/embeddings.test.js;
// llama2 again on the OpenCL backend where one is found (a line says when it is not).
// Needs: tests/oracle/gen/models_embed.sh output, `npm ci --prefix tests/oracle`, node.
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "base/file.h"
#include "http_test.h"
#include "serve_proc.h"
#include "serve_mock.h"
#include "server/server.h"
#include "test_util.h"

#define RESP_CAP (4u << 20)
#define TOL_ABS 1e-5
#define MIN_COS 0.9999

static char *resp_buf;

// POST body to path; returns the HTTP status (-1 on a transport error) and the parsed JSON body
// in *out (NULL when not JSON; caller frees).
static int post(int port, const char *path, const char *body, cJSON **out) {
    *out = NULL;
    int fd = td_http_connect(port);
    if (fd < 0) return -1;
    size_t bl = strlen(body);
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n",
                      path, bl);
    if (write(fd, head, (size_t)hl) != hl || write(fd, body, bl) != (ssize_t)bl) {
        close(fd);
        return -1;
    }
    size_t n = 0;
    td_http_read_until(fd, resp_buf, RESP_CAP, &n, NULL);
    close(fd);
    int status = -1;
    if (sscanf(resp_buf, "HTTP/1.%*d %d", &status) != 1) return -1;
    const char *b = strstr(resp_buf, "\r\n\r\n");
    if (b) *out = cJSON_Parse(b + 4);
    return status;
}

static int get_text(int port, const char *path, char *buf, size_t cap) {
    int fd = td_http_connect(port);
    if (fd < 0) return -1;
    char req[256];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", path);
    if (write(fd, req, (size_t)rl) != rl) return close(fd), -1;
    size_t n = 0;
    td_http_read_until(fd, buf, cap, &n, NULL);
    close(fd);
    return (int)n;
}

// The embeddings of a 200 response as floats: [n, dim] malloc'd (float or base64 form).
static float *embeddings_of(const cJSON *j, int n, int dim, bool b64) {
    const cJSON *data = cJSON_GetObjectItem(j, "data");
    if (cJSON_GetArraySize(data) != n) return NULL;
    float *v = calloc((size_t)n * (size_t)dim, sizeof *v);
    int i = 0;
    for (const cJSON *it = data->child; it; it = it->next, i++) {
        const cJSON *idx = cJSON_GetObjectItem(it, "index"), *e = cJSON_GetObjectItem(it, "embedding");
        const cJSON *obj = cJSON_GetObjectItem(it, "object");
        if (!cJSON_IsNumber(idx) || idx->valueint != i || !cJSON_IsString(obj) || strcmp(obj->valuestring, "embedding"))
            return free(v), NULL;
        if (b64) {  // an independent decoder: RFC 4648, then little-endian float32
            if (!cJSON_IsString(e)) return free(v), NULL;
            static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            const char *s = e->valuestring;
            size_t len = strlen(s), nb = 0;
            unsigned char *bytes = malloc(len);
            uint32_t acc = 0;
            int bits = 0;
            for (size_t k = 0; k < len && s[k] != '='; k++) {
                const char *p = strchr(tab, s[k]);
                if (!p || !s[k]) return free(bytes), free(v), NULL;
                acc = acc << 6 | (uint32_t)(p - tab);
                bits += 6;
                if (bits >= 8) bits -= 8, bytes[nb++] = (unsigned char)(acc >> bits);
            }
            if (nb != (size_t)dim * 4) return free(bytes), free(v), NULL;
            for (int d = 0; d < dim; d++) {
                uint32_t u = 0;
                for (int k = 0; k < 4; k++) u |= (uint32_t)bytes[d * 4 + k] << (8 * k);
                memcpy(&v[(size_t)i * dim + d], &u, 4);
            }
            free(bytes);
        } else {
            if (cJSON_GetArraySize(e) != dim) return free(v), NULL;
            int d = 0;
            for (const cJSON *x = e->child; x; x = x->next, d++) v[(size_t)i * dim + d] = (float)x->valuedouble;
        }
    }
    return v;
}

// Compares got[dim] with the oracle row; returns whether within tolerance (and says why not).
static bool close_to(const float *got, const cJSON *ref, int dim, const char *what) {
    double dot = 0, ng = 0, nr = 0, maxd = 0, scale = 1;
    int d = 0;
    for (const cJSON *x = ref->child; x && d < dim; x = x->next, d++) {
        double r = x->valuedouble, g = got[d];
        dot += r * g, ng += g * g, nr += r * r;
        if (fabs(g - r) > maxd) maxd = fabs(g - r);
        if (fabs(r) > scale) scale = fabs(r);
    }
    double cos = dot / sqrt(ng * nr + 1e-300);
    bool ok = d == dim && cos > MIN_COS && maxd <= TOL_ABS * scale;
    if (!ok) fprintf(stderr, "  %s: cosine %.9f, max abs diff %.3g (scale %.3g)\n", what, cos, maxd, scale);
    return ok;
}

// The inputs of the oracle as a JSON array: texts (strings) or token-id arrays.
static char *inputs_json(const cJSON *inputs, bool want_text, bool as_ids, int *n, int *idx, bool reverse) {
    cJSON *a = cJSON_CreateArray();
    int k = 0, i = 0;
    for (const cJSON *it = inputs->child; it; it = it->next, i++) {
        const cJSON *t = cJSON_GetObjectItem(it, "text");
        if (want_text != (t != NULL)) continue;
        idx[k++] = i;
    }
    for (int q = 0; q < k; q++) {
        const cJSON *it = cJSON_GetArrayItem(inputs, idx[reverse ? k - 1 - q : q]);
        if (want_text && !as_ids)
            cJSON_AddItemToArray(a, cJSON_CreateString(cJSON_GetObjectItem(it, "text")->valuestring));
        else
            cJSON_AddItemToArray(a, cJSON_Duplicate(cJSON_GetObjectItem(it, "ids"), 1));
    }
    if (reverse)
        for (int q = 0; q < k / 2; q++) {
            int t = idx[q];
            idx[q] = idx[k - 1 - q];
            idx[k - 1 - q] = t;
        }
    *n = k;
    char *s = cJSON_PrintUnformatted(a);
    cJSON_Delete(a);
    return s;
}

static char *body_with(const char *input_json, const char *extra) {
    char *b = malloc(strlen(input_json) + strlen(extra) + 64);
    sprintf(b, "{\"model\":\"m\",\"input\":%s%s}", input_json, extra);
    return b;
}

// Sends the oracle's texts (or ids), checks every embedding against pooled[kind]; returns them.
static float *check_set(int port, const cJSON *inputs, const cJSON *ref, int dim, bool text, bool as_ids, bool reverse,
                        bool b64, const char *what, int *n_out) {
    int n = 0, idx[64];
    char *in = inputs_json(inputs, text, as_ids, &n, idx, reverse);
    char *body = body_with(in, b64 ? ",\"encoding_format\":\"base64\"" : "");
    cJSON *j = NULL;
    int st = post(port, "/v1/embeddings", body, &j);
    CHECK(st == 200, "%s: status %d: %.300s", what, st, resp_buf);
    float *v = st == 200 ? embeddings_of(j, n, dim, b64) : NULL;
    CHECK(v != NULL, "%s: response shape", what);
    long want_tokens = 0;
    for (int q = 0; q < n; q++) want_tokens += cJSON_GetArraySize(cJSON_GetObjectItem(cJSON_GetArrayItem(inputs, idx[q]), "ids"));
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    CHECK(u && cJSON_GetObjectItem(u, "prompt_tokens")->valueint == want_tokens &&
              cJSON_GetObjectItem(u, "total_tokens")->valueint == want_tokens,
          "%s: usage counts %ld tokens", what, want_tokens);
    const cJSON *obj = cJSON_GetObjectItem(j, "object"), *model = cJSON_GetObjectItem(j, "model");
    const cJSON *id = cJSON_GetObjectItem(j, "id"), *created = cJSON_GetObjectItem(j, "created");
    CHECK(cJSON_IsString(obj) && !strcmp(obj->valuestring, "list") && cJSON_IsString(model) &&
              !strcmp(model->valuestring, "m") && cJSON_IsString(id) && !strncmp(id->valuestring, "embd-", 5) &&
              cJSON_IsNumber(created) && created->valuedouble > 1.7e9,
          "%s: object list, id, created, model as requested", what);
    for (int q = 0; v && q < n; q++) {
        char w[160];
        snprintf(w, sizeof w, "%s input %d", what, idx[q]);
        CHECK(close_to(v + (size_t)q * dim, cJSON_GetArrayItem(ref, idx[q]), dim, w), "%s vs the oracle", w);
    }
    cJSON_Delete(j);
    free(body);
    free(in);
    *n_out = n;
    return v;
}

typedef struct bad_case {
    const char *body, *param;
    int status;
} bad_case;

static void check_errors(int port) {
    static char many[2049 * 4 + 16];
    size_t k = 0;
    many[k++] = '[';
    for (int i = 0; i < 2049; i++) k += (size_t)sprintf(many + k, "%s\"a\"", i ? "," : "");
    many[k++] = ']';
    many[k] = 0;
    static char toolong[600 * 4 + 16];
    k = 0;
    toolong[k++] = '[';
    for (int i = 0; i < 513; i++) k += (size_t)sprintf(toolong + k, "%s%d", i ? "," : "", 5 + i % 300);
    toolong[k++] = ']';
    toolong[k] = 0;
    char *b_many = body_with(many, ""), *b_long = body_with(toolong, "");
    const bad_case cases[] = {
        {"{}", "input", 400},
        {"{\"input\":\"\"}", "input", 400},
        {"{\"input\":[]}", "input", 400},
        {"{\"input\":[[]]}", "input", 400},
        {"{\"input\":5}", "input", 400},
        {"{\"input\":{\"a\":1}}", "input", 400},
        {"{\"input\":[1,\"a\"]}", "input", 400},
        {"{\"input\":[\"a\",[1]]}", "input", 400},
        {"{\"input\":[\"a\",\"\"]}", "input", 400},
        {"{\"input\":[384]}", "input", 400},
        {"{\"input\":[-1]}", "input", 400},
        {"{\"input\":[1.5]}", "input", 400},
        {b_long, "input", 400},
        {b_many, "input", 400},
        {"{\"input\":\"x\",\"encoding_format\":\"hex\"}", "encoding_format", 400},
        {"{\"input\":\"x\",\"encoding_format\":1}", "encoding_format", 400},
        {"{\"input\":\"x\",\"dimensions\":3}", "dimensions", 400},
        {"{\"input\":\"x\",\"dimensions\":\"64\"}", "dimensions", 400},
        {"{\"input\":\"x\",\"dimensions\":0}", "dimensions", 400},
        {"{\"input\":\"x\",\"user\":7}", "user", 400},
        {"{\"input\":\"x\",\"add_special_tokens\":1}", "add_special_tokens", 400},
        {"{\"input\":\"x\",\"model\":\"nope\"}", "model", 404},
        {"{\"input\":\"x\",\"model\":3}", "model", 400},
        {"[\"x\"]", "", 400},
        {"{\"input\":\"x\"", "", 400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *j = NULL;
        int st = post(port, "/v1/embeddings", cases[i].body, &j);
        const cJSON *e = cJSON_GetObjectItem(j, "error");
        const cJSON *p = cJSON_GetObjectItem(e, "param");
        bool param_ok = !*cases[i].param ? true : cJSON_IsString(p) && !strcmp(p->valuestring, cases[i].param);
        CHECK(st == cases[i].status && e && param_ok, "bad body %zu (%.60s): status %d (want %d), param %s (want %s)", i,
              cases[i].body, st, cases[i].status, cJSON_IsString(p) ? p->valuestring : "-", cases[i].param);
        cJSON_Delete(j);
    }
    // The accepted spellings: dimensions equal to the hidden size, user, add_special_tokens false.
    cJSON *j = NULL;
    int st = post(port, "/v1/embeddings", "{\"input\":\"x\",\"dimensions\":64,\"user\":\"u\",\"encoding_format\":\"float\"}", &j);
    CHECK(st == 200, "dimensions == hidden size accepted (%d)", st);
    cJSON_Delete(j);
    int with = -1, without = -1;
    st = post(port, "/v1/embeddings", "{\"input\":\"hello world\",\"add_special_tokens\":true}", &j);
    const cJSON *u = cJSON_GetObjectItem(j, "usage");
    if (st == 200 && u) with = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    cJSON_Delete(j);
    st = post(port, "/v1/embeddings", "{\"input\":\"hello world\",\"add_special_tokens\":false}", &j);
    u = cJSON_GetObjectItem(j, "usage");
    if (st == 200 && u) without = cJSON_GetObjectItem(u, "prompt_tokens")->valueint;
    cJSON_Delete(j);
    CHECK(with > 1 && without == with - 1, "add_special_tokens false: one token (the BOS) fewer (%d, %d)", with, without);
    free(b_many);
    free(b_long);
}

// A streamed greedy completion's text; run_embeds: while it streams (after its first chunk), this
// many embedding requests run and are checked against the oracle.
static char *stream_text(int port, int run_embeds, const cJSON *inputs, const cJSON *ref, int dim) {
    int fd = td_http_connect(port);
    if (fd < 0) return NULL;
    const char *body = "{\"prompt\":\"Once upon a time\",\"max_tokens\":300,\"temperature\":0,\"ignore_eos\":true,"
                       "\"stream\":true}";
    char req[512];
    int rl = snprintf(req, sizeof req,
                      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                      "%zu\r\nConnection: close\r\n\r\n%s",
                      strlen(body), body);
    if (write(fd, req, (size_t)rl) != rl) return close(fd), NULL;
    size_t cap = 1u << 20, n = 0;
    char *buf = malloc(cap);
    bool started = td_http_read_until(fd, buf, cap, &n, "data: ");
    CHECK(started, "the stream started");
    if (run_embeds) {
        bool all_ok = true, overlapped = !strstr(buf, "[DONE]");
        for (int r = 0; r < run_embeds; r++) {
            int k = 0;
            float *v = check_set(port, inputs, ref, dim, r % 2 == 0, false, false, false, "during generation", &k);
            all_ok = all_ok && v;
            free(v);
        }
        CHECK(all_ok && overlapped, "embeddings during a stream (began before it ended: %d)", overlapped);
    }
    td_http_read_until(fd, buf, cap, &n, "data: [DONE]");
    close(fd);
    // Concatenate the chunks' text.
    char *text = calloc(1, cap);
    size_t tl = 0;
    for (char *p = strstr(buf, "data: {"); p; p = strstr(p + 1, "data: {")) {
        char *end = strstr(p, "\n\n");
        if (!end) break;
        cJSON *j = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
        const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "text");
        if (cJSON_IsString(t)) {
            size_t l = strlen(t->valuestring);
            if (tl + l < cap) memcpy(text + tl, t->valuestring, l), tl += l;
        }
        cJSON_Delete(j);
    }
    free(buf);
    return text;
}

static double metric(const char *text, const char *name) {
    const char *p = text;
    size_t nl = strlen(name);
    while ((p = strstr(p, name))) {
        if ((p == text || p[-1] == '\n') && p[nl] == '{') {
            const char *sp = strchr(p, ' ');
            return sp ? atof(sp + 1) : -1;
        }
        p += nl;
    }
    return -1;
}

static const cJSON *model_oracle(const cJSON *o, const char *name) {
    for (const cJSON *m = cJSON_GetObjectItem(o, "models")->child; m; m = m->next)
        if (!strcmp(cJSON_GetObjectItem(m, "name")->valuestring, name)) return m;
    return NULL;
}

static const char *const BASE[] = {"--threads", "2", "--max-seqs", "4", "--max-batched-tokens", "64",
                                   "--served-model-name", "m", NULL};

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    resp_buf = malloc(RESP_CAP);
    const char *bin = getenv("TANDEM_BIN");
    if (!bin || !*bin) bin = "build/tandem";
    CHECK(access(bin, X_OK) == 0, "%s is not executable (set TANDEM_BIN)", bin);
    char opath[512], llama[512], qwen[512];
    snprintf(opath, sizeof opath, "%s/embed_oracle.json", td_test_data_dir());
    snprintf(llama, sizeof llama, "%s/ref/llama2", td_test_data_dir());
    snprintf(qwen, sizeof qwen, "%s/ref/qwen3", td_test_data_dir());
    char *otxt = NULL;
    size_t olen = 0;
    CHECK(td_read_file(opath, 0, &otxt, &olen, NULL) == TD_OK, "%s missing: run bash tests/oracle/gen/models_embed.sh",
          opath);
    const char *mods = "tests/oracle/node_modules/openai/package.json";
    CHECK(access(mods, R_OK) == 0, "%s missing: run npm ci --prefix tests/oracle", mods);
    if (td_test_failed) TEST_DONE();
    cJSON *o = cJSON_Parse(otxt);
    free(otxt);
    const cJSON *inputs = cJSON_GetObjectItem(o, "inputs");
    const cJSON *ol = model_oracle(o, "llama2"), *oq = model_oracle(o, "qwen3");
    CHECK(o && inputs && ol && oq, "oracle parsed");
    if (td_test_failed) TEST_DONE();
    const int dim = cJSON_GetObjectItem(ol, "dim")->valueint;

    // llama2, default pooling (last, normalised): everything.
    server s = {0};
    CHECK(td_serve_start(bin, llama, BASE, NULL, &s), "serve %s", llama);
    if (s.port) {
        const cJSON *ref = cJSON_GetObjectItem(ol, "last");
        int nt = 0, ni = 0, nr = 0, nb = 0, nid = 0;
        float *vt = check_set(s.port, inputs, ref, dim, true, false, false, false, "llama2 last texts", &nt);
        float *vi = check_set(s.port, inputs, ref, dim, false, false, false, false, "llama2 last ids", &ni);
        float *vr = check_set(s.port, inputs, ref, dim, true, false, true, false, "llama2 last texts reversed", &nr);
        float *vb = check_set(s.port, inputs, ref, dim, true, false, false, true, "llama2 last texts base64", &nb);
        float *vid = check_set(s.port, inputs, ref, dim, true, true, false, false, "llama2 last texts as ids", &nid);
        CHECK(vt && vb && nb == nt && !memcmp(vt, vb, sizeof(float) * (size_t)nt * dim),
              "base64 decodes to exactly the float form");
        CHECK(vt && vid && nid == nt && !memcmp(vt, vid, sizeof(float) * (size_t)nt * dim),
              "token-id inputs give the same embeddings as their text");
        bool order = vt && vr && nr == nt;
        for (int q = 0; order && q < nt; q++)
            for (int d = 0; d < dim; d++)
                order = order && fabsf(vt[(size_t)q * dim + d] - vr[(size_t)(nt - 1 - q) * dim + d]) <= 1e-6f;
        CHECK(order, "a reversed batch gives the same embeddings in reversed order");
        // One flat token-id array is one input.
        cJSON *j = NULL;
        char *one = cJSON_PrintUnformatted(cJSON_GetObjectItem(cJSON_GetArrayItem(inputs, 5), "ids"));
        char *body = body_with(one, "");
        int st = post(s.port, "/v1/embeddings", body, &j);
        float *v1 = st == 200 ? embeddings_of(j, 1, dim, false) : NULL;
        CHECK(v1 && close_to(v1, cJSON_GetArrayItem(ref, 5), dim, "flat id array"), "a flat token-id array (%d)", st);
        free(v1), free(body), free(one), cJSON_Delete(j);
        free(vt), free(vi), free(vr), free(vb), free(vid);

        check_errors(s.port);

        // Generation is not disturbed: the same greedy text alone and with embeddings during it.
        char *alone = stream_text(s.port, 0, NULL, NULL, dim);
        char *mixed = stream_text(s.port, 6, inputs, ref, dim);
        CHECK(alone && mixed && strlen(alone) > 100 && !strcmp(alone, mixed),
              "greedy stream with embeddings during it == alone (%zu / %zu bytes)", alone ? strlen(alone) : 0,
              mixed ? strlen(mixed) : 0);
        free(alone), free(mixed);
        // The stats lag the engine by up to a step (the stream's [DONE] can come first): poll.
        char *mt = malloc(1 << 20);
        int ml = 0;
        for (double t0 = td_serve_now(); td_serve_now() - t0 < 5; usleep(20000))
            if ((ml = get_text(s.port, "/metrics", mt, 1 << 20)) > 0 && metric(mt, "vllm:kv_cache_usage_perc") == 0) break;
        CHECK(ml > 0 && metric(mt, "vllm:kv_cache_usage_perc") == 0, "no KV block in use afterwards (%g)",
              metric(mt, "vllm:kv_cache_usage_perc"));
        // 5 sets + 1 flat + 3 accepted bodies + 6 during the stream; inputs 22 + 1 + 3 + 21.
        CHECK(metric(mt, "tandem:embedding_requests_total") == 15 && metric(mt, "tandem:embedding_inputs_total") == 47 &&
                  metric(mt, "tandem:embedding_prompt_tokens_total") > 500,
              "metrics count embeddings (%g requests, %g inputs, %g tokens)", metric(mt, "tandem:embedding_requests_total"),
              metric(mt, "tandem:embedding_inputs_total"), metric(mt, "tandem:embedding_prompt_tokens_total"));
        free(mt);

        // The official client: embeddings.create (base64 on the wire by default, decoded by it).
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "node tests/e2e/embeddings.test.js --port %d --oracle %s --model m", s.port, opath);
        int rc = system(cmd);
        CHECK(rc == 0, "node embeddings.test.js failed (status %d)", rc);
        CHECK(td_serve_stop(&s) == 0, "serve exits 0");
    }

    // The other poolings, raw and normalised, on both models.
    const struct {
        const char *model, *kind;
        const cJSON *oracle;
        const char *flags[4];
    } runs[] = {
        {llama, "mean", ol, {"--pooling", "mean", NULL}},
        {qwen, "last", oq, {NULL}},
        {qwen, "last_raw", oq, {"--no-normalize", NULL}},
        {qwen, "mean_raw", oq, {"--pooling", "mean", "--no-normalize", NULL}},
    };
    for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
        server t = {0};
        CHECK(td_serve_start(bin, runs[r].model, BASE, runs[r].flags, &t), "serve %s %s", runs[r].model, runs[r].kind);
        if (!t.port) continue;
        const int qd = cJSON_GetObjectItem(runs[r].oracle, "dim")->valueint;
        const cJSON *ref = cJSON_GetObjectItem(runs[r].oracle, runs[r].kind);
        char what[128];
        int n = 0;
        snprintf(what, sizeof what, "%s %s texts", cJSON_GetObjectItem(runs[r].oracle, "name")->valuestring, runs[r].kind);
        free(check_set(t.port, inputs, ref, qd, true, false, false, false, what, &n));
        snprintf(what, sizeof what, "%s %s ids", cJSON_GetObjectItem(runs[r].oracle, "name")->valuestring, runs[r].kind);
        free(check_set(t.port, inputs, ref, qd, false, false, false, false, what, &n));
        CHECK(td_serve_stop(&t) == 0, "serve exits 0");
    }

    // The OpenCL backend (the forward is shared) where a device is found; said when not.
    td_backend *cl = NULL;
    td_backend_params bp = td_backend_default_params();
    bp.name = "opencl";
    td_err berr = {0};
    if (td_backend_create(&bp, &cl, &berr) == TD_OK) {
        td_backend_free(cl);
        const char *flags[] = {"--backend", "opencl", NULL};
        server t = {0};
        CHECK(td_serve_start(bin, llama, BASE, flags, &t), "serve %s --backend opencl", llama);
        int n = 0;
        if (t.port) free(check_set(t.port, inputs, cJSON_GetObjectItem(ol, "last"), dim, true, false, false, false,
                                   "llama2 last texts on opencl", &n));
        if (t.port) CHECK(td_serve_stop(&t) == 0, "serve exits 0");
    } else {
        printf("opencl backend unavailable (%s): its run is skipped\n", berr.msg);
    }

    // An engine without embeddings (the mock: no embed method) -> 400 saying so.
    td_mock_params mp = td_mock_default_params();
    td_engine eng;
    td_err err = {0};
    CHECK(td_mock_engine_create(&mp, &eng, &err) == TD_OK, "mock: %s", err.msg);
    td_server_params sp = td_server_default_params();
    td_server *srv = td_server_start(&sp, eng, &err);
    CHECK(srv != NULL, "mock server: %s", err.msg);
    if (srv) {
        cJSON *j = NULL;
        int st = post(td_server_port(srv), "/v1/embeddings", "{\"input\":\"hello\"}", &j);
        const cJSON *m = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "error"), "message");
        CHECK(st == 400 && cJSON_IsString(m) && strstr(m->valuestring, "does not serve embeddings"),
              "mock engine: 400 does not serve embeddings (%d)", st);
        cJSON_Delete(j);
        td_server_stop(srv, 1000);
    }
    td_mock_engine_free(&eng);
    cJSON_Delete(o);
    free(resp_buf);
    TEST_DONE();
}
