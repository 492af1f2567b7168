// Serving metrics of a run with the definitions of `vllm bench serve` (calculate_metrics):
// per completed request TTFT, E2EL, TPOT = (E2EL - TTFT) / (output tokens - 1) when more than one
// output token, all ITL gaps pooled; throughputs over the run's duration; goodput against SLOs;
// peak 1-second output rate and peak overlap. Pure computation over a td_lg_run.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "loadgen/lg_stats.h"
#include "loadgen/loadgen.h"

void td_lg_metrics_free(td_lg_metrics *m) {
    if (!m) return;
    free(m->output_lens);
    m->output_lens = NULL;
}

// Summary in milliseconds of x (seconds); sorts x.
static void summarize(double *x, size_t n, const double *pcts, int n_pct, td_lg_summary *s) {
    td_lg_sort(x, n);
    s->mean = td_lg_mean(x, n) * 1000.0;
    s->std = td_lg_std(x, n) * 1000.0;
    s->median = td_lg_percentile_sorted(x, n, 50.0) * 1000.0;
    for (int k = 0; k < n_pct; k++) s->pct[k] = td_lg_percentile_sorted(x, n, pcts[k]) * 1000.0;
}

typedef struct {
    double t;
    int d;  // +1 start, -1 end
} edge;

static int cmp_edge(const void *a, const void *b) {
    const edge *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    return x->d - y->d;  // ends before starts at the same instant: intervals are [start, end)
}

td_status td_lg_metrics_compute(const td_lg_run *run, const td_lg_slo *slo, const double *pcts, int n_pct,
                                td_lg_metrics *m, td_err *err) {
    memset(m, 0, sizeof *m);
    if (n_pct < 0 || n_pct > TD_LG_MAX_PCT)
        return td_err_set(err, TD_ERR_INVALID, "at most %d percentiles", TD_LG_MAX_PCT);
    for (int k = 0; k < n_pct; k++) {
        if (!(pcts[k] >= 0 && pcts[k] <= 100))
            return td_err_set(err, TD_ERR_INVALID, "percentile %g outside [0, 100]", pcts[k]);
        m->pcts[k] = pcts[k];
    }
    m->n_pct = n_pct;
    int n = run->n;
    size_t n_itl = 0;
    for (int i = 0; i < n; i++)
        if (run->res[i].success) n_itl += (size_t)run->res[i].n_itl;
    m->output_lens = calloc((size_t)n + 1, sizeof *m->output_lens);
    double *buf = malloc(((size_t)n * 4 + n_itl + 1) * sizeof *buf);
    edge *edges = malloc(((size_t)n * 2 + 1) * sizeof *edges);
    if (!m->output_lens || !buf || !edges) {
        free(buf);
        free(edges);
        td_lg_metrics_free(m);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    double *ttfts = buf, *tpots = buf + n, *all_tpots = buf + 2 * n, *e2els = buf + 3 * n, *itls = buf + 4 * n;
    size_t nt = 0, ntp = 0, ni = 0;
    m->n = n;
    m->duration = run->duration;
    for (int i = 0; i < n; i++) {
        const td_lg_result *r = &run->res[i];
        if (!r->success) {
            m->failed++;
            continue;
        }
        int out = td_lg_result_output_tokens(r);
        m->output_lens[i] = out;
        m->total_output += out;
        m->total_input += r->prompt_len;
        double tpot = 0.0;  // vLLM: 0 for goodput when a single token
        if (out > 1) {
            tpot = (r->latency - r->ttft) / (double)(out - 1);
            tpots[ntp++] = tpot;
        }
        all_tpots[nt] = tpot;
        ttfts[nt] = r->ttft;
        e2els[nt] = r->latency;
        nt++;
        for (int k = 0; k < r->n_itl; k++) itls[ni++] = r->itl[k];
        m->completed++;
    }
    double dur = run->duration > 0 ? run->duration : 1e-9;
    m->request_throughput = m->completed / dur;
    m->output_throughput = (double)m->total_output / dur;
    m->total_token_throughput = (double)(m->total_input + m->total_output) / dur;
    if (slo && (slo->ttft >= 0 || slo->tpot >= 0 || slo->e2el >= 0)) {
        m->has_goodput = 1;
        int good = 0;
        for (size_t j = 0; j < nt; j++) {
            int ok = 1;
            if (slo->ttft >= 0 && !(slo->ttft / 1000.0 >= ttfts[j])) ok = 0;
            if (slo->tpot >= 0 && !(slo->tpot / 1000.0 >= all_tpots[j])) ok = 0;
            if (slo->e2el >= 0 && !(slo->e2el / 1000.0 >= e2els[j])) ok = 0;
            good += ok;
        }
        m->request_goodput = good / dur;
    }

    // Peak output tokens in a 1 s bucket and peak overlap of successful requests.
    if (m->completed > 0) {
        double t_min = INFINITY, t_max = -INFINITY;
        for (int i = 0; i < n; i++) {
            const td_lg_result *r = &run->res[i];
            if (!r->success) continue;
            if (r->start < t_min) t_min = r->start;
            if (r->start + r->latency > t_max) t_max = r->start + r->latency;
        }
        double span = t_max - t_min;
        long nb = span >= 0 && span < 1e8 ? (long)ceil(span) + 1 : 1;  // 1 s buckets
        double *bucket = calloc((size_t)nb, sizeof *bucket);
        if (bucket) {
            for (int i = 0; i < n; i++) {
                const td_lg_result *r = &run->res[i];
                if (!r->success) continue;
                double t = r->start + r->ttft;
                for (int k = -1; k < r->n_itl; k++) {
                    if (k >= 0) t += r->itl[k];
                    long b = (long)(t - t_min);
                    if (b >= 0 && b < nb) bucket[b] += 1;
                }
            }
            for (long b = 0; b < nb; b++)
                if (bucket[b] > m->max_output_tokens_per_s) m->max_output_tokens_per_s = bucket[b];
            free(bucket);
        }
        size_t ne = 0;
        for (int i = 0; i < n; i++) {
            const td_lg_result *r = &run->res[i];
            if (!r->success) continue;
            edges[ne++] = (edge){r->start, +1};
            edges[ne++] = (edge){r->start + r->latency, -1};
        }
        qsort(edges, ne, sizeof *edges, cmp_edge);
        int cur = 0;
        for (size_t k = 0; k < ne; k++) {
            cur += edges[k].d;
            if (cur > m->max_concurrent_requests) m->max_concurrent_requests = cur;
        }
    }

    summarize(ttfts, nt, m->pcts, n_pct, &m->ttft);
    summarize(tpots, ntp, m->pcts, n_pct, &m->tpot);
    summarize(itls, ni, m->pcts, n_pct, &m->itl);
    summarize(e2els, nt, m->pcts, n_pct, &m->e2el);
    free(buf);
    free(edges);
    return TD_OK;
}
