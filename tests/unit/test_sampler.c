// Sampler against the torch oracle (tests/reference/sampler_oracle.py): the filtered distribution
// for each parameter combination, seeded reproducibility, and empirical frequencies.
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "engine/sampler.h"
#include "test_util.h"

static float num(const cJSON *o, const char *k) { return (float)cJSON_GetObjectItem(o, k)->valuedouble; }

static int read_ints(const cJSON *a, int32_t *out) {
    int n = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, a) out[n++] = x->valueint;
    return n;
}

// A large vocabulary (the sampler radix-sorts whole vocabularies): its draws must equal a walk over
// the candidates in qsort order (descending logit, ties by ascending id) with the sampler's own
// arithmetic, for logits with ties, -0/+0, -inf (masked) and both signs.
static const float *g_logits;
static int cmp_ref(const void *a, const void *b) {
    float x = g_logits[*(const int32_t *)a], y = g_logits[*(const int32_t *)b];
    if (x > y) return -1;
    if (x < y) return 1;
    return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

static void test_big_vocab(void) {
    enum { V = 20000 };
    float *l0 = malloc(V * sizeof(float)), *l = malloc(V * sizeof(float)), *prob = malloc(V * sizeof(float));
    int32_t *ord = malloc(V * sizeof(int32_t));
    td_rng g;
    td_rng_seed(&g, 7);
    for (int i = 0; i < V; i++) {
        const double u = td_rng_uniform(&g);
        l0[i] = u < 0.1 ? 1.5f : u < 0.12 ? 0.0f : u < 0.14 ? -0.0f : u < 0.15 ? -INFINITY
                : (float)((td_rng_uniform(&g) - 0.5) * 8);
    }
    td_sampler *s = td_sampler_create(V);
    const float top_ps[] = {1.0f, 0.9f, 0.3f};
    int bad = 0;
    for (int c = 0; c < 3; c++) {
        td_sampling_params p = td_sampling_default_params();
        p.top_p = top_ps[c];
        for (int i = 0; i < V; i++) ord[i] = i;
        g_logits = l0;  // temperature 1, no penalties: the sampler sees l0 itself
        qsort(ord, V, sizeof *ord, cmp_ref);
        float maxl = l0[ord[0]];
        double sum = 0;
        int n = V;
        for (int i = 0; i < n; i++) sum += (prob[i] = expf(l0[ord[i]] - maxl));
        for (int i = 0; i < n; i++) prob[i] = (float)(prob[i] / sum);
        if (p.top_p < 1.0f) {
            double cum = 0;
            int keep = n;
            for (int i = n - 1; i > 0; i--) {
                cum += prob[i];
                if (cum <= 1.0 - p.top_p) keep = i;
                else break;
            }
            n = keep;
        }
        sum = 0;
        for (int i = 0; i < n; i++) sum += prob[i];
        for (int i = 0; i < n; i++) prob[i] = (float)(prob[i] / sum);
        td_rng r1, r2;
        td_rng_seed(&r1, 100 + c);
        td_rng_seed(&r2, 100 + c);
        for (int k = 0; k < 300; k++) {
            memcpy(l, l0, V * sizeof(float));
            const int32_t got = td_sampler_sample(s, &p, l, NULL, 0, NULL, 0, &r1);
            const double u = td_rng_uniform(&r2);
            double acc = 0;
            int32_t want = ord[n - 1];
            for (int i = 0; i < n; i++) {
                acc += prob[i];
                if (u < acc) {
                    want = ord[i];
                    break;
                }
            }
            bad += got != want;
        }
    }
    CHECK(bad == 0, "big vocabulary: %d of 900 draws differ from the qsort-order walk", bad);
    td_sampler_free(s);
    free(l0), free(l), free(prob), free(ord);
}

int main(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/sampler_oracle.json", td_test_data_dir());
    char *text;
    td_err err;
    if (td_read_file(path, 0, &text, NULL, &err) != TD_OK) {
        fprintf(stderr, "missing oracle (run tests/reference/sampler_oracle.py): %s\n", err.msg);
        return 1;
    }
    cJSON *cases = cJSON_Parse(text);
    CHECK(cases && cJSON_GetArraySize(cases) > 0, "oracle parses");
    const cJSON *c;
    int ci = 0;
    cJSON_ArrayForEach(c, cases) {
        int V = cJSON_GetObjectItem(c, "vocab")->valueint;
        const cJSON *pp = cJSON_GetObjectItem(c, "params");
        td_sampling_params p = td_sampling_default_params();
        p.temperature = num(pp, "temperature");
        p.top_k = cJSON_GetObjectItem(pp, "top_k")->valueint;
        p.top_p = num(pp, "top_p");
        p.min_p = num(pp, "min_p");
        p.repetition_penalty = num(pp, "repetition_penalty");
        p.presence_penalty = num(pp, "presence_penalty");
        p.frequency_penalty = num(pp, "frequency_penalty");
        td_logit_bias lb[8];
        const cJSON *b;
        cJSON_ArrayForEach(b, cJSON_GetObjectItem(pp, "logit_bias")) {
            lb[p.n_logit_bias].token = cJSON_GetArrayItem(b, 0)->valueint;
            lb[p.n_logit_bias].bias = (float)cJSON_GetArrayItem(b, 1)->valuedouble;
            p.n_logit_bias++;
        }
        p.logit_bias = lb;
        CHECK(td_sampling_params_check(&p, V, &err) == TD_OK, "case %d params valid: %s", ci, err.msg);

        int32_t prompt[64], output[64];
        int np = read_ints(cJSON_GetObjectItem(c, "prompt"), prompt);
        int no = read_ints(cJSON_GetObjectItem(c, "output"), output);
        float *logits0 = malloc(V * sizeof(float)), *logits = malloc(V * sizeof(float));
        float *probs = malloc(V * sizeof(float)), *want = malloc(V * sizeof(float));
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "logits")) logits0[i++] = (float)x->valuedouble;
        i = 0;
        cJSON_ArrayForEach(x, cJSON_GetObjectItem(c, "probs")) want[i++] = (float)x->valuedouble;

        td_sampler *s = td_sampler_create(V);
        memcpy(logits, logits0, V * sizeof(float));
        td_sampler_probs(s, &p, logits, prompt, np, output, no, probs);
        double maxd = 0;
        int support_mismatch = 0;
        for (int j = 0; j < V; j++) {
            double d = fabs((double)probs[j] - want[j]);
            if (d > maxd) maxd = d;
            if ((probs[j] > 0) != (want[j] > 0)) support_mismatch++;
        }
        CHECK(maxd < 2e-5, "case %d (vocab %d): max |p - oracle| = %g", ci, V, maxd);
        CHECK(support_mismatch == 0, "case %d: %d tokens kept/removed differently", ci, support_mismatch);

        // Same seed, same tokens; draws only from the support; frequencies follow the distribution.
        enum { N = 20000 };
        int *hist = calloc(V, sizeof(int));
        td_rng r1, r2;
        td_rng_seed(&r1, 42 + ci);
        td_rng_seed(&r2, 42 + ci);
        int same = 1, outside = 0;
        for (int k = 0; k < N; k++) {
            memcpy(logits, logits0, V * sizeof(float));
            int32_t t1 = td_sampler_sample(s, &p, logits, prompt, np, output, no, &r1);
            memcpy(logits, logits0, V * sizeof(float));
            int32_t t2 = td_sampler_sample(s, &p, logits, prompt, np, output, no, &r2);
            same &= t1 == t2;
            if (want[t1] == 0) outside++;
            hist[t1]++;
            if (k >= 200 && V > 100) break;  // the big vocabulary only checks support and seeds
        }
        CHECK(same, "case %d: same seed gave different tokens", ci);
        CHECK(outside == 0, "case %d: %d draws outside the oracle's support", ci, outside);
        if (V <= 100) {
            // Each token's count within 5 standard deviations of N * p (binomial).
            int bad = 0;
            for (int j = 0; j < V; j++) {
                double mu = N * (double)want[j], sd = sqrt(N * (double)want[j] * (1 - want[j]));
                if (fabs(hist[j] - mu) > 5 * sd + 1) bad++;
            }
            CHECK(bad == 0, "case %d: %d tokens with implausible frequencies", ci, bad);
        }
        free(hist);
        td_sampler_free(s);
        free(logits0), free(logits), free(probs), free(want);
        ci++;
    }
    // Log-probabilities: top-k is sorted and equals log-softmax.
    float l[7] = {0.5f, -1, 3, 2.5f, 3, -7, 0};
    double lse = td_logsumexp(l, 7), ref = 0;
    for (int j = 0; j < 7; j++) ref += exp(l[j]);
    CHECK_NEAR(lse, log(ref), 1e-9, "logsumexp");
    int32_t ids[3];
    float lps[3];
    td_logprobs_topk(l, 7, lse, 3, ids, lps);
    CHECK(ids[0] == 2 && ids[1] == 4 && ids[2] == 3, "top-3 ids %d %d %d", ids[0], ids[1], ids[2]);
    CHECK_NEAR(lps[2], 2.5 - log(ref), 1e-6, "top-3 logprob");
    test_big_vocab();
    cJSON_Delete(cases);
    free(text);
    TEST_DONE();
}
