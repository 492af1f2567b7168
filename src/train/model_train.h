// The trainable Llama-family model: f32 master weights in one contiguous buffer with a view per
// tensor, gradients in a second buffer of the same layout, and an activation buffer sized once from
// (batch, seq_len); the forward that keeps what the backward needs, and the hand-written backward.
// Every piece of math runs through a td_backend (backend/backend.h): the forward slots the
// inference forward calls, the training slots for the backward; so trainer and engine compute the
// same function by calling the same slots. Not here: the optimizer (train/adamw.h), the step with
// accumulation and clipping (train/trainer.h).
#ifndef TD_TRAIN_MODEL_TRAIN_H
#define TD_TRAIN_MODEL_TRAIN_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "base/status.h"
#include "model/config.h"
#include "model/model.h"

typedef enum {
    TD_TRAIN_FP32 = 0,  // every matmul in f32 (the same kernels as the inference forward)
    TD_TRAIN_BF16,      // matmul operands rounded to bf16, f32 accumulation; f32 master weights
} td_train_precision;

typedef enum {
    TD_TRAIN_GEMM_KERNELS = 0,  // matmuls on the backend's matmul and mm_bwd slots
    TD_TRAIN_GEMM_DNNL,         // oneDNN sgemm for every matmul (train/gemm.h; when built in)
} td_train_gemm;

typedef struct td_tmodel_params {
    int batch;      // sequences per micro-batch (B)
    int seq_len;    // tokens per sequence (T); positions 0..T-1
    int n_threads;  // the own CPU backend's threads (<= 0: all online CPUs); unused with backend
    const char *backend_name;  // the own backend (td_backend_create): NULL = $TANDEM_BACKEND or cpu
    td_train_precision precision;
    int recompute;       // 1: keep only each layer's input and recompute the layer in backward
    td_train_gemm gemm;  // TD_TRAIN_GEMM_DNNL without oneDNN built in: create fails
    // Borrowed; must outlive the model; any backend (a device one too: see the host view
    // below). NULL: create makes its own backend (backend_name; the CPU one gets n_threads and
    // kernel set $TANDEM_KERNELS or the best) and frees it with the model. Sharing one with
    // td_forward makes both run the same slots on the same kernel set.
    td_backend *backend;
} td_tmodel_params;

// batch 1, seq_len 64, n_threads 0, FP32, no recomputation, own backend.
td_tmodel_params td_tmodel_default_params(void);

// One parameter tensor: a view into the parameter buffer and the same view into the gradients
// (addresses in the backend's memory: slots read them; the host may only on a host backend), and
// the tensor in the host view (td_tmodel_host_params).
typedef struct td_tparam {
    char name[64];       // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
    float *data;         // into the parameter buffer
    float *grad;         // into the gradient buffer (same offset)
    float *host;         // into the host view (== data on a host backend)
    size_t offset;       // elements from the start of the buffers
    int64_t rows, cols;  // [rows, cols]; 1-D tensors have rows 1
    int decay;           // 1: weight decay applies (matrices, embeddings); 0: norms and biases
} td_tparam;

typedef struct td_tmodel td_tmodel;

// Sizes and allocates everything once (parameters, gradients, activations for B x T tokens,
// gradient scratch). Parameters start at zero: call td_tmodel_init_random or td_tmodel_load.
// c must pass td_config_validate; head_dim even and <= TD_ATTN_MAX_HEAD_DIM. On success *out is
// owned by the caller (td_tmodel_free); on failure *out is NULL and nothing leaks. A kernel set
// $TANDEM_KERNELS names that does not exist is TD_ERR_INVALID (own backend only); the oneDNN
// GEMM on a backend whose memory is not host memory is TD_ERR_UNSUPPORTED.
td_status td_tmodel_create(const td_model_config *c, const td_tmodel_params *p, td_tmodel **out,
                           td_err *err);
void td_tmodel_free(td_tmodel *tm);  // NULL is fine

// Hugging Face initialisation: every matrix and embedding ~ normal(0, std) (std 0.02 usually),
// norms 1, biases 0. Deterministic in seed. Written into the host view, then uploaded.
void td_tmodel_init_random(td_tmodel *tm, uint64_t seed, float std);

// Copies (converting to f32) the weights of a loaded model whose config matches the one given
// to create (sizes, tie, bias, qk-norm) and adopts its RoPE settings (style, theta, scaling,
// GGUF rope_freqs) and norm eps; m is only read during the call. On failure the parameters may
// be partly overwritten. Written into the host view, then uploaded.
td_status td_tmodel_load(td_tmodel *tm, const td_model *m, td_err *err);

const td_model_config *td_tmodel_config(const td_tmodel *tm);
td_tmodel_params td_tmodel_get_params(const td_tmodel *tm);
int td_tmodel_n_tensors(const td_tmodel *tm);
const td_tparam *td_tmodel_tensor(const td_tmodel *tm, int i);           // i in [0, n_tensors)
const td_tparam *td_tmodel_find(const td_tmodel *tm, const char *name);  // NULL if absent
// The parameter and gradient buffers (backend addresses; host arrays on a host backend). While a
// grad store is set (td_tmodel_set_grad_store) there is no gradient buffer: grads_buf and
// grads_buffer return NULL (n is still set), td_tparam.grad is NULL and grads_bytes is 0.
float *td_tmodel_params_buf(td_tmodel *tm, size_t *n);  // n: elements (both buffers)
float *td_tmodel_grads_buf(td_tmodel *tm, size_t *n);
td_buffer *td_tmodel_grads_buffer(td_tmodel *tm);  // the backend buffer behind td_tmodel_grads_buf
size_t td_tmodel_grads_bytes(const td_tmodel *tm);  // bytes the model holds for gradients
// The backend every slot runs on (p.backend, or the model's own): borrowed, valid until
// td_tmodel_free. The optimizer and clipping run on it too (trainer.h).
td_backend *td_tmodel_backend(td_tmodel *tm);
size_t td_tmodel_activation_bytes(const td_tmodel *tm);

void td_tmodel_zero_grad(td_tmodel *tm);  // the gradient buffer (nothing with a grad store)

// ---- The host view: how code that needs host arrays (loading, checkpoints, evaluation, tests)
// reaches a model whose buffers may be device memory. On a host backend (the CPU) the views ARE
// the buffers: td_tmodel_host_params is the parameter buffer, td_tmodel_host_logits the logits,
// and the sync calls do nothing (no copy, no cost). On any other backend create allocates host
// mirrors once (the parameters, n_params floats; the logits, B*T*vocab floats) and the calls
// below copy, synchronously, through the backend's buffers:
//   td_tmodel_params_to_host    mirror <- parameters (before reading the host view: after steps);
//   td_tmodel_params_from_host  parameters <- mirror (after writing it: restore, a test's edit);
//   td_tmodel_host_logits       the last forward's logits, downloaded into the mirror;
//   td_tmodel_grads_to_host     the gradient buffer into the caller's dst[n_params] (zeros while
//                               a grad store holds the gradients instead).
// init_random and load write the host view and upload it themselves.
float *td_tmodel_host_params(td_tmodel *tm, size_t *n);  // n: elements; td_tparam.host points in
void td_tmodel_params_to_host(td_tmodel *tm);
void td_tmodel_params_from_host(td_tmodel *tm);
const float *td_tmodel_host_logits(td_tmodel *tm);  // [B*T, vocab]; valid until the next forward
void td_tmodel_grads_to_host(td_tmodel *tm, float *dst);

// Forward and backward allocate nothing and are not thread-safe (one caller per model, and one
// caller per backend at a time: a shared backend's slots must not be issued concurrently; the
// backend does the threading).

// Forward over tokens[B*T] (row b*T + t is token t of sequence b). targets[B*T] (ids, or -1 to
// ignore) may be NULL: then no loss. On success *loss_sum is the sum of per-token losses over the
// counted targets and *n_counted their number (either pointer may be NULL). Logits stay available
// through td_tmodel_logits until the next backward. Bad ids are TD_ERR_INVALID.
td_status td_tmodel_forward(td_tmodel *tm, const int32_t *tokens, const int32_t *targets,
                            double *loss_sum, int *n_counted, td_err *err);

// [B*T, vocab] logits of the last forward (overwritten by td_tmodel_backward), in the backend's
// memory (td_tmodel_host_logits for a host array on any backend).
const float *td_tmodel_logits(const td_tmodel *tm);

// Backward of the last forward (which must have had targets): ADDS d(dscale * sum of losses)/dθ to
// the gradient buffer (or to the grad store's storage: td_tmodel_set_grad_store). dscale is
// 1/(counted targets over all micro-batches of the step) for a mean. A store's failure is returned
// (the backward stops there).
td_status td_tmodel_backward(td_tmodel *tm, float dscale, td_err *err);

// The backward of a loss of the caller's own on the last forward's logits (which needs no
// targets): dlogits [B*T, vocab] is d loss / d logits, already scaled as the step's mean wants;
// ADDS the gradient to the gradient buffer (or grad store) as td_tmodel_backward does (RL's
// policy-gradient losses: rl/grpo.h). A host array: on a host backend it may be td_tmodel_host_logits itself,
// overwritten in place (no copy); otherwise it is uploaded. The logits are consumed.
td_status td_tmodel_backward_from(td_tmodel *tm, const float *dlogits, td_err *err);

// Told, during td_tmodel_backward (and td_tmodel_backward_from), each time a range [off, off + n)
// of the gradient layout (in elements) has had its last contribution of this backward issued on
// the backend: the final norm and the head first (through the end of the layout), then layer L-1
// down to layer 0, then the embedding table (offset 0). The ranges are disjoint, together cover
// the layout, and come in descending order of offset, so adjacent ones merge into contiguous
// buckets (data-parallel training starts each bucket's all-reduce there, while backward goes on).
// On a device backend the slots may still be running: synchronize before the host reads the
// range. NULL fn removes it.
typedef void (*td_tmodel_grad_hook_fn)(void *ctx, size_t off, size_t n);
void td_tmodel_set_grad_hook(td_tmodel *tm, td_tmodel_grad_hook_fn fn, void *ctx);

// Gradients outside the model (ZeRO-2's ring of bucket buffers, train/trainer.c). With fn set the
// model frees its full-size gradient buffer, and every backward asks fn, before it first writes a
// range of the hook's ranges, where that range's gradient lives: *out (backend memory) holds
// element off, n elements, zeros on return (backward adds into it), and must stay valid until
// the hook has reported the range. Each range is asked for once per backward, in the hook's order,
// except that a tied embedding's range (offset 0) is asked for first: the head's gradient adds
// into it at the start of backward, the embedding's at the end (td_tmodel_set_tied_split: in
// pieces, each asked for twice instead). An error from fn stops the
// backward, which returns it. fn NULL gives the model a full-size gradient buffer again (zeroed;
// TD_ERR_NOMEM if it cannot be allocated: then backward fails until a later call succeeds).
typedef td_status (*td_tmodel_grad_store_fn)(void *ctx, size_t off, size_t n, float **out, td_err *err);
td_status td_tmodel_set_grad_store(td_tmodel *tm, td_tmodel_grad_store_fn fn, void *ctx, td_err *err);

// With a grad store, a tied embedding's gradient in pieces of rows rows (the last piece the rest),
// each asked for and reported as a range of its own, twice per backward: first every piece with
// the head's contribution (dlogits' columns of the piece against the final normed activations),
// before the head's range, then, after layer 0, every piece with the embedding's scatter-add. The
// pieces come in descending order of offset each time; the second time fn's storage must hold one
// row more (rows + 1: the scratch row the tokens outside the piece add into). Each time the piece
// holds that contribution only: the store sums the two (ZeRO-2 reduces them separately, so the
// rounding is not a single process's h + e). Host backends only (TD_ERR_UNSUPPORTED); rows 0:
// the whole table, asked for once, as above.
td_status td_tmodel_set_tied_split(td_tmodel *tm, int rows, td_err *err);

#endif
