// Compares tandem's forward with the PyTorch oracle (tests/reference/make_models.py, model_ref.py)
// on every reference model file: log-softmax at every position, several sequences in one batch,
// long prompts fed in chunks through the KV cache, and the greedy continuation.
// Not a speed test, and not a test of sampling or tokenization (other tests own those).
//
// Tolerances. The oracle runs in float64 on exactly the weights each file stores (rounded to
// F16/BF16, or quantized and dequantized), so the only difference left is tandem's f32
// arithmetic: about 1e-6 relative on logits of magnitude <= ~20, far inside 1e-4. The bound is
// therefore 1e-4 for every dtype. Should a kernel ever quantize activations (as llama.cpp's
// q8_0 x q8_0 dot does), Q8_0/Q4_0 would need a measured, looser bound here; every run prints the
// measured maxima so such a change is visible.
#include <cjson/cJSON.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "model/model.h"
#include "test_util.h"

#if __has_include("model/forward.h")
#include "model/forward.h"
#define HAVE_FORWARD 1
#else
#define HAVE_FORWARD 0
#endif

#define TOL 1e-4       // max |log-softmax difference|, every dtype (see above)
#define CHUNK 64       // tokens per step when feeding the long prompt through the KV cache
#define SIDE_CHUNK 7   // tokens per step of the second sequence sharing those batches
#define MAX_PROMPTS 8

typedef struct {
    char name[32];
    int n;
    int32_t *tok;  // [n]
} prompt;

typedef struct {
    prompt p[MAX_PROMPTS];
    int np;
    int vocab;
    int32_t *greedy_prompt;
    int n_greedy_prompt;
    int n_greedy;
} oracle_set;

static int32_t *json_ints(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n > 0 ? *n : 1));
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, a) v[i++] = (int32_t)e->valuedouble;
    return v;
}

#if HAVE_FORWARD

// Reads a raw little-endian f32 file of exactly n floats; NULL (with a failed CHECK) otherwise.
static float *read_f32(const char *path, size_t n) {
    char *buf = NULL;
    size_t len = 0;
    td_err err;
    if (td_read_file(path, 0, &buf, &len, &err) != TD_OK) {
        CHECK(0, "%s", err.msg);
        return NULL;
    }
    if (len != n * sizeof(float)) {
        CHECK(0, "%s: %zu bytes, expected %zu", path, len, n * sizeof(float));
        free(buf);
        return NULL;
    }
    float *v = malloc(len);
    memcpy(v, buf, len);
    free(buf);
    return v;
}

// Max |log_softmax(logits) - ref| over one row of n entries, log-softmax taken in double.
static double row_diff(const float *logits, const float *ref, int n) {
    double mx = -DBL_MAX, s = 0, d = 0;
    for (int i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++) s += exp(logits[i] - mx);
    double lse = mx + log(s);
    for (int i = 0; i < n; i++) {
        double e = fabs((logits[i] - lse) - ref[i]);
        if (isnan(e)) return INFINITY;
        if (e > d) d = e;
    }
    return d;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

typedef struct {
    double batch, chunked, greedy_lp;
    int greedy_ok;
} model_result;

// All prompts as sequences 0..np-1 of one batch; every position compared with the oracle.
static double check_batch(td_forward *f, const oracle_set *o, float **ref, float *logits,
                          const char *what) {
    int n = 0;
    for (int i = 0; i < o->np; i++) n += o->p[i].n;
    int32_t *tok = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * n),
            *seq = malloc(sizeof(int32_t) * n);
    // Interleave the sequences token by token so that no kernel can rely on contiguous runs.
    int k = 0;
    for (int t = 0; k < n; t++)
        for (int i = 0; i < o->np; i++)
            if (t < o->p[i].n) tok[k] = o->p[i].tok[t], pos[k] = t, seq[k] = i, k++;
    for (int i = 0; i < o->np; i++) td_forward_seq_clear(f, i);
    td_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq, .want_logits = NULL};
    td_err err;
    double worst = 0;
    td_status st = td_forward_run(f, &b, logits, &err);
    CHECK(st == TD_OK, "%s: batch run: %s", what, err.msg);
    if (st == TD_OK)
        for (k = 0; k < n; k++) {
            double d = row_diff(logits + (size_t)k * o->vocab,
                                ref[seq[k]] + (size_t)pos[k] * o->vocab, o->vocab);
            if (d > worst) worst = d;
        }
    else
        worst = INFINITY;
    CHECK(worst <= TOL, "%s: %d sequences in one batch: max |dlogprob| %.3g", what, o->np, worst);
    free(tok), free(pos), free(seq);
    return worst;
}

// Each prompt alone, the longest in chunks of CHUNK through the KV cache while the next prompt
// shares the same batches in chunks of SIDE_CHUNK (so a batch mixes a cached continuation with
// a second sequence); the rest one whole prompt per run.
static double check_chunked(td_forward *f, const oracle_set *o, float **ref, float *logits,
                            const char *what) {
    int lo = 0;
    for (int i = 1; i < o->np; i++)
        if (o->p[i].n > o->p[lo].n) lo = i;
    int side = (lo + o->np - 1) % o->np;  // any other prompt
    for (int i = 0; i < o->np; i++) td_forward_seq_clear(f, i);
    int n_max = CHUNK + SIDE_CHUNK;
    int32_t tok[CHUNK + SIDE_CHUNK], pos[CHUNK + SIDE_CHUNK], seq[CHUNK + SIDE_CHUNK];
    double worst = 0;
    td_err err;
    const prompt *pl = &o->p[lo], *ps = &o->p[side];
    int done_l = 0, done_s = 0;
    while (done_l < pl->n || done_s < ps->n) {
        int n = 0;
        for (int t = done_l; t < pl->n && t < done_l + CHUNK; t++)
            tok[n] = pl->tok[t], pos[n] = t, seq[n] = lo, n++;
        for (int t = done_s; t < ps->n && t < done_s + SIDE_CHUNK; t++)
            tok[n] = ps->tok[t], pos[n] = t, seq[n] = side, n++;
        TD_ASSERT(n <= n_max);
        td_batch b = {.n_tokens = n, .tokens = tok, .pos = pos, .seq_id = seq, .want_logits = NULL};
        td_status st = td_forward_run(f, &b, logits, &err);
        CHECK(st == TD_OK, "%s: chunked run: %s", what, err.msg);
        if (st != TD_OK) return INFINITY;
        for (int k = 0; k < n; k++) {
            double d = row_diff(logits + (size_t)k * o->vocab,
                                ref[seq[k]] + (size_t)pos[k] * o->vocab, o->vocab);
            if (d > worst) worst = d;
        }
        done_l = done_l + CHUNK < pl->n ? done_l + CHUNK : pl->n;
        done_s = done_s + SIDE_CHUNK < ps->n ? done_s + SIDE_CHUNK : ps->n;
    }
    CHECK(td_forward_seq_len(f, lo) == pl->n, "%s: cached length %d, expected %d", what,
          td_forward_seq_len(f, lo), pl->n);
    // The remaining prompts one at a time, each alone in its batch.
    for (int i = 0; i < o->np; i++) {
        if (i == lo || i == side) continue;
        td_forward_seq_clear(f, i);
        int32_t *p = malloc(sizeof(int32_t) * o->p[i].n), *s = malloc(sizeof(int32_t) * o->p[i].n);
        for (int t = 0; t < o->p[i].n; t++) p[t] = t, s[t] = i;
        td_batch b = {.n_tokens = o->p[i].n, .tokens = o->p[i].tok, .pos = p, .seq_id = s};
        td_status st = td_forward_run(f, &b, logits, &err);
        CHECK(st == TD_OK, "%s: single run: %s", what, err.msg);
        for (int t = 0; st == TD_OK && t < o->p[i].n; t++) {
            double d = row_diff(logits + (size_t)t * o->vocab, ref[i] + (size_t)t * o->vocab, o->vocab);
            if (d > worst) worst = d;
        }
        free(p), free(s);
    }
    CHECK(worst <= TOL, "%s: prompts alone / in chunks of %d: max |dlogprob| %.3g", what, CHUNK, worst);
    return worst;
}

// Prompt with logits for the last token only, then one token per run: argmax each time.
static int check_greedy(td_forward *f, const oracle_set *o, const cJSON *greedy, float *logits,
                        double *lp_diff, const char *what) {
    int n_ref;
    int32_t *want = json_ints(cJSON_GetObjectItem(greedy, "tokens"), &n_ref);
    const cJSON *lps = cJSON_GetObjectItem(greedy, "token_logprobs");
    double margin = cJSON_GetNumberValue(cJSON_GetObjectItem(greedy, "min_margin"));
    int np = o->n_greedy_prompt, ok = n_ref == o->n_greedy;
    int32_t *pos = malloc(sizeof(int32_t) * np), *seq = calloc(np, sizeof(int32_t));
    uint8_t *wl = calloc(np, 1);
    for (int t = 0; t < np; t++) pos[t] = t;
    wl[np - 1] = 1;
    td_forward_seq_clear(f, 0);
    td_batch b = {.n_tokens = np, .tokens = o->greedy_prompt, .pos = pos, .seq_id = seq, .want_logits = wl};
    td_err err;
    *lp_diff = 0;
    td_status st = td_forward_run(f, &b, logits, &err);
    CHECK(st == TD_OK, "%s: greedy prompt: %s", what, err.msg);
    for (int i = 0; st == TD_OK && i < n_ref; i++) {
        int32_t t = argmax(logits, o->vocab);
        double mx = logits[t], s = 0;
        for (int j = 0; j < o->vocab; j++) s += exp(logits[j] - mx);
        double d = fabs(-log(s) - cJSON_GetNumberValue(cJSON_GetArrayItem(lps, i)));
        if (d > *lp_diff) *lp_diff = d;
        if (t != want[i]) {
            CHECK(0, "%s: greedy token %d is %d, oracle %d (oracle's smallest top-2 margin %.3g)",
                  what, i, t, want[i], margin);
            ok = 0;
            break;
        }
        int32_t p = np + i, sq = 0;
        td_batch one = {.n_tokens = 1, .tokens = &t, .pos = &p, .seq_id = &sq};
        st = td_forward_run(f, &one, logits, &err);
        CHECK(st == TD_OK, "%s: greedy step %d: %s", what, i, err.msg);
    }
    ok = ok && st == TD_OK;
    CHECK(*lp_diff <= TOL, "%s: greedy token logprobs differ by %.3g", what, *lp_diff);
    free(want), free(pos), free(seq), free(wl);
    return ok;
}

static void check_model(const char *dir, const cJSON *m, const oracle_set *o, double *worst_by_dtype,
                        const char **dtypes, int n_dtypes) {
    const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(m, "name"));
    const char *rel = cJSON_GetStringValue(cJSON_GetObjectItem(m, "path"));
    const char *dtype = cJSON_GetStringValue(cJSON_GetObjectItem(m, "dtype"));
    const cJSON *lpf = cJSON_GetObjectItem(m, "logprobs");
    if (!name || !rel || !dtype || !lpf) {
        CHECK(0, "oracle.json: model entry lacks name/path/dtype/logprobs");
        return;
    }
    char path[1024];
    td_path_join(path, sizeof path, dir, rel);

    float *ref[MAX_PROMPTS] = {0};
    int ok = 1;
    for (int i = 0; i < o->np; i++) {
        char fp[1024];
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItem(lpf, o->p[i].name));
        if (!f) {
            CHECK(0, "%s: no oracle for prompt %s", name, o->p[i].name);
            ok = 0;
            continue;
        }
        td_path_join(fp, sizeof fp, dir, f);
        ref[i] = read_f32(fp, (size_t)o->p[i].n * o->vocab);
        ok = ok && ref[i];
    }

    td_model *model = NULL;
    td_forward *fw = NULL;
    td_err err;
    if (ok) {
        td_status st = td_model_load(path, &model, &err);
        CHECK(st == TD_OK, "%s: load: %s", name, err.msg);
        ok = st == TD_OK;
    }
    if (ok) {
        CHECK(model->cfg.vocab_size == o->vocab, "%s: vocab %d, oracle %d", name, model->cfg.vocab_size, o->vocab);
        ok = model->cfg.vocab_size == o->vocab;
    }
    int total = 0;
    for (int i = 0; i < o->np; i++) total += o->p[i].n;
    if (ok) {
        td_forward_params fp = td_forward_default_params();
        fp.max_batch_tokens = total > o->n_greedy_prompt ? total : o->n_greedy_prompt;
        fp.max_seqs = o->np;
        fp.max_ctx = 0;
        fp.n_threads = 2;
        td_status st = td_forward_create(model, &fp, &fw, &err);
        CHECK(st == TD_OK, "%s: forward: %s", name, err.msg);
        ok = st == TD_OK;
    }
    if (ok) {
        float *logits = malloc(sizeof(float) * (size_t)total * o->vocab);
        model_result r = {0};
        r.batch = check_batch(fw, o, ref, logits, name);
        r.chunked = check_chunked(fw, o, ref, logits, name);
        r.greedy_ok = check_greedy(fw, o, cJSON_GetObjectItem(m, "greedy"), logits, &r.greedy_lp, name);
        printf("%-20s %-5s max|dlogprob| batch %.2e  alone/chunked %.2e  greedy %s (logprob %.2e)\n",
               name, dtype, r.batch, r.chunked, r.greedy_ok ? "same" : "DIFFERS", r.greedy_lp);
        double w = fmax(fmax(r.batch, r.chunked), r.greedy_lp);
        for (int i = 0; i < n_dtypes; i++)
            if (!strcmp(dtypes[i], dtype) && w > worst_by_dtype[i]) worst_by_dtype[i] = w;
        free(logits);
    } else {
        printf("%-20s %-5s FAILED to run\n", name, dtype);
    }
    td_forward_free(fw);
    if (model) td_model_free(model);
    for (int i = 0; i < o->np; i++) free(ref[i]);
}
#endif  // HAVE_FORWARD

int main(void) {
    char dir[1024], index[1024];
    td_path_join(dir, sizeof dir, td_test_data_dir(), "ref");
    td_path_join(index, sizeof index, dir, "oracle.json");
    char *text = NULL;
    size_t len = 0;
    td_err err;
    if (td_read_file(index, 0, &text, &len, &err) != TD_OK) {
        CHECK(0, "oracle data missing (%s); run /usr/bin/python3 tests/reference/make_models.py",
              err.msg);
        TEST_DONE();
    }
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    CHECK(root != NULL, "%s: not JSON", index);
    if (!root) TEST_DONE();

    oracle_set o = {0};
    o.vocab = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(root, "vocab_size"));
    o.n_greedy = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(root, "n_greedy"));
    o.greedy_prompt = json_ints(cJSON_GetObjectItem(root, "greedy_prompt"), &o.n_greedy_prompt);
    const cJSON *pr;
    cJSON_ArrayForEach(pr, cJSON_GetObjectItem(root, "prompts")) {
        if (o.np == MAX_PROMPTS) break;
        prompt *p = &o.p[o.np++];
        snprintf(p->name, sizeof p->name, "%s", pr->string);
        p->tok = json_ints(pr, &p->n);
    }
    const cJSON *models = cJSON_GetObjectItem(root, "models");
    int n_models = cJSON_GetArraySize(models);
    CHECK(o.vocab > 0 && o.np >= 2 && o.n_greedy_prompt > 0 && n_models > 0,
          "%s: incomplete index (vocab %d, %d prompts, %d models)", index, o.vocab, o.np, n_models);

#if HAVE_FORWARD
    {  // (a weak td_model_load would never pull the loader out of the static library)
        const char *dtypes[] = {"F32", "F16", "BF16", "Q8_0", "Q4_0"};
        double worst[5] = {0};
        const cJSON *m;
        cJSON_ArrayForEach(m, models) check_model(dir, m, &o, worst, dtypes, 5);
        printf("worst max|dlogprob| per dtype (bound %.0e):", TOL);
        for (int i = 0; i < 5; i++) printf(" %s %.2e", dtypes[i], worst[i]);
        printf("\n");
    }
#else
    CHECK(0, "model/forward.h is not in this build yet: nothing was compared");
#endif
    for (int i = 0; i < o.np; i++) free(o.p[i].tok);
    free(o.greedy_prompt);
    cJSON_Delete(root);
    TEST_DONE();
}
