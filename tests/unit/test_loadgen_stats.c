// The load generator's numbers against independent oracles: summary statistics and the serving
// metrics of `vllm bench serve` computed by numpy (tests/reference/loadgen_oracle.py), the
// arrival-time generator's distribution (exponential / gamma moments, a Kolmogorov-Smirnov test,
// the rescaling to n / rate) and the random dataset's lengths and prompt ids.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "loadgen/lg_stats.h"
#include "loadgen/loadgen.h"
#include "test_util.h"

static double num(const cJSON *o, const char *k) {
    const cJSON *x = cJSON_GetObjectItem(o, k);
    return x ? x->valuedouble : NAN;
}

static int close_rel(double a, double b) { return fabs(a - b) <= 1e-9 * fmax(1.0, fabs(b)); }

static cJSON *load_oracle(void) {
    char path[1024], cmd[2048];
    snprintf(path, sizeof path, "%s/loadgen_oracle.json", td_test_data_dir());
    char *text = NULL;
    td_err err;
    if (td_read_file(path, 0, &text, NULL, &err) != TD_OK) {  // generate it (numpy) if missing
        snprintf(cmd, sizeof cmd, "/usr/bin/python3 tests/reference/loadgen_oracle.py --out '%s'", path);
        if (system(cmd) != 0 || td_read_file(path, 0, &text, NULL, &err) != TD_OK) {
            fprintf(stderr, "missing oracle %s (run tests/reference/loadgen_oracle.py): %s\n", path, err.msg);
            return NULL;
        }
    }
    cJSON *j = cJSON_Parse(text);
    free(text);
    return j;
}

static void test_stats(const cJSON *cases) {
    const cJSON *c;
    int ci = 0;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *xa = cJSON_GetObjectItem(c, "x");
        int n = cJSON_GetArraySize(xa);
        double *x = malloc(((size_t)n + 1) * sizeof *x);
        int i = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, xa) x[i++] = v->valuedouble;
        CHECK(close_rel(td_lg_mean(x, (size_t)n), num(c, "mean")), "case %d mean %.17g vs %.17g", ci,
              td_lg_mean(x, (size_t)n), num(c, "mean"));
        CHECK(close_rel(td_lg_std(x, (size_t)n), num(c, "std")), "case %d std %.17g vs %.17g", ci,
              td_lg_std(x, (size_t)n), num(c, "std"));
        td_lg_sort(x, (size_t)n);
        CHECK(close_rel(td_lg_percentile_sorted(x, (size_t)n, 50), num(c, "median")), "case %d median", ci);
        const cJSON *pcts = cJSON_GetObjectItem(c, "pcts"), *want = cJSON_GetObjectItem(c, "percentiles");
        for (int k = 0; k < cJSON_GetArraySize(pcts); k++) {
            double p = cJSON_GetArrayItem(pcts, k)->valuedouble, w = cJSON_GetArrayItem(want, k)->valuedouble;
            double got = td_lg_percentile_sorted(x, (size_t)n, p);
            CHECK(close_rel(got, w), "case %d (n %d) p%g: %.17g vs numpy %.17g", ci, n, p, got, w);
        }
        free(x);
        ci++;
    }
    CHECK(ci >= 8, "stats cases: %d", ci);
}

static void check_summary(int ci, const char *name, const td_lg_summary *s, const td_lg_metrics *m, const cJSON *w) {
    CHECK(close_rel(s->mean, num(w, "mean")), "metrics %d %s mean %.12g vs %.12g", ci, name, s->mean, num(w, "mean"));
    CHECK(close_rel(s->std, num(w, "std")), "metrics %d %s std %.12g vs %.12g", ci, name, s->std, num(w, "std"));
    CHECK(close_rel(s->median, num(w, "median")), "metrics %d %s median %.12g vs %.12g", ci, name, s->median,
          num(w, "median"));
    const cJSON *pct = cJSON_GetObjectItem(w, "pct");
    for (int k = 0; k < m->n_pct; k++)
        CHECK(close_rel(s->pct[k], cJSON_GetArrayItem(pct, k)->valuedouble), "metrics %d %s p%g %.12g vs %.12g", ci,
              name, m->pcts[k], s->pct[k], cJSON_GetArrayItem(pct, k)->valuedouble);
}

static void test_metrics(const cJSON *cases) {
    const cJSON *c;
    int ci = 0;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *reqs = cJSON_GetObjectItem(c, "requests");
        td_lg_run run = {0};
        run.n = cJSON_GetArraySize(reqs);
        run.res = calloc((size_t)run.n, sizeof *run.res);
        run.duration = num(c, "duration");
        int i = 0;
        const cJSON *r;
        cJSON_ArrayForEach(r, reqs) {
            td_lg_result *x = &run.res[i++];
            x->success = cJSON_IsTrue(cJSON_GetObjectItem(r, "success"));
            x->prompt_len = (int)num(r, "prompt_len");
            x->usage_tokens = (int)num(r, "usage_tokens");
            x->chunks = (int)num(r, "chunks");
            x->start = num(r, "start");
            x->ttft = num(r, "ttft");
            x->latency = num(r, "latency");
            const cJSON *itl = cJSON_GetObjectItem(r, "itl");
            x->n_itl = x->cap_itl = cJSON_GetArraySize(itl);
            x->itl = malloc(((size_t)x->n_itl + 1) * sizeof(double));
            for (int k = 0; k < x->n_itl; k++) x->itl[k] = cJSON_GetArrayItem(itl, k)->valuedouble;
        }
        td_lg_slo slo = {-1, -1, -1}, *slop = NULL;
        const cJSON *sj = cJSON_GetObjectItem(c, "slo");
        if (cJSON_IsObject(sj)) {
            slop = &slo;
            if (cJSON_GetObjectItem(sj, "ttft")) slo.ttft = num(sj, "ttft");
            if (cJSON_GetObjectItem(sj, "tpot")) slo.tpot = num(sj, "tpot");
            if (cJSON_GetObjectItem(sj, "e2el")) slo.e2el = num(sj, "e2el");
        }
        double pcts[TD_LG_MAX_PCT];
        int np = 0;
        const cJSON *p;
        cJSON_ArrayForEach(p, cJSON_GetObjectItem(c, "pcts")) pcts[np++] = p->valuedouble;
        td_lg_metrics m;
        td_err err;
        CHECK(td_lg_metrics_compute(&run, slop, pcts, np, &m, &err) == TD_OK, "metrics %d computes", ci);
        const cJSON *w = cJSON_GetObjectItem(c, "expected");
        CHECK(m.completed == (int)num(w, "completed") && m.failed == (int)num(w, "failed"), "metrics %d counts %d/%d",
              ci, m.completed, m.failed);
        CHECK(m.total_input == (long long)num(w, "total_input"), "metrics %d total input %lld vs %g", ci, m.total_input,
              num(w, "total_input"));
        CHECK(m.total_output == (long long)num(w, "total_output"), "metrics %d total output %lld vs %g", ci,
              m.total_output, num(w, "total_output"));
        int lens_ok = 1;
        for (int k = 0; k < run.n; k++)
            lens_ok &= m.output_lens[k] == cJSON_GetArrayItem(cJSON_GetObjectItem(w, "output_lens"), k)->valueint;
        CHECK(lens_ok, "metrics %d output_lens", ci);
        CHECK(close_rel(m.request_throughput, num(w, "request_throughput")), "metrics %d request throughput", ci);
        CHECK(close_rel(m.output_throughput, num(w, "output_throughput")), "metrics %d output throughput", ci);
        CHECK(close_rel(m.total_token_throughput, num(w, "total_token_throughput")), "metrics %d total throughput", ci);
        if (slop)
            CHECK(m.has_goodput && close_rel(m.request_goodput, num(w, "request_goodput")),
                  "metrics %d goodput %.9g vs %.9g", ci, m.request_goodput, num(w, "request_goodput"));
        else
            CHECK(!m.has_goodput, "metrics %d no goodput without SLOs", ci);
        CHECK(m.max_output_tokens_per_s == num(w, "max_output_tokens_per_s"), "metrics %d peak tok/s %g vs %g", ci,
              m.max_output_tokens_per_s, num(w, "max_output_tokens_per_s"));
        CHECK(m.max_concurrent_requests == (int)num(w, "max_concurrent_requests"), "metrics %d peak concurrency %d vs %g",
              ci, m.max_concurrent_requests, num(w, "max_concurrent_requests"));
        check_summary(ci, "ttft", &m.ttft, &m, cJSON_GetObjectItem(w, "ttft"));
        check_summary(ci, "tpot", &m.tpot, &m, cJSON_GetObjectItem(w, "tpot"));
        check_summary(ci, "itl", &m.itl, &m, cJSON_GetObjectItem(w, "itl"));
        check_summary(ci, "e2el", &m.e2el, &m, cJSON_GetObjectItem(w, "e2el"));
        td_lg_metrics_free(&m);
        run.duration = 1.0;
        td_lg_run_free(&run);
        ci++;
    }
    CHECK(ci >= 5, "metrics cases: %d", ci);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void test_arrivals(void) {
    enum { N = 200000 };
    double *x = malloc(N * sizeof *x);
    td_rng rng;

    // Exponential sampler: moments and a Kolmogorov-Smirnov test against 1 - exp(-rate x).
    td_rng_seed(&rng, 42);
    double rate = 4.0;
    for (int i = 0; i < N; i++) x[i] = td_rng_exponential(&rng, rate);
    double m = td_lg_mean(x, N), s = td_lg_std(x, N);
    CHECK(fabs(m - 0.25) < 0.25 * 0.01, "exponential mean %.5f (0.25)", m);
    CHECK(fabs(s - 0.25) < 0.25 * 0.02, "exponential std %.5f (0.25)", s);
    qsort(x, N, sizeof *x, cmp_d);
    double d = 0;
    for (int i = 0; i < N; i++) {
        double F = 1.0 - exp(-rate * x[i]);
        d = fmax(d, fmax(fabs(F - (double)i / N), fabs(F - (double)(i + 1) / N)));
    }
    CHECK(d < 1.63 / sqrt((double)N), "exponential KS statistic %.5f (< %.5f)", d, 1.63 / sqrt((double)N));

    // Gamma sampler (burstiness != 1): mean k theta, variance k theta^2, for k < 1 and k > 1.
    double shapes[] = {0.5, 3.0};
    for (int t = 0; t < 2; t++) {
        double k = shapes[t], theta = 0.2;
        for (int i = 0; i < N; i++) x[i] = td_rng_gamma(&rng, k, theta);
        m = td_lg_mean(x, N);
        s = td_lg_std(x, N);
        CHECK(fabs(m - k * theta) < k * theta * 0.015, "gamma(%g) mean %.5f (%.5f)", k, m, k * theta);
        CHECK(fabs(s * s - k * theta * theta) < k * theta * theta * 0.04, "gamma(%g) var %.6f (%.6f)", k, s * s,
              k * theta * theta);
    }

    // Arrival times: Poisson, rescaled so that the last is exactly n / rate.
    enum { NA = 2000 };
    double a[NA], b[NA], gaps[NA];
    td_rng_seed(&rng, 7);
    td_lg_arrivals(NA, 10.0, 1.0, &rng, a);
    CHECK(fabs(a[NA - 1] - NA / 10.0) < 1e-9, "last arrival %.12f (%.1f)", a[NA - 1], NA / 10.0);
    int mono = a[0] > 0;
    for (int i = 0; i < NA; i++) {
        gaps[i] = i ? a[i] - a[i - 1] : a[0];
        mono &= gaps[i] >= 0;
    }
    CHECK(mono, "arrivals increase");
    double gm = td_lg_mean(gaps, NA), cv = td_lg_std(gaps, NA) / gm;
    CHECK(fabs(gm - 0.1) < 1e-9, "mean gap %.6f", gm);
    CHECK(cv > 0.93 && cv < 1.07, "Poisson gaps: coefficient of variation %.3f (1)", cv);
    td_rng_seed(&rng, 7);
    td_lg_arrivals(NA, 10.0, 1.0, &rng, b);
    CHECK(!memcmp(a, b, sizeof a), "same seed, same arrivals");
    td_rng_seed(&rng, 8);
    td_lg_arrivals(NA, 10.0, 1.0, &rng, b);
    CHECK(memcmp(a, b, sizeof a) != 0, "another seed, other arrivals");
    // Burstiness 4: gamma gaps, coefficient of variation 1 / sqrt(4).
    td_lg_arrivals(NA, 10.0, 4.0, &rng, a);
    for (int i = 0; i < NA; i++) gaps[i] = i ? a[i] - a[i - 1] : a[0];
    cv = td_lg_std(gaps, NA) / td_lg_mean(gaps, NA);
    CHECK(cv > 0.45 && cv < 0.55, "burstiness 4: coefficient of variation %.3f (0.5)", cv);
    td_lg_arrivals(NA, 10.0, INFINITY, &rng, a);
    CHECK(fabs(a[0] - 0.1) < 1e-12 && fabs(a[NA - 1] - NA / 10.0) < 1e-9, "burstiness inf: constant gaps");
    td_lg_arrivals(NA, INFINITY, 1.0, &rng, a);
    int zeros = 1;
    for (int i = 0; i < NA; i++) zeros &= a[i] == 0.0;
    CHECK(zeros, "rate inf: all at time 0");

    // Integers: uniform over [lo, hi] inclusive.
    long counts[10] = {0};
    for (int i = 0; i < N; i++) {
        long v = td_rng_int(&rng, 5, 14);
        if (v >= 5 && v <= 14) counts[v - 5]++;
        else counts[0] = -N;
    }
    int uni = 1;
    for (int i = 0; i < 10; i++) uni &= labs(counts[i] - N / 10) < N / 10 / 20;
    CHECK(uni, "uniform integers in [5, 14]");
    free(x);
}

// The random dataset: lengths in vLLM's bounds, prompt ids in range, well-formed bodies.
static void test_workload(void) {
    td_lg_params p = td_lg_default_params();
    p.num_prompts = 200;
    p.input_len = 100;
    p.output_len = 50;
    p.range_ratio = 0.25;
    p.vocab_size = 500;
    p.vocab_offset = 3000;
    p.ignore_eos = 1;
    p.temperature = 0.5;
    p.extra_body = "{\"top_k\": 3, \"max_tokens\": 999}";
    td_lg_workload w;
    td_err err;
    CHECK(td_lg_workload_build(&p, "m", &w, &err) == TD_OK, "workload builds: %s", err.msg);
    int in_min = 1 << 30, in_max = 0, out_min = 1 << 30, out_max = 0, ok = 1;
    for (int i = 0; i < w.n; i++) {
        const td_lg_request *q = &w.reqs[i];
        cJSON *j = cJSON_ParseWithLength(q->body, q->body_len);
        const cJSON *pr = cJSON_GetObjectItem(j, "prompt");
        ok &= cJSON_GetArraySize(pr) == q->prompt_len;
        const cJSON *id;
        cJSON_ArrayForEach(id, pr) ok &= id->valueint >= 3000 && id->valueint < 3500;
        ok &= cJSON_IsTrue(cJSON_GetObjectItem(j, "stream")) && cJSON_IsTrue(cJSON_GetObjectItem(j, "ignore_eos"));
        ok &= cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "stream_options"), "include_usage"));
        ok &= num(j, "temperature") == 0.5 && num(j, "top_k") == 3 && num(j, "max_tokens") == 999;  // extra wins
        ok &= q->body_len == strlen(q->body);
        in_min = q->prompt_len < in_min ? q->prompt_len : in_min;
        in_max = q->prompt_len > in_max ? q->prompt_len : in_max;
        out_min = q->max_tokens < out_min ? q->max_tokens : out_min;
        out_max = q->max_tokens > out_max ? q->max_tokens : out_max;
        cJSON_Delete(j);
    }
    CHECK(ok, "bodies: prompt ids, stream options, ignore_eos, temperature, extra body, length");
    CHECK(w.url && !strcmp(w.url, "http://127.0.0.1:8000/v1/completions"), "request URL %s", w.url ? w.url : "(none)");
    // floor(100 * 0.75) = 75 .. ceil(100 * 1.25) = 125; 37 .. 63 for outputs; 200 draws reach near both ends
    CHECK(in_min >= 75 && in_max <= 125 && in_min <= 80 && in_max >= 120, "input lengths %d..%d", in_min, in_max);
    CHECK(out_min >= 37 && out_max <= 63 && out_min <= 40 && out_max >= 60, "output lengths %d..%d", out_min, out_max);
    td_lg_workload_free(&w);

    p.range_ratio = 0;
    p.extra_body = NULL;
    p.endpoint = "/v1/chat/completions";
    p.base_url = "http://localhost:1234/prefix/";
    CHECK(td_lg_workload_build(&p, "m", &w, &err) == TD_OK, "chat workload builds");
    ok = 1;
    for (int i = 0; i < w.n; i++) {
        ok &= w.reqs[i].prompt_len == 100 && w.reqs[i].max_tokens == 50;
        cJSON *j = cJSON_Parse(w.reqs[i].body);
        const cJSON *msg = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "messages"), 0);
        const cJSON *content = cJSON_GetObjectItem(msg, "content");
        int words = 0;
        if (cJSON_IsString(content))
            for (const char *s = content->valuestring; *s; s++) words += *s != ' ' && (s == content->valuestring || s[-1] == ' ');
        ok &= words == 100 && num(j, "max_completion_tokens") == 50;
        cJSON_Delete(j);
    }
    CHECK(!strcmp(w.url, "http://localhost:1234/prefix/v1/chat/completions"), "chat URL with prefix: %s", w.url);
    CHECK(ok, "chat: fixed lengths, 100 words, prefix kept");
    td_lg_workload_free(&w);

    p.range_ratio = 1.0;
    CHECK(td_lg_workload_build(&p, "m", &w, &err) == TD_ERR_INVALID, "range ratio 1 refused");
    p.range_ratio = 0;
    p.extra_body = "[1]";
    CHECK(td_lg_workload_build(&p, "m", &w, &err) == TD_ERR_INVALID, "extra body must be an object");
    p.extra_body = NULL;

    // --random-prefix-len: every prompt starts with the same 64 ids, then its own 100; the suffixes
    // are those of the same dataset without a prefix; chat refuses it.
    p.prefix_len = 64;
    CHECK(td_lg_workload_build(&p, "m", &w, &err) == TD_ERR_INVALID, "prefix refused for chat");
    p.endpoint = "/v1/completions";
    p.num_prompts = 20;
    td_lg_workload w0;
    p.prefix_len = 0;
    CHECK(td_lg_workload_build(&p, "m", &w0, &err) == TD_OK, "no-prefix workload builds");
    p.prefix_len = 64;
    CHECK(td_lg_workload_build(&p, "m", &w, &err) == TD_OK, "prefix workload builds: %s", err.msg);
    ok = w.n == 20 && w0.n == 20;
    cJSON *first = NULL;
    int differ = 0;
    for (int i = 0; ok && i < w.n; i++) {
        cJSON *j = cJSON_Parse(w.reqs[i].body);
        cJSON *j0 = cJSON_Parse(w0.reqs[i].body);
        const cJSON *pr = cJSON_GetObjectItem(j, "prompt"), *pr0 = cJSON_GetObjectItem(j0, "prompt");
        ok &= w.reqs[i].prompt_len == 164 && cJSON_GetArraySize(pr) == 164 && cJSON_GetArraySize(pr0) == 100;
        for (int k = 0; ok && k < 100; k++)
            ok &= cJSON_GetArrayItem(pr, 64 + k)->valueint == cJSON_GetArrayItem(pr0, k)->valueint;
        if (!first) first = cJSON_Duplicate(pr, 1);
        for (int k = 0; ok && k < 64; k++) {
            int v = cJSON_GetArrayItem(pr, k)->valueint;
            ok &= v == cJSON_GetArrayItem(first, k)->valueint && v >= 3000 && v < 3500;
            differ |= k > 0 && v != cJSON_GetArrayItem(pr, 0)->valueint;
        }
        cJSON_Delete(j);
        cJSON_Delete(j0);
    }
    CHECK(ok && differ, "prefix: shared 64 ids, then the no-prefix dataset's prompts");
    cJSON_Delete(first);
    td_lg_workload_free(&w);
    td_lg_workload_free(&w0);
}

int main(void) {
    cJSON *o = load_oracle();
    CHECK(o != NULL, "oracle loads");
    if (o) {
        test_stats(cJSON_GetObjectItem(o, "stats"));
        test_metrics(cJSON_GetObjectItem(o, "metrics"));
    }
    cJSON_Delete(o);
    test_arrivals();
    test_workload();
    TEST_DONE();
}
