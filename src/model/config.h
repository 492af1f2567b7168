// The hyper-parameters of a Llama-family model, from HF config.json or GGUF metadata.
#ifndef TD_MODEL_CONFIG_H
#define TD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "base/status.h"

typedef enum { TD_ARCH_LLAMA = 0, TD_ARCH_MISTRAL, TD_ARCH_QWEN2, TD_ARCH_QWEN3 } td_arch;

// How RoPE pairs the dimensions of a head.
//   TD_ROPE_NEOX: HF's rotate_half: dimension i pairs with i + head_dim/2 (HF checkpoints, and
//                 GGUF qwen2/qwen3, which store HF's layout).
//   TD_ROPE_NORM: adjacent pairs (2i, 2i+1): GGUF `llama` files, whose Q/K rows llama.cpp's
//                 converter permuted. The loader keeps those weights as stored (no copy) and the
//                 forward rotates adjacent pairs instead.
typedef enum { TD_ROPE_NEOX = 0, TD_ROPE_NORM } td_rope_style;

typedef enum { TD_ROPE_SCALING_NONE = 0, TD_ROPE_SCALING_LINEAR, TD_ROPE_SCALING_LLAMA3 } td_rope_scaling;

#define TD_MAX_EOS 8

typedef struct td_model_config {
    td_arch arch;
    int vocab_size;
    int dim;         // hidden_size
    int n_layers;
    int n_heads;
    int n_kv_heads;  // grouped-query attention when < n_heads
    int head_dim;    // may differ from dim / n_heads
    int ffn_dim;     // intermediate_size
    int max_pos;     // max_position_embeddings (context length)
    float norm_eps;  // rms_norm_eps
    float rope_theta;
    td_rope_style rope_style;
    td_rope_scaling rope_scaling;
    float rope_factor;          // linear / llama3 factor
    float rope_low_freq_factor;   // llama3
    float rope_high_freq_factor;  // llama3
    int rope_orig_max_pos;      // llama3 original_max_position_embeddings
    bool tie_embeddings;  // output head shares token embeddings
    bool qkv_bias;        // Qwen2: q/k/v projections have bias
    bool qk_norm;         // Qwen3: RMSNorm on q and k per head before RoPE
    int sliding_window;   // 0 = none (recorded; full attention is used)

    // Special tokens and defaults (generation_config.json / tokenizer_config.json / GGUF).
    int bos_id;  // -1 if none
    int n_eos;
    int eos_ids[TD_MAX_EOS];
    float gen_temperature;  // < 0 when unspecified
    float gen_top_p;        // < 0 when unspecified
    int gen_top_k;          // < 0 when unspecified
    float gen_min_p;        // < 0 when unspecified
} td_model_config;

const char *td_arch_name(td_arch a);

// Fills defaults that every path shares (ids -1, gen_* unspecified, rope none).
void td_model_config_init(td_model_config *c);

// Parses a Hugging Face config.json text. `what` names the source in error messages.
td_status td_config_from_hf_json(td_model_config *c, const char *json, size_t len, const char *what,
                                 td_err *err);

// Merges a generation_config.json text into c (additive): bos_token_id, eos_token_id (int or list,
// appended to the eos list without duplicates), temperature, top_p, top_k, min_p. Absent fields
// leave c unchanged.
td_status td_config_merge_generation_json(td_model_config *c, const char *json, size_t len, const char *what,
                                          td_err *err);

// Fills c from GGUF metadata (general.architecture llama/qwen2/qwen3 and its `{arch}.*` keys,
// tokenizer.ggml.* special ids) and tensor presence (attn_q.bias -> qkv_bias, attn_q_norm ->
// qk_norm, no output.weight -> tied). Does not validate: call td_config_validate.
struct td_gguf;
td_status td_config_from_gguf(td_model_config *c, const struct td_gguf *g, td_err *err);

// Checks that the numbers are consistent (positive sizes, heads divide, etc.).
td_status td_config_validate(const td_model_config *c, const char *what, td_err *err);

#endif
