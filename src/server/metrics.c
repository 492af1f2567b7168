// Server metrics (see metrics.h). Histogram buckets follow vLLM's definitions (v1 loggers) so dashboards
// built for vLLM read ours unchanged; bucket counts are stored per bucket and rendered cumulative.
#include "server/metrics.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

const double td_metrics_ttft_buckets[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                          1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const int td_metrics_ttft_nbuckets = sizeof td_metrics_ttft_buckets / sizeof(double);
const double td_metrics_itl_buckets[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                         0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
const int td_metrics_itl_nbuckets = sizeof td_metrics_itl_buckets / sizeof(double);
const double td_metrics_e2e_buckets[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
                                         30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const int td_metrics_e2e_nbuckets = sizeof td_metrics_e2e_buckets / sizeof(double);

#define MAX_BUCKETS 24

typedef struct hist {
    const double *le;
    int nb;
    uint64_t counts[MAX_BUCKETS + 1];  // per bucket; [nb] = above the last bound
    uint64_t count;
    double sum;
} hist;

struct td_srv_metrics {
    pthread_mutex_t mu;
    hist ttft, itl, tpot, tpot_old, e2e;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t finished[4];  // by td_finish_reason
    uint64_t http_2xx, http_4xx, http_5xx;
    uint64_t embed_requests, embed_inputs, embed_tokens;  // POST /v1/embeddings answered with 200
};

static void hist_init(hist *h, const double *le, int nb) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->nb = nb;
}

static void hist_add(hist *h, double v) {
    int i = 0;
    while (i < h->nb && v > h->le[i]) i++;
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

td_srv_metrics *td_srv_metrics_create(void) {
    td_srv_metrics *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    pthread_mutex_init(&m->mu, NULL);
    hist_init(&m->ttft, td_metrics_ttft_buckets, td_metrics_ttft_nbuckets);
    hist_init(&m->itl, td_metrics_itl_buckets, td_metrics_itl_nbuckets);
    hist_init(&m->tpot, td_metrics_itl_buckets, td_metrics_itl_nbuckets);
    hist_init(&m->tpot_old, td_metrics_itl_buckets, td_metrics_itl_nbuckets);
    hist_init(&m->e2e, td_metrics_e2e_buckets, td_metrics_e2e_nbuckets);
    return m;
}

void td_srv_metrics_free(td_srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void td_srv_metrics_embeddings(td_srv_metrics *m, int n_inputs, int prompt_tokens) {
    pthread_mutex_lock(&m->mu);
    m->embed_requests++;
    m->embed_inputs += n_inputs > 0 ? (uint64_t)n_inputs : 0;
    m->embed_tokens += prompt_tokens > 0 ? (uint64_t)prompt_tokens : 0;
    pthread_mutex_unlock(&m->mu);
}

void td_srv_metrics_request(td_srv_metrics *m, int prompt_tokens, int generation_tokens, double ttft,
                            double e2e, const double *itl, int n_itl, double tpot) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += prompt_tokens > 0 ? (uint64_t)prompt_tokens : 0;
    m->generation_tokens += generation_tokens > 0 ? (uint64_t)generation_tokens : 0;
    if (ttft >= 0) hist_add(&m->ttft, ttft);
    for (int i = 0; i < n_itl; i++) {
        hist_add(&m->itl, itl[i]);
        hist_add(&m->tpot_old, itl[i]);  // vLLM's older time_per_output_token is per token gap too
    }
    if (generation_tokens > 1 && tpot >= 0) hist_add(&m->tpot, tpot);
    hist_add(&m->e2e, e2e);
    pthread_mutex_unlock(&m->mu);
}

void td_srv_metrics_finish(td_srv_metrics *m, td_finish_reason reason) {
    if ((unsigned)reason > TD_FINISH_ABORT) return;
    pthread_mutex_lock(&m->mu);
    m->finished[reason]++;
    pthread_mutex_unlock(&m->mu);
}

void td_srv_metrics_http(td_srv_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    if (status < 400) m->http_2xx++;
    else if (status < 500) m->http_4xx++;
    else m->http_5xx++;
    pthread_mutex_unlock(&m->mu);
}

// Label value escaping per the text format: backslash, double quote, newline.
static void escape_label(const char *s, char *out, size_t cap) {
    size_t o = 0;
    for (; *s && o + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') {
            out[o++] = '\\';
            out[o++] = *s;
        } else if (*s == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *s;
        }
    }
    out[o] = 0;
}

void td_srv_metrics_label(const char *s, char *out, size_t cap) { escape_label(s ? s : "", out, cap); }

static bool render_hist(td_srv_buf *b, const char *name, const char *help, const hist *h, const char *lab) {
    bool ok = td_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->nb; i++) {
        cum += h->counts[i];
        ok = ok && td_srv_buf_printf(b, "%s_bucket{le=\"%g\",model_name=\"%s\"} %llu\n", name, h->le[i], lab,
                                     (unsigned long long)cum);
    }
    cum += h->counts[h->nb];
    ok = ok && td_srv_buf_printf(b, "%s_bucket{le=\"+Inf\",model_name=\"%s\"} %llu\n", name, lab, (unsigned long long)cum);
    ok = ok && td_srv_buf_printf(b, "%s_count{model_name=\"%s\"} %llu\n", name, lab, (unsigned long long)h->count);
    ok = ok && td_srv_buf_printf(b, "%s_sum{model_name=\"%s\"} %.9g\n", name, lab, h->sum);
    return ok;
}

static bool render_counter(td_srv_buf *b, const char *name, const char *help, uint64_t v, const char *lab) {
    return td_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s{model_name=\"%s\"} %llu\n", name, help, name,
                             name, lab, (unsigned long long)v);
}

static bool render_gauge(td_srv_buf *b, const char *name, const char *help, double v, const char *lab) {
    return td_srv_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s{model_name=\"%s\"} %.9g\n", name, help, name, name,
                             lab, v);
}

bool td_srv_metrics_render(td_srv_metrics *m, const char *model, const td_engine_stats *st, td_srv_buf *b) {
    char lab[512];
    escape_label(model ? model : "", lab, sizeof lab);
    pthread_mutex_lock(&m->mu);
    td_srv_metrics c = *m;  // snapshot, render without the lock
    pthread_mutex_unlock(&m->mu);
    bool ok = true;
    ok = ok && render_gauge(b, "vllm:num_requests_running", "Number of requests in model execution batches.",
                            st->num_running, lab);
    ok = ok && render_gauge(b, "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                            st->num_waiting, lab);
    ok = ok && render_gauge(b, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                            st->kv_cache_usage, lab);
    ok = ok && render_gauge(b, "vllm:gpu_cache_usage_perc", "KV-cache usage (older name of kv_cache_usage_perc).",
                            st->kv_cache_usage, lab);
    ok = ok && render_counter(b, "vllm:prefix_cache_queries_total",
                              "Prefix cache queries, in terms of number of queried tokens.", st->prefix_cache_queries, lab);
    ok = ok && render_counter(b, "vllm:prefix_cache_hits_total",
                              "Prefix cache hits, in terms of number of cached tokens.", st->prefix_cache_hits, lab);
    ok = ok && render_counter(b, "vllm:num_preemptions_total", "Cumulative number of preemptions from the engine.",
                              st->num_preemptions, lab);
    ok = ok && render_counter(b, "tandem:engine_aborted_requests_total",
                              "Requests cancelled and freed by the engine (client gone, shutdown).", st->num_aborted, lab);
    ok = ok && render_counter(b, "vllm:prompt_tokens_total", "Number of prefill tokens processed.", c.prompt_tokens, lab);
    ok = ok && render_counter(b, "vllm:generation_tokens_total", "Number of generation tokens processed.",
                              c.generation_tokens, lab);
    ok = ok && render_counter(b, "tandem:embedding_requests_total", "Embeddings requests answered (200).",
                              c.embed_requests, lab);
    ok = ok && render_counter(b, "tandem:embedding_inputs_total", "Inputs embedded.", c.embed_inputs, lab);
    ok = ok && render_counter(b, "tandem:embedding_prompt_tokens_total",
                              "Tokens run through the forward for embeddings (not in vllm:prompt_tokens_total).",
                              c.embed_tokens, lab);
    ok = ok && td_srv_buf_printf(b, "# HELP vllm:request_success_total Count of successfully processed requests.\n"
                                    "# TYPE vllm:request_success_total counter\n");
    for (int r = TD_FINISH_STOP; r <= TD_FINISH_ABORT; r++)
        ok = ok && td_srv_buf_printf(b, "vllm:request_success_total{finished_reason=\"%s\",model_name=\"%s\"} %llu\n",
                                     td_finish_reason_str((td_finish_reason)r), lab, (unsigned long long)c.finished[r]);
    ok = ok && render_hist(b, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                           &c.ttft, lab);
    ok = ok && render_hist(b, "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                           &c.itl, lab);
    ok = ok && render_hist(b, "vllm:time_per_output_token_seconds",
                           "Histogram of time per output token in seconds (older name of inter_token_latency).",
                           &c.tpot_old, lab);
    ok = ok && render_hist(b, "vllm:request_time_per_output_token_seconds",
                           "Histogram of time_per_output_token_seconds per request.", &c.tpot, lab);
    ok = ok && render_hist(b, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                           &c.e2e, lab);
    ok = ok && td_srv_buf_printf(b, "# HELP tandem:http_responses_total HTTP responses by status class.\n"
                                    "# TYPE tandem:http_responses_total counter\n"
                                    "tandem:http_responses_total{code=\"2xx\"} %llu\n"
                                    "tandem:http_responses_total{code=\"4xx\"} %llu\n"
                                    "tandem:http_responses_total{code=\"5xx\"} %llu\n",
                                 (unsigned long long)c.http_2xx, (unsigned long long)c.http_4xx,
                                 (unsigned long long)c.http_5xx);
    return ok;
}
