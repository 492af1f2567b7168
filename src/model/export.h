// Model export: a td_model_config plus f32 weights by Hugging Face name -> a Hugging Face model
// directory (config.json, generation_config.json, tokenizer files copied as is, model.safetensors or
// shards + model.safetensors.index.json) or a GGUF v3 file in llama.cpp's conventions (arch
// "llama" for llama/mistral with permuted Q/K rows and rope_freqs.weight for llama3 rope scaling;
// "qwen2"/"qwen3" unpermuted; 1-D tensors F32; tokenizer.ggml.* metadata built from tokenizer.json).
// Also GGUF -> GGUF requantization. Weights are fetched and written one tensor at a time; every
// output file is written to a temporary name and renamed when complete.
// Not here: reading models (model.h), the CLI (src/cli/cmd_convert.c).
#ifndef TD_MODEL_EXPORT_H
#define TD_MODEL_EXPORT_H

#include <stdbool.h>
#include <stdint.h>
#include "base/status.h"
#include "model/config.h"
#include "model/model.h"
#include "tensor/dtype.h"

// Fills dst with the n f32 values of tensor `hf_name` (HF name and layout, row-major, n = the
// product of its shape). Called once per tensor, in order; returning an error aborts the export.
typedef td_status (*td_export_get_fn)(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err);
// An optional second form of a source, for consumers that store the values in another element
// type: fills dst with the n values of `hf_name` (HF layout) already in `type` (F32, F16 or BF16:
// n * 4 or n * 2 bytes), or returns TD_ERR_UNSUPPORTED when it cannot give that type directly (the
// consumer then asks the td_export_get_fn). Saves the f32 round trip when the types agree.
typedef td_status (*td_export_get_typed_fn)(void *ctx, const char *hf_name, td_dtype type, void *dst, int64_t n,
                                            td_err *err);

typedef struct td_export_params {
    td_dtype type;       // HF: F32/F16/BF16. GGUF: also Q8_0/Q4_0/Q5_0/Q4_K/Q6_K or TD_EXPORT_Q4_K_M
                         // (2-D tensors; 1-D stay F32)
    const char *tokenizer;  // directory with tokenizer.json (+ tokenizer_config.json), or the path of
                            // a tokenizer.json; NULL: no tokenizer files / metadata
    const char *name;    // GGUF general.name; NULL: "tandem"
    uint64_t max_shard_bytes;  // HF: split safetensors so each file holds at most this many bytes of
                               // data (one tensor larger than that gets a file alone); 0: one file
} td_export_params;

td_export_params td_export_default_params(void);  // F32, no tokenizer, "tandem", no sharding

// Writes a Hugging Face model directory `dir` (created if missing; files in it are replaced).
// cfg must validate (td_config_validate). On failure, files already completed stay; no file is
// ever left half-written under its final name.
td_status td_export_hf(const char *dir, const td_model_config *cfg, const td_export_params *p,
                       td_export_get_fn get, void *ctx, td_err *err);

// Writes a GGUF file at `path` (atomically).
td_status td_export_gguf(const char *path, const td_model_config *cfg, const td_export_params *p,
                         td_export_get_fn get, void *ctx, td_err *err);

// A source of tensors held in memory: names[i] -> data[i] (f32, HF layout). ctx = td_export_arrays*.
typedef struct td_export_arrays {
    int n;
    const char *const *names;
    const float *const *data;
    const int64_t *nelem;  // [n] element counts, checked against what the export asks for
} td_export_arrays;
td_status td_export_arrays_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err);

// A loaded model as source (ctx = const td_model *): any stored dtype, dequantized with
// td_to_f32 row by row; GGUF llama Q/K rows are un-permuted back to HF's layout.
td_status td_export_model_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err);
// Its typed form (td_export_get_typed_fn): a memcpy when the stored tensor already is `type` and
// needs no un-permuting; TD_ERR_UNSUPPORTED otherwise (ask td_export_model_get).
td_status td_export_model_get_typed(void *ctx, const char *hf_name, td_dtype type, void *dst, int64_t n, td_err *err);

// The tensors a model of config cfg has, by HF name, in llama.cpp's order (the order the exporters
// fetch them in): what a td_export_get_fn must provide. shape is outermost first (a matrix is
// [rows, cols], row-major; a vector [n], shape[1] = 0).
typedef struct td_export_tensor {
    char name[128];    // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
    int ndim;          // 1 or 2
    int64_t shape[2];  // elements
} td_export_tensor;
// Writes min(count, cap) entries into out (may be NULL with cap 0) and returns the count
// (size-first; 0 when out of memory). cfg is not validated: a config td_config_validate refuses
// gives a list of no use.
int td_export_tensor_list(const td_model_config *cfg, td_export_tensor *out, int cap);

// Builds the tokenizer.ggml.* / tokenizer.chat_template metadata from a tokenizer.json (path as in
// td_export_params.tokenizer) into a GGUF writer; vocab_size pads the token list with [PADi]
// tokens as llama.cpp's converter does. The files are read by td_tokenizer_load (one reader of
// tokenizer files; anything it refuses fails here too) and described from td_tokenizer_info:
// add_bos_token / add_eos_token say whether the post-processor adds tokens before / after the
// text; a byte-level pre-tokenizer must be GPT-2's (ByteLevel with use_regex) or one Split with
// Llama 3's or Qwen2's regex, else TD_ERR_UNSUPPORTED. bos/eos fall back to cfg when
// tokenizer_config.json lacks them (cfg may be NULL: then the tokenizer's own).
struct td_gguf_writer;
td_status td_export_tokenizer_gguf(struct td_gguf_writer *w, const char *tokenizer, int vocab_size,
                                   const td_model_config *cfg, td_err *err);

// The reverse: writes tokenizer.json and tokenizer_config.json into `dir` (which must exist) from
// tokenizer.ggml.*: "gpt2" vocabularies with pre "gpt-2"/"default", "llama-bpe"/"llama3" or
// "qwen2"; "llama" (SentencePiece) vocabularies with BPE merges rebuilt from the scores (every split
// of a piece into two pieces, ranked by the piece's score, as transformers' SentencePieceExtractor
// does), byte fallback and the U+2581 normalizer/decoder. TD_ERR_UNSUPPORTED for other models or
// pre-tokenizers, TD_ERR_NOT_FOUND when g has no vocabulary.
struct td_gguf;
td_status td_export_tokenizer_json(const struct td_gguf *g, const char *dir, int max_pos, td_err *err);

// GGUF -> GGUF at another type: every tensor is dequantized to f32 and re-encoded (2-D tensors to
// `type`, 1-D to F32); metadata is copied with general.file_type updated. *was_quantized (may be
// NULL) tells whether the source held Q8_0/Q4_0 tensors (requantizing loses precision twice).
td_status td_export_requantize(const char *in, const char *out, td_dtype type, bool *was_quantized, td_err *err);

// Not a dtype: llama.cpp's Q4_K_M mix (Q4_K matrices; Q6_K for output.weight and for attn_v /
// ffn_down in the layers llama.cpp's use_more_bits picks), accepted as td_export_params.type and by
// td_export_requantize. Rows not a multiple of 256 fall back as llama.cpp's: Q4_K -> Q5_0, Q6_K ->
// Q8_0 (-> F16 if not a multiple of 32 either).
enum { TD_EXPORT_Q4_K_M = 100 };

// llama.cpp's general.file_type (LLAMA_FTYPE_*) and ggml type number for a td_dtype.
uint32_t td_export_file_type(td_dtype t);
uint32_t td_export_ggml_type(td_dtype t);
// Parses "f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_k", "q6_k" (case-insensitive), or "q4_k_m"
// (TD_EXPORT_Q4_K_M); -1 if unknown.
int td_export_parse_type(const char *s);
// The names td_export_parse_type accepts, "f32, f16, ..." (hf_only: those a model directory holds,
// td_export_type_hf), written into buf (truncated to cap); returns buf. For help and error text.
const char *td_export_type_list(char *buf, size_t cap, bool hf_only);
bool td_export_type_hf(int type);  // F32, F16, BF16: td_export_hf accepts it

#endif
