// Held-out loss and perplexity of a causal LM over token windows: the mean negative log-likelihood
// (nats per predicted token) and exp of it, computed with the inference forward (model/forward.h).
// Not here: training, backward passes, sampling, or byte-level metrics needing the raw text.
//
// Convention (the same as the trainer's validation loss and the loader, as in llm.c): a window is
// T+1 consecutive tokens w[0..T]; the model reads the inputs w[0..T-1] at positions 0..T-1 from an
// empty context and each position t predicts the target w[t+1], so a window gives exactly T
// predictions and NLL(window) = -sum_t log softmax(logits_t)[w[t+1]]. A shard of n tokens holds
// floor((n-1)/T) non-overlapping windows starting at 0, T, 2T, ... (consecutive windows share one
// boundary token: the last target of one is the first input of the next), never crossing shards.
#ifndef TD_TRAIN_EVAL_H
#define TD_TRAIN_EVAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "model/forward.h"
#include "model/model.h"

typedef struct td_eval_params {
    int seq_len;           // T: predictions per window (a window is T+1 tokens); <= model context
    int batch;             // windows per forward batch, each its own sequence id 0..batch-1
    int max_batch_tokens;  // tokens per td_forward_run; 0 = batch * seq_len (one run per batch)
    int n_threads;         // forward threads; <= 0 = all online CPUs
} td_eval_params;

td_eval_params td_eval_default_params(void);  // T 256, batch 4, max_batch_tokens 0, threads 0

// Forward parameters that fit an evaluator with params p (max_seqs = batch, max_ctx = seq_len,
// max_batch_tokens as resolved above). A forward created otherwise must have at least these.
td_forward_params td_eval_forward_params(const td_eval_params *p);

typedef struct td_eval td_eval;

// Creates an evaluator over forward f, which is borrowed (must outlive the evaluator) and whose
// sequences 0..batch-1 the evaluator clears and reuses freely. Allocates once: the logits buffer
// [max_batch_tokens, vocab] f32 and the flat batch arrays. TD_ERR_INVALID for nonpositive sizes or
// seq_len above the model's context (cfg.max_pos). On failure *out is NULL.
td_status td_eval_create(td_forward *f, const td_eval_params *p, td_eval **out, td_err *err);
void td_eval_free(td_eval *e);  // NULL is fine; does not free the forward

// Convenience owner: creates a forward sized by td_eval_forward_params for model m (borrowed) and
// an evaluator that owns it (td_eval_free frees both).
td_status td_eval_create_for_model(const td_model *m, const td_eval_params *p, td_eval **out,
                                   td_err *err);

// The NLL of n windows, windows[n][seq_len + 1] (row-major token ids < vocab), evaluated `batch` at
// a time as separate sequences. Writes the sum over all n * seq_len predictions (nats) to *sum
// and, when per_window is non-NULL, each window's sum to per_window[n]. The mean NLL is
// *sum / (n * seq_len). Sums accumulate in double. The result does not depend on batch or
// max_batch_tokens beyond float rounding of the forward. TD_ERR_INVALID for an id outside the
// model's vocabulary (nothing evaluated). Not thread-safe (one forward).
td_status td_eval_nll(td_eval *e, const int32_t *windows, size_t n, double *per_window, double *sum,
                      td_err *err);

// -log softmax(row)[target] in double (logsumexp(row) - row[target]): the per-token loss above,
// for a trainer whose own forward produces the logits row[vocab].
double td_eval_token_nll(const float *row, int vocab, int target);

// ---- over token shards (`tandem eval`) ----

typedef struct td_eval_result {
    uint64_t windows;  // windows evaluated
    uint64_t tokens;   // predictions = windows * seq_len
    double nll_sum;    // nats
    double nll;        // mean nats per predicted token
    double ppl;        // exp(nll)
    double seconds;    // wall time of the forward passes and reads
    double tokens_per_s;
} td_eval_result;

// Evaluates every window of the shards (shards.h files, in the given order), or the first
// floor(max_tokens / seq_len) windows (at least one) when max_tokens > 0. Errors (with the path):
// a missing or corrupt shard (from td_shard_open), a shard vocabulary larger than the model's (a
// model may pad its vocabulary, so smaller is fine), a shard with fewer than seq_len + 1 tokens
// when no window at all can be formed.
td_status td_eval_shards(td_eval *e, const char *const *paths, int n_paths, uint64_t max_tokens,
                         td_eval_result *out, td_err *err);

#endif
