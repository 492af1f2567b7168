// Output of `tandem bench serve`: the "Serving Benchmark Result" table laid out like vLLM's and the
// result JSON with vLLM's keys (plus a few tandem extras). Formatting only; no computation.
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "loadgen/loadgen.h"

static void banner(FILE *f, const char *title, char fill) {  // Python's "{:c^50}"
    int len = (int)strlen(title), pad = 50 - len;
    if (pad < 0) pad = 0;
    int left = pad / 2, right = pad - left;
    for (int i = 0; i < left; i++) fputc(fill, f);
    fputs(title, f);
    for (int i = 0; i < right; i++) fputc(fill, f);
    fputc('\n', f);
}

static void row_int(FILE *f, const char *label, long long v) { fprintf(f, "%-40s %-10lld\n", label, v); }
static void row_num(FILE *f, const char *label, double v) { fprintf(f, "%-40s %-10.2f\n", label, v); }

// "99" for whole percentiles, "99.9" otherwise (vLLM's key and label spelling).
static void pct_word(double p, char *out, size_t n) {
    if (p == floor(p)) snprintf(out, n, "%d", (int)p);
    else snprintf(out, n, "%g", p);
}

static void section(FILE *f, const td_lg_metrics *m, const char *name, const char *header, const td_lg_summary *s) {
    char label[64], pw[32];
    banner(f, header, '-');
    snprintf(label, sizeof label, "Mean %s (ms):", name);
    row_num(f, label, s->mean);
    snprintf(label, sizeof label, "Median %s (ms):", name);
    row_num(f, label, s->median);
    for (int k = 0; k < m->n_pct; k++) {
        pct_word(m->pcts[k], pw, sizeof pw);
        snprintf(label, sizeof label, "P%s %s (ms):", pw, name);
        row_num(f, label, s->pct[k]);
    }
}

void td_lg_report_print(FILE *f, const td_lg_params *p, const td_lg_metrics *m, int which) {
    banner(f, " Serving Benchmark Result ", '=');
    row_int(f, "Successful requests:", m->completed);
    row_int(f, "Failed requests:", m->failed);
    if (p->max_concurrency > 0) row_int(f, "Maximum request concurrency:", p->max_concurrency);
    if (!isinf(p->request_rate)) row_num(f, "Request rate configured (RPS):", p->request_rate);
    row_num(f, "Benchmark duration (s):", m->duration);
    row_int(f, "Total input tokens:", m->total_input);
    row_int(f, "Total generated tokens:", m->total_output);
    row_num(f, "Request throughput (req/s):", m->request_throughput);
    if (m->has_goodput) row_num(f, "Request goodput (req/s):", m->request_goodput);
    row_num(f, "Output token throughput (tok/s):", m->output_throughput);
    row_num(f, "Peak output token throughput (tok/s):", m->max_output_tokens_per_s);
    row_num(f, "Peak concurrent requests:", m->max_concurrent_requests);
    row_num(f, "Total token throughput (tok/s):", m->total_token_throughput);
    if (which & TD_LG_METRIC_TTFT) section(f, m, "TTFT", "Time to First Token", &m->ttft);
    if (which & TD_LG_METRIC_TPOT) section(f, m, "TPOT", "Time per Output Token (excl. 1st token)", &m->tpot);
    if (which & TD_LG_METRIC_ITL) section(f, m, "ITL", "Inter-token Latency", &m->itl);
    if (which & TD_LG_METRIC_E2EL) section(f, m, "E2EL", "End-to-end Latency", &m->e2el);
    for (int i = 0; i < 50; i++) fputc('=', f);
    fputc('\n', f);
}

static void add_summary(cJSON *o, const td_lg_metrics *m, const char *name, const td_lg_summary *s) {
    char key[64], pw[32];
    snprintf(key, sizeof key, "mean_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->mean);
    snprintf(key, sizeof key, "median_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->median);
    snprintf(key, sizeof key, "std_%s_ms", name);
    cJSON_AddNumberToObject(o, key, s->std);
    for (int k = 0; k < m->n_pct; k++) {
        pct_word(m->pcts[k], pw, sizeof pw);
        snprintf(key, sizeof key, "p%s_%s_ms", pw, name);
        cJSON_AddNumberToObject(o, key, s->pct[k]);
    }
}

cJSON *td_lg_report_json(const td_lg_params *p, const char *model, const td_lg_run *run, const td_lg_metrics *m) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    char date[32];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
    cJSON_AddStringToObject(o, "date", date);
    cJSON_AddStringToObject(o, "backend", strstr(p->endpoint, "chat/completions") ? "openai-chat" : "openai");
    cJSON_AddStringToObject(o, "endpoint", p->endpoint);
    cJSON_AddStringToObject(o, "base_url", p->base_url);
    cJSON_AddStringToObject(o, "model_id", model ? model : "");
    cJSON_AddNumberToObject(o, "num_prompts", run->n);
    if (isinf(p->request_rate)) cJSON_AddStringToObject(o, "request_rate", "inf");
    else cJSON_AddNumberToObject(o, "request_rate", p->request_rate);
    cJSON_AddNumberToObject(o, "burstiness", p->burstiness);
    if (p->max_concurrency > 0) cJSON_AddNumberToObject(o, "max_concurrency", p->max_concurrency);
    else cJSON_AddNullToObject(o, "max_concurrency");
    cJSON_AddNumberToObject(o, "duration", m->duration);
    cJSON_AddNumberToObject(o, "completed", m->completed);
    cJSON_AddNumberToObject(o, "failed", m->failed);
    cJSON_AddNumberToObject(o, "total_input_tokens", (double)m->total_input);
    cJSON_AddNumberToObject(o, "total_output_tokens", (double)m->total_output);
    cJSON_AddNumberToObject(o, "request_throughput", m->request_throughput);
    if (m->has_goodput) cJSON_AddNumberToObject(o, "request_goodput", m->request_goodput);
    else cJSON_AddNullToObject(o, "request_goodput");
    cJSON_AddNumberToObject(o, "output_throughput", m->output_throughput);
    cJSON_AddNumberToObject(o, "total_token_throughput", m->total_token_throughput);
    cJSON_AddNumberToObject(o, "max_output_tokens_per_s", m->max_output_tokens_per_s);
    cJSON_AddNumberToObject(o, "max_concurrent_requests", m->max_concurrent_requests);
    add_summary(o, m, "ttft", &m->ttft);
    add_summary(o, m, "tpot", &m->tpot);
    add_summary(o, m, "itl", &m->itl);
    add_summary(o, m, "e2el", &m->e2el);

    cJSON *in = cJSON_AddArrayToObject(o, "input_lens"), *out = cJSON_AddArrayToObject(o, "output_lens");
    cJSON *tt = cJSON_AddArrayToObject(o, "ttfts"), *it = cJSON_AddArrayToObject(o, "itls");
    cJSON *lat = cJSON_AddArrayToObject(o, "latencies"), *st = cJSON_AddArrayToObject(o, "start_times");
    cJSON *qt = cJSON_AddArrayToObject(o, "queue_times"), *er = cJSON_AddArrayToObject(o, "errors");
    double t0 = INFINITY;
    for (int i = 0; i < run->n; i++)
        if (run->res[i].start > 0 && run->res[i].start < t0) t0 = run->res[i].start;
    for (int i = 0; i < run->n; i++) {
        const td_lg_result *r = &run->res[i];
        cJSON_AddItemToArray(in, cJSON_CreateNumber(r->prompt_len));
        cJSON_AddItemToArray(out, cJSON_CreateNumber(m->output_lens ? m->output_lens[i] : 0));
        cJSON_AddItemToArray(tt, cJSON_CreateNumber(r->ttft));
        cJSON_AddItemToArray(it, cJSON_CreateDoubleArray(r->itl ? r->itl : (const double[]){0}, r->n_itl));
        cJSON_AddItemToArray(lat, cJSON_CreateNumber(r->latency));
        cJSON_AddItemToArray(st, cJSON_CreateNumber(isinf(t0) ? 0 : r->start - t0));
        cJSON_AddItemToArray(qt, cJSON_CreateNumber(r->start > 0 && r->queued > 0 ? r->start - r->queued : 0));
        cJSON_AddItemToArray(er, cJSON_CreateString(r->error));
    }
    return o;
}
