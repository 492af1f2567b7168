// The Llama-family forward pass (Llama, Mistral, Qwen2, Qwen3) over one flat batch of tokens from
// several sequences, continuing each sequence from its KV cache. Inference only: no saved
// activations, no gradients. Weights are read in their stored dtype through the backend, which
// also holds every buffer the forward owns (placed weights, scratch, its own KV cache).
// The KV cache here is contiguous per sequence (max_ctx rows per sequence, f32 or, by kv_dtype,
// f16/bf16); attention reads it
// through a block table, so a paged pool can replace it without touching the kernels: a forward
// created with external_kv owns no cache and td_forward_run_kv reads and writes the caller's
// per-layer block-addressed arrays (the engine's td_kv_pool).
#ifndef TD_MODEL_FORWARD_H
#define TD_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "kernels/kernels.h"
#include "model/export.h"
#include "model/model.h"

struct td_backend;

typedef struct td_forward td_forward;

typedef struct td_forward_params {
    int max_batch_tokens;  // tokens per td_forward_run (sizes the activation scratch)
    int max_seqs;          // sequence ids are in [0, max_seqs)
    int max_ctx;           // positions per sequence are in [0, max_ctx); 0 = min(cfg.max_pos, 4096)
    int n_threads;         // <= 0: all online CPUs
    const char *backend_name;  // the own backend's (td_backend_create): NULL = $TANDEM_BACKEND or cpu
    bool external_kv;      // no own KV cache: only td_forward_run_kv may be used (max_ctx then
                           // only bounds positions; it sizes nothing)
    td_dtype kv_dtype;     // element type of the own KV cache: TD_F32 (default), TD_F16, TD_BF16
    struct td_backend *backend;  // the backend every slot runs on (borrowed: must outlive the
                                 // forward; the engine's KV pool and a trainer in the same process
                                 // share it); NULL: the forward makes a CPU backend of n_threads
    bool own_weights;      // copy every weight into backend memory the forward owns, so that
                           // td_forward_set_weights can replace them (a host backend otherwise
                           // reads mapped weights in place; a device backend always copies)
} td_forward_params;

// max_batch_tokens 512, max_seqs 1, max_ctx 0 (model's, capped), n_threads 0, own KV cache.
td_forward_params td_forward_default_params(void);

// One flat batch. Arrays have n_tokens entries and are only read during td_forward_run.
// The tokens of one sequence appear in increasing, consecutive positions; the first one of each
// sequence is at a position <= that sequence's cached length (a smaller position overwrites the
// cache from there on and truncates it). A token attends to its own sequence's positions <= pos,
// including earlier tokens of the same batch.
typedef struct td_batch {
    int n_tokens;
    const int32_t *tokens;       // [n_tokens] token ids < vocab_size
    const int32_t *pos;          // [n_tokens] positions < max_ctx
    const int32_t *seq_id;       // [n_tokens] in [0, max_seqs)
    const uint8_t *want_logits;  // [n_tokens] nonzero = return this token's logits; NULL = every token
} td_batch;

// Creates a forward for model m: checks every weight's shape and dtype, precomputes RoPE
// frequencies, converts norms and biases to f32, and allocates the KV cache and all scratch once.
// m must outlive the forward. Its weights are read in place, except the matmul weights the kernel
// set packs (docs/kernels.md, TANDEM_PACK): those are copied once here, so the model's weights must
// not change while the forward lives. On success *out is owned by the caller (td_forward_free);
// on failure *out is NULL and nothing leaks.
td_status td_forward_create(const td_model *m, const td_forward_params *p, td_forward **out,
                            td_err *err);
void td_forward_free(td_forward *f);  // NULL is fine

// Runs the batch and writes logits[n_out, vocab_size] (caller-owned, f32) for the tokens whose
// want_logits is set, in batch order (n_out = n_tokens when want_logits is NULL); logits may be
// NULL when n_out is 0. Invalid batches (ids, positions, sizes) return TD_ERR_INVALID with a
// message and leave every sequence's cache as it was. Allocates nothing. Not thread-safe.
// TD_ERR_INVALID for a forward created with external_kv.
td_status td_forward_run(td_forward *f, const td_batch *b, float *logits, td_err *err);

// The same over a caller-owned KV cache: kv[n_layers] gives each layer's K/V arrays (kv[l].dtype
// f32, f16 or bf16, [n_blocks, block_size, kv_dim] with kv_dim = n_kv_heads * head_dim, in the
// forward's backend's memory) and one flat host block table shared by every layer: row seq_id of
// table_stride ids (<= max_ctx) holds that batch sequence's blocks (TD_ERR_INVALID when layers name
// different tables or strides). The rows the batch uses are uploaded into the forward's scratch.
// Batch sequence ids are only indices into that table here, valid for this call. The caller
// guarantees that every table covers positions [0, last position of that sequence in the batch]
// and that earlier positions hold that sequence's K/V (the forward cannot check what it does not
// own); the batch is checked as td_forward_run checks it, except against cached lengths. K/V rows
// of the batch's positions are written through the tables. Allocates nothing. Not thread-safe.
td_status td_forward_run_kv(td_forward *f, const td_batch *b, const td_kv_layer *kv, float *logits,
                            td_err *err);

// The same as td_forward_run_kv, except that the head is not run: hidden[n_out, dim] (caller-owned,
// host f32) receives, for the tokens whose want_logits is set (every token when NULL), in batch
// order, the final hidden state: the residual stream after the last layer and the final RMSNorm
// (model.norm), i.e. the LM head's input. Pooled embeddings are built from it (engine.h,
// TD_ENG_CMD_EMBED). Allocates nothing. Not thread-safe.
td_status td_forward_run_kv_hidden(td_forward *f, const td_batch *b, const td_kv_layer *kv, float *hidden,
                                   td_err *err);

// Forgets a sequence's cached keys and values (its length becomes 0). Out-of-range ids are ignored.
void td_forward_seq_clear(td_forward *f, int seq_id);
// Cached positions of a sequence (0 for an out-of-range id).
int td_forward_seq_len(const td_forward *f, int seq_id);

const td_model_config *td_forward_config(const td_forward *f);

// Replaces every weight in place from a named-tensor source (Hugging Face names and layout, f32
// values: td_export_model_get over another loaded model of the same config, the trainer's
// parameters, a checkpoint reader): each tensor is fetched into a host staging buffer sized at
// create and converted into the buffers the forward already owns (dtype, GGUF Q/K row order,
// packed copies redone), allocating nothing. Needs own_weights (or a device backend):
// TD_ERR_UNSUPPORTED otherwise. Cached KV of the own cache is forgotten (every length becomes 0).
// On failure (a tensor missing or of the wrong size: the source's error, naming it) some weights
// may already be new: td_forward_run then refuses to run (TD_ERR_INVALID, "weights incomplete")
// until a later td_forward_set_weights succeeds, so a mix is never computed. Not thread-safe
// (the forward's one caller, between runs).
td_status td_forward_set_weights(td_forward *f, td_export_get_fn get, void *ctx, td_err *err);
// The same with a typed fast path (typed may be NULL): a weight placed in host memory, not row
// permuted, in F32/F16/BF16, is first asked of typed(ctx, name, its placed type, its placed bytes,
// n), written in place (packed copies then redone); TD_ERR_UNSUPPORTED from typed falls back to
// get. Values written by typed are not checked for finiteness: such a source vouches for them
// (weight sync checks them on arrival). Any other typed error fails as get's would.
td_status td_forward_set_weights_typed(td_forward *f, td_export_get_fn get, td_export_get_typed_fn typed, void *ctx,
                                       td_err *err);
// The backend the forward runs on (borrowed or its own; valid while f lives).
struct td_backend *td_forward_backend(td_forward *f);

#endif
