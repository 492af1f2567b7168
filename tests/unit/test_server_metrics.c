// Prometheus rendering (src/server/metrics.c): every sample line is well formed, HELP/TYPE precede
// each family, histogram buckets are cumulative with +Inf == count and the sum right (checked against
// counts computed here from the observed values), vLLM's names and bucket bounds, label escaping.
#include <stdlib.h>
#include <string.h>
#include "server/metrics.h"
#include "test_util.h"

// Value of the first sample line starting with `prefix` (whole label set included), NAN if none.
static double sample(const char *text, const char *prefix) {
    size_t n = strlen(prefix);
    for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (strncmp(l, prefix, n) == 0 && l[n] == ' ') return strtod(l + n + 1, NULL);
    return NAN;
}

static bool valid_line(const char *l, size_t len) {
    if (len == 0) return false;
    if (l[0] == '#') return strncmp(l, "# HELP ", 7) == 0 || strncmp(l, "# TYPE ", 7) == 0;
    size_t i = 0;
    while (i < len && (l[i] == '_' || l[i] == ':' || (l[i] >= 'a' && l[i] <= 'z') || (l[i] >= 'A' && l[i] <= 'Z') ||
                       (i > 0 && l[i] >= '0' && l[i] <= '9')))
        i++;
    if (i == 0) return false;
    if (i < len && l[i] == '{') {
        bool in_str = false;
        for (i++; i < len; i++) {
            if (in_str && l[i] == '\\') { i++; continue; }
            if (l[i] == '"') in_str = !in_str;
            if (!in_str && l[i] == '}') break;
        }
        if (i >= len) return false;
        i++;
    }
    if (i >= len || l[i] != ' ') return false;
    char *end;
    char buf[64];
    size_t vl = len - i - 1 < 63 ? len - i - 1 : 63;
    memcpy(buf, l + i + 1, vl);
    buf[vl] = 0;
    strtod(buf, &end);
    return end != buf && *end == 0;
}

int main(void) {
    // vLLM's bucket bounds (vllm/v1/metrics/loggers.py).
    CHECK(td_metrics_ttft_nbuckets == 22 && td_metrics_ttft_buckets[0] == 0.001 && td_metrics_ttft_buckets[21] == 2560.0, "ttft buckets");
    CHECK(td_metrics_itl_nbuckets == 19 && td_metrics_itl_buckets[0] == 0.01 && td_metrics_itl_buckets[18] == 80.0, "itl buckets");
    CHECK(td_metrics_e2e_nbuckets == 21 && td_metrics_e2e_buckets[0] == 0.3 && td_metrics_e2e_buckets[20] == 7680.0, "e2e buckets");

    td_srv_metrics *m = td_srv_metrics_create();
    double ttfts[] = {0.0005, 0.001, 0.003, 0.5, 3000.0};
    double itl[] = {0.02, 0.02, 0.3};
    for (int i = 0; i < 5; i++) td_srv_metrics_request(m, 10, i == 0 ? 4 : 1, ttfts[i], 1.2, i == 0 ? itl : NULL, i == 0 ? 3 : 0, 0.05);
    td_srv_metrics_request(m, 3, 0, -1, 0.1, NULL, 0, -1);  // no token came: no TTFT sample
    td_srv_metrics_finish(m, TD_FINISH_STOP);
    td_srv_metrics_finish(m, TD_FINISH_LENGTH);
    td_srv_metrics_finish(m, TD_FINISH_LENGTH);
    td_srv_metrics_finish(m, TD_FINISH_ABORT);
    td_engine_stats st = {.num_running = 3, .num_waiting = 2, .kv_cache_usage = 0.25, .prefix_cache_queries = 100,
                          .prefix_cache_hits = 40, .num_aborted = 1};
    td_srv_buf b;
    td_srv_buf_init(&b, 0);
    CHECK(td_srv_metrics_render(m, "my\"model\\x", &st, &b), "render");
    const char *t = b.p;
    // Every line well formed.
    int bad = 0, lines = 0;
    for (const char *l = t; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        if (!valid_line(l, len)) {
            if (bad++ < 3) fprintf(stderr, "bad line: %.*s\n", (int)len, l);
        }
        lines++;
        l = nl ? nl + 1 : l + len;
    }
    CHECK(bad == 0 && lines > 100, "%d malformed of %d lines", bad, lines);
    CHECK(b.len > 0 && t[b.len - 1] == '\n', "ends with a newline");
#define LAB "model_name=\"my\\\"model\\\\x\""
    CHECK(sample(t, "vllm:num_requests_running{" LAB "}") == 3, "running");
    CHECK(sample(t, "vllm:num_requests_waiting{" LAB "}") == 2, "waiting");
    CHECK(sample(t, "vllm:kv_cache_usage_perc{" LAB "}") == 0.25, "kv usage");
    CHECK(sample(t, "vllm:gpu_cache_usage_perc{" LAB "}") == 0.25, "older kv usage name");
    CHECK(sample(t, "vllm:prefix_cache_queries_total{" LAB "}") == 100 && sample(t, "vllm:prefix_cache_hits_total{" LAB "}") == 40, "prefix cache");
    CHECK(sample(t, "vllm:prompt_tokens_total{" LAB "}") == 53, "prompt tokens");
    CHECK(sample(t, "vllm:generation_tokens_total{" LAB "}") == 8, "generation tokens");
    CHECK(sample(t, "vllm:request_success_total{finished_reason=\"stop\"," LAB "}") == 1 &&
              sample(t, "vllm:request_success_total{finished_reason=\"length\"," LAB "}") == 2 &&
              sample(t, "vllm:request_success_total{finished_reason=\"abort\"," LAB "}") == 1,
          "success by reason");
    // TTFT: cumulative counts computed here from the observed values.
    for (int i = 0; i < td_metrics_ttft_nbuckets; i++) {
        int want = 0;
        for (int k = 0; k < 5; k++) want += ttfts[k] <= td_metrics_ttft_buckets[i];
        char key[256];
        snprintf(key, sizeof key, "vllm:time_to_first_token_seconds_bucket{le=\"%g\"," LAB "}", td_metrics_ttft_buckets[i]);
        CHECK(sample(t, key) == want, "%s = %g, want %d", key, sample(t, key), want);
    }
    CHECK(sample(t, "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\"," LAB "}") == 5 &&
              sample(t, "vllm:time_to_first_token_seconds_count{" LAB "}") == 5,
          "ttft +Inf and count");
    CHECK_NEAR(sample(t, "vllm:time_to_first_token_seconds_sum{" LAB "}"), 3000.5045, 1e-6, "ttft sum");
    CHECK(sample(t, "vllm:inter_token_latency_seconds_bucket{le=\"0.025\"," LAB "}") == 2 &&
              sample(t, "vllm:inter_token_latency_seconds_bucket{le=\"0.3\"," LAB "}") == 3 &&
              sample(t, "vllm:inter_token_latency_seconds_count{" LAB "}") == 3,
          "itl");
    CHECK(sample(t, "vllm:time_per_output_token_seconds_count{" LAB "}") == 3, "older tpot name (per gap)");
    CHECK(sample(t, "vllm:request_time_per_output_token_seconds_count{" LAB "}") == 1, "per-request tpot only with > 1 tokens");
    CHECK(sample(t, "vllm:e2e_request_latency_seconds_bucket{le=\"1\"," LAB "}") == 1 &&
              sample(t, "vllm:e2e_request_latency_seconds_bucket{le=\"1.5\"," LAB "}") == 6 &&
              sample(t, "vllm:e2e_request_latency_seconds_count{" LAB "}") == 6,
          "e2e");
    CHECK(strstr(t, "# TYPE vllm:e2e_request_latency_seconds histogram\n") && strstr(t, "# TYPE vllm:prompt_tokens_total counter\n") &&
              strstr(t, "# TYPE vllm:num_requests_running gauge\n"),
          "TYPE lines");
    td_srv_buf_free(&b);
    td_srv_metrics_free(m);
    TEST_DONE();
}
