// Model export to Hugging Face directories and GGUF files, and GGUF requantization (see export.h).
// Tensor names, order and layout follow llama.cpp's convert_hf_to_gguf.py for the llama/qwen2/qwen3
// architectures; one tensor's f32 values are in memory at a time (plus its encoded form).
// Not here: the container formats themselves (format/gguf_write.c, format/safetensors_write.c).
#include "model/export.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "base/afile.h"
#include "base/file.h"
#include "base/log.h"
#include "base/threadpool.h"
#include "format/gguf.h"
#include "format/gguf_write.h"
#include "format/safetensors_write.h"
#include "tokenizer/tokenizer.h"

#define MAX_JSON_BYTES (256u << 20)

td_export_params td_export_default_params(void) {
    td_export_params p = {TD_F32, NULL, NULL, 0};
    return p;
}

uint32_t td_export_file_type(td_dtype t) {
    switch (t) {
    case TD_F32: return 0;   // LLAMA_FTYPE_ALL_F32
    case TD_F16: return 1;   // MOSTLY_F16
    case TD_Q4_0: return 2;  // MOSTLY_Q4_0
    case TD_Q8_0: return 7;  // MOSTLY_Q8_0
    case TD_BF16: return 32; // MOSTLY_BF16
    case TD_Q4_K: return 14; // MOSTLY_Q4_K_S (llama.cpp has no all-Q4_K type; the closest)
    case TD_Q6_K: return 18; // MOSTLY_Q6_K
    case TD_Q5_0: return 8;  // MOSTLY_Q5_0
    default: return (int)t == TD_EXPORT_Q4_K_M ? 15 : 0;  // MOSTLY_Q4_K_M
    }
}

uint32_t td_export_ggml_type(td_dtype t) {
    switch (t) {
    case TD_F16: return TD_GGML_F16;
    case TD_BF16: return TD_GGML_BF16;
    case TD_Q8_0: return TD_GGML_Q8_0;
    case TD_Q4_0: return TD_GGML_Q4_0;
    case TD_Q4_K: return TD_GGML_Q4_K;
    case TD_Q6_K: return TD_GGML_Q6_K;
    case TD_Q5_0: return TD_GGML_Q5_0;
    default: return TD_GGML_F32;
    }
}

// The output types by name, in the order help lists them; hf: a model directory can hold it.
static const struct {
    const char *n;
    int t;
    bool hf;
} EXPORT_TYPES[] = {{"f32", TD_F32, true},    {"f16", TD_F16, true},    {"bf16", TD_BF16, true},
                    {"q8_0", TD_Q8_0, false}, {"q4_0", TD_Q4_0, false}, {"q5_0", TD_Q5_0, false},
                    {"q4_k", TD_Q4_K, false}, {"q6_k", TD_Q6_K, false}, {"q4_k_m", TD_EXPORT_Q4_K_M, false}};
#define N_EXPORT_TYPES (sizeof EXPORT_TYPES / sizeof EXPORT_TYPES[0])

int td_export_parse_type(const char *s) {
    for (size_t i = 0; s && i < N_EXPORT_TYPES; i++)
        if (!strcasecmp(s, EXPORT_TYPES[i].n)) return EXPORT_TYPES[i].t;
    return -1;
}

const char *td_export_type_list(char *buf, size_t cap, bool hf_only) {
    size_t len = 0;
    if (cap) buf[0] = 0;
    for (size_t i = 0; i < N_EXPORT_TYPES; i++) {
        if (hf_only && !EXPORT_TYPES[i].hf) continue;
        const int n = snprintf(buf + len, len < cap ? cap - len : 0, "%s%s", len ? ", " : "", EXPORT_TYPES[i].n);
        if (n > 0) len += (size_t)n;
    }
    return buf;
}

bool td_export_type_hf(int type) {
    for (size_t i = 0; i < N_EXPORT_TYPES; i++)
        if (EXPORT_TYPES[i].t == type) return EXPORT_TYPES[i].hf;
    return false;
}

// ---- the tensors of a model -----------------------------------------------------------------

typedef struct {
    char hf[128], gguf[128];
    int ndim;
    int64_t ne[2];  // outermost first
    int perm_heads;  // GGUF llama: Q/K rows permuted for this many heads; 0 otherwise
} tinfo;

// Fills out (capacity: see n_tensors_max) in llama.cpp's GGUF order; returns the count.
static int n_tensors_max(const td_model_config *c) { return 2 + 14 * c->n_layers + 1; }

static int gguf_arch_is_llama(const td_model_config *c) {
    return c->arch == TD_ARCH_LLAMA || c->arch == TD_ARCH_MISTRAL;
}

static int list_tensors(const td_model_config *c, int for_gguf, tinfo *out) {
    int n = 0, perm = for_gguf && gguf_arch_is_llama(c);
    int64_t q = (int64_t)c->n_heads * c->head_dim, kv = (int64_t)c->n_kv_heads * c->head_dim;
#define ADD(HF, GG, ND, R, C, PH)                                                  \
    do {                                                                           \
        tinfo *t = &out[n++];                                                      \
        snprintf(t->hf, sizeof t->hf, "%s", HF);                                   \
        snprintf(t->gguf, sizeof t->gguf, "%s", GG);                               \
        t->ndim = ND;                                                              \
        t->ne[0] = R;                                                              \
        t->ne[1] = C;                                                              \
        t->perm_heads = PH;                                                        \
    } while (0)
    ADD("model.embed_tokens.weight", "token_embd.weight", 2, c->vocab_size, c->dim, 0);
    for (int l = 0; l < c->n_layers; l++) {
        char h[128], g[128];
#define LAYER(HFS, GGS, ND, R, C, PH)                                 \
        do {                                                          \
            snprintf(h, sizeof h, "model.layers.%d.%s", l, HFS);      \
            snprintf(g, sizeof g, "blk.%d.%s", l, GGS);               \
            ADD(h, g, ND, R, C, PH);                                  \
        } while (0)
        LAYER("input_layernorm.weight", "attn_norm.weight", 1, c->dim, 0, 0);
        LAYER("self_attn.q_proj.weight", "attn_q.weight", 2, q, c->dim, perm ? c->n_heads : 0);
        LAYER("self_attn.k_proj.weight", "attn_k.weight", 2, kv, c->dim, perm ? c->n_kv_heads : 0);
        LAYER("self_attn.v_proj.weight", "attn_v.weight", 2, kv, c->dim, 0);
        if (c->qkv_bias) {
            LAYER("self_attn.q_proj.bias", "attn_q.bias", 1, q, 0, perm ? c->n_heads : 0);
            LAYER("self_attn.k_proj.bias", "attn_k.bias", 1, kv, 0, perm ? c->n_kv_heads : 0);
            LAYER("self_attn.v_proj.bias", "attn_v.bias", 1, kv, 0, 0);
        }
        if (c->qk_norm) {
            LAYER("self_attn.q_norm.weight", "attn_q_norm.weight", 1, c->head_dim, 0, 0);
            LAYER("self_attn.k_norm.weight", "attn_k_norm.weight", 1, c->head_dim, 0, 0);
        }
        LAYER("self_attn.o_proj.weight", "attn_output.weight", 2, c->dim, q, 0);
        LAYER("post_attention_layernorm.weight", "ffn_norm.weight", 1, c->dim, 0, 0);
        LAYER("mlp.gate_proj.weight", "ffn_gate.weight", 2, c->ffn_dim, c->dim, 0);
        LAYER("mlp.up_proj.weight", "ffn_up.weight", 2, c->ffn_dim, c->dim, 0);
        LAYER("mlp.down_proj.weight", "ffn_down.weight", 2, c->dim, c->ffn_dim, 0);
#undef LAYER
    }
    ADD("model.norm.weight", "output_norm.weight", 1, c->dim, 0, 0);
    if (!c->tie_embeddings) ADD("lm_head.weight", "output.weight", 2, c->vocab_size, c->dim, 0);
#undef ADD
    return n;
}

static int64_t tinfo_nelem(const tinfo *t) { return t->ndim == 2 ? t->ne[0] * t->ne[1] : t->ne[0]; }

int td_export_tensor_list(const td_model_config *cfg, td_export_tensor *out, int cap) {
    tinfo *ts = calloc((size_t)n_tensors_max(cfg), sizeof *ts);
    if (!ts) return 0;
    int n = list_tensors(cfg, 0, ts);
    for (int i = 0; i < n && i < cap; i++) {
        td_export_tensor *o = &out[i];
        memcpy(o->name, ts[i].hf, sizeof o->name);
        o->ndim = ts[i].ndim;
        o->shape[0] = ts[i].ne[0];
        o->shape[1] = ts[i].ndim == 2 ? ts[i].ne[1] : 0;
    }
    free(ts);
    return n;
}

// Row map of llama.cpp's permute(w, n_head) = w.reshape(n_head, 2, hd/2, ...).swapaxes(1, 2):
// output row h*hd + 2i + j holds input row h*hd + j*hd/2 + i. inverse: the other direction.
static int64_t perm_src_row(int64_t r, int64_t rows, int n_head, int inverse) {
    int64_t hd = rows / n_head, h = r / hd, k = r % hd, half = hd / 2;
    if (!inverse) return h * hd + (k % 2) * half + k / 2;
    return h * hd + (k % half) * 2 + k / half;
}

// ---- sources -------------------------------------------------------------------------------

td_status td_export_arrays_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err) {
    const td_export_arrays *a = ctx;
    for (int i = 0; i < a->n; i++) {
        if (strcmp(a->names[i], hf_name)) continue;
        if (a->nelem && a->nelem[i] != n)
            return td_err_set(err, TD_ERR_INVALID, "export: tensor %s has %lld values, the config needs %lld", hf_name,
                              (long long)a->nelem[i], (long long)n);
        memcpy(dst, a->data[i], (size_t)n * sizeof *dst);
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_NOT_FOUND, "export: tensor %s not given", hf_name);
}

// The td_model field holding HF tensor `name`, or NULL.
static const td_tensor *model_tensor(const td_model *m, const char *name, int *perm_heads) {
    *perm_heads = 0;
    if (!strcmp(name, "model.embed_tokens.weight")) return &m->tok_embd;
    if (!strcmp(name, "model.norm.weight")) return &m->out_norm;
    if (!strcmp(name, "lm_head.weight")) return &m->output;
    int l, off = 0;
    if (sscanf(name, "model.layers.%d.%n", &l, &off) != 1 || off == 0 || l < 0 || l >= m->cfg.n_layers) return NULL;
    const char *s = name + off;
    td_layer_weights *w = &m->layers[l];
    int norm = m->cfg.rope_style == TD_ROPE_NORM;
    static const struct { const char *n; size_t off; int perm; } F[] = {
        {"input_layernorm.weight", offsetof(td_layer_weights, attn_norm), 0},
        {"self_attn.q_proj.weight", offsetof(td_layer_weights, wq), 1},
        {"self_attn.k_proj.weight", offsetof(td_layer_weights, wk), 2},
        {"self_attn.v_proj.weight", offsetof(td_layer_weights, wv), 0},
        {"self_attn.o_proj.weight", offsetof(td_layer_weights, wo), 0},
        {"self_attn.q_proj.bias", offsetof(td_layer_weights, bq), 1},
        {"self_attn.k_proj.bias", offsetof(td_layer_weights, bk), 2},
        {"self_attn.v_proj.bias", offsetof(td_layer_weights, bv), 0},
        {"self_attn.q_norm.weight", offsetof(td_layer_weights, q_norm), 0},
        {"self_attn.k_norm.weight", offsetof(td_layer_weights, k_norm), 0},
        {"post_attention_layernorm.weight", offsetof(td_layer_weights, ffn_norm), 0},
        {"mlp.gate_proj.weight", offsetof(td_layer_weights, w_gate), 0},
        {"mlp.up_proj.weight", offsetof(td_layer_weights, w_up), 0},
        {"mlp.down_proj.weight", offsetof(td_layer_weights, w_down), 0},
    };
    for (size_t i = 0; i < sizeof F / sizeof F[0]; i++)
        if (!strcmp(s, F[i].n)) {
            if (norm && F[i].perm) *perm_heads = F[i].perm == 1 ? m->cfg.n_heads : m->cfg.n_kv_heads;
            return (const td_tensor *)((const char *)w + F[i].off);
        }
    return NULL;
}

td_status td_export_model_get(void *ctx, const char *hf_name, float *dst, int64_t n, td_err *err) {
    const td_model *m = ctx;
    int ph;
    const td_tensor *t = model_tensor(m, hf_name, &ph);
    if (!t || !td_tensor_present(t)) return td_err_set(err, TD_ERR_NOT_FOUND, "export: model has no tensor %s", hf_name);
    if (td_tensor_nelem(t) != n)
        return td_err_set(err, TD_ERR_INVALID, "export: tensor %s has %lld values, expected %lld", hf_name,
                          (long long)td_tensor_nelem(t), (long long)n);
    int64_t rows = t->ndim == 2 ? t->ne[0] : 1, cols = t->ndim == 2 ? t->ne[1] : t->ne[0];
    size_t rb = td_tensor_row_bytes(t);
    if (ph && t->ndim == 1) {  // permuted bias: one value per row
        rows = t->ne[0];
        cols = 1;
    }
    if (ph && t->ndim == 1) {
        float *tmp = malloc((size_t)rows * sizeof *tmp);
        if (!tmp) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        td_to_f32(t->type, t->data, tmp, rows);
        for (int64_t r = 0; r < rows; r++) dst[r] = tmp[perm_src_row(r, rows, ph, 1)];
        free(tmp);
        return TD_OK;
    }
    for (int64_t r = 0; r < rows; r++) {
        // The converter moved HF row s to stored row inverse(s): read it back from there.
        int64_t src = ph ? perm_src_row(r, rows, ph, 1) : r;
        td_to_f32(t->type, (const uint8_t *)t->data + (size_t)src * rb, dst + r * cols, cols);
    }
    return TD_OK;
}

td_status td_export_model_get_typed(void *ctx, const char *hf_name, td_dtype type, void *dst, int64_t n, td_err *err) {
    const td_model *m = ctx;
    int ph;
    const td_tensor *t = model_tensor(m, hf_name, &ph);
    if (!t || !td_tensor_present(t) || t->type != type || ph || td_tensor_nelem(t) != n ||
        (type != TD_F32 && type != TD_F16 && type != TD_BF16))
        return TD_ERR_UNSUPPORTED;
    (void)err;
    memcpy(dst, t->data, (size_t)n * (type == TD_F32 ? 4 : 2));
    return TD_OK;
}

// ---- small helpers ---------------------------------------------------------------------------

// A float as the shortest decimal that reads back as the same float (so 1e-5f prints 1e-05).
static double nice_float(float f) {
    char b[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(b, sizeof b, "%.*g", prec, (double)f);
        if ((float)strtod(b, NULL) == f) break;
    }
    return strtod(b, NULL);
}

static td_status write_text_atomic(const char *path, const char *text, td_err *err) {
    td_afile f;
    td_status st = td_afile_open(&f, path, err);
    if (st) return st;
    if ((st = td_afile_write(&f, text, strlen(text), err))) {
        td_afile_abort(&f);
        return st;
    }
    return td_afile_commit(&f, err);
}

static td_status write_json_atomic(const char *path, cJSON *j, td_err *err) {
    char *s = j ? cJSON_Print(j) : NULL;
    if (!s) return td_err_set(err, TD_ERR_NOMEM, "out of memory writing %s", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    t[n] = '\n';
    t[n + 1] = 0;
    td_status st = write_text_atomic(path, t, err);
    free(t);
    return st;
}

// Directory and file of a tokenizer source: a directory, or a tokenizer.json path.
static td_status tok_paths(const char *src, char *dir, size_t cap, char *json, td_err *err) {
    if (td_is_dir(src)) {
        snprintf(dir, cap, "%s", src);
    } else if (td_file_exists(src)) {
        snprintf(dir, cap, "%s", src);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, cap, ".");
    } else {
        return td_err_set(err, TD_ERR_NOT_FOUND, "tokenizer %s: no such file or directory", src);
    }
    if (td_is_dir(src)) {
        if (!td_path_join(json, 4096, dir, "tokenizer.json")) return td_err_set(err, TD_ERR_INVALID, "path too long");
    } else {
        snprintf(json, 4096, "%s", src);
    }
    if (!td_file_exists(json)) return td_err_set(err, TD_ERR_NOT_FOUND, "tokenizer %s: tokenizer.json not found", src);
    return TD_OK;
}

static int64_t eos0(const td_model_config *c) { return c->n_eos > 0 ? c->eos_ids[0] : -1; }

// ---- Hugging Face directory ------------------------------------------------------------------

static const char *hf_model_type(td_arch a) { return td_arch_name(a); }
static const char *hf_class(td_arch a) {
    switch (a) {
    case TD_ARCH_MISTRAL: return "MistralForCausalLM";
    case TD_ARCH_QWEN2: return "Qwen2ForCausalLM";
    case TD_ARCH_QWEN3: return "Qwen3ForCausalLM";
    default: return "LlamaForCausalLM";
    }
}

static void add_eos(cJSON *o, const td_model_config *c) {
    if (c->n_eos == 1) {
        cJSON_AddNumberToObject(o, "eos_token_id", c->eos_ids[0]);
    } else if (c->n_eos > 1) {
        cJSON *a = cJSON_AddArrayToObject(o, "eos_token_id");
        for (int i = 0; i < c->n_eos; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(c->eos_ids[i]));
    }
}

// config.json as transformers writes it for these model types.
static cJSON *hf_config_json(const td_model_config *c, td_dtype type) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON *arch = cJSON_AddArrayToObject(o, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString(hf_class(c->arch)));
    if (c->arch == TD_ARCH_LLAMA || c->arch == TD_ARCH_QWEN3) cJSON_AddBoolToObject(o, "attention_bias", c->qkv_bias);
    cJSON_AddNumberToObject(o, "attention_dropout", 0.0);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", c->bos_id);
    add_eos(o, c);
    if (c->head_dim != c->dim / c->n_heads || c->arch == TD_ARCH_QWEN3)
        cJSON_AddNumberToObject(o, "head_dim", c->head_dim);
    cJSON_AddStringToObject(o, "hidden_act", "silu");
    cJSON_AddNumberToObject(o, "hidden_size", c->dim);
    cJSON_AddNumberToObject(o, "initializer_range", 0.02);
    cJSON_AddNumberToObject(o, "intermediate_size", c->ffn_dim);
    cJSON_AddNumberToObject(o, "max_position_embeddings", c->max_pos);
    if (c->arch == TD_ARCH_QWEN2 || c->arch == TD_ARCH_QWEN3) cJSON_AddNumberToObject(o, "max_window_layers", c->n_layers);
    if (c->arch == TD_ARCH_LLAMA) cJSON_AddBoolToObject(o, "mlp_bias", 0);
    cJSON_AddStringToObject(o, "model_type", hf_model_type(c->arch));
    cJSON_AddNumberToObject(o, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(o, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(o, "num_key_value_heads", c->n_kv_heads);
    if (c->arch == TD_ARCH_LLAMA) cJSON_AddNumberToObject(o, "pretraining_tp", 1);
    cJSON_AddNumberToObject(o, "rms_norm_eps", nice_float(c->norm_eps));
    if (c->rope_scaling == TD_ROPE_SCALING_NONE) {
        cJSON_AddNullToObject(o, "rope_scaling");
    } else {
        cJSON *rs = cJSON_AddObjectToObject(o, "rope_scaling");
        cJSON_AddNumberToObject(rs, "factor", nice_float(c->rope_factor));
        if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3) {
            cJSON_AddNumberToObject(rs, "high_freq_factor", nice_float(c->rope_high_freq_factor));
            cJSON_AddNumberToObject(rs, "low_freq_factor", nice_float(c->rope_low_freq_factor));
            cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_orig_max_pos);
            cJSON_AddStringToObject(rs, "rope_type", "llama3");
        } else {
            cJSON_AddStringToObject(rs, "rope_type", "linear");
            cJSON_AddStringToObject(rs, "type", "linear");
        }
    }
    cJSON_AddNumberToObject(o, "rope_theta", nice_float(c->rope_theta));
    if (c->arch != TD_ARCH_LLAMA) {
        if (c->sliding_window > 0) cJSON_AddNumberToObject(o, "sliding_window", c->sliding_window);
        else cJSON_AddNullToObject(o, "sliding_window");
    }
    cJSON_AddBoolToObject(o, "tie_word_embeddings", c->tie_embeddings);
    cJSON_AddStringToObject(o, "torch_dtype", type == TD_F16 ? "float16" : type == TD_BF16 ? "bfloat16" : "float32");
    cJSON_AddStringToObject(o, "transformers_version", "4.51.0");
    cJSON_AddBoolToObject(o, "use_cache", 1);
    if (c->arch == TD_ARCH_QWEN2 || c->arch == TD_ARCH_QWEN3)
        cJSON_AddBoolToObject(o, "use_sliding_window", c->sliding_window > 0);
    cJSON_AddNumberToObject(o, "vocab_size", c->vocab_size);
    return o;
}

static cJSON *hf_generation_json(const td_model_config *c) {
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddBoolToObject(o, "_from_model_config", 1);
    if (c->bos_id >= 0) cJSON_AddNumberToObject(o, "bos_token_id", c->bos_id);
    if (c->gen_temperature >= 0) cJSON_AddBoolToObject(o, "do_sample", c->gen_temperature > 0);
    add_eos(o, c);
    if (c->gen_min_p >= 0) cJSON_AddNumberToObject(o, "min_p", nice_float(c->gen_min_p));
    if (c->gen_temperature >= 0) cJSON_AddNumberToObject(o, "temperature", nice_float(c->gen_temperature));
    if (c->gen_top_k >= 0) cJSON_AddNumberToObject(o, "top_k", c->gen_top_k);
    if (c->gen_top_p >= 0) cJSON_AddNumberToObject(o, "top_p", nice_float(c->gen_top_p));
    cJSON_AddStringToObject(o, "transformers_version", "4.51.0");
    return o;
}

static td_status copy_file_atomic(const char *src, const char *dst, td_err *err) {
    char *buf = NULL;
    size_t len = 0;
    td_status st = td_read_file(src, MAX_JSON_BYTES, &buf, &len, err);
    if (st) return st;
    td_afile f;
    if (!(st = td_afile_open(&f, dst, err))) {
        if ((st = td_afile_write(&f, buf, len, err))) td_afile_abort(&f);
        else st = td_afile_commit(&f, err);
    }
    free(buf);
    return st;
}

static td_status copy_tokenizer_files(const char *tok, const char *dir, td_err *err) {
    char tdir[4096], tjson[4096], src[4096], dst[4096];
    td_status st = tok_paths(tok, tdir, sizeof tdir, tjson, err);
    if (st) return st;
    if (!td_path_join(dst, sizeof dst, dir, "tokenizer.json")) return td_err_set(err, TD_ERR_INVALID, "path too long");
    if ((st = copy_file_atomic(tjson, dst, err))) return st;
    static const char *const extra[] = {"tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
        if (!td_path_join(src, sizeof src, tdir, extra[i]) || !td_file_exists(src)) continue;
        if (!td_path_join(dst, sizeof dst, dir, extra[i])) return td_err_set(err, TD_ERR_INVALID, "path too long");
        if ((st = copy_file_atomic(src, dst, err))) return st;
    }
    return TD_OK;
}

// Fetches tensor t (f32, HF layout) into buf (tinfo_nelem floats), checking the values are finite.
static td_status fetch(td_export_get_fn get, void *ctx, const tinfo *t, float *buf, td_err *err) {
    int64_t n = tinfo_nelem(t);
    td_status st = get(ctx, t->hf, buf, n, err);
    if (st) return st;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(buf[i]))
            return td_err_set(err, TD_ERR_INVALID, "export: tensor %s has a non-finite value at %lld", t->hf, (long long)i);
    return TD_OK;
}

static td_status check_common(const td_model_config *cfg, const td_export_params *p, td_err *err) {
    td_status st = td_config_validate(cfg, "export", err);
    if (st) return st;
    if ((unsigned)p->type >= TD_DTYPE_COUNT && (int)p->type != TD_EXPORT_Q4_K_M)
        return td_err_set(err, TD_ERR_INVALID, "export: unknown type %d", (int)p->type);
    return TD_OK;
}

td_status td_export_hf(const char *dir, const td_model_config *cfg, const td_export_params *p,
                       td_export_get_fn get, void *ctx, td_err *err) {
    td_export_params dp = td_export_default_params();
    if (!p) p = &dp;
    td_status st = check_common(cfg, p, err);
    if (st) return st;
    if (p->type != TD_F32 && p->type != TD_F16 && p->type != TD_BF16)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "export: a model directory holds F32, F16 or BF16, not %s",
                          td_dtype_name(p->type));
    if (!td_is_dir(dir) && mkdir(dir, 0755) != 0)
        return td_err_set(err, TD_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));

    char path[4096];
    int nt_max = n_tensors_max(cfg);
    tinfo *ts = calloc((size_t)nt_max, sizeof *ts);
    if (!ts) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    int nt = list_tensors(cfg, 0, ts);
    // Shard assignment: greedy in order, a new shard when the next tensor would overflow.
    int *shard = calloc((size_t)nt, sizeof *shard);
    float *buf = NULL;
    void *enc = NULL;
    cJSON *j = NULL;
    td_st_writer *w = NULL;
    int n_shards = 1;
    size_t esz = p->type == TD_F32 ? 4 : 2, max_n = 0;
    uint64_t total = 0;
    if (!shard) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto done;
    }
    {
        uint64_t cur = 0;
        for (int i = 0; i < nt; i++) {
            uint64_t b = (uint64_t)tinfo_nelem(&ts[i]) * esz;
            if (p->max_shard_bytes && cur > 0 && cur + b > p->max_shard_bytes) {
                n_shards++;
                cur = 0;
            }
            shard[i] = n_shards - 1;
            cur += b;
            total += b;
            if ((size_t)tinfo_nelem(&ts[i]) > max_n) max_n = (size_t)tinfo_nelem(&ts[i]);
        }
    }
    buf = malloc(max_n * sizeof *buf);
    enc = malloc(max_n * esz);
    if (!buf || !enc) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory for a %zu-element tensor", max_n);
        goto done;
    }
    cJSON *wmap = NULL;
    if (n_shards > 1) {
        j = cJSON_CreateObject();
        cJSON *meta = cJSON_AddObjectToObject(j, "metadata");
        cJSON_AddNumberToObject(meta, "total_size", (double)total);
        wmap = cJSON_AddObjectToObject(j, "weight_map");
        if (!wmap) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    for (int s = 0, i0 = 0; s < n_shards; s++) {
        char fname[64];
        if (n_shards == 1) snprintf(fname, sizeof fname, "model.safetensors");
        else snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
        int i1 = i0;
        while (i1 < nt && shard[i1] == s) i1++;
        if (!(w = td_st_w_new())) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto done;
        }
        if ((st = td_st_w_meta(w, "format", "pt", err))) goto done;
        for (int i = i0; i < i1; i++) {
            if ((st = td_st_w_tensor(w, ts[i].hf, p->type, ts[i].ndim, ts[i].ne, err))) goto done;
            if (wmap) cJSON_AddStringToObject(wmap, ts[i].hf, fname);
        }
        if (!td_path_join(path, sizeof path, dir, fname)) {
            st = td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
            goto done;
        }
        if ((st = td_st_w_begin(w, path, err))) goto done;
        for (int i = i0; i < i1; i++) {
            int64_t n = tinfo_nelem(&ts[i]);
            if ((st = fetch(get, ctx, &ts[i], buf, err))) goto done;
            td_from_f32(p->type, buf, enc, n);
            if ((st = td_st_w_data(w, enc, (size_t)n * esz, err))) goto done;
        }
        if ((st = td_st_w_finish(w, err))) goto done;
        td_st_w_free(w);
        w = NULL;
        i0 = i1;
    }
    if (j) {
        if (!td_path_join(path, sizeof path, dir, "model.safetensors.index.json")) {
            st = td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
            goto done;
        }
        if ((st = write_json_atomic(path, j, err))) goto done;
    } else if (td_path_join(path, sizeof path, dir, "model.safetensors.index.json") && td_file_exists(path)) {
        remove(path);  // a stale index would point the loader at stale shards
    }
    cJSON_Delete(j);
    j = hf_config_json(cfg, p->type);
    if (!td_path_join(path, sizeof path, dir, "config.json") || (st = write_json_atomic(path, j, err))) {
        if (!st) st = td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
        goto done;
    }
    cJSON_Delete(j);
    j = hf_generation_json(cfg);
    if (!td_path_join(path, sizeof path, dir, "generation_config.json") || (st = write_json_atomic(path, j, err))) {
        if (!st) st = td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
        goto done;
    }
    if (p->tokenizer) st = copy_tokenizer_files(p->tokenizer, dir, err);
done:
    td_st_w_free(w);
    cJSON_Delete(j);
    free(buf);
    free(enc);
    free(shard);
    free(ts);
    return st;
}

// ---- tokenizer -> GGUF metadata --------------------------------------------------------------

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

// The pre-tokenizer regexes llama.cpp recognises by name (its tokenizer.ggml.pre values).
static const char LLAMA3_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_RE[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

// A string -> id map with open addressing (cJSON object lookups are linear; vocabularies are 100k+).
// Keys are borrowed (they point into cJSON strings or a GGUF mapping that outlive the map).
typedef struct {
    const char **key;
    size_t *len;
    int32_t *id;
    size_t cap;  // power of two, >= 2 * entries
} strmap;

static uint64_t str_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}
static int strmap_init(strmap *m, size_t n) {
    m->cap = 16;
    while (m->cap < 2 * n) m->cap *= 2;
    m->key = calloc(m->cap, sizeof *m->key);
    m->len = calloc(m->cap, sizeof *m->len);
    m->id = calloc(m->cap, sizeof *m->id);
    return m->key && m->len && m->id;
}
static void strmap_free(strmap *m) {
    free(m->key);
    free(m->len);
    free(m->id);
}
// Inserts unless present (the first id for a spelling wins, as in a vocabulary).
static void strmap_put(strmap *m, const char *k, size_t n, int32_t id) {
    for (size_t i = str_hash(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        if (!m->key[i]) {
            m->key[i] = k, m->len[i] = n, m->id[i] = id;
            return;
        }
        if (m->len[i] == n && !memcmp(m->key[i], k, n)) return;
    }
}
static int32_t strmap_get(const strmap *m, const char *k, size_t n) {
    for (size_t i = str_hash(k, n) & (m->cap - 1); m->key[i]; i = (i + 1) & (m->cap - 1))
        if (m->len[i] == n && !memcmp(m->key[i], k, n)) return m->id[i];
    return -1;
}

// The tokenizer.ggml.pre name of a byte-level tokenizer's pre-tokenizer, or NULL if llama.cpp has
// none for it: GPT-2's regex run by ByteLevel itself, or one Split with Llama 3's or Qwen2's regex
// before a ByteLevel that does not split again.
static const char *gguf_pre_name(const td_tokenizer_info *ti) {
    if (ti->n_split == 0) return ti->bytelevel_regex ? "gpt-2" : NULL;
    if (ti->n_split > 1 || ti->split_literal || ti->bytelevel_regex) return NULL;
    if (!strcmp(ti->split_pattern, LLAMA3_RE)) return "llama-bpe";
    if (!strcmp(ti->split_pattern, QWEN2_RE)) return "qwen2";
    return NULL;
}

// The tokenizer is read once, by the tokenizer room's loader (td_tokenizer_load: tokenizer.json
// and tokenizer_config.json); everything below asks the loaded td_tokenizer.
td_status td_export_tokenizer_gguf(td_gguf_writer *w, const char *tokenizer, int vocab_size,
                                   const td_model_config *mc, td_err *err) {
    char tdir[4096], tjson[4096];
    td_status st = tok_paths(tokenizer, tdir, sizeof tdir, tjson, err);
    if (st) return st;
    td_tokenizer *t = NULL;
    if ((st = td_tokenizer_load(tjson, &t, err))) return st;  // err names the file
    td_tokenizer_info ti;
    td_tokenizer_get_info(t, &ti);
    const char **tokens = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    char **owned = NULL;   // [n] token spellings
    const char **merges = NULL;
    char **mown = NULL;    // [n_merges] "a b" strings
    td_tokenizer_merge *tm = NULL;
    size_t n_merges = 0;
    int n = 0;  // tokens
    const bool byte_level = ti.byte_level, spm = ti.sentencepiece;
    if (!byte_level && !spm) {
        st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: neither a byte-level BPE nor a SentencePiece-style BPE", tjson);
        goto done;
    }
    // Token count: highest id + 1, padded up to the model's vocabulary.
    n = td_tokenizer_vocab_size(t);
    if (vocab_size > 0 && n > vocab_size) {
        // llama.cpp sizes the embedding by the token list: they must agree.
        st = td_err_set(err, TD_ERR_INVALID, "%s: the tokenizer has ids up to %d but the model's vocab_size is %d", tjson,
                        n - 1, vocab_size);
        goto done;
    }
    if (vocab_size > n) n = vocab_size;
    tokens = calloc((size_t)n, sizeof *tokens);
    types = malloc((size_t)n * sizeof *types);
    owned = calloc((size_t)n, sizeof *owned);
    if (!tokens || !types || !owned) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto done;
    }
    // Spellings as in tokenizer.json ("Ġthe", "▁the", "<|im_end|>"); ids nobody uses are [PADi].
    for (int i = 0; i < n; i++) {
        int len = td_tokenizer_id_to_piece(t, i, NULL, 0);
        const bool present = len >= 0;
        char pad[32];
        if (!present) len = snprintf(pad, sizeof pad, "[PAD%d]", i);
        if (!(owned[i] = malloc((size_t)len + 1))) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (present) td_tokenizer_id_to_piece(t, i, owned[i], (size_t)len + 1);
        else memcpy(owned[i], pad, (size_t)len + 1);
        tokens[i] = owned[i];
        if (!present) types[i] = TT_UNUSED;
        else if (td_tokenizer_is_added(t, i)) types[i] = td_tokenizer_is_special(t, i) ? TT_CONTROL : TT_USER;
        else types[i] = TT_NORMAL;
        if (spm && types[i] == TT_NORMAL && len == 6 && !strncmp(owned[i], "<0x", 3) && owned[i][5] == '>')
            types[i] = TT_BYTE;
        if (spm && present && i == ti.unk_id) types[i] = TT_UNKNOWN;
    }
    if ((st = td_tokenizer_merges(t, &tm, &n_merges, err))) goto done;
    if (spm) {
        // SentencePiece vocabulary: scores make llama.cpp's merge-by-score reproduce the merge order:
        // score(piece) = -(rank of the first merge producing it); other pieces get -1e9.
        if (!(scores = malloc((size_t)n * sizeof *scores))) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < n; i++) scores[i] = -1e9f;
        for (size_t r = n_merges; r-- > 0;)  // backwards: the first rank wins
            if (tm[r].merged >= 0 && tm[r].merged < n) scores[tm[r].merged] = -(float)r;
    } else {
        // Merges as "a b" strings of the tokens' spellings.
        merges = calloc(n_merges + 1, sizeof *merges);
        mown = calloc(n_merges + 1, sizeof *mown);
        if (!merges || !mown) {
            st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (size_t r = 0; r < n_merges; r++) {
            const char *a = tokens[tm[r].left], *b = tokens[tm[r].right];
            size_t la = strlen(a), lb = strlen(b);
            if (!(mown[r] = malloc(la + lb + 2))) {
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
                goto done;
            }
            memcpy(mown[r], a, la);
            mown[r][la] = ' ';
            memcpy(mown[r] + la + 1, b, lb + 1);
            merges[r] = mown[r];
        }
    }
    st = td_gguf_w_str(w, "tokenizer.ggml.model", spm ? "llama" : "gpt2", spm ? 5 : 4, err);
    if (!st && byte_level) {
        const char *name = gguf_pre_name(&ti);
        if (!name && !ti.n_split)
            st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: the pre-tokenizer splits with no regex (a ByteLevel without "
                            "use_regex and no Split): none llama.cpp knows by name (GPT-2, Llama 3, Qwen2)", tjson);
        else if (!name)
            st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: the pre-tokenizer (%d Split, the first with the %s \"%.200s\"%s) "
                            "is none llama.cpp knows by name (GPT-2, Llama 3, Qwen2)", tjson, ti.n_split,
                            ti.split_literal ? "string" : "regex", ti.split_pattern,
                            ti.bytelevel_regex ? ", then ByteLevel's own GPT-2 regex" : "");
        else st = td_gguf_w_str(w, "tokenizer.ggml.pre", name, strlen(name), err);
    }
    if (!st) st = td_gguf_w_arr_str(w, "tokenizer.ggml.tokens", tokens, NULL, (uint64_t)n, err);
    if (!st && spm) st = td_gguf_w_arr(w, "tokenizer.ggml.scores", TD_GGUF_FLOAT32, scores, (uint64_t)n, err);
    if (!st) st = td_gguf_w_arr(w, "tokenizer.ggml.token_type", TD_GGUF_INT32, types, (uint64_t)n, err);
    if (!st && byte_level) st = td_gguf_w_arr_str(w, "tokenizer.ggml.merges", merges, NULL, (uint64_t)n_merges, err);
    if (st) goto done;
    // Special tokens: tokenizer_config.json names them; the model config is the fallback, then what
    // the tokenizer itself has (its post-processor's BOS).
    {
        const char *bt = td_tokenizer_bos_token(t), *et = td_tokenizer_eos_token(t);
        int64_t bos = bt ? td_tokenizer_token_id(t, bt, strlen(bt)) : -1;
        int64_t eos = et ? td_tokenizer_token_id(t, et, strlen(et)) : -1;
        if (bos < 0) bos = mc ? mc->bos_id : td_tokenizer_bos_id(t);
        if (eos < 0) eos = mc ? eos0(mc) : td_tokenizer_eos_id(t);
        if (!st && bos >= 0) st = td_gguf_w_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos, err);
        if (!st && eos >= 0) st = td_gguf_w_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos, err);
        if (!st && ti.unk_id >= 0) st = td_gguf_w_u32(w, "tokenizer.ggml.unknown_token_id", (uint32_t)ti.unk_id, err);
        if (!st && ti.pad_id >= 0) st = td_gguf_w_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)ti.pad_id, err);
        // add_bos / add_eos mirror what the post-processor adds with add_special_tokens.
        if (!st) st = td_gguf_w_bool(w, "tokenizer.ggml.add_bos_token", ti.n_prefix > 0, err);
        if (!st && ti.n_suffix > 0) st = td_gguf_w_bool(w, "tokenizer.ggml.add_eos_token", true, err);
        if (!st && spm) st = td_gguf_w_bool(w, "tokenizer.ggml.add_space_prefix", ti.add_space_prefix, err);
        const char *ct = td_tokenizer_chat_template(t);
        if (!st && ct) st = td_gguf_w_str(w, "tokenizer.chat_template", ct, strlen(ct), err);
    }
done:
    if (owned)
        for (int i = 0; i < n; i++) free(owned[i]);
    if (mown)
        for (size_t r = 0; r < n_merges; r++) free(mown[r]);
    free(owned);
    free(mown);
    free(merges);
    free(tm);
    free(tokens);
    free(types);
    free(scores);
    td_tokenizer_free(t);
    return st;
}

// ---- GGUF ------------------------------------------------------------------------------------

static const char *gguf_arch(td_arch a) {
    switch (a) {
    case TD_ARCH_QWEN2: return "qwen2";
    case TD_ARCH_QWEN3: return "qwen3";
    default: return "llama";  // llama.cpp runs Mistral as llama
    }
}

// llama.cpp's rope_freqs.weight for llama3 scaling: per frequency, the divisor that turns the
// unscaled inverse frequency into the scaled one (1 for short wavelengths, factor for long ones,
// interpolated between), computed in double as HF's _compute_llama3_parameters does.
static void llama3_rope_factors(const td_model_config *c, float *out) {
    int half = c->head_dim / 2;
    double factor = c->rope_factor, lo = c->rope_low_freq_factor, hi = c->rope_high_freq_factor,
           old = c->rope_orig_max_pos > 0 ? c->rope_orig_max_pos : 8192;
    double lo_wl = old / lo, hi_wl = old / hi;
    for (int i = 0; i < half; i++) {
        double inv = 1.0 / pow((double)c->rope_theta, (double)(2 * i) / c->head_dim);
        double wl = 2 * 3.14159265358979323846 / inv, scaled = wl > lo_wl ? inv / factor : inv;
        if (wl >= hi_wl && wl <= lo_wl) {
            double s = (old / wl - lo) / (hi - lo);
            scaled = (1 - s) * scaled / factor + s * scaled;
        }
        out[i] = (float)(inv / scaled);
    }
}

// The type a tensor is stored in: 2-D in the chosen type (F16 when a quantized type's block does
// not divide the rows, as llama.cpp's converter falls back), 1-D always F32. k-quants need rows of
// a multiple of 256: otherwise Q4_K falls back to Q5_0 and Q6_K to Q8_0 (as llama.cpp's quantize),
// each again to F16 if 32 does not divide the rows either.
static td_dtype tensor_type(td_dtype want, int ndim, int64_t cols) {
    if (ndim != 2) return TD_F32;
    if (want == TD_Q4_K && cols % TD_QK_K) want = TD_Q5_0;
    if (want == TD_Q6_K && cols % TD_QK_K) want = TD_Q8_0;
    if ((want == TD_Q8_0 || want == TD_Q4_0 || want == TD_Q5_0) && cols % TD_QK) return TD_F16;
    return want;
}

// llama.cpp's use_more_bits: the layers of a Q4_K_M file whose attn_v / ffn_down get Q6_K (the
// first and last eighth, and every third layer between).
static int use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

// The type of GGUF tensor `name` for the requested type `want` (a td_dtype or TD_EXPORT_Q4_K_M).
// Q4_K_M follows llama.cpp's recipe for dense Llama-family models: Q6_K for output.weight (or for
// token_embd.weight when there is no output.weight: tied embeddings), Q6_K for attn_v and
// ffn_down in the use_more_bits layers, Q4_K for every other matrix (token_embd included); the
// k-quant fallbacks of tensor_type apply. n_layers: the model's layer count.
static td_dtype pick_type(int want, const char *name, int ndim, int64_t cols, int n_layers, int has_output) {
    if (want != TD_EXPORT_Q4_K_M) return tensor_type((td_dtype)want, ndim, cols);
    td_dtype t = TD_Q4_K;
    int layer = -1;
    if (!strcmp(name, "output.weight") || (!has_output && !strcmp(name, "token_embd.weight"))) {
        t = TD_Q6_K;
    } else if ((strstr(name, "attn_v.weight") || strstr(name, "ffn_down")) && sscanf(name, "blk.%d.", &layer) == 1 &&
               layer >= 0 && layer < n_layers && use_more_bits(layer, n_layers)) {
        t = TD_Q6_K;
    }
    return tensor_type(t, ndim, cols);
}

// 1 for the types whose files carry general.quantization_version.
static int is_quantized_type(int t) {
    return t == TD_Q8_0 || t == TD_Q4_0 || t == TD_Q5_0 || t == TD_Q4_K || t == TD_Q6_K || t == TD_EXPORT_Q4_K_M;
}

static td_status gguf_hparams(td_gguf_writer *w, const td_model_config *c, const td_export_params *p, td_err *err) {
    const char *arch = gguf_arch(c->arch);
    char k[128];
    td_status st;
    const char *name = p->name ? p->name : "tandem";
    if ((st = td_gguf_w_str(w, "general.architecture", arch, strlen(arch), err)) ||
        (st = td_gguf_w_str(w, "general.name", name, strlen(name), err)) ||
        (st = td_gguf_w_u32(w, "general.file_type", td_export_file_type(p->type), err)) ||
        (st = td_gguf_w_u32(w, "general.alignment", TD_GGUF_ALIGNMENT, err)))
        return st;
    // ggml's quantization format version (2 since 2023), which llama.cpp's writers add to quantized files.
    if (is_quantized_type((int)p->type) && (st = td_gguf_w_u32(w, "general.quantization_version", 2, err)))
        return st;
#define U32(KEY, V) (snprintf(k, sizeof k, "%s." KEY, arch), td_gguf_w_u32(w, k, (uint32_t)(V), err))
#define F32(KEY, V) (snprintf(k, sizeof k, "%s." KEY, arch), td_gguf_w_f32(w, k, (V), err))
    if ((st = U32("vocab_size", c->vocab_size)) || (st = U32("context_length", c->max_pos)) ||
        (st = U32("embedding_length", c->dim)) || (st = U32("block_count", c->n_layers)) ||
        (st = U32("feed_forward_length", c->ffn_dim)) || (st = U32("attention.head_count", c->n_heads)) ||
        (st = U32("attention.head_count_kv", c->n_kv_heads)) ||
        (st = F32("attention.layer_norm_rms_epsilon", c->norm_eps)) || (st = F32("rope.freq_base", c->rope_theta)) ||
        (st = U32("rope.dimension_count", c->head_dim)) || (st = U32("attention.key_length", c->head_dim)) ||
        (st = U32("attention.value_length", c->head_dim)))
        return st;
    if (c->rope_scaling == TD_ROPE_SCALING_LINEAR) {
        snprintf(k, sizeof k, "%s.rope.scaling.type", arch);
        if ((st = td_gguf_w_str(w, k, "linear", 6, err)) || (st = F32("rope.scaling.factor", c->rope_factor))) return st;
    }
#undef U32
#undef F32
    return TD_OK;
}

// Rows of one f32 tensor encoded by the pool's workers (row r from source row perm(r) when the
// heads are permuted); the bytes are those of a one-thread loop.
typedef struct {
    const float *buf;
    uint8_t *enc;
    td_dtype to;
    int64_t rows, cols;
    int perm_heads;
} encode_job;

static void encode_task(void *job_, int ith, int nth) {
    const encode_job *j = job_;
    const size_t rb = td_row_bytes(j->to, j->cols);
    long lo, hi;
    td_split((long)j->rows, ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        const int64_t src = j->perm_heads ? perm_src_row(r, j->rows, j->perm_heads, 0) : r;
        td_from_f32(j->to, j->buf + src * j->cols, j->enc + (size_t)r * rb, j->cols);
    }
}

td_status td_export_gguf(const char *path, const td_model_config *cfg, const td_export_params *p,
                         td_export_get_fn get, void *ctx, td_err *err) {
    td_export_params dp = td_export_default_params();
    if (!p) p = &dp;
    td_status st = check_common(cfg, p, err);
    if (st) return st;
    if (cfg->rope_scaling == TD_ROPE_SCALING_LLAMA3 && !gguf_arch_is_llama(cfg))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "export: llama3 rope scaling on %s has no GGUF form",
                          td_arch_name(cfg->arch));
    td_gguf_writer *w = td_gguf_w_new();
    tinfo *ts = calloc((size_t)n_tensors_max(cfg), sizeof *ts);
    float *buf = NULL;
    uint8_t *enc = NULL;
    td_pool *pool = NULL;
    if (!w || !ts) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto done;
    }
    int nt = list_tensors(cfg, 1, ts);
    int rope_freqs = cfg->rope_scaling == TD_ROPE_SCALING_LLAMA3;
    if ((st = gguf_hparams(w, cfg, p, err))) goto done;
    if (p->tokenizer && (st = td_export_tokenizer_gguf(w, p->tokenizer, cfg->vocab_size, cfg, err))) goto done;
    size_t max_n = (size_t)cfg->head_dim, max_b = 0;
    int has_output = 0;
    for (int i = 0; i < nt; i++) has_output |= !strcmp(ts[i].gguf, "output.weight");
    for (int i = 0; i < nt; i++) {
        td_dtype t = pick_type((int)p->type, ts[i].gguf, ts[i].ndim, ts[i].ne[1], cfg->n_layers, has_output);
        if ((st = td_gguf_w_tensor(w, ts[i].gguf, td_export_ggml_type(t), ts[i].ndim, ts[i].ne, err))) goto done;
        size_t n = (size_t)tinfo_nelem(&ts[i]);
        if (n > max_n) max_n = n;
        if (td_gguf_w_tensor_bytes(w, i) > max_b) max_b = td_gguf_w_tensor_bytes(w, i);
    }
    int64_t half = cfg->head_dim / 2;
    if (rope_freqs && (st = td_gguf_w_tensor(w, "rope_freqs.weight", TD_GGML_F32, 1, &half, err))) goto done;
    buf = malloc(max_n * sizeof *buf);
    enc = malloc(max_b > max_n * 4 ? max_b : max_n * 4);
    pool = td_pool_create(0);  // all CPUs; NULL runs the encoding inline
    if (!buf || !enc) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory for a %zu-element tensor", max_n);
        goto done;
    }
    if ((st = td_gguf_w_begin(w, path, err))) goto done;
    for (int i = 0; i < nt; i++) {
        const tinfo *t = &ts[i];
        td_dtype ty = pick_type((int)p->type, t->gguf, t->ndim, t->ne[1], cfg->n_layers, has_output);
        if ((st = fetch(get, ctx, t, buf, err))) goto done;
        int64_t rows = t->ndim == 2 ? t->ne[0] : 1, cols = t->ndim == 2 ? t->ne[1] : t->ne[0];
        size_t rb = td_row_bytes(ty, cols);
        if (t->perm_heads && t->ndim == 1) {  // a permuted bias: rows of one value
            float *o = (float *)enc;
            for (int64_t r = 0; r < cols; r++) o[r] = buf[perm_src_row(r, cols, t->perm_heads, 0)];
        } else {
            encode_job job = {buf, enc, ty, rows, cols, t->perm_heads};
            td_pool_run(pool, encode_task, &job);
        }
        if ((st = td_gguf_w_data(w, enc, rb * (size_t)rows, err))) goto done;
    }
    if (rope_freqs) {
        llama3_rope_factors(cfg, buf);
        if ((st = td_gguf_w_data(w, buf, (size_t)half * 4, err))) goto done;
    }
    st = td_gguf_w_finish(w, err);
done:
    td_pool_free(pool);
    td_gguf_w_free(w);
    free(ts);
    free(buf);
    free(enc);
    return st;
}

// ---- GGUF -> GGUF ----------------------------------------------------------------------------

// Copies metadata pair i of g into w (general.file_type replaced by file_type).
static td_status copy_kv(td_gguf_writer *w, const td_gguf *g, int64_t i, uint32_t file_type, td_err *err) {
    td_gguf_str ks = td_gguf_key(g, i);
    char key[1024];
    if (ks.len >= sizeof key) return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: metadata key too long", td_gguf_path(g));
    memcpy(key, ks.ptr, ks.len);
    key[ks.len] = 0;
    if (!strcmp(key, "general.file_type")) return td_gguf_w_u32(w, key, file_type, err);
    if (!strcmp(key, "general.alignment")) return td_gguf_w_u32(w, key, TD_GGUF_ALIGNMENT, err);
    td_gguf_type t = td_gguf_kv_type(g, i);
    td_status st;
    if (t == TD_GGUF_STRING) {
        td_gguf_str s;
        if ((st = td_gguf_get_str(g, key, &s, err))) return st;
        return td_gguf_w_str(w, key, s.ptr, s.len, err);
    }
    if (t == TD_GGUF_ARRAY) {
        td_gguf_type et = td_gguf_arr_type(g, i);
        uint64_t n = td_gguf_arr_len(g, i);
        if (et == TD_GGUF_STRING) {
            const char **p = malloc((n ? n : 1) * sizeof *p);
            size_t *l = malloc((n ? n : 1) * sizeof *l);
            if (!p || !l) {
                free(p);
                free(l);
                return td_err_set(err, TD_ERR_NOMEM, "out of memory");
            }
            for (uint64_t j = 0; j < n; j++) {
                td_gguf_str s = td_gguf_arr_str(g, i, j);
                p[j] = s.ptr;
                l[j] = s.len;
            }
            st = td_gguf_w_arr_str(w, key, p, l, n, err);
            free(p);
            free(l);
            return st;
        }
        if (et == TD_GGUF_ARRAY) {
            TD_LOGW("%s: metadata %s (an array of arrays) is not copied", td_gguf_path(g), key);
            return TD_OK;
        }
        return td_gguf_w_arr(w, key, et, td_gguf_arr_data(g, i), n, err);
    }
    size_t sz = td_gguf_scalar_size(t);
    if (!sz) return td_err_set(err, TD_ERR_FORMAT, "%s: metadata %s has type %d", td_gguf_path(g), key, (int)t);
    uint8_t v[8] = {0};
    if (t == TD_GGUF_FLOAT32) {
        float f;
        if ((st = td_gguf_get_f32(g, key, &f, err))) return st;
        memcpy(v, &f, 4);
    } else if (t == TD_GGUF_FLOAT64) {
        float f;
        if ((st = td_gguf_get_f32(g, key, &f, err))) return st;
        double d = f;
        memcpy(v, &d, 8);
    } else if (t == TD_GGUF_BOOL) {
        bool b;
        if ((st = td_gguf_get_bool(g, key, &b, err))) return st;
        v[0] = b;
    } else {
        int64_t x;
        if ((st = td_gguf_get_i64(g, key, &x, err))) return st;
        memcpy(v, &x, 8);  // little-endian: the low bytes are the narrower value
    }
    return td_gguf_w_scalar(w, key, t, v, err);
}

// Rows [r0, r1) of one tensor, dequantized and requantized by the pool's workers (rows are
// independent, so the bytes are those of a one-thread loop).
typedef struct {
    const td_tensor *t;
    td_dtype to;
    int64_t cols, r0, r1;
    float *rows;  // [n_threads][cols] f32 scratch
    uint8_t *enc; // [r1 - r0] encoded rows
} requant_job;

static void requant_task(void *job_, int ith, int nth) {
    const requant_job *j = job_;
    const size_t srb = td_row_bytes(j->t->type, j->cols), drb = td_row_bytes(j->to, j->cols);
    float *row = j->rows + (size_t)ith * (size_t)j->cols;
    long lo, hi;
    td_split((long)(j->r1 - j->r0), ith, nth, &lo, &hi);
    for (long r = lo; r < hi; r++) {
        td_to_f32(j->t->type, (const uint8_t *)j->t->data + (size_t)(j->r0 + r) * srb, row, j->cols);
        td_from_f32(j->to, row, j->enc + (size_t)r * drb, j->cols);
    }
}

enum { REQUANT_CHUNK_BYTES = 16 << 20 };  // encoded bytes per parallel step (a bounded buffer)

td_status td_export_requantize(const char *in, const char *out, td_dtype type, bool *was_quantized, td_err *err) {
    if (was_quantized) *was_quantized = false;
    if ((unsigned)type >= TD_DTYPE_COUNT && (int)type != TD_EXPORT_Q4_K_M)
        return td_err_set(err, TD_ERR_INVALID, "requantize: unknown type %d", (int)type);
    td_gguf *g = NULL;
    td_status st = td_gguf_open(in, &g, err);
    if (st) return st;
    td_gguf_writer *w = td_gguf_w_new();
    td_tensor *ts = NULL;
    td_dtype *types = NULL;
    float *row = NULL;
    uint8_t *enc = NULL;
    td_pool *pool = NULL;
    int64_t nt = td_gguf_n_tensors(g);
    if (!w || !(ts = calloc((size_t)nt + 1, sizeof *ts)) || !(types = calloc((size_t)nt + 1, sizeof *types))) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < td_gguf_n_kv(g) && !st; i++) st = copy_kv(w, g, i, td_export_file_type(type), err);
    if (st) goto done;
    if (td_gguf_find_key(g, "general.file_type") < 0 &&
        (st = td_gguf_w_u32(w, "general.file_type", td_export_file_type(type), err)))
        goto done;
    if (is_quantized_type((int)type) && td_gguf_find_key(g, "general.quantization_version") < 0 &&
        (st = td_gguf_w_u32(w, "general.quantization_version", 2, err)))
        goto done;
    if (td_gguf_find_key(g, "general.alignment") < 0 &&
        (st = td_gguf_w_u32(w, "general.alignment", TD_GGUF_ALIGNMENT, err)))
        goto done;
    int64_t max_cols = 1;
    size_t max_rb = 1;
    // Q4_K_M's per-layer choices: the layer count is the number of attn_v tensors (llama.cpp counts
    // them the same way); tied embeddings: no output.weight.
    int n_layers = 0, has_output = 0;
    for (int64_t i = 0; i < nt; i++) {
        td_gguf_str ns = td_gguf_tensor_name(g, i);
        n_layers += ns.len >= 13 && !memcmp(ns.ptr + ns.len - 13, "attn_v.weight", 13);
        has_output |= ns.len == 13 && !memcmp(ns.ptr, "output.weight", 13);
    }
    for (int64_t i = 0; i < nt; i++) {
        td_gguf_str ns = td_gguf_tensor_name(g, i);
        char name[512];
        if (ns.len >= sizeof name) {
            st = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: tensor name too long", in);
            goto done;
        }
        memcpy(name, ns.ptr, ns.len);
        name[ns.len] = 0;
        if ((st = td_gguf_get_tensor(g, name, &ts[i], err))) goto done;
        if (is_quantized_type((int)ts[i].type)) {
            if (was_quantized) *was_quantized = true;
        }
        int64_t cols = ts[i].ne[ts[i].ndim - 1];
        // Matrices (2-D and up) take the new type; vectors stay F32, as llama.cpp keeps them.
        types[i] = pick_type((int)type, name, ts[i].ndim >= 2 ? 2 : 1, cols, n_layers, has_output);
        if (cols > max_cols) max_cols = cols;
        if (td_row_bytes(types[i], cols) > max_rb) max_rb = td_row_bytes(types[i], cols);
        if ((st = td_gguf_w_tensor(w, name, td_export_ggml_type(types[i]), ts[i].ndim, ts[i].ne, err))) goto done;
    }
    pool = td_pool_create(0);  // all CPUs; NULL (no threads) runs the tasks inline
    const int nth = pool ? td_pool_size(pool) : 1;
    const size_t chunk_rows = REQUANT_CHUNK_BYTES / max_rb > 0 ? REQUANT_CHUNK_BYTES / max_rb : 1;
    row = malloc((size_t)nth * (size_t)max_cols * sizeof *row);
    enc = malloc(chunk_rows * max_rb);
    if (!row || !enc) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((st = td_gguf_w_begin(w, out, err))) goto done;
    for (int64_t i = 0; i < nt; i++) {
        const td_tensor *t = &ts[i];
        int64_t cols = t->ne[t->ndim - 1], rows = td_tensor_nelem(t) / cols;
        size_t drb = td_row_bytes(types[i], cols);
        for (int64_t r0 = 0; r0 < rows; r0 += (int64_t)chunk_rows) {
            requant_job job = {t, types[i], cols, r0, rows - r0 < (int64_t)chunk_rows ? rows : r0 + (int64_t)chunk_rows,
                               row, enc};
            td_pool_run(pool, requant_task, &job);
            if ((st = td_gguf_w_data(w, enc, drb * (size_t)(job.r1 - r0), err))) goto done;
        }
    }
    st = td_gguf_w_finish(w, err);
done:
    td_pool_free(pool);
    td_gguf_w_free(w);
    td_gguf_close(g);
    free(ts);
    free(types);
    free(row);
    free(enc);
    return st;
}

// ---- GGUF vocabulary -> tokenizer.json -------------------------------------------------------

static cJSON *str_n(td_gguf_str s) {
    char *b = malloc(s.len + 1);
    if (!b) return NULL;
    memcpy(b, s.ptr, s.len);
    b[s.len] = 0;
    cJSON *j = cJSON_CreateString(b);
    free(b);
    return j;
}

static int gstr_is(td_gguf_str s, const char *z) { return s.len == strlen(z) && !memcmp(s.ptr, z, s.len); }

// {"type": "ByteLevel", ...} with the given flags.
static cJSON *byte_level(int add_prefix_space, int trim_offsets, int use_regex) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}


static cJSON *replace_op(const char *from, const char *to) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "Replace");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(o, "pattern"), "String", from);
    cJSON_AddStringToObject(o, "content", to);
    return o;
}

typedef struct {
    float score;
    int32_t id;
} scored;

static int by_score(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->score != y->score) return x->score > y->score ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}
static int by_pair(const void *a, const void *b) {
    const int32_t *x = a, *y = b;
    if (x[0] != y[0]) return (x[0] > y[0]) - (x[0] < y[0]);
    return (x[1] > y[1]) - (x[1] < y[1]);
}

// BPE merges equivalent to llama.cpp's SentencePiece merge-by-score (as transformers'
// SentencePieceExtractor builds them): every split of a piece into two vocabulary pieces is a
// merge, ranked by the merged piece's score (higher first; ties by id, then by the parts' ids).
// Pieces scored -1e9 or below (never produced by a merge, e.g. tandem's converted scores) get none.
static td_status spm_merges(const td_gguf *g, int64_t it, int64_t ity, int64_t isc, uint64_t n, cJSON *out,
                            td_err *err) {
    strmap vm = {0};
    scored *ord = malloc((n ? n : 1) * sizeof *ord);
    int32_t(*pairs)[2] = NULL;
    size_t np_cap = 0, n_ord = 0;
    td_status st = TD_OK;
    if (!ord || !strmap_init(&vm, n)) {
        st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (uint64_t i = 0; i < n; i++) {
        td_gguf_str s = td_gguf_arr_str(g, it, i);
        strmap_put(&vm, s.ptr, s.len, (int32_t)i);
        float sc = (float)td_gguf_arr_f64(g, isc, i);
        int64_t ty = ity >= 0 ? td_gguf_arr_i64(g, ity, i) : TT_NORMAL;
        if (ty == TT_NORMAL && s.len > 1 && sc > -1e8f) ord[n_ord++] = (scored){sc, (int32_t)i};
    }
    qsort(ord, n_ord, sizeof *ord, by_score);
    for (size_t k = 0; k < n_ord; k++) {
        td_gguf_str s = td_gguf_arr_str(g, it, (uint64_t)ord[k].id);
        size_t np = 0;
        for (size_t c = 1; c < s.len; c++) {
            if (((uint8_t)s.ptr[c] & 0xC0) == 0x80) continue;  // not a character boundary
            int32_t l = strmap_get(&vm, s.ptr, c), r = strmap_get(&vm, s.ptr + c, s.len - c);
            if (l < 0 || r < 0) continue;
            if (np == np_cap) {
                size_t nc = np_cap ? 2 * np_cap : 16;
                int32_t(*pp)[2] = realloc(pairs, nc * sizeof *pairs);
                if (!pp) {
                    st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
                    goto done;
                }
                pairs = pp;
                np_cap = nc;
            }
            pairs[np][0] = l;
            pairs[np][1] = r;
            np++;
        }
        qsort(pairs, np, sizeof *pairs, by_pair);
        for (size_t q = 0; q < np; q++) {
            td_gguf_str a = td_gguf_arr_str(g, it, (uint64_t)pairs[q][0]), b = td_gguf_arr_str(g, it, (uint64_t)pairs[q][1]);
            char *m = malloc(a.len + b.len + 2);
            if (!m) {
                st = td_err_set(err, TD_ERR_NOMEM, "out of memory");
                goto done;
            }
            memcpy(m, a.ptr, a.len);
            m[a.len] = ' ';
            memcpy(m + a.len + 1, b.ptr, b.len);
            m[a.len + 1 + b.len] = 0;
            cJSON *item;
            if (memchr(a.ptr, ' ', a.len) || memchr(b.ptr, ' ', b.len)) {  // spaces need the [a, b] form
                item = cJSON_CreateArray();
                m[a.len] = 0;
                cJSON_AddItemToArray(item, cJSON_CreateString(m));
                cJSON_AddItemToArray(item, cJSON_CreateString(m + a.len + 1));
            } else {
                item = cJSON_CreateString(m);
            }
            free(m);
            cJSON_AddItemToArray(out, item);
        }
    }
done:
    strmap_free(&vm);
    free(ord);
    free(pairs);
    return st;
}

td_status td_export_tokenizer_json(const td_gguf *g, const char *dir, int max_pos, td_err *err) {
    td_gguf_str model = {0}, pre = {0};
    if (td_gguf_get_str(g, "tokenizer.ggml.model", &model, NULL))
        return td_err_set(err, TD_ERR_NOT_FOUND, "%s: no tokenizer.ggml.model", td_gguf_path(g));
    int spm = gstr_is(model, "llama");
    if (!spm && !gstr_is(model, "gpt2"))
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: tokenizer model \"%.*s\" cannot be written as tokenizer.json "
                          "(only \"gpt2\" and \"llama\" vocabularies)", td_gguf_path(g), (int)model.len, model.ptr);
    const char *re = NULL;
    int nfc = 0, ignore_merges = 0;
    if (spm || td_gguf_get_str(g, "tokenizer.ggml.pre", &pre, NULL) || gstr_is(pre, "gpt-2") ||
        gstr_is(pre, "default")) {
        re = NULL;
    } else if (gstr_is(pre, "llama-bpe") || gstr_is(pre, "llama3")) {
        re = LLAMA3_RE;
        ignore_merges = 1;
    } else if (gstr_is(pre, "qwen2")) {
        re = QWEN2_RE;
        nfc = 1;
    } else {
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: pre-tokenizer \"%.*s\" cannot be written as tokenizer.json",
                          td_gguf_path(g), (int)pre.len, pre.ptr);
    }
    int64_t it = td_gguf_find_key(g, "tokenizer.ggml.tokens"), ity = td_gguf_find_key(g, "tokenizer.ggml.token_type"),
            im = td_gguf_find_key(g, "tokenizer.ggml.merges"), isc = td_gguf_find_key(g, "tokenizer.ggml.scores");
    if (it < 0 || td_gguf_arr_type(g, it) != TD_GGUF_STRING ||
        (!spm && (im < 0 || td_gguf_arr_type(g, im) != TD_GGUF_STRING)))
        return td_err_set(err, TD_ERR_FORMAT, "%s: vocabulary without tokens/merges string arrays", td_gguf_path(g));
    uint64_t n = td_gguf_arr_len(g, it);
    if (n > (1u << 24)) return td_err_set(err, TD_ERR_LIMIT, "%s: %llu tokens", td_gguf_path(g), (unsigned long long)n);
    if (ity >= 0 && td_gguf_arr_len(g, ity) != n)
        return td_err_set(err, TD_ERR_FORMAT, "%s: token_type length differs from tokens", td_gguf_path(g));
    if (spm && (isc < 0 || td_gguf_arr_len(g, isc) != n || td_gguf_arr_type(g, isc) == TD_GGUF_STRING ||
                td_gguf_arr_type(g, isc) == TD_GGUF_ARRAY))
        return td_err_set(err, TD_ERR_FORMAT, "%s: llama vocabulary without numeric scores per token", td_gguf_path(g));
    int64_t bos = -1, eos = -1, unk = -1;
    bool add_bos = spm, add_space_prefix = true;  // llama.cpp's defaults
    td_gguf_get_i64(g, "tokenizer.ggml.bos_token_id", &bos, NULL);
    td_gguf_get_i64(g, "tokenizer.ggml.eos_token_id", &eos, NULL);
    td_gguf_get_i64(g, "tokenizer.ggml.unknown_token_id", &unk, NULL);
    td_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add_bos, NULL);
    td_gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &add_space_prefix, NULL);
    if (bos >= (int64_t)n) bos = -1;
    if (eos >= (int64_t)n) eos = -1;
    if (unk >= (int64_t)n) unk = -1;
    for (uint64_t i = 0; spm && unk < 0 && ity >= 0 && i < n; i++)
        if (td_gguf_arr_i64(g, ity, i) == TT_UNKNOWN) unk = (int64_t)i;

    cJSON *tj = cJSON_CreateObject(), *tc = cJSON_CreateObject();
    cJSON_AddStringToObject(tj, "version", "1.0");
    cJSON_AddNullToObject(tj, "truncation");
    cJSON_AddNullToObject(tj, "padding");
    cJSON *added = cJSON_AddArrayToObject(tj, "added_tokens");
    cJSON *atd = cJSON_CreateObject();  // tokenizer_config.json added_tokens_decoder
    cJSON *vocab = cJSON_CreateObject();
    for (uint64_t i = 0; i < n; i++) {
        int64_t ty = ity >= 0 ? td_gguf_arr_i64(g, ity, i) : TT_NORMAL;
        td_gguf_str s = td_gguf_arr_str(g, it, i);
        if (ty == TT_NORMAL || (spm && ty != TT_UNUSED)) {
            char *b = malloc(s.len + 1);
            if (!b) continue;
            memcpy(b, s.ptr, s.len);
            b[s.len] = 0;
            cJSON_AddNumberToObject(vocab, b, (double)i);
            free(b);
        }
        if (ty == TT_CONTROL || ty == TT_USER || (int64_t)i == bos || (int64_t)i == eos || (int64_t)i == unk) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddItemToObject(a, "content", str_n(s));
            cJSON_AddBoolToObject(a, "single_word", 0);
            cJSON_AddBoolToObject(a, "lstrip", 0);
            cJSON_AddBoolToObject(a, "rstrip", 0);
            cJSON_AddBoolToObject(a, "normalized", 0);
            cJSON_AddBoolToObject(a, "special", ty != TT_USER);
            cJSON_AddItemToArray(added, a);
            char idb[24];
            snprintf(idb, sizeof idb, "%llu", (unsigned long long)i);
            cJSON *d = cJSON_Duplicate(a, 1);
            cJSON_DeleteItemFromObject(d, "id");
            cJSON_AddItemToObject(atd, idb, d);
        }
    }
    if (spm) {
        // SentencePiece: spaces become U+2581 (plus one in front when add_space_prefix); no
        // pre-tokenizer; the decoder undoes it and fuses byte-fallback tokens.
        cJSON *no = cJSON_AddObjectToObject(tj, "normalizer");
        cJSON_AddStringToObject(no, "type", "Sequence");
        cJSON *ns = cJSON_AddArrayToObject(no, "normalizers");
        if (add_space_prefix) {
            cJSON *pp = cJSON_CreateObject();
            cJSON_AddStringToObject(pp, "type", "Prepend");
            cJSON_AddStringToObject(pp, "prepend", "\xe2\x96\x81");
            cJSON_AddItemToArray(ns, pp);
        }
        cJSON_AddItemToArray(ns, replace_op(" ", "\xe2\x96\x81"));
        cJSON_AddNullToObject(tj, "pre_tokenizer");
    } else if (nfc) {
        cJSON *no = cJSON_AddObjectToObject(tj, "normalizer");
        cJSON_AddStringToObject(no, "type", "NFC");
    } else {
        cJSON_AddNullToObject(tj, "normalizer");
    }
    if (spm) {
        // (set above)
    } else if (re) {
        cJSON *pt = cJSON_AddObjectToObject(tj, "pre_tokenizer");
        cJSON_AddStringToObject(pt, "type", "Sequence");
        cJSON *seq = cJSON_AddArrayToObject(pt, "pretokenizers");
        cJSON *sp = cJSON_CreateObject();
        cJSON_AddStringToObject(sp, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(sp, "pattern"), "Regex", re);
        cJSON_AddStringToObject(sp, "behavior", "Isolated");
        cJSON_AddBoolToObject(sp, "invert", 0);
        cJSON_AddItemToArray(seq, sp);
        cJSON_AddItemToArray(seq, byte_level(0, 1, 0));
    } else {
        cJSON_AddItemToObject(tj, "pre_tokenizer", byte_level(0, 1, 1));
    }
    if (add_bos && bos >= 0) {
        cJSON *pp = cJSON_AddObjectToObject(tj, "post_processor");
        cJSON *bt = str_n(td_gguf_arr_str(g, it, (uint64_t)bos));
        const char *bs = cJSON_GetStringValue(bt);
        cJSON_AddStringToObject(pp, "type", "TemplateProcessing");
        const char *parts[2][2] = {{"A", NULL}, {"A", "B"}};
        for (int k = 0; k < 2; k++) {
            cJSON *arr = cJSON_AddArrayToObject(pp, k ? "pair" : "single");
            for (int q = 0; q < 2 && parts[k][q]; q++) {
                cJSON *stok = cJSON_CreateObject(), *inner = cJSON_AddObjectToObject(stok, "SpecialToken");
                cJSON_AddStringToObject(inner, "id", bs);
                cJSON_AddNumberToObject(inner, "type_id", q);
                cJSON_AddItemToArray(arr, stok);
                cJSON *sq = cJSON_CreateObject(), *si = cJSON_AddObjectToObject(sq, "Sequence");
                cJSON_AddStringToObject(si, "id", parts[k][q]);
                cJSON_AddNumberToObject(si, "type_id", q);
                cJSON_AddItemToArray(arr, sq);
            }
        }
        cJSON *st = cJSON_AddObjectToObject(pp, "special_tokens"), *e = cJSON_AddObjectToObject(st, bs);
        cJSON_AddStringToObject(e, "id", bs);
        cJSON_AddItemToArray(cJSON_AddArrayToObject(e, "ids"), cJSON_CreateNumber((double)bos));
        cJSON_AddItemToArray(cJSON_AddArrayToObject(e, "tokens"), cJSON_CreateString(bs));
        cJSON_Delete(bt);
    } else if (spm) {
        cJSON_AddNullToObject(tj, "post_processor");
    } else {
        cJSON_AddItemToObject(tj, "post_processor", byte_level(1, 0, 1));
    }
    if (spm) {
        cJSON *de = cJSON_AddObjectToObject(tj, "decoder");
        cJSON_AddStringToObject(de, "type", "Sequence");
        cJSON *ds = cJSON_AddArrayToObject(de, "decoders");
        cJSON_AddItemToArray(ds, replace_op("\xe2\x96\x81", " "));
        cJSON *x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "ByteFallback");
        cJSON_AddItemToArray(ds, x);
        x = cJSON_CreateObject();
        cJSON_AddStringToObject(x, "type", "Fuse");
        cJSON_AddItemToArray(ds, x);
        if (add_space_prefix) {
            x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "type", "Strip");
            cJSON_AddStringToObject(x, "content", " ");
            cJSON_AddNumberToObject(x, "start", 1);
            cJSON_AddNumberToObject(x, "stop", 0);
            cJSON_AddItemToArray(ds, x);
        }
    } else {
        cJSON_AddItemToObject(tj, "decoder", byte_level(1, 1, 1));
    }
    cJSON *m = cJSON_AddObjectToObject(tj, "model");
    cJSON_AddStringToObject(m, "type", "BPE");
    cJSON_AddNullToObject(m, "dropout");
    if (unk >= 0 && spm) cJSON_AddItemToObject(m, "unk_token", str_n(td_gguf_arr_str(g, it, (uint64_t)unk)));
    else cJSON_AddNullToObject(m, "unk_token");
    cJSON_AddNullToObject(m, "continuing_subword_prefix");
    cJSON_AddNullToObject(m, "end_of_word_suffix");
    cJSON_AddBoolToObject(m, "fuse_unk", spm);
    cJSON_AddBoolToObject(m, "byte_fallback", spm);
    cJSON_AddBoolToObject(m, "ignore_merges", ignore_merges);
    cJSON_AddItemToObject(m, "vocab", vocab);
    cJSON *ma = cJSON_AddArrayToObject(m, "merges");
    td_status st = TD_OK;
    if (spm) st = spm_merges(g, it, ity, isc, n, ma, err);
    else
        for (uint64_t i = 0; i < td_gguf_arr_len(g, im); i++) cJSON_AddItemToArray(ma, str_n(td_gguf_arr_str(g, im, i)));

    cJSON_AddBoolToObject(tc, "add_bos_token", add_bos);
    cJSON_AddBoolToObject(tc, "add_eos_token", 0);
    cJSON_AddItemToObject(tc, "added_tokens_decoder", atd);
    if (bos >= 0) cJSON_AddItemToObject(tc, "bos_token", str_n(td_gguf_arr_str(g, it, (uint64_t)bos)));
    td_gguf_str ct;
    if (!td_gguf_get_str(g, "tokenizer.chat_template", &ct, NULL)) cJSON_AddItemToObject(tc, "chat_template", str_n(ct));
    cJSON_AddBoolToObject(tc, "clean_up_tokenization_spaces", 0);
    if (eos >= 0) cJSON_AddItemToObject(tc, "eos_token", str_n(td_gguf_arr_str(g, it, (uint64_t)eos)));
    if (max_pos > 0) cJSON_AddNumberToObject(tc, "model_max_length", max_pos);
    cJSON_AddStringToObject(tc, "tokenizer_class", "PreTrainedTokenizerFast");

    char path[4096];
    if (!st && !td_path_join(path, sizeof path, dir, "tokenizer.json")) st = td_err_set(err, TD_ERR_INVALID, "path too long");
    if (!st) st = write_json_atomic(path, tj, err);
    if (!st && !td_path_join(path, sizeof path, dir, "tokenizer_config.json"))
        st = td_err_set(err, TD_ERR_INVALID, "path too long");
    if (!st) st = write_json_atomic(path, tc, err);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    return st;
}
