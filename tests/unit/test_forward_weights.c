// The forward's weights through the backend, on the reference models (tests/oracle/gen/models.sh):
// own_weights copies give the same bits as weights read in place; td_forward_set_weights from a
// model's own values reproduces it bit for bit (float and Q8_0/Q4_0 dtypes, GGUF's permuted Q/K
// rows included);
// replacing model A's weights with perturbed values B gives exactly the logits of a forward
// created from B written to disk by the exporter and loaded back (HF and GGUF llama targets); a
// failed update is reported, blocks every run, and a good one restores service; weights read in
// place cannot be replaced; two forwards on one shared backend compute what separate ones do.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "model/export.h"
#include "model/forward.h"
#include "model/model.h"
#include "test_util.h"

enum { N = 9 };

static td_model *load(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/ref/%s", td_test_data_dir(), name);
    td_model *m = NULL;
    td_err err = {0};
    if (td_model_load(path, &m, &err) != TD_OK) {
        CHECK(0, "%s: %s (run tests/oracle/gen/models.sh)", name, err.msg);
        return NULL;
    }
    return m;
}

static td_forward *make(const td_model *m, bool own, td_backend *be) {
    td_forward_params p = td_forward_default_params();
    p.max_batch_tokens = N, p.max_ctx = 32, p.n_threads = 2, p.own_weights = own, p.backend = be;
    td_forward *f = NULL;
    td_err err = {0};
    CHECK(td_forward_create(m, &p, &f, &err) == TD_OK, "create: %s", err.msg);
    return f;
}

// All N positions' logits of a fixed prompt (fresh sequence).
static td_status logits_of(td_forward *f, float *lg, td_err *err) {
    const td_model_config *c = td_forward_config(f);
    int32_t tok[N], pos[N], seq[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 7919 + 11) % c->vocab_size), pos[i] = i, seq[i] = 0;
    td_forward_seq_clear(f, 0);
    td_batch b = {.n_tokens = N, .tokens = tok, .pos = pos, .seq_id = seq};
    return td_forward_run(f, &b, lg, err);
}

static bool same_bits(const float *a, const float *b, size_t n, size_t *first) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof *a)) {
            *first = i;
            return false;
        }
    return true;
}

// A source of model values scaled per tensor and element: B = A * (1 + 0.05 sin(k)), so every
// weight changes by a deterministic amount the exporter can write to disk as well.
typedef struct perturbed {
    const td_model *m;
    int fail_at;  // >= 0: the fail_at-th fetch returns an error naming the tensor
    int calls;
} perturbed;

static td_status perturbed_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    perturbed *p = ctx;
    if (p->fail_at >= 0 && p->calls++ == p->fail_at)
        return td_err_set(err, TD_ERR_NOT_FOUND, "test source: %s is unavailable", name);
    td_status st = td_export_model_get((void *)p->m, name, dst, n, err);
    if (st) return st;
    uint64_t h = 1469598103934665603ull;
    for (const char *s = name; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    for (int64_t i = 0; i < n; i++) dst[i] *= 1.0f + 0.05f * sinf((float)((h >> 40) % 1000) + 0.37f * (float)i);
    return TD_OK;
}

// own_weights vs in place, and an update from the model's own values, bit for bit.
static void check_self(const char *name) {
    td_model *m = load(name);
    if (!m) return;
    const size_t V = (size_t)m->cfg.vocab_size;
    float *a = malloc(N * V * sizeof *a), *b = malloc(N * V * sizeof *b);
    td_forward *fa = make(m, false, NULL), *fb = make(m, true, NULL);
    td_err err = {0};
    size_t at = 0;
    if (fa && fb && logits_of(fa, a, &err) == TD_OK && logits_of(fb, b, &err) == TD_OK) {
        CHECK(same_bits(a, b, N * V, &at), "%s: own_weights logits differ at %zu: %g vs %g", name, at, a[at], b[at]);
        CHECK(td_forward_set_weights(fa, td_export_model_get, m, &err) == TD_ERR_UNSUPPORTED &&
                  strstr(err.msg, "own_weights"),
              "%s: weights read in place refuse replacement: %s", name, err.msg);
        CHECK(logits_of(fa, b, &err) == TD_OK && same_bits(a, b, N * V, &at), "%s: still serving after the refusal", name);
        CHECK(td_forward_set_weights(fb, td_export_model_get, m, &err) == TD_OK, "%s: self update: %s", name, err.msg);
        CHECK(logits_of(fb, b, &err) == TD_OK, "%s: run after update: %s", name, err.msg);
        CHECK(same_bits(a, b, N * V, &at), "%s: self update changed logit %zu: %g vs %g", name, at, a[at], b[at]);
    } else {
        CHECK(0, "%s: %s", name, err.msg);
    }
    td_forward_free(fa), td_forward_free(fb);
    free(a), free(b);
    td_model_free(m);
}

// A's forward given B's values equals B's own forward, B written by the exporter (hf: an HF
// directory; else a GGUF file in llama.cpp's layout, Q/K rows permuted) and loaded back.
static void check_replace(const char *a_name, const char *b_values_of, bool hf) {
    td_model *ma = load(a_name), *mv = load(b_values_of), *mb = NULL;
    if (!ma || !mv) goto done0;
    char path[256];
    snprintf(path, sizeof path, "/tmp/tandem-fw-weights-%d-%s%s", (int)getpid(), a_name, hf ? "" : ".gguf");
    perturbed src = {.m = mv, .fail_at = -1};
    td_export_params ep = td_export_default_params();
    td_err err = {0};
    td_status st = hf ? td_export_hf(path, &mv->cfg, &ep, perturbed_get, &src, &err)
                      : td_export_gguf(path, &mv->cfg, &ep, perturbed_get, &src, &err);
    CHECK(st == TD_OK, "export B: %s", err.msg);
    if (st || td_model_load(path, &mb, &err) != TD_OK) {
        CHECK(0, "load B: %s", err.msg);
        goto done0;
    }
    const size_t V = (size_t)ma->cfg.vocab_size;
    float *la = malloc(N * V * sizeof *la), *lb = malloc(N * V * sizeof *lb), *lu = malloc(N * V * sizeof *lu);
    td_forward *fa = make(ma, true, NULL), *fb = make(mb, false, NULL);
    size_t at = 0;
    if (!fa || !fb || logits_of(fa, la, &err) || logits_of(fb, lb, &err)) {
        CHECK(0, "%s: %s", a_name, err.msg);
        goto done;
    }
    // A failed update: the source's message comes back, and nothing runs until a good one.
    src.fail_at = 5, src.calls = 0;
    st = td_forward_set_weights(fa, perturbed_get, &src, &err);
    CHECK(st == TD_ERR_NOT_FOUND && strstr(err.msg, "unavailable"), "%s: failed update reported (%d: %s)", a_name,
          (int)st, err.msg);
    st = logits_of(fa, lu, &err);
    CHECK(st == TD_ERR_INVALID && strstr(err.msg, "incomplete"), "%s: a half-updated forward refuses to run: %s",
          a_name, err.msg);
    src.fail_at = -1;
    CHECK(td_forward_set_weights(fa, perturbed_get, &src, &err) == TD_OK, "%s: update: %s", a_name, err.msg);
    CHECK(logits_of(fa, lu, &err) == TD_OK, "%s: run after update: %s", a_name, err.msg);
    CHECK(!same_bits(la, lb, N * V, &at), "%s: B differs from A (the test would prove nothing)", a_name);
    CHECK(same_bits(lu, lb, N * V, &at), "%s <- %s (%s): updated logit %zu %.9g, B's own %.9g", a_name, b_values_of,
          hf ? "hf" : "gguf", at, lu[at], lb[at]);
done:
    td_forward_free(fa), td_forward_free(fb);
    free(la), free(lb), free(lu);
    if (hf) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
        if (system(cmd)) fprintf(stderr, "cannot remove %s\n", path);
    } else {
        unlink(path);
    }
done0:
    td_model_free(ma), td_model_free(mv), td_model_free(mb);
}

// Two forwards on one backend (as the engine's forward, KV pool and a trainer share one).
static void check_shared_backend(void) {
    td_model *m = load("qwen3");
    if (!m) return;
    td_backend *be = NULL;
    td_err err = {0};
    td_backend_cpu_params bp = td_backend_cpu_default_params();
    bp.n_threads = 2;
    CHECK(td_backend_cpu_create(&bp, &be, &err) == TD_OK, "backend: %s", err.msg);
    const size_t V = (size_t)m->cfg.vocab_size;
    float *a = malloc(N * V * sizeof *a), *b = malloc(N * V * sizeof *b), *c = malloc(N * V * sizeof *c);
    td_forward *f1 = make(m, false, be), *f2 = make(m, true, be), *f3 = make(m, false, NULL);
    size_t at = 0;
    CHECK(f1 && f2 && f3 && td_forward_backend(f1) == be && td_forward_backend(f2) == be &&
              td_forward_backend(f3) != be,
          "borrowed backend used, own one otherwise");
    if (f1 && f2 && f3 && !logits_of(f1, a, &err) && !logits_of(f2, b, &err) && !logits_of(f3, c, &err))
        CHECK(same_bits(a, c, N * V, &at) && same_bits(b, c, N * V, &at), "shared backend: logit %zu differs", at);
    td_forward_free(f1), td_forward_free(f2), td_forward_free(f3);
    td_backend_free(be);  // after the forwards that borrowed it
    free(a), free(b), free(c);
    td_model_free(m);
}

int main(void) {
    const char *exact[] = {"llama2", "llama2-f32.gguf", "qwen2", "qwen3", "llama3", "mistral-f16.gguf",
                           "qwen3-bf16.gguf", "llama2-hf-bf16"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++) check_self(exact[i]);
    // Q8_0/Q4_0: the dequantized values re-encode to the same blocks, so this is exact too.
    check_self("mistral-q8_0.gguf");
    check_self("llama3-q4_0.gguf");
    check_replace("qwen2", "qwen2", true);              // q/k/v biases
    check_replace("qwen3", "qwen3", true);              // q/k norms, tied head
    check_replace("llama2-f32.gguf", "llama2", false);  // GGUF llama: Q/K rows permuted on the way in
    check_shared_backend();
    TEST_DONE();
}
