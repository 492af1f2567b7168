// The load generator behind `tandem bench serve`: drives any OpenAI-compatible server with
// streamed completions from one epoll event loop (no thread per request) and computes the serving
// metrics of `vllm bench serve` (TTFT, TPOT, ITL, E2EL, throughput, goodput) with its definitions.
// Transfers go through libcurl's multi interface (http and https, keep-alive). It is a client
// only: no tokenizer (input lengths come from token-id prompts or from the server's usage report).
#ifndef TD_LOADGEN_LOADGEN_H
#define TD_LOADGEN_LOADGEN_H

#include <stdint.h>
#include <stdio.h>

#include "base/status.h"

typedef struct cJSON cJSON;

// ---- parameters ------------------------------------------------------------------------------

typedef struct td_lg_params {
    const char *base_url;    // "http://127.0.0.1:8000" or https://... (an optional path prefix is kept)
    const char *endpoint;    // "/v1/completions" or "/v1/chat/completions"
    const char *model;       // NULL: the first id from GET /v1/models
    int num_prompts;         // requests in the run
    int input_len;           // tokens: mean prompt length (--random-input-len)
    int output_len;          // tokens: mean max_tokens (--random-output-len)
    double range_ratio;      // lengths uniform in [floor(L(1-r)), ceil(L(1+r))]; 0 = fixed
    int vocab_size;          // prompt token ids are uniform in [vocab_offset, vocab_offset+vocab_size)
    int vocab_offset;        // ids below this (special/byte tokens in common vocabularies) are avoided
    int prefix_len;          // tokens of one random prefix every prompt starts with, before its own
                             // input_len tokens (--random-prefix-len, as vLLM); completions only
    int max_concurrency;     // requests in flight at most; 0 = no cap
    double request_rate;     // requests/s; INFINITY = all at time 0
    double burstiness;       // gamma shape of inter-arrival gaps; 1 = Poisson
    int ignore_eos;          // send "ignore_eos": true
    uint64_t seed;           // lengths, prompt ids and arrivals
    double timeout_s;        // seconds per request (connect to last byte); <= 0: none
    int keep_alive;          // reuse connections between requests (HTTP/1.1 keep-alive)
    const char *api_key;     // sent as "Authorization: Bearer KEY" (also on GET /v1/models); NULL or
                             // "": none (the command line defaults it to $OPENAI_API_KEY, as vLLM)
    const char *const *headers;  // n_headers extra "Name: value" lines on every request (borrowed)
    int n_headers;
    const char *cacert;      // https: PEM file of trusted CA certificates; NULL: the system store
    int insecure;            // https: do not verify the server's certificate
    double temperature;      // NAN: not sent
    const char *extra_body;  // JSON object whose members are added to every request body, or NULL
    int num_warmups;         // requests sent (and discarded) before the timed run
    int require_text;        // count a chunk as a token only when its text / delta.content is
                             // non-empty (older vLLM); default 0: any chunk with choices (vLLM now)
} td_lg_params;

td_lg_params td_lg_default_params(void);

// ---- requests and their outcome --------------------------------------------------------------

// One prepared request: the JSON body is built before the run so that the timed loop only hands
// bytes to libcurl. Owned by a td_lg_workload.
typedef struct td_lg_request {
    char *body;          // the JSON request body, NUL-terminated
    size_t body_len;     // bytes
    int prompt_len;      // tokens (exact for token-id prompts; words for chat text)
    int max_tokens;      // tokens requested
} td_lg_request;

typedef struct td_lg_workload {
    td_lg_request *reqs;
    int n;
    char *url;           // base URL + endpoint, the same for every request (owned)
} td_lg_workload;

// Builds n requests from the random dataset (p->num_prompts of them) for `model`. The caller frees
// with td_lg_workload_free (also safe after a failed build).
td_status td_lg_workload_build(const td_lg_params *p, const char *model, td_lg_workload *w, td_err *err);
void td_lg_workload_free(td_lg_workload *w);

// What happened to one request; times in seconds on CLOCK_MONOTONIC.
typedef struct td_lg_result {
    int success;         // HTTP 200 and at least one token-carrying chunk, no error
    int prompt_len;      // tokens: usage.prompt_tokens when reported, else the request's
    int usage_tokens;    // usage.completion_tokens (0 when not reported)
    int chunks;          // token-carrying chunks received (choices non-empty)
    double start;        // when the request was handed to libcurl (before connecting or reuse)
    double queued;       // when it arrived (its scheduled time); start - queued = client queueing
    double ttft;         // first token-carrying chunk - start
    double latency;      // last token-carrying chunk - start (E2EL)
    double *itl;         // gaps between consecutive token-carrying chunks, n_itl of them (owned)
    int n_itl, cap_itl;
    int http_status;     // 0 when no response arrived
    char error[200];     // "" on success
} td_lg_result;

// Output tokens of a request as the metrics count them: usage when reported, else chunks.
static inline int td_lg_result_output_tokens(const td_lg_result *r) {
    return r->usage_tokens > 0 ? r->usage_tokens : r->chunks;
}

typedef struct td_lg_run {
    td_lg_result *res;      // one per request, in request order (owned)
    int n;
    double duration;        // seconds from the first dispatch to the last completion
    int max_in_flight;      // the most requests the client had in flight at once
    int connections_opened; // TCP connections opened (fewer than requests with keep-alive; libcurl's
                            // CURLINFO_NUM_CONNECTS summed over the requests)
} td_lg_run;

// Runs the workload against the server: arrivals, concurrency cap, per-request timeout. Request
// failures (refused connection, non-200, malformed stream, timeout) are recorded per request;
// the call itself fails only for setup problems (bad URL or header, out of memory, libcurl).
td_status td_lg_run_workload(const td_lg_params *p, const td_lg_workload *w, td_lg_run *out, td_err *err);
void td_lg_run_free(td_lg_run *r);

// ---- metrics ---------------------------------------------------------------------------------

#define TD_LG_MAX_PCT 8

typedef struct td_lg_summary {  // milliseconds
    double mean, median, std;
    double pct[TD_LG_MAX_PCT];  // at td_lg_metrics.pcts
} td_lg_summary;

typedef struct td_lg_slo {  // goodput service-level objectives, milliseconds; < 0 = not set
    double ttft, tpot, e2el;
} td_lg_slo;

typedef struct td_lg_metrics {
    int completed, failed;
    long long total_input, total_output;  // tokens (completed requests)
    double duration;                      // s
    double request_throughput;            // completed / s
    double request_goodput;               // completed within every SLO / s (0 when none set)
    int has_goodput;
    double output_throughput;             // output tokens / s
    double total_token_throughput;        // (input + output) tokens / s
    double max_output_tokens_per_s;       // the busiest 1 s bucket of token arrivals
    int max_concurrent_requests;          // peak overlap of successful requests
    int n_pct;
    double pcts[TD_LG_MAX_PCT];           // percentiles reported, e.g. {99}
    td_lg_summary ttft, tpot, itl, e2el;
    int *output_lens;                     // per request, 0 when failed (owned)
    int n;
} td_lg_metrics;

// Computes the metrics of a run exactly as `vllm bench serve` defines them. slo may be NULL.
td_status td_lg_metrics_compute(const td_lg_run *run, const td_lg_slo *slo, const double *pcts, int n_pct,
                                td_lg_metrics *m, td_err *err);
void td_lg_metrics_free(td_lg_metrics *m);

// ---- report ----------------------------------------------------------------------------------

enum { TD_LG_METRIC_TTFT = 1, TD_LG_METRIC_TPOT = 2, TD_LG_METRIC_ITL = 4, TD_LG_METRIC_E2EL = 8 };

// The "Serving Benchmark Result" table, in the layout of vLLM's; `which` selects the latency
// sections (TD_LG_METRIC_* bits).
void td_lg_report_print(FILE *f, const td_lg_params *p, const td_lg_metrics *m, int which);

// The result object with vLLM's keys (see docs/bench-serve.md). Caller deletes with cJSON_Delete.
cJSON *td_lg_report_json(const td_lg_params *p, const char *model, const td_lg_run *run, const td_lg_metrics *m);

// ---- command line ----------------------------------------------------------------------------

// `tandem bench serve` (argv[0] = "serve"): parses options, runs, prints. Returns the exit status
// (0 ok, 1 runtime error or no request completed, 2 usage error).
int td_lg_bench_main(int argc, char **argv);

#endif
