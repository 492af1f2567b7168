// Sampler against the torch oracle (tests/reference/sampler_oracle.py): the filtered distribution
// for each parameter combination, seeded reproducibility, and empirical frequencies; the processed
// log-probabilities of td_sampler_logprob (every token, removed ones -inf) and their gradient against
// torch autograd; the kept set equal to the set the sampler draws from (exactly against
// td_sampler_probs' support, statistically against draws), also with ties at the top-k boundary.
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

// td_sampler_logprob on one oracle case: every token's processed logprob (null: removed -> -inf),
// logits untouched, the kept set == td_sampler_probs' support at temperature > 0 (exact), and the
// gradient against autograd for the oracle's grad_tokens.
static void check_logprob_case(const cJSON *c, int ci, td_sampler *s, const td_sampling_params *p, int V,
                               const float *logits0, const int32_t *prompt, int np, const int32_t *output, int no) {
    float *l = malloc(V * sizeof(float)), *dl = malloc(V * sizeof(float)), *probs = malloc(V * sizeof(float));
    memcpy(l, logits0, V * sizeof(float));
    const cJSON *lps = cJSON_GetObjectItem(c, "logprobs");
    CHECK(cJSON_GetArraySize(lps) == V, "case %d: oracle logprobs (regenerate: tests/oracle/gen/sampler.sh)", ci);
    double maxd = 0;
    int kept_bad = 0, n_kept = 0;
    for (int j = 0; j < V && cJSON_GetArraySize(lps) == V; j++) {
        const cJSON *w = cJSON_GetArrayItem(lps, j);
        double got = td_sampler_logprob(s, p, l, prompt, np, output, no, j, NULL);
        if (cJSON_IsNull(w)) {
            kept_bad += got != -INFINITY;
        } else {
            n_kept++;
            if (!isfinite(got)) kept_bad++;
            else if (fabs(got - w->valuedouble) > maxd) maxd = fabs(got - w->valuedouble);
        }
    }
    CHECK(memcmp(l, logits0, V * sizeof(float)) == 0, "case %d: td_sampler_logprob modified logits", ci);
    CHECK(kept_bad == 0, "case %d: %d tokens kept/removed differently from the oracle", ci, kept_bad);
    CHECK(maxd < 2e-5, "case %d (vocab %d): max |logprob - oracle| = %g over %d kept", ci, V, maxd, n_kept);
    if (p->temperature > 0) {
        td_sampler_probs(s, p, l, prompt, np, output, no, probs);
        int diff = 0;
        // A kept token whose float probability underflows (logit_bias -100) is in the set but has
        // probs 0; below exp(-60) only kept => finite is checked.
        for (int j = 0; j < V; j++) {
            double lp = td_sampler_logprob(s, p, logits0, prompt, np, output, no, j, NULL);
            diff += probs[j] > 0 ? !isfinite(lp) : lp > -60;
        }
        CHECK(diff == 0, "case %d: kept set != the sampler's support on %d tokens", ci, diff);
    }
    const cJSON *gt = cJSON_GetObjectItem(c, "grad_tokens"), *gs = cJSON_GetObjectItem(c, "grads");
    CHECK(cJSON_GetArraySize(gt) >= 1 && cJSON_GetArraySize(gt) == cJSON_GetArraySize(gs), "case %d: oracle grads", ci);
    for (int k = 0; k < cJSON_GetArraySize(gt) && k < cJSON_GetArraySize(gs); k++) {
        int32_t t = cJSON_GetArrayItem(gt, k)->valueint;
        const cJSON *g = cJSON_GetArrayItem(gs, k);
        double lp = td_sampler_logprob(s, p, logits0, prompt, np, output, no, t, dl);
        double lp0 = td_sampler_logprob(s, p, logits0, prompt, np, output, no, t, NULL);
        CHECK(lp == lp0, "case %d: the logprob depends on dlogits being asked for", ci);
        double gd = 0, gsum = 0;
        int j = 0, nz_out = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, g) {
            if (j < V) {
                double d = fabs(dl[j] - x->valuedouble);
                gd = d > gd ? d : gd;
                gsum += dl[j];
                if (cJSON_IsNull(cJSON_GetArrayItem(lps, j)) && dl[j] != 0) nz_out++;
            }
            j++;
        }
        CHECK(j == V, "case %d: oracle grad length %d", ci, j);
        CHECK(gd < 2e-6, "case %d token %d: max |dlogits - autograd| = %g", ci, t, gd);
        CHECK(nz_out == 0, "case %d token %d: %d nonzero gradients outside the kept set", ci, t, nz_out);
        (void)gsum;
    }
    // A removed token: -inf and an all-zero gradient.
    for (int j = 0; j < V; j++)
        if (cJSON_IsNull(cJSON_GetArrayItem(lps, j))) {
            double lp = td_sampler_logprob(s, p, logits0, prompt, np, output, no, j, dl);
            int nz = 0;
            for (int i = 0; i < V; i++) nz += dl[i] != 0;
            CHECK(lp == -INFINITY && nz == 0, "case %d: removed token %d: logprob %g, %d nonzero gradients", ci, j, lp, nz);
            break;
        }
    free(l), free(dl), free(probs);
}

// Ties at the filters' boundaries (top-k among equal logits, equal logits across the top-p cut, the
// top_k == 1 shortcut among tied maxima): the kept set of td_sampler_logprob must be the set the
// sampler draws from, exactly (td_sampler_probs' support) and for every draw.
static void test_logprob_ties(void) {
    enum { V = 64 };
    float l0[V], l[V], probs[V];
    for (int i = 0; i < V; i++) l0[i] = i % 3 == 0 ? 2.0f : i % 3 == 1 ? 1.0f : (float)(i % 7) * 0.1f;
    const int ks[] = {1, 3, 5, 11, 22, 23, 40};
    const float tps[] = {1.0f, 0.5f, 0.7f};
    int bad = 0, outside = 0;
    td_sampler *s = td_sampler_create(V);
    for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
        for (size_t b = 0; b < sizeof tps / sizeof *tps; b++) {
            td_sampling_params p = td_sampling_default_params();
            p.top_k = ks[a];
            p.top_p = tps[b];
            p.temperature = 0.9f;
            memcpy(l, l0, sizeof l);
            td_sampler_probs(s, &p, l, NULL, 0, NULL, 0, probs);
            double mass = 0;
            for (int j = 0; j < V; j++) {
                double lp = td_sampler_logprob(s, &p, l0, NULL, 0, NULL, 0, j, NULL);
                bad += (probs[j] > 0) != isfinite(lp);
                if (isfinite(lp)) mass += exp(lp);
            }
            CHECK(fabs(mass - 1.0) < 1e-9, "top_k %d top_p %g: kept mass %.17g", ks[a], tps[b], mass);
            td_rng r;
            td_rng_seed(&r, 5 + a * 7 + b);
            for (int k = 0; k < 500; k++) {
                memcpy(l, l0, sizeof l);
                int32_t t = td_sampler_sample(s, &p, l, NULL, 0, NULL, 0, &r);
                outside += !isfinite(td_sampler_logprob(s, &p, l0, NULL, 0, NULL, 0, t, NULL));
            }
        }
    CHECK(bad == 0, "ties: %d tokens where the kept set and the sampler's support differ", bad);
    CHECK(outside == 0, "ties: %d draws outside the kept set", outside);
    // Greedy: processed as temperature 1 with the filters; the argmax is kept.
    td_sampling_params p = td_sampling_default_params();
    p.temperature = 0;
    p.top_k = 4;
    td_sampler_logprob(s, &p, l0, NULL, 0, NULL, 0, 0, NULL);
    int32_t ids[8];
    float tl[8];
    int n = td_sampler_logprob_topk(s, 8, ids, tl);
    double lp = n > 0 ? td_sampler_logprob(s, &p, l0, NULL, 0, NULL, 0, ids[n - 1], NULL) : 0;
    CHECK(fabs(lp + log(4.0)) < 1e-12, "greedy top_k 4 among tied maxima: logprob %g", lp);
    bool ok = n == 4;
    for (int i = 0; i < n && ok; i++) ok = l0[ids[i]] == 2.0f && fabsf(tl[i] + logf(4.0f)) < 1e-6f && (i == 0 || ids[i] > ids[i - 1]);
    CHECK(ok, "topk of the kept set: n %d, ids %d %d %d %d", n, ids[0], ids[1], ids[2], ids[3]);
    td_sampler_free(s);
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
        if (p.temperature > 0 && V <= 100) {
            // Draw frequencies follow exp(td_sampler_logprob): the logprob describes what is drawn.
            int bad = 0;
            for (int j = 0; j < V; j++) {
                double pj = exp(td_sampler_logprob(s, &p, logits0, prompt, np, output, no, j, NULL));
                double mu = N * pj, sd = sqrt(N * pj * (1 - pj));
                if (fabs(hist[j] - mu) > 5 * sd + 1) bad++;
            }
            CHECK(bad == 0, "case %d: %d tokens drawn with frequencies implausible under exp(logprob)", ci, bad);
        }
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
        check_logprob_case(c, ci, s, &p, V, logits0, prompt, np, output, no);
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
    test_logprob_ties();
    cJSON_Delete(cases);
    free(text);
    TEST_DONE();
}
