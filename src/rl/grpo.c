// GRPO: advantages, and the clipped, importance-weighted policy-gradient step (see grpo.h) as a
// loss of its own on the trainer's logits (td_trainer_step_with + td_tmodel_backward_from).
#include "rl/grpo.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct td_grpo {
    td_grpo_params p;
    td_trainer *t;
    td_tmodel *tm, *ref;
    int B, T, V, K, R;       // rows per micro-batch, tokens per row, vocabulary, micro-batches, rows
    td_sampler *smp;
    float *old_lp, *ref_lp;  // [R * T] per sample i at i * T, token j at + j
    float *dl;               // [V] d logprob / d logits of one token
    int32_t *tok;            // [B * T] one micro-batch's input rows
    // the step in progress
    const td_grpo_sample *s;
    int n, epoch;
    double kl_sum, ent_sum, diff_max, diff_sum, is_sum, ratio_dev, loss0;
    long n_trunc, n_clip, n_terms;
};

td_grpo_params td_grpo_default_params(void) {
    td_grpo_params p = {.clip_eps = 0.2f, .clip_eps_high = 0.0f, .kl_coef = 0.0f, .is_cap = 2.0f, .std_norm = 1,
                        .ppo_epochs = 1, .sp = td_sampling_default_params()};
    return p;
}

void td_grpo_advantages(const double *rewards, int n_groups, int G, int std_norm, double *adv) {
    for (int g = 0; g < n_groups; g++) {
        const double *r = rewards + (size_t)g * G;
        double mean = 0.0, var = 0.0;
        for (int i = 0; i < G; i++) mean += r[i];
        mean /= G;
        for (int i = 0; i < G; i++) var += (r[i] - mean) * (r[i] - mean);
        const double sd = G > 1 ? sqrt(var / (G - 1)) : 0.0;  // unbiased, as torch.std in GRPO
        for (int i = 0; i < G; i++) adv[(size_t)g * G + i] = std_norm ? (r[i] - mean) / (sd + 1e-6) : r[i] - mean;
    }
}

void td_grpo_free(td_grpo *g) {
    if (!g) return;
    td_sampler_free(g->smp);
    free(g->old_lp);
    free(g->ref_lp);
    free(g->dl);
    free(g->tok);
    free(g);
}

td_status td_grpo_create(td_trainer *t, td_tmodel *policy, td_tmodel *ref, const td_grpo_params *p,
                         td_grpo **out, td_err *err) {
    *out = NULL;
    if (!t || !policy || !p) return td_err_set(err, TD_ERR_INVALID, "grpo: no trainer or policy");
    if (!(p->clip_eps > 0 && p->clip_eps < 1) || p->clip_eps_high < 0 || !(p->is_cap >= 1) || p->ppo_epochs < 1 ||
        !(p->kl_coef >= 0))
        return td_err_set(err, TD_ERR_INVALID,
                          "grpo: clip_eps must be in (0, 1), clip_eps_high >= 0, is_cap >= 1, ppo_epochs >= 1, "
                          "kl_coef >= 0");
    if (p->kl_coef > 0 && !ref) return td_err_set(err, TD_ERR_INVALID, "grpo: kl_coef > 0 needs a reference model");
    if (p->sp.repetition_penalty != 1.0f || p->sp.presence_penalty != 0.0f || p->sp.frequency_penalty != 0.0f ||
        p->sp.n_logit_bias)
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "grpo: sampling penalties and logit bias are not supported in training (sample with "
                          "temperature, top_k, top_p and min_p only)");
    const td_tmodel_params mp = td_tmodel_get_params(policy);
    td_grpo *g = calloc(1, sizeof *g);
    if (!g) return td_err_set(err, TD_ERR_NOMEM, "grpo: out of memory");
    g->p = *p;
    if (g->p.clip_eps_high <= 0) g->p.clip_eps_high = g->p.clip_eps;
    g->t = t, g->tm = policy, g->ref = p->kl_coef > 0 ? ref : NULL;
    g->B = mp.batch, g->T = mp.seq_len, g->V = td_tmodel_config(policy)->vocab_size;
    g->K = td_trainer_grad_accum(t);
    g->R = g->B * g->K;
    if (g->ref) {
        const td_tmodel_params rp = td_tmodel_get_params(g->ref);
        if (rp.batch != g->B || rp.seq_len != g->T || td_tmodel_config(g->ref)->vocab_size != g->V) {
            td_grpo_free(g);
            return td_err_set(err, TD_ERR_INVALID, "grpo: the reference model's batch, seq_len or vocabulary differ");
        }
    }
    g->smp = td_sampler_create(g->V);
    g->old_lp = malloc((size_t)g->R * g->T * sizeof(float));
    g->ref_lp = malloc((size_t)g->R * g->T * sizeof(float));
    g->dl = malloc((size_t)g->V * sizeof(float));
    g->tok = malloc((size_t)g->B * g->T * sizeof(int32_t));
    if (!g->smp || !g->old_lp || !g->ref_lp || !g->dl || !g->tok) {
        td_grpo_free(g);
        return td_err_set(err, TD_ERR_NOMEM, "grpo: out of memory");
    }
    *out = g;
    return TD_OK;
}

const float *td_grpo_old_logprobs(const td_grpo *g) { return g->old_lp; }

// Micro-batch k's input rows: sample i = k * B + b is row b, prompt ++ completion without its last
// token (position p's logits predict token p + 1); the rest of the row is padding (id 0) whose
// logits take no part.
static void build_rows(td_grpo *g, int k) {
    memset(g->tok, 0, (size_t)g->B * g->T * sizeof(int32_t));
    for (int b = 0; b < g->B; b++) {
        const int i = k * g->B + b;
        if (i >= g->n || g->s[i].n_out == 0) continue;
        const td_grpo_sample *s = &g->s[i];
        int32_t *row = g->tok + (size_t)b * g->T;
        memcpy(row, s->prompt, (size_t)s->n_prompt * sizeof(int32_t));
        memcpy(row + s->n_prompt, s->out, (size_t)(s->n_out - 1) * sizeof(int32_t));
    }
}

// The entropy (nats) of softmax(z * (1 / temperature)), the sampler's scaling.
static double entropy_of(const float *z, int V, float temperature) {
    const float inv = temperature > 0 && temperature != 1.0f ? 1.0f / temperature : 1.0f;
    float m = -INFINITY;
    for (int i = 0; i < V; i++) m = fmaxf(m, z[i] * inv);
    double s = 0.0, sz = 0.0;
    for (int i = 0; i < V; i++) {
        const double x = (double)(z[i] * inv) - m, e = exp(x);
        s += e, sz += e * x;
    }
    return log(s) - sz / s;
}

static td_status micro(void *ctx, int k, td_tmodel *tm, float dscale, double *loss_sum, td_err *err) {
    td_grpo *g = ctx;
    const int T = g->T, V = g->V;
    build_rows(g, k);
    if (g->epoch == 0 && g->ref) {  // the reference's log-probabilities, once per batch
        td_status st = td_tmodel_forward(g->ref, g->tok, NULL, NULL, NULL, err);
        if (st) return st;
        const float *L = td_tmodel_host_logits(g->ref);
        for (int b = 0; b < g->B; b++) {
            const int i = k * g->B + b;
            if (i >= g->n) break;
            const td_grpo_sample *s = &g->s[i];
            for (int j = 0; j < s->n_out; j++) {
                const float *row = L + ((size_t)b * T + s->n_prompt - 1 + j) * V;
                g->ref_lp[(size_t)i * T + j] =
                    (float)td_sampler_logprob(g->smp, &g->p.sp, row, s->prompt, s->n_prompt, s->out, j, s->out[j], NULL);
            }
        }
    }
    td_status st = td_tmodel_forward(tm, g->tok, NULL, NULL, NULL, err);
    if (st) return st;
    float *L = (float *)td_tmodel_host_logits(tm);  // the logits' host view, rewritten as d loss / d logits
    const double lo = 1.0 - g->p.clip_eps, hi = 1.0 + g->p.clip_eps_high;
    double loss = 0.0;
    for (int b = 0; b < g->B; b++) {
        const int i = k * g->B + b;
        const td_grpo_sample *s = i < g->n ? &g->s[i] : NULL;
        const int n_out = s ? s->n_out : 0;
        const int first = n_out ? s->n_prompt - 1 : T;  // the rows predicting completion tokens
        float *rows = L + (size_t)b * T * V;
        if (first > 0) memset(rows, 0, (size_t)(first < T ? first : T) * V * sizeof(float));
        if (first + n_out < T) memset(rows + (size_t)(first + n_out) * V, 0, (size_t)(T - first - n_out) * V * sizeof(float));
        for (int j = 0; j < n_out; j++) {
            float *row = rows + (size_t)(first + j) * V;
            const double lp = td_sampler_logprob(g->smp, &g->p.sp, row, s->prompt, s->n_prompt, s->out, j, s->out[j], g->dl);
            const float lpf = (float)lp;
            float *old = &g->old_lp[(size_t)i * T + j];
            if (g->epoch == 0) {
                *old = lpf;
                g->ent_sum += entropy_of(row, V, g->p.sp.temperature);
                const double d = fabs((double)lpf - (double)s->behav_lp[j]);
                if (isfinite(d)) {
                    g->diff_sum += d;
                    if (d > g->diff_max) g->diff_max = d;
                } else {
                    g->diff_max = INFINITY;
                }
            }
            if (!isfinite(lp) || !isfinite(*old)) {  // filtered out under this policy: no gradient
                memset(row, 0, (size_t)V * sizeof(float));
                continue;
            }
            const double r = exp((double)lpf - (double)*old);
            const double w_raw = exp((double)*old - (double)s->behav_lp[j]);
            const double w = w_raw < g->p.is_cap ? w_raw : g->p.is_cap;
            const double A = s->adv;
            const double rc = r < lo ? lo : r > hi ? hi : r;
            const bool clipped = rc * A < r * A;
            double lt = -w * (clipped ? rc * A : r * A);
            double glp = clipped ? 0.0 : -w * A * r;  // d L / d lp
            if (g->ref) {
                const double d = (double)g->ref_lp[(size_t)i * T + j] - (double)lpf, e = exp(d);
                lt += g->p.kl_coef * (e - d - 1.0);
                glp += g->p.kl_coef * (1.0 - e);
                if (g->epoch == 0) g->kl_sum += e - d - 1.0;
            }
            if (g->epoch == 0) {
                g->is_sum += w_raw;
                g->n_trunc += w_raw > g->p.is_cap;
            }
            if (fabs(r - 1.0) > g->ratio_dev) g->ratio_dev = fabs(r - 1.0);
            g->n_clip += clipped;
            g->n_terms++;
            loss += lt;
            const float c = (float)(glp * dscale);
            for (int v = 0; v < V; v++) row[v] = c * g->dl[v];
        }
    }
    *loss_sum = loss;
    return td_tmodel_backward_from(tm, L, err);
}

td_status td_grpo_step(td_grpo *g, const td_grpo_sample *s, int n, td_grpo_stats *st, td_err *err) {
    if (!g || (n && !s)) return td_err_set(err, TD_ERR_INVALID, "grpo: no samples");
    if (n > g->R) return td_err_set(err, TD_ERR_INVALID, "grpo: %d samples, the batch holds %d rows", n, g->R);
    long n_tok = 0;
    for (int i = 0; i < n; i++) {
        const td_grpo_sample *x = &s[i];
        if (x->n_out == 0) continue;
        if (x->n_prompt < 1 || x->n_out < 0 || x->n_prompt + x->n_out - 1 > g->T || !x->prompt || !x->out ||
            !x->behav_lp)
            return td_err_set(err, TD_ERR_INVALID,
                              "grpo: sample %d: %d prompt + %d completion tokens do not fit a row of %d", i,
                              x->n_prompt, x->n_out, g->T + 1);
        for (int j = 0; j < x->n_prompt + x->n_out; j++) {
            const int32_t id = j < x->n_prompt ? x->prompt[j] : x->out[j - x->n_prompt];
            if (id < 0 || id >= g->V)
                return td_err_set(err, TD_ERR_INVALID, "grpo: sample %d: token %d is outside the vocabulary", i, id);
        }
        if (!isfinite(x->adv)) return td_err_set(err, TD_ERR_INVALID, "grpo: sample %d: advantage is not finite", i);
        n_tok += x->n_out;
    }
    if (n_tok == 0) return td_err_set(err, TD_ERR_INVALID, "grpo: the batch has no completion tokens");
    g->s = s, g->n = n;
    g->kl_sum = g->ent_sum = g->diff_max = g->diff_sum = g->is_sum = g->ratio_dev = 0.0;
    g->n_trunc = g->n_clip = g->n_terms = 0;
    td_step_stats ss = {0};
    for (g->epoch = 0; g->epoch < g->p.ppo_epochs; g->epoch++) {
        td_status rc = td_trainer_step_with(g->t, micro, g, n_tok, &ss, err);
        if (rc) return rc;
        if (g->epoch == 0) g->loss0 = ss.loss;
    }
    if (st)
        *st = (td_grpo_stats){.step = ss,
                              .n_tokens = n_tok,
                              .loss = g->loss0,
                              .kl = g->kl_sum / n_tok,
                              .entropy = g->ent_sum / n_tok,
                              .lp_diff_max = g->diff_max,
                              .lp_diff_mean = g->diff_sum / n_tok,
                              .is_mean = g->is_sum / n_tok,
                              .is_trunc = (double)g->n_trunc / n_tok,
                              .ratio_max_dev = g->ratio_dev,
                              .clip_frac = g->n_terms ? (double)g->n_clip / g->n_terms : 0.0};
    return TD_OK;
}

td_status td_rl_tmodel_get(void *ctx, const char *name, float *dst, int64_t n, td_err *err) {
    const td_tparam *t = td_tmodel_find(ctx, name);
    if (!t) return td_err_set(err, TD_ERR_NOT_FOUND, "rl: the policy has no tensor %s", name);
    if ((int64_t)(t->rows * t->cols) != n)
        return td_err_set(err, TD_ERR_INVALID, "rl: tensor %s has %lld values, %lld asked", name,
                          (long long)(t->rows * t->cols), (long long)n);
    memcpy(dst, t->host, (size_t)n * sizeof *dst);
    return TD_OK;
}
