// Windowed NLL / perplexity with the inference forward: windows become separate sequences of one
// flat batch, fed in slices of at most max_batch_tokens, and log-softmax at each target in double.
// Not here: the forward itself, shard format details (shards.h), command-line parsing.
#include "train/eval.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "train/shards.h"

#define EVAL_DEFAULT_MAX_TOKENS 1024  // tokens per forward run when not given (bounds the logits)

struct td_eval {
    td_forward *f;
    td_forward *owned;  // == f when created by td_eval_create_for_model, else NULL
    td_eval_params p;   // resolved: max_batch_tokens > 0
    int vocab;
    float *logits;     // [max_batch_tokens, vocab]
    int32_t *tok;      // [max_batch_tokens]
    int32_t *pos;      // [max_batch_tokens]
    int32_t *seq;      // [max_batch_tokens]
    int32_t *windows;  // [batch, seq_len + 1] staging for td_eval_shards
};

td_eval_params td_eval_default_params(void) {
    return (td_eval_params){.seq_len = 256, .batch = 4, .max_batch_tokens = 0, .n_threads = 0};
}

static int resolved_max_tokens(const td_eval_params *p) {
    if (p->max_batch_tokens > 0) return p->max_batch_tokens;
    long n = (long)p->batch * p->seq_len;
    return n > EVAL_DEFAULT_MAX_TOKENS ? EVAL_DEFAULT_MAX_TOKENS : (int)n;
}

td_forward_params td_eval_forward_params(const td_eval_params *p) {
    td_forward_params fp = td_forward_default_params();
    fp.max_batch_tokens = resolved_max_tokens(p);
    fp.max_seqs = p->batch;
    fp.max_ctx = p->seq_len;
    fp.n_threads = p->n_threads;
    return fp;
}

static td_status check_params(const td_eval_params *p, const td_model_config *c, td_err *err) {
    if (p->seq_len <= 0 || p->batch <= 0 || p->max_batch_tokens < 0)
        return td_err_set(err, TD_ERR_INVALID, "eval: seq_len %d and batch %d must be > 0", p->seq_len,
                          p->batch);
    if (p->seq_len > c->max_pos)
        return td_err_set(err, TD_ERR_INVALID,
                          "eval: seq_len %d is larger than the model's context (%d positions)",
                          p->seq_len, c->max_pos);
    if ((long)p->batch * p->seq_len > (1L << 30))
        return td_err_set(err, TD_ERR_INVALID, "eval: batch %d x seq_len %d is too large", p->batch,
                          p->seq_len);
    return TD_OK;
}

td_status td_eval_create(td_forward *f, const td_eval_params *p, td_eval **out, td_err *err) {
    *out = NULL;
    const td_model_config *c = td_forward_config(f);
    td_status st = check_params(p, c, err);
    if (st) return st;
    td_eval *e = calloc(1, sizeof *e);
    if (!e) return td_err_set(err, TD_ERR_NOMEM, "eval: out of memory");
    e->f = f;
    e->p = *p;
    e->p.max_batch_tokens = resolved_max_tokens(p);
    e->vocab = c->vocab_size;
    size_t mt = (size_t)e->p.max_batch_tokens;
    e->logits = malloc(mt * (size_t)e->vocab * sizeof(float));
    e->tok = malloc(mt * sizeof(int32_t));
    e->pos = malloc(mt * sizeof(int32_t));
    e->seq = malloc(mt * sizeof(int32_t));
    e->windows = malloc((size_t)p->batch * ((size_t)p->seq_len + 1) * sizeof(int32_t));
    if (!e->logits || !e->tok || !e->pos || !e->seq || !e->windows) {
        td_eval_free(e);
        return td_err_set(err, TD_ERR_NOMEM, "eval: out of memory for %d tokens x %d vocab logits",
                          e->p.max_batch_tokens, c->vocab_size);
    }
    *out = e;
    return TD_OK;
}

td_status td_eval_create_for_model(const td_model *m, const td_eval_params *p, td_eval **out,
                                   td_err *err) {
    *out = NULL;
    td_status st = check_params(p, &m->cfg, err);
    if (st) return st;
    td_forward_params fp = td_eval_forward_params(p);
    td_forward *f = NULL;
    st = td_forward_create(m, &fp, &f, err);
    if (st) return st;
    st = td_eval_create(f, p, out, err);
    if (st) {
        td_forward_free(f);
        return st;
    }
    (*out)->owned = f;
    return TD_OK;
}

void td_eval_free(td_eval *e) {
    if (!e) return;
    td_forward_free(e->owned);
    free(e->logits);
    free(e->tok);
    free(e->pos);
    free(e->seq);
    free(e->windows);
    free(e);
}

double td_eval_token_nll(const float *row, int vocab, int target) {
    float mx = row[0];
    for (int i = 1; i < vocab; i++) mx = row[i] > mx ? row[i] : mx;
    double s = 0;
    for (int i = 0; i < vocab; i++) s += exp((double)row[i] - mx);
    return (double)mx + log(s) - (double)row[target];
}

td_status td_eval_nll(td_eval *e, const int32_t *windows, size_t n, double *per_window, double *sum,
                      td_err *err) {
    const size_t T = (size_t)e->p.seq_len, W = T + 1;
    for (size_t i = 0; i < n * W; i++)
        if (windows[i] < 0 || windows[i] >= e->vocab)
            return td_err_set(err, TD_ERR_INVALID,
                              "eval: window %zu position %zu: token id %d outside the model's "
                              "vocabulary (%d)",
                              i / W, i % W, windows[i], e->vocab);
    double total = 0;
    for (size_t w0 = 0; w0 < n; w0 += (size_t)e->p.batch) {
        size_t g = n - w0 < (size_t)e->p.batch ? n - w0 : (size_t)e->p.batch;
        for (size_t j = 0; j < g; j++) {
            td_forward_seq_clear(e->f, (int)j);
            if (per_window) per_window[w0 + j] = 0;
        }
        // The group's inputs as one flat list, window-major: flat i = j * T + t. Any slice of it
        // continues each of its sequences from that sequence's cache (consecutive positions).
        size_t nflat = g * T;
        for (size_t s0 = 0; s0 < nflat; s0 += (size_t)e->p.max_batch_tokens) {
            size_t ns = nflat - s0 < (size_t)e->p.max_batch_tokens ? nflat - s0
                                                                    : (size_t)e->p.max_batch_tokens;
            for (size_t k = 0; k < ns; k++) {
                size_t i = s0 + k, j = i / T, t = i % T;
                e->tok[k] = windows[(w0 + j) * W + t];
                e->pos[k] = (int32_t)t;
                e->seq[k] = (int32_t)j;
            }
            td_batch b = {.n_tokens = (int)ns, .tokens = e->tok, .pos = e->pos, .seq_id = e->seq,
                          .want_logits = NULL};
            td_status st = td_forward_run(e->f, &b, e->logits, err);
            if (st) {
                td_err_prefix(err, "eval: forward");
                return st;
            }
            for (size_t k = 0; k < ns; k++) {
                size_t i = s0 + k, j = i / T, t = i % T;
                int target = windows[(w0 + j) * W + t + 1];
                double l = td_eval_token_nll(e->logits + k * (size_t)e->vocab, e->vocab, target);
                total += l;
                if (per_window) per_window[w0 + j] += l;
            }
        }
    }
    for (int j = 0; j < e->p.batch; j++) td_forward_seq_clear(e->f, j);
    *sum = total;
    return TD_OK;
}

td_status td_eval_shards(td_eval *e, const char *const *paths, int n_paths, uint64_t max_tokens,
                         td_eval_result *out, td_err *err) {
    memset(out, 0, sizeof *out);
    if (n_paths <= 0) return td_err_set(err, TD_ERR_INVALID, "eval: no shards given");
    const uint64_t T = (uint64_t)e->p.seq_len;
    td_shard **sh = calloc((size_t)n_paths, sizeof *sh);
    if (!sh) return td_err_set(err, TD_ERR_NOMEM, "eval: out of memory");
    td_status st = TD_OK;
    uint64_t total_windows = 0;
    for (int i = 0; i < n_paths && !st; i++) {
        st = td_shard_open(paths[i], &sh[i], err);
        if (st) {
            td_err_prefix(err, "%s", paths[i]);
            break;
        }
        if (td_shard_vocab(sh[i]) > e->vocab) {
            st = td_err_set(err, TD_ERR_INVALID,
                            "%s: shard vocabulary (%d tokens) is larger than the model's (%d): "
                            "shards and model come from different tokenizers",
                            paths[i], td_shard_vocab(sh[i]), e->vocab);
            break;
        }
        uint64_t nt = td_shard_tokens(sh[i]);
        total_windows += nt > 0 ? (nt - 1) / T : 0;
    }
    if (!st && total_windows == 0)
        st = td_err_set(err, TD_ERR_INVALID,
                        "eval: the shards hold no window of seq_len + 1 = %llu tokens",
                        (unsigned long long)(T + 1));
    uint64_t want = total_windows;
    if (!st && max_tokens > 0) {
        uint64_t w = max_tokens / T;
        if (w < 1) w = 1;
        if (w < want) want = w;
    }
    double t0 = td_now(), sum = 0;
    uint64_t done = 0;
    size_t fill = 0;
    const size_t W = (size_t)T + 1;
    for (int i = 0; i < n_paths && !st && done + fill < want; i++) {
        uint64_t nt = td_shard_tokens(sh[i]), nw = nt > 0 ? (nt - 1) / T : 0;
        for (uint64_t k = 0; k < nw && done + fill < want && !st; k++) {
            td_shard_read(sh[i], k * T, W, e->windows + fill * W);
            if (++fill == (size_t)e->p.batch || done + fill == want) {
                double s = 0;
                st = td_eval_nll(e, e->windows, fill, NULL, &s, err);
                if (st) td_err_prefix(err, "%s", paths[i]);
                sum += s;
                done += fill;
                fill = 0;
            }
        }
    }
    for (int i = 0; i < n_paths; i++) td_shard_close(sh[i]);
    free(sh);
    if (st) return st;
    out->windows = done;
    out->tokens = done * T;
    out->nll_sum = sum;
    out->nll = sum / (double)out->tokens;
    out->ppl = exp(out->nll);
    out->seconds = td_now() - t0;
    out->tokens_per_s = out->seconds > 0 ? (double)out->tokens / out->seconds : 0;
    return TD_OK;
}
