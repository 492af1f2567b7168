// Prometheus metrics of the server under vLLM's names and meanings (histograms with vLLM's bucket
// boundaries, counters, and gauges read from the engine's stats at scrape time), rendered in the
// Prometheus text format 0.0.4. Thread-safe (one mutex; updates are a few adds).
#ifndef TD_SERVER_METRICS_H
#define TD_SERVER_METRICS_H

#include <stdint.h>
#include "engine/serve_api.h"
#include "server/srv_mem.h"
#include "server/openai.h"

typedef struct td_srv_metrics td_srv_metrics;

td_srv_metrics *td_srv_metrics_create(void);
void td_srv_metrics_free(td_srv_metrics *m);

// One finished request (per choice for finish counts). Times in seconds; ttft < 0: no token came.
// itl[n_itl]: each gap between consecutive output tokens. tpot: (last - first token) / (tokens - 1).
void td_srv_metrics_request(td_srv_metrics *m, int prompt_tokens, int generation_tokens, double ttft,
                            double e2e, const double *itl, int n_itl, double tpot);
// One embeddings request answered: its inputs and their tokens.
void td_srv_metrics_embeddings(td_srv_metrics *m, int n_inputs, int prompt_tokens);
void td_srv_metrics_finish(td_srv_metrics *m, td_finish_reason reason);
void td_srv_metrics_http(td_srv_metrics *m, int status);  // one response sent with this status

// A label value escaped for the text format (backslash, double quote, newline) into out[cap].
void td_srv_metrics_label(const char *s, char *out, size_t cap);

// Renders all metrics with label model_name="<model>" (escaped) and gauges from *stats.
bool td_srv_metrics_render(td_srv_metrics *m, const char *model, const td_engine_stats *stats, td_srv_buf *out);

// Exposed for tests: vLLM's bucket upper bounds (seconds), without +Inf.
extern const double td_metrics_ttft_buckets[];
extern const int td_metrics_ttft_nbuckets;
extern const double td_metrics_itl_buckets[];
extern const int td_metrics_itl_nbuckets;
extern const double td_metrics_e2e_buckets[];
extern const int td_metrics_e2e_nbuckets;

#endif
