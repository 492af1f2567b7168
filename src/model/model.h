// A loaded Llama-family model: its configuration and views of its weights.
// Weights stay memory-mapped in their stored dtype; nothing is copied unless a conversion is
// needed. The model owns its mappings; td_model_free releases them.
#ifndef TD_MODEL_MODEL_H
#define TD_MODEL_MODEL_H

#include "base/status.h"
#include "model/config.h"
#include "tensor/tensor.h"

typedef struct td_layer_weights {
    td_tensor attn_norm;  // [dim]
    td_tensor wq;         // [n_heads * head_dim, dim]
    td_tensor wk;         // [n_kv_heads * head_dim, dim]
    td_tensor wv;         // [n_kv_heads * head_dim, dim]
    td_tensor wo;         // [dim, n_heads * head_dim]
    td_tensor bq, bk, bv; // [rows of wq/wk/wv], present iff cfg.qkv_bias
    td_tensor q_norm;     // [head_dim], present iff cfg.qk_norm
    td_tensor k_norm;     // [head_dim], present iff cfg.qk_norm
    td_tensor ffn_norm;   // [dim]
    td_tensor w_gate;     // [ffn_dim, dim]
    td_tensor w_up;       // [ffn_dim, dim]
    td_tensor w_down;     // [dim, ffn_dim]
} td_layer_weights;

typedef struct td_model {
    td_model_config cfg;
    td_tensor tok_embd;    // [vocab, dim]
    td_tensor out_norm;    // [dim]
    td_tensor output;      // [vocab, dim]; a copy of the tok_embd view when tied
    td_tensor rope_freqs;  // [head_dim / 2] f32 divisors of the RoPE frequencies (GGUF
                           // `rope_freqs.weight`), or absent; llama3 scaling from config.json is
                           // applied by the forward from cfg instead
    td_layer_weights *layers;  // [n_layers]
    char *path;                // as given to td_model_load
    char *tokenizer_path;      // directory or .gguf file the tokenizer loads from (may equal path)
    void *impl;                // loader-private: mappings and converted buffers
} td_model;

// Loads a model directory (config.json + model.safetensors or shards with
// model.safetensors.index.json, generation_config.json optional) or a .gguf file.
// Every tensor's presence, shape and dtype is checked against the config; any problem is an error
// naming the file and tensor. On failure *out is NULL and nothing leaks.
td_status td_model_load(const char *path, td_model **out, td_err *err);
void td_model_free(td_model *m);

#endif
