// Sampling: bias, penalties, temperature, top-k / top-p / min-p, and a seeded draw.
#define _GNU_SOURCE  // qsort_r
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct td_sampler {
    int vocab;
    int32_t *idx;     // [vocab] candidate ids, sorted by logit when filtering
    float *prob;      // [vocab] candidate probabilities (aligned with idx)
    int32_t *count;   // [vocab] occurrences in output (kept all-zero between calls)
    uint8_t *seen;    // [vocab] present in prompt or output (kept all-zero between calls)
    uint32_t *rkey, *rkey2;  // [vocab] radix-sort scratch (whole-vocabulary sorts)
    int32_t *ridx2;          // [vocab]
    float *work;             // [vocab] td_sampler_logprob's processed logits (its input stays intact)
    int last_n;              // td_sampler_logprob's kept set: idx[0..last_n) over work, descending;
    double last_lse;         //   logsumexp of work over it (td_sampler_logprob_topk reads both)
};

td_sampling_params td_sampling_default_params(void) {
    td_sampling_params p = {0};
    p.temperature = 1.0f;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.repetition_penalty = 1.0f;
    return p;
}

td_status td_sampling_params_check(const td_sampling_params *p, int vocab, td_err *err) {
    if (!(p->temperature >= 0 && p->temperature <= 100))
        return td_err_set(err, TD_ERR_INVALID, "temperature must be in [0, 100], got %g", p->temperature);
    if (!(p->top_p > 0 && p->top_p <= 1))
        return td_err_set(err, TD_ERR_INVALID, "top_p must be in (0, 1], got %g", p->top_p);
    if (!(p->min_p >= 0 && p->min_p <= 1))
        return td_err_set(err, TD_ERR_INVALID, "min_p must be in [0, 1], got %g", p->min_p);
    if (p->top_k < -1) return td_err_set(err, TD_ERR_INVALID, "top_k must be -1, 0 or positive, got %d", p->top_k);
    if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 100))
        return td_err_set(err, TD_ERR_INVALID, "repetition_penalty must be in (0, 100], got %g", p->repetition_penalty);
    if (!(p->presence_penalty >= -2 && p->presence_penalty <= 2))
        return td_err_set(err, TD_ERR_INVALID, "presence_penalty must be in [-2, 2], got %g", p->presence_penalty);
    if (!(p->frequency_penalty >= -2 && p->frequency_penalty <= 2))
        return td_err_set(err, TD_ERR_INVALID, "frequency_penalty must be in [-2, 2], got %g", p->frequency_penalty);
    for (int i = 0; i < p->n_logit_bias; i++) {
        if (p->logit_bias[i].token < 0 || p->logit_bias[i].token >= vocab)
            return td_err_set(err, TD_ERR_INVALID, "logit_bias token %d is outside the vocabulary (size %d)",
                              p->logit_bias[i].token, vocab);
        if (!(p->logit_bias[i].bias >= -100 && p->logit_bias[i].bias <= 100))
            return td_err_set(err, TD_ERR_INVALID, "logit_bias value for token %d must be in [-100, 100]",
                              p->logit_bias[i].token);
    }
    return TD_OK;
}

td_sampler *td_sampler_create(int vocab) {
    if (vocab <= 0) return NULL;
    td_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->vocab = vocab;
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->prob = malloc((size_t)vocab * sizeof *s->prob);
    s->count = calloc((size_t)vocab, sizeof *s->count);
    s->seen = calloc((size_t)vocab, 1);
    s->rkey = malloc((size_t)vocab * sizeof *s->rkey);
    s->rkey2 = malloc((size_t)vocab * sizeof *s->rkey2);
    s->ridx2 = malloc((size_t)vocab * sizeof *s->ridx2);
    s->work = malloc((size_t)vocab * sizeof *s->work);
    if (!s->idx || !s->prob || !s->count || !s->seen || !s->rkey || !s->rkey2 || !s->ridx2 || !s->work) {
        td_sampler_free(s);
        return NULL;
    }
    return s;
}

void td_sampler_free(td_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->prob);
    free(s->count);
    free(s->seen);
    free(s->rkey);
    free(s->rkey2);
    free(s->ridx2);
    free(s->work);
    free(s);
}

static inline int valid_tok(const td_sampler *s, int32_t t) { return t >= 0 && t < s->vocab; }

// Bias, penalties and temperature, in place. factor (may be NULL): [vocab] of ones on entry; gets the
// repetition penalty's derivative (1/pen or pen) for each penalised token.
static void process_logits(td_sampler *s, const td_sampling_params *p, float *logits,
                           const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                           float *factor) {
    if (p->allow) {
        const int words = (s->vocab + 31) / 32;
        for (int w = 0; w < words; w++) {
            uint32_t m = p->allow[w];
            if (m == 0xFFFFFFFFu) continue;
            const int base = w * 32, lim = base + 32 < s->vocab ? 32 : s->vocab - base;
            if (m == 0) {  // the common word under a grammar: a plain (vectorised) fill
                for (int b = 0; b < lim; b++) logits[base + b] = -INFINITY;
                continue;
            }
            for (int b = 0; b < lim; b++)
                if (!(m >> b & 1)) logits[base + b] = -INFINITY;
        }
    }
    for (int i = 0; i < p->n_logit_bias; i++)
        if (valid_tok(s, p->logit_bias[i].token)) logits[p->logit_bias[i].token] += p->logit_bias[i].bias;

    bool rep = p->repetition_penalty != 1.0f;
    bool pres = p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
    if (rep || pres) {
        for (int i = 0; i < n_output; i++)
            if (valid_tok(s, output[i])) s->count[output[i]]++, s->seen[output[i]] = 1;
        if (rep)
            for (int i = 0; i < n_prompt; i++)
                if (valid_tok(s, prompt[i])) s->seen[prompt[i]] = 1;
        // Apply once per distinct token, then clear the scratch back to zeros.
        for (int pass = 0; pass < 2; pass++) {
            const int32_t *toks = pass ? output : prompt;
            int n = pass ? n_output : n_prompt;
            for (int i = 0; i < n; i++) {
                int32_t t = toks[i];
                if (!valid_tok(s, t) || !s->seen[t]) continue;
                if (rep) {
                    float pen = p->repetition_penalty;
                    if (factor) factor[t] = logits[t] > 0 ? 1.0f / pen : pen;
                    logits[t] = logits[t] > 0 ? logits[t] / pen : logits[t] * pen;
                }
                if (pres && s->count[t] > 0)
                    logits[t] -= p->presence_penalty + p->frequency_penalty * (float)s->count[t];
                s->seen[t] = 0;
                s->count[t] = 0;
            }
        }
    }
    if (p->temperature > 0 && p->temperature != 1.0f) {
        float inv = 1.0f / p->temperature;
        for (int i = 0; i < s->vocab; i++) logits[i] *= inv;
    }
}

// Orders candidate ids by descending logit, ties by ascending id (qsort_r context: logits).
static int cmp_desc(const void *a, const void *b, void *ctx) {
    const float *l = ctx;
    float x = l[*(const int32_t *)a], y = l[*(const int32_t *)b];
    if (x > y) return -1;
    if (x < y) return 1;
    return *(const int32_t *)a < *(const int32_t *)b ? -1 : 1;
}

// Sorts idx[0..n) (ascending ids on entry) by descending logit, ties by ascending id - the order
// of cmp_desc - in three stable LSD radix passes over the logits' bits (-0 counted as +0, as the
// comparison does): a whole vocabulary (150k ids) in ~1 ms where qsort took ~20 ms per token.
static void radix_desc(const td_sampler *s, const float *logits, int32_t *idx, int n) {
    uint32_t *k = s->rkey, *k2 = s->rkey2;
    int32_t *src = idx, *dst = s->ridx2;
    for (int i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, &logits[idx[i]], sizeof b);
        if (b == 0x80000000u) b = 0;
        k[i] = ~((b & 0x80000000u) ? ~b : (b | 0x80000000u));  // ascending key, inverted
    }
    for (int shift = 0; shift < 32; shift += 11) {
        uint32_t cnt[2048] = {0};
        for (int i = 0; i < n; i++) cnt[(k[i] >> shift) & 2047]++;
        for (uint32_t d = 0, sum = 0; d < 2048; d++) {
            const uint32_t c = cnt[d];
            cnt[d] = sum, sum += c;
        }
        for (int i = 0; i < n; i++) {
            const uint32_t d = cnt[(k[i] >> shift) & 2047]++;
            k2[d] = k[i], dst[d] = src[i];
        }
        uint32_t *tk = k;
        k = k2, k2 = tk;
        int32_t *ti = src;
        src = dst, dst = ti;
    }
    if (src != idx) memcpy(idx, src, (size_t)n * sizeof *idx);
}

// Selects the n largest of idx[0..m) (by logit) to the front, sorted descending. Uses a
// quickselect partition then sorts the front, so top-k costs O(vocab + k log k); a whole
// vocabulary (no top-k) is radix-sorted.
static void sort_candidates(const td_sampler *s, const float *logits, int32_t *idx, int m, int n) {
    if (n == m && n >= 4096) {
        radix_desc(s, logits, idx, n);
        return;
    }
    if (n < m) {
        int lo = 0, hi = m - 1;
        while (lo < hi) {
            float pivot = logits[idx[(lo + hi) / 2]];
            int i = lo, j = hi;
            while (i <= j) {
                while (logits[idx[i]] > pivot) i++;
                while (logits[idx[j]] < pivot) j--;
                if (i <= j) {
                    int32_t t = idx[i];
                    idx[i] = idx[j];
                    idx[j] = t;
                    i++, j--;
                }
            }
            if (n - 1 <= j) hi = j;
            else if (n - 1 >= i) lo = i;
            else break;
        }
    }
    qsort_r(idx, (size_t)n, sizeof *idx, cmp_desc, (void *)logits);
}

// Fills s->idx[0..n) and s->prob[0..n) with the surviving candidates (descending), normalised.
static int filter(td_sampler *s, const td_sampling_params *p, const float *logits) {
    int V = s->vocab;
    for (int i = 0; i < V; i++) s->idx[i] = i;
    int n = V;
    if (p->top_k > 0 && p->top_k < V) n = p->top_k;
    sort_candidates(s, logits, s->idx, V, n);
    while (n > 1 && logits[s->idx[n - 1]] == -INFINITY) n--;  // masked tokens never enter the kept set
    float maxl = logits[s->idx[0]];
    double sum = 0;
    for (int i = 0; i < n; i++) sum += (s->prob[i] = expf(logits[s->idx[i]] - maxl));
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    if (p->top_p < 1.0f) {
        // Keep the smallest prefix whose mass reaches top_p (vLLM/HF: drop tokens whose
        // cumulative mass from the bottom is <= 1 - top_p; always keep the top one).
        double cum = 0;
        int keep = n;
        for (int i = n - 1; i > 0; i--) {
            cum += s->prob[i];
            if (cum <= 1.0 - p->top_p) keep = i;
            else break;
        }
        n = keep;
    }
    if (p->min_p > 0) {
        float thr = p->min_p * s->prob[0];
        int keep = 1;
        while (keep < n && s->prob[keep] >= thr) keep++;
        n = keep;
    }
    sum = 0;
    for (int i = 0; i < n; i++) sum += s->prob[i];
    for (int i = 0; i < n; i++) s->prob[i] = (float)(s->prob[i] / sum);
    return n;
}

static int32_t argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// The set td_sampler_sample draws from at temperature > 0, in s->idx[0..n) (descending, ties by
// ascending id) with s->prob its renormalised probabilities. top_k == 1 is the argmax alone (the
// sampler's shortcut: lowest id among ties), everything else the filters.
static int kept_set(td_sampler *s, const td_sampling_params *p, const float *logits) {
    if (p->top_k == 1) {
        s->idx[0] = argmax(logits, s->vocab);
        s->prob[0] = 1.0f;
        return 1;
    }
    return filter(s, p, logits);
}

int32_t td_sampler_sample(td_sampler *s, const td_sampling_params *p, float *logits,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          td_rng *rng) {
    process_logits(s, p, logits, prompt, n_prompt, output, n_output, NULL);
    if (p->temperature <= 0 || p->top_k == 1) return argmax(logits, s->vocab);
    int n = kept_set(s, p, logits);
    double u = td_rng_uniform(rng), acc = 0;
    for (int i = 0; i < n; i++) {
        acc += s->prob[i];
        if (u < acc) return s->idx[i];
    }
    return s->idx[n - 1];  // rounding left u >= acc
}

void td_sampler_probs(td_sampler *s, const td_sampling_params *p, float *logits,
                      const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                      float *probs) {
    process_logits(s, p, logits, prompt, n_prompt, output, n_output, NULL);
    memset(probs, 0, (size_t)s->vocab * sizeof *probs);
    if (p->temperature <= 0 || p->top_k == 1) {
        probs[argmax(logits, s->vocab)] = 1.0f;
        return;
    }
    int n = kept_set(s, p, logits);
    for (int i = 0; i < n; i++) probs[s->idx[i]] = s->prob[i];
}

double td_sampler_logprob(td_sampler *s, const td_sampling_params *p, const float *logits,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          int32_t token, float *dlogits) {
    const int V = s->vocab;
    float *z = s->work;
    memcpy(z, logits, (size_t)V * sizeof *z);
    if (dlogits)
        for (int i = 0; i < V; i++) dlogits[i] = 1.0f;
    // temperature 0 scales nothing in process_logits: greedy is processed as temperature 1.
    process_logits(s, p, z, prompt, n_prompt, output, n_output, dlogits);
    const int n = kept_set(s, p, z);
    const double m = z[s->idx[0]];  // the kept set's maximum
    double sum = 0;
    bool in = false;
    for (int i = 0; i < n; i++) {
        sum += exp((double)z[s->idx[i]] - m);
        in |= s->idx[i] == token;
    }
    const double lse = m + log(sum);
    s->last_n = n;
    s->last_lse = lse;
    if (dlogits) {
        // d/dz'_i [z'_t - lse] = onehot_i - prob_i on the kept set (locally constant), 0 outside;
        // times dz'_i/dlogit_i = (1/temperature) * the penalty factor process_logits left there.
        const float inv_t = p->temperature > 0 && p->temperature != 1.0f ? 1.0f / p->temperature : 1.0f;
        for (int i = 0; i < n; i++) {
            const int32_t t = s->idx[i];
            const double pr = exp((double)z[t] - lse);
            s->prob[i] = (float)((double)dlogits[t] * inv_t * ((t == token ? 1.0 : 0.0) - pr));
        }
        memset(dlogits, 0, (size_t)V * sizeof *dlogits);
        if (in)
            for (int i = 0; i < n; i++) dlogits[s->idx[i]] = s->prob[i];
    }
    if (!valid_tok(s, token) || !in) return -INFINITY;
    return (double)z[token] - lse;
}

int td_sampler_logprob_topk(const td_sampler *s, int k, int32_t *ids, float *lps) {
    int n = k < s->last_n ? k : s->last_n;
    for (int i = 0; i < n; i++) {
        ids[i] = s->idx[i];
        lps[i] = (float)((double)s->work[s->idx[i]] - s->last_lse);
    }
    return n;
}

double td_logsumexp(const float *logits, int vocab) {
    float m = -INFINITY;
    for (int i = 0; i < vocab; i++) m = logits[i] > m ? logits[i] : m;
    double sum = 0;
    for (int i = 0; i < vocab; i++) sum += exp((double)logits[i] - m);
    return m + log(sum);
}

void td_logprobs_topk(const float *logits, int vocab, double lse, int k, int32_t *ids, float *lps) {
    // Insertion into a small sorted array: k is small (OpenAI caps top_logprobs at 20).
    int n = 0;
    for (int i = 0; i < vocab; i++) {
        float v = logits[i];
        if (n == k && v <= logits[ids[n - 1]]) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && logits[ids[j - 1]] < v) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int i = 0; i < n; i++) lps[i] = (float)((double)logits[ids[i]] - lse);
}
