// Token sampling: the OpenAI/vLLM sampling surface over one row of logits, plus log-probabilities.
// Processing order (as vLLM): the allowed-token mask (structured output), logit_bias, repetition/presence/frequency penalties, temperature,
// then top-k, top-p, min-p filters, then a draw from the request's own RNG. temperature == 0 is
// greedy (argmax after bias and penalties). A td_sampler owns scratch for one vocabulary, sized at
// creation, so sampling allocates nothing per token; one sampler per thread.
#ifndef TD_ENGINE_SAMPLER_H
#define TD_ENGINE_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>
#include "base/rng.h"
#include "base/status.h"


typedef struct td_logit_bias {
    int32_t token;
    float bias;  // added to the logit; OpenAI clamps to [-100, 100]
} td_logit_bias;

typedef struct td_sampling_params {
    float temperature;         // 0 = greedy
    int top_k;                 // <= 0: off
    float top_p;               // (0, 1]; 1: off
    float min_p;               // [0, 1]; 0: off
    float repetition_penalty;  // > 0; 1: off. Divides positive / multiplies negative logits of
                               // tokens seen in prompt or output.
    float presence_penalty;    // [-2, 2]; subtracted once for each token present in the output
    float frequency_penalty;   // [-2, 2]; subtracted per occurrence in the output
    const td_logit_bias *logit_bias;  // not owned
    int n_logit_bias;
    const uint32_t *allow;  // NULL: every token. Else [ceil(vocab / 32)] bits, bit (id & 31) of word
                            //   id >> 5 set = allowed (a grammar's mask, grammar/grammar.h): the others
                            //   get logit -inf first, so every mode (greedy, filters, draw, logprob)
                            //   sees only allowed tokens. At least one must be allowed. Not owned.
} td_sampling_params;

td_sampling_params td_sampling_default_params(void);
// Range checks with a message naming the field (for request validation).
td_status td_sampling_params_check(const td_sampling_params *p, int vocab_size, td_err *err);

typedef struct td_sampler td_sampler;

td_sampler *td_sampler_create(int vocab_size);
void td_sampler_free(td_sampler *s);

// Picks the next token. logits [vocab] is modified in place (bias, penalties, temperature).
// prompt/output are the sequence's tokens so far (for penalties); either may be NULL when n is 0.
int32_t td_sampler_sample(td_sampler *s, const td_sampling_params *p, float *logits,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          td_rng *rng);

// The filtered, renormalised distribution that td_sampler_sample draws from, written densely into
// probs [vocab] (zeros for removed tokens). Same in-place processing of logits. For tests and for
// clients that want to inspect it; not needed on the hot path.
void td_sampler_probs(td_sampler *s, const td_sampling_params *p, float *logits,
                      const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                      float *probs);

// The log-probability of `token` under the distribution td_sampler_sample draws from with p and this
// history (logit_bias, penalties, temperature, then the top-k / top-p / min-p set, renormalised):
// z'[token] - logsumexp(z' over the kept set), in double, where z' are the processed logits.
// temperature 0 (greedy) processes as temperature 1 (the filters still apply). -INFINITY when the
// filters remove token. logits is not modified (processing happens in the sampler's scratch).
// dlogits (may be NULL): [vocab] d logprob / d logits (the raw logits): zero outside the kept set,
// f_i * (onehot_i - prob_i) inside, f_i the chain factor of the processing (1/temperature, and the
// repetition penalty's 1/pen or pen for penalised tokens). Allocates nothing.
// The kept set is computed by the same code, on bitwise the same processed logits, as the set
// td_sampler_sample draws from (top_k == 1: the argmax, lowest id among ties). prob_i is
// exp(z'_i - logsumexp) in double. When token is removed, dlogits is all zeros.
double td_sampler_logprob(td_sampler *s, const td_sampling_params *p, const float *logits,
                          const int32_t *prompt, int n_prompt, const int32_t *output, int n_output,
                          int32_t token, float *dlogits);

// The min(k, kept set size) most probable tokens of the last td_sampler_logprob call's kept set, best
// first (ties: lower id first), with their processed log-probabilities (float of the double
// z'_i - logsumexp). Returns how many were written. Valid until the sampler is next used.
int td_sampler_logprob_topk(const td_sampler *s, int k, int32_t *ids, float *lps);

// log-softmax helpers over raw logits [vocab]:
double td_logsumexp(const float *logits, int vocab);
// Top k (id, logprob) pairs in descending order of logprob (ties: lower id first); k <= vocab.
void td_logprobs_topk(const float *logits, int vocab, double lse, int k, int32_t *ids, float *lps);

#endif
