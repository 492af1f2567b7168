// Model configuration from Hugging Face config.json / generation_config.json or GGUF metadata,
// and its consistency checks. Defaults follow transformers' LlamaConfig, MistralConfig,
// Qwen2Config and Qwen3Config. Not a loader of weights (loader.c) nor of tokenizers.
#include "model/config.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "format/gguf.h"

const char *td_arch_name(td_arch a) {
    switch (a) {
    case TD_ARCH_LLAMA: return "llama";
    case TD_ARCH_MISTRAL: return "mistral";
    case TD_ARCH_QWEN2: return "qwen2";
    case TD_ARCH_QWEN3: return "qwen3";
    }
    return "unknown";
}

void td_model_config_init(td_model_config *c) {
    memset(c, 0, sizeof *c);
    c->arch = TD_ARCH_LLAMA;
    c->norm_eps = 1e-6f;
    c->rope_theta = 10000.0f;
    c->rope_style = TD_ROPE_NEOX;
    c->rope_scaling = TD_ROPE_SCALING_NONE;
    c->rope_factor = 1.0f;
    c->bos_id = -1;
    c->gen_temperature = -1;
    c->gen_top_p = -1;
    c->gen_top_k = -1;
    c->gen_min_p = -1;
}

static void add_eos(td_model_config *c, int64_t id) {
    if (id < 0 || id > INT32_MAX) return;
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return;
    if (c->n_eos < TD_MAX_EOS) c->eos_ids[c->n_eos++] = (int)id;
}

// ---- config.json --------------------------------------------------------------------------

// The shape fields' allowed ranges [1, cap]: the caps keep every product below in range (products
// of two fit in int64, of sizes in int). Shared by json_int (as read) and td_config_validate.
#define SHAPE_CAP (1 << 24)
static const struct { const char *name; int cap; } SHAPE_RANGE[] = {
    {"vocab_size", 1 << 26},          {"hidden_size", SHAPE_CAP},         {"num_hidden_layers", 1 << 16},
    {"num_attention_heads", 1 << 16}, {"num_key_value_heads", 1 << 16},   {"head_dim", 1 << 16},
    {"intermediate_size", SHAPE_CAP}, {"max_position_embeddings", 1 << 30},
};

static int shape_cap(const char *key) {
    for (size_t i = 0; i < sizeof SHAPE_RANGE / sizeof SHAPE_RANGE[0]; i++)
        if (!strcmp(SHAPE_RANGE[i].name, key)) return SHAPE_RANGE[i].cap;
    return 0;
}

static const char *json_type_name(const cJSON *j) {
    return cJSON_IsString(j) ? "a string" : cJSON_IsBool(j) ? "a boolean" : cJSON_IsArray(j) ? "an array"
           : cJSON_IsObject(j) ? "an object" : "not a number";
}

// Reads an integer field. Absent or null -> *out = def (TD_ERR_FORMAT naming it if required).
// A shape field (SHAPE_RANGE) must lie in [1, cap], any other in int32's range; the message says
// which of wrong type, not an integer, or out of range (with the range).
static td_status json_int(const cJSON *o, const char *key, int required, int def, int *out, const char *what,
                          td_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        if (required) return td_err_set(err, TD_ERR_FORMAT, "%s: missing %s", what, key);
        *out = def;
        return TD_OK;
    }
    if (!cJSON_IsNumber(j))
        return td_err_set(err, TD_ERR_FORMAT, "%s: %s must be an integer, not %s", what, key, json_type_name(j));
    const double v = j->valuedouble;
    const int cap = shape_cap(key);
    const double lo = cap ? 1 : -2147483648.0, hi = cap ? cap : 2147483647.0;
    if (isfinite(v) && v == floor(v) && (v < lo || v > hi))
        return td_err_set(err, TD_ERR_FORMAT, "%s: %s: %.17g is out of range [%.0f, %.0f]", what, key, v, lo, hi);
    if (v != floor(v) || !isfinite(v))
        return td_err_set(err, TD_ERR_FORMAT, "%s: %s: %.17g must be an integer", what, key, v);
    *out = (int)v;
    return TD_OK;
}

static td_status json_float(const cJSON *o, const char *key, int required, float def, float *out,
                            const char *what, td_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        if (required) return td_err_set(err, TD_ERR_FORMAT, "%s: missing %s", what, key);
        *out = def;
        return TD_OK;
    }
    if (!cJSON_IsNumber(j) || !isfinite(j->valuedouble))
        return td_err_set(err, TD_ERR_FORMAT, "%s: %s must be a number", what, key);
    *out = (float)j->valuedouble;
    return TD_OK;
}

static td_status json_bool(const cJSON *o, const char *key, bool def, bool *out, const char *what, td_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!j || cJSON_IsNull(j)) {
        *out = def;
        return TD_OK;
    }
    if (!cJSON_IsBool(j)) return td_err_set(err, TD_ERR_FORMAT, "%s: %s must be true or false", what, key);
    *out = cJSON_IsTrue(j);
    return TD_OK;
}

// eos_token_id: an int, a list of ints, or null. Appends to c's eos list.
static td_status json_eos(td_model_config *c, const cJSON *o, const char *what, td_err *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, "eos_token_id");
    if (!j || cJSON_IsNull(j)) return TD_OK;
    if (cJSON_IsNumber(j)) {
        int v;
        td_status s = json_int(o, "eos_token_id", 0, -1, &v, what, err);
        if (s) return s;
        add_eos(c, v);
        return TD_OK;
    }
    if (!cJSON_IsArray(j)) return td_err_set(err, TD_ERR_FORMAT, "%s: eos_token_id must be an integer or a list", what);
    const cJSON *x;
    cJSON_ArrayForEach(x, j) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble > 2147483647.0)
            return td_err_set(err, TD_ERR_FORMAT, "%s: eos_token_id list holds a non-integer", what);
        add_eos(c, (int64_t)x->valuedouble);
    }
    return TD_OK;
}

static td_status parse_arch(td_model_config *c, const cJSON *root, const char *what, td_err *err) {
    static const struct { const char *model_type, *cls; td_arch a; } archs[] = {
        {"llama", "LlamaForCausalLM", TD_ARCH_LLAMA},
        {"mistral", "MistralForCausalLM", TD_ARCH_MISTRAL},
        {"qwen2", "Qwen2ForCausalLM", TD_ARCH_QWEN2},
        {"qwen3", "Qwen3ForCausalLM", TD_ARCH_QWEN3},
    };
    const cJSON *mt = cJSON_GetObjectItemCaseSensitive(root, "model_type");
    if (cJSON_IsString(mt)) {
        for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
            if (strcmp(mt->valuestring, archs[i].model_type) == 0) {
                c->arch = archs[i].a;
                return TD_OK;
            }
        return td_err_set(err, TD_ERR_UNSUPPORTED,
                          "%s: model_type \"%.100s\" is not supported (llama, mistral, qwen2, qwen3)", what,
                          mt->valuestring);
    }
    if (mt && !cJSON_IsNull(mt)) return td_err_set(err, TD_ERR_FORMAT, "%s: model_type must be a string", what);
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    const cJSON *a0 = cJSON_IsArray(ar) ? cJSON_GetArrayItem(ar, 0) : NULL;
    if (!cJSON_IsString(a0))
        return td_err_set(err, TD_ERR_FORMAT, "%s: neither model_type nor architectures names the model", what);
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strcmp(a0->valuestring, archs[i].cls) == 0) {
            c->arch = archs[i].a;
            return TD_OK;
        }
    return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: architecture \"%.100s\" is not supported "
                      "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)", what,
                      a0->valuestring);
}

static td_status parse_rope_scaling(td_model_config *c, const cJSON *root, const char *what, td_err *err) {
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(root, "rope_scaling");
    c->rope_scaling = TD_ROPE_SCALING_NONE;
    if (!rs || cJSON_IsNull(rs)) return TD_OK;
    if (!cJSON_IsObject(rs)) return td_err_set(err, TD_ERR_FORMAT, "%s: rope_scaling must be an object or null", what);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) return td_err_set(err, TD_ERR_FORMAT, "%s: rope_scaling has no rope_type", what);
    const char *ty = t->valuestring;
    td_status s;
    char w[300];
    snprintf(w, sizeof w, "%s: rope_scaling", what);
    if (strcmp(ty, "default") == 0) return TD_OK;
    if (strcmp(ty, "linear") == 0) {
        c->rope_scaling = TD_ROPE_SCALING_LINEAR;
        return json_float(rs, "factor", 1, 1, &c->rope_factor, w, err);
    }
    if (strcmp(ty, "llama3") == 0) {
        c->rope_scaling = TD_ROPE_SCALING_LLAMA3;
        if ((s = json_float(rs, "factor", 1, 1, &c->rope_factor, w, err)) ||
            (s = json_float(rs, "low_freq_factor", 1, 1, &c->rope_low_freq_factor, w, err)) ||
            (s = json_float(rs, "high_freq_factor", 1, 4, &c->rope_high_freq_factor, w, err)) ||
            (s = json_int(rs, "original_max_position_embeddings", 1, 8192, &c->rope_orig_max_pos, w, err)))
            return s;
        return TD_OK;
    }
    return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: rope_scaling type \"%.100s\" is not supported (linear, llama3)",
                      what, ty);
}

td_status td_config_from_hf_json(td_model_config *c, const char *json, size_t len, const char *what,
                                 td_err *err) {
    td_model_config_init(c);
    if (!what) what = "config.json";
    cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!root) return td_err_set(err, TD_ERR_FORMAT, "%s: malformed JSON", what);
    td_status s;
    if (!cJSON_IsObject(root)) {
        s = td_err_set(err, TD_ERR_FORMAT, "%s: not a JSON object", what);
        goto done;
    }
    if ((s = parse_arch(c, root, what, err))) goto done;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(root, "hidden_act");
    if (act && !cJSON_IsNull(act) && !(cJSON_IsString(act) && strcmp(act->valuestring, "silu") == 0)) {
        s = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: hidden_act %.60s is not supported (silu)", what,
                       cJSON_IsString(act) ? act->valuestring : "(not a string)");
        goto done;
    }
    int max_pos_def = c->arch == TD_ARCH_LLAMA ? 2048 : c->arch == TD_ARCH_MISTRAL ? 131072 : 32768;
    if ((s = json_int(root, "vocab_size", 1, 0, &c->vocab_size, what, err)) ||
        (s = json_int(root, "hidden_size", 1, 0, &c->dim, what, err)) ||
        (s = json_int(root, "num_hidden_layers", 1, 0, &c->n_layers, what, err)) ||
        (s = json_int(root, "num_attention_heads", 1, 0, &c->n_heads, what, err)) ||
        (s = json_int(root, "num_key_value_heads", 0, c->n_heads, &c->n_kv_heads, what, err)) ||
        (s = json_int(root, "intermediate_size", 1, 0, &c->ffn_dim, what, err)) ||
        (s = json_int(root, "max_position_embeddings", 0, max_pos_def, &c->max_pos, what, err)) ||
        (s = json_float(root, "rms_norm_eps", 0, 1e-6f, &c->norm_eps, what, err)) ||
        (s = json_float(root, "rope_theta", 0, 10000.0f, &c->rope_theta, what, err)) ||
        (s = json_bool(root, "tie_word_embeddings", false, &c->tie_embeddings, what, err)) ||
        (s = json_int(root, "bos_token_id", 0, -1, &c->bos_id, what, err)) ||
        (s = json_eos(c, root, what, err)) || (s = parse_rope_scaling(c, root, what, err)))
        goto done;
    if (c->n_heads <= 0) {
        s = td_err_set(err, TD_ERR_FORMAT, "%s: num_attention_heads must be positive", what);
        goto done;
    }
    if ((s = json_int(root, "head_dim", 0, c->dim / c->n_heads, &c->head_dim, what, err))) goto done;

    // Biases: Qwen2 always has q/k/v bias. Llama's and Qwen3's attention_bias also puts a bias on
    // o_proj, which the model does not carry, so it is refused rather than silently dropped.
    bool attn_bias = false, mlp_bias = false;
    if ((s = json_bool(root, "attention_bias", false, &attn_bias, what, err)) ||
        (s = json_bool(root, "mlp_bias", false, &mlp_bias, what, err)))
        goto done;
    if ((attn_bias && c->arch != TD_ARCH_QWEN2) || mlp_bias) {
        s = td_err_set(err, TD_ERR_UNSUPPORTED, "%s: %s=true is not supported", what,
                       mlp_bias ? "mlp_bias" : "attention_bias");
        goto done;
    }
    c->qkv_bias = c->arch == TD_ARCH_QWEN2;
    c->qk_norm = c->arch == TD_ARCH_QWEN3;
    c->rope_style = TD_ROPE_NEOX;

    // Sliding window: Qwen configs carry a window even when use_sliding_window is false.
    bool use_sw = true;
    if ((s = json_bool(root, "use_sliding_window", c->arch != TD_ARCH_QWEN2 && c->arch != TD_ARCH_QWEN3, &use_sw,
                       what, err)) ||
        (s = json_int(root, "sliding_window", 0, 0, &c->sliding_window, what, err)))
        goto done;
    if (!use_sw || c->sliding_window < 0) c->sliding_window = 0;
    if (c->bos_id < 0) c->bos_id = -1;
    s = TD_OK;
done:
    cJSON_Delete(root);
    return s;
}

td_status td_config_merge_generation_json(td_model_config *c, const char *json, size_t len, const char *what,
                                          td_err *err) {
    if (!what) what = "generation_config.json";
    cJSON *root = json ? cJSON_ParseWithLength(json, len) : NULL;
    if (!root) return td_err_set(err, TD_ERR_FORMAT, "%s: malformed JSON", what);
    td_status s = TD_OK;
    int bos = c->bos_id;
    if (!cJSON_IsObject(root)) {
        s = td_err_set(err, TD_ERR_FORMAT, "%s: not a JSON object", what);
    } else if (!(s = json_int(root, "bos_token_id", 0, c->bos_id, &bos, what, err)) &&
               !(s = json_eos(c, root, what, err)) &&
               !(s = json_float(root, "temperature", 0, c->gen_temperature, &c->gen_temperature, what, err)) &&
               !(s = json_float(root, "top_p", 0, c->gen_top_p, &c->gen_top_p, what, err)) &&
               !(s = json_int(root, "top_k", 0, c->gen_top_k, &c->gen_top_k, what, err)) &&
               !(s = json_float(root, "min_p", 0, c->gen_min_p, &c->gen_min_p, what, err))) {
        c->bos_id = bos >= 0 ? bos : c->bos_id;
    }
    cJSON_Delete(root);
    return s;
}

// ---- GGUF metadata ------------------------------------------------------------------------

static int gguf_has_tensor(const td_gguf *g, const char *name) {
    td_tensor t;
    return td_gguf_get_tensor(g, name, &t, NULL) != TD_ERR_NOT_FOUND;
}

// Reads "{arch}.{suffix}" as an int; absent -> def (error if required).
static td_status gg_int(const td_gguf *g, const char *arch, const char *suffix, int required, int def, int *out,
                        td_err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int64_t v;
    td_status s = td_gguf_get_i64(g, key, &v, err);
    if (s == TD_ERR_NOT_FOUND && !required) {
        *out = def;
        return TD_OK;
    }
    if (s) return s;
    if (v < INT32_MIN || v > INT32_MAX)
        return td_err_set(err, TD_ERR_FORMAT, "%s: %s: %" PRId64 " is out of range [%d, %d]", td_gguf_path(g), key, v,
                          INT32_MIN, INT32_MAX);
    *out = (int)v;
    return TD_OK;
}

static td_status gg_float(const td_gguf *g, const char *arch, const char *suffix, float def, float *out,
                          td_err *err) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    td_status s = td_gguf_get_f32(g, key, out, err);
    if (s == TD_ERR_NOT_FOUND) {
        *out = def;
        return TD_OK;
    }
    return s;
}

static td_status gg_token(const td_gguf *g, const char *key, int64_t *out, td_err *err) {
    td_status s = td_gguf_get_i64(g, key, out, err);
    if (s == TD_ERR_NOT_FOUND) {
        *out = -1;
        return TD_OK;
    }
    return s;
}

td_status td_config_from_gguf(td_model_config *c, const td_gguf *g, td_err *err) {
    td_model_config_init(c);
    const char *what = td_gguf_path(g);
    td_gguf_str a;
    td_status s = td_gguf_get_str(g, "general.architecture", &a, err);
    if (s) return s;
    char arch[64];
    snprintf(arch, sizeof arch, "%.*s", (int)(a.len < 63 ? a.len : 63), a.ptr);
    if (strcmp(arch, "llama") == 0) c->arch = TD_ARCH_LLAMA, c->rope_style = TD_ROPE_NORM;
    else if (strcmp(arch, "qwen2") == 0) c->arch = TD_ARCH_QWEN2, c->rope_style = TD_ROPE_NEOX;
    else if (strcmp(arch, "qwen3") == 0) c->arch = TD_ARCH_QWEN3, c->rope_style = TD_ROPE_NEOX;
    else
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: architecture \"%s\" is not supported (llama, qwen2, qwen3)",
                          what, arch);
    int rope_dims = 0;
    if ((s = gg_int(g, arch, "context_length", 1, 0, &c->max_pos, err)) ||
        (s = gg_int(g, arch, "embedding_length", 1, 0, &c->dim, err)) ||
        (s = gg_int(g, arch, "block_count", 1, 0, &c->n_layers, err)) ||
        (s = gg_int(g, arch, "feed_forward_length", 1, 0, &c->ffn_dim, err)) ||
        (s = gg_int(g, arch, "attention.head_count", 1, 0, &c->n_heads, err)) ||
        (s = gg_int(g, arch, "attention.head_count_kv", 0, c->n_heads, &c->n_kv_heads, err)) ||
        (s = gg_float(g, arch, "attention.layer_norm_rms_epsilon", 1e-5f, &c->norm_eps, err)) ||
        (s = gg_float(g, arch, "rope.freq_base", 10000.0f, &c->rope_theta, err)) ||
        (s = gg_int(g, arch, "attention.sliding_window", 0, 0, &c->sliding_window, err)))
        return s;
    if (c->n_heads <= 0) return td_err_set(err, TD_ERR_FORMAT, "%s: %s.attention.head_count must be positive", what, arch);
    if ((s = gg_int(g, arch, "attention.key_length", 0, c->dim / c->n_heads, &c->head_dim, err)) ||
        (s = gg_int(g, arch, "rope.dimension_count", 0, c->head_dim, &rope_dims, err)))
        return s;
    if (rope_dims != c->head_dim)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: partial rotary embedding (%s.rope.dimension_count %d, "
                          "head dim %d) is not supported", what, arch, rope_dims, c->head_dim);
    int vlen = c->head_dim;
    if ((s = gg_int(g, arch, "attention.value_length", 0, c->head_dim, &vlen, err))) return s;
    if (vlen != c->head_dim)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: value_length %d != key_length %d is not supported", what,
                          vlen, c->head_dim);

    // RoPE scaling. llama3-style scaling travels as the rope_freqs.weight tensor (loaded into
    // model->rope_freqs), so cfg keeps NONE for it.
    char key[160];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    td_gguf_str st;
    s = td_gguf_get_str(g, key, &st, err);
    if (s && s != TD_ERR_NOT_FOUND) return s;
    if (s == TD_OK && !(st.len == 4 && memcmp(st.ptr, "none", 4) == 0)) {
        if (st.len == 6 && memcmp(st.ptr, "linear", 6) == 0) {
            c->rope_scaling = TD_ROPE_SCALING_LINEAR;
            if ((s = gg_float(g, arch, "rope.scaling.factor", 1.0f, &c->rope_factor, err))) return s;
        } else if (!(st.len == 6 && memcmp(st.ptr, "llama3", 6) == 0 && gguf_has_tensor(g, "rope_freqs.weight"))) {
            return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: rope scaling type \"%.*s\" is not supported (linear)",
                              what, (int)(st.len > 60 ? 60 : st.len), st.ptr);
        }
    }
    if ((s = gg_int(g, arch, "rope.scaling.original_context_length", 0, 0, &c->rope_orig_max_pos, err))) return s;

    // Vocabulary size: explicit key, else the token list, else the embedding rows.
    snprintf(key, sizeof key, "%s.vocab_size", arch);
    if (td_gguf_find_key(g, key) >= 0) {
        if ((s = gg_int(g, arch, "vocab_size", 1, 0, &c->vocab_size, err))) return s;
    } else {
        int64_t ti = td_gguf_find_key(g, "tokenizer.ggml.tokens");
        if (ti >= 0 && td_gguf_kv_type(g, ti) == TD_GGUF_ARRAY && td_gguf_arr_len(g, ti) <= INT32_MAX) {
            c->vocab_size = (int)td_gguf_arr_len(g, ti);
        } else {
            td_tensor t;
            if (td_gguf_get_tensor(g, "token_embd.weight", &t, NULL) == TD_OK && t.ndim == 2 && t.ne[0] <= INT32_MAX)
                c->vocab_size = (int)t.ne[0];
        }
    }

    int64_t id;
    if ((s = gg_token(g, "tokenizer.ggml.bos_token_id", &id, err))) return s;
    c->bos_id = id >= 0 && id <= INT32_MAX ? (int)id : -1;
    static const char *eos_keys[] = {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                                     "tokenizer.ggml.eom_token_id"};
    for (size_t i = 0; i < sizeof eos_keys / sizeof eos_keys[0]; i++) {
        if ((s = gg_token(g, eos_keys[i], &id, err))) return s;
        add_eos(c, id);
    }

    c->qkv_bias = gguf_has_tensor(g, "blk.0.attn_q.bias");
    c->qk_norm = gguf_has_tensor(g, "blk.0.attn_q_norm.weight");
    c->tie_embeddings = !gguf_has_tensor(g, "output.weight");
    return TD_OK;
}

// ---- validation ---------------------------------------------------------------------------

td_status td_config_validate(const td_model_config *c, const char *what, td_err *err) {
    if (!what) what = "config";
    const int v[] = {c->vocab_size, c->dim,     c->n_layers, c->n_heads,
                     c->n_kv_heads, c->head_dim, c->ffn_dim,  c->max_pos};  // SHAPE_RANGE's order
    for (size_t i = 0; i < sizeof SHAPE_RANGE / sizeof SHAPE_RANGE[0]; i++)
        if (v[i] <= 0 || v[i] > SHAPE_RANGE[i].cap)
            return td_err_set(err, TD_ERR_INVALID, "%s: %s: %d is out of range [1, %d]", what, SHAPE_RANGE[i].name,
                              v[i], SHAPE_RANGE[i].cap);
    if (c->n_heads % c->n_kv_heads)
        return td_err_set(err, TD_ERR_INVALID, "%s: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                          what, c->n_heads, c->n_kv_heads);
    if (c->head_dim % 2)
        return td_err_set(err, TD_ERR_INVALID, "%s: head_dim %d must be even (RoPE pairs)", what, c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > SHAPE_CAP)
        return td_err_set(err, TD_ERR_INVALID, "%s: heads * head_dim too large", what);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return td_err_set(err, TD_ERR_INVALID, "%s: rms_norm_eps %g must be positive", what, c->norm_eps);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return td_err_set(err, TD_ERR_INVALID, "%s: rope_theta %g must be positive", what, c->rope_theta);
    if (c->rope_scaling != TD_ROPE_SCALING_NONE && (!(c->rope_factor > 0) || !isfinite(c->rope_factor)))
        return td_err_set(err, TD_ERR_INVALID, "%s: rope_scaling factor %g must be positive", what, c->rope_factor);
    if (c->rope_scaling == TD_ROPE_SCALING_LLAMA3) {
        if (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
            c->rope_orig_max_pos <= 0)
            return td_err_set(err, TD_ERR_INVALID, "%s: llama3 rope_scaling needs 0 < low_freq_factor (%g) < "
                              "high_freq_factor (%g) and original_max_position_embeddings > 0 (%d)", what,
                              c->rope_low_freq_factor, c->rope_high_freq_factor, c->rope_orig_max_pos);
    }
    if (c->bos_id >= c->vocab_size)
        return td_err_set(err, TD_ERR_INVALID, "%s: bos_token_id %d outside the vocabulary (%d)", what, c->bos_id,
                          c->vocab_size);
    if (c->n_eos < 0 || c->n_eos > TD_MAX_EOS) return td_err_set(err, TD_ERR_INVALID, "%s: bad eos count", what);
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] < 0 || c->eos_ids[i] >= c->vocab_size)
            return td_err_set(err, TD_ERR_INVALID, "%s: eos_token_id %d outside the vocabulary (%d)", what,
                              c->eos_ids[i], c->vocab_size);
    if (c->sliding_window < 0)
        return td_err_set(err, TD_ERR_INVALID, "%s: sliding_window %d negative", what, c->sliding_window);
    return TD_OK;
}
