// td_model_load: a Hugging Face directory (config.json + model.safetensors or index-sharded
// safetensors) or a GGUF file -> td_model whose tensors are views into the mapped files.
// Every tensor's presence, shape and dtype is checked against the config here, so the forward can
// trust them. Not a converter: weights keep their stored dtype (and GGUF llama's Q/K row order).
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "format/gguf.h"
#include "format/safetensors.h"
#include "model/model.h"

#define MAX_JSON_BYTES (64u << 20)  // config/index JSON larger than this is refused

// Loader-private state behind td_model.impl: what the tensor views point into.
typedef struct {
    td_gguf *gguf;        // GGUF source, or NULL
    td_st_file **shards;  // [n_shards] safetensors files, each mapped once
    char **shard_names;   // [n_shards] file names as in the index (or "model.safetensors")
    int n_shards;
    void **bufs;          // [n_bufs] aligned copies of tensors whose mapped data was misaligned
    int n_bufs;
} loader_impl;

static void impl_free(loader_impl *im) {
    if (!im) return;
    td_gguf_close(im->gguf);
    for (int i = 0; i < im->n_shards; i++) {
        td_st_close(im->shards[i]);
        free(im->shard_names[i]);
    }
    free(im->shards);
    free(im->shard_names);
    for (int i = 0; i < im->n_bufs; i++) free(im->bufs[i]);
    free(im->bufs);
    free(im);
}

void td_model_free(td_model *m) {
    if (!m) return;
    impl_free(m->impl);
    free(m->layers);
    free(m->path);
    free(m->tokenizer_path);
    free(m);
}

// ---- tensor source ------------------------------------------------------------------------

typedef struct {
    loader_impl *im;
    const cJSON *weight_map;  // sharded HF: name -> shard file name; NULL otherwise
} source;

// Fetches a tensor by name from whichever file holds it; *file names that file for messages.
static td_status src_get(const source *s, const char *name, td_tensor *t, const char **file, td_err *err) {
    loader_impl *im = s->im;
    if (im->gguf) {
        *file = td_gguf_path(im->gguf);
        return td_gguf_get_tensor(im->gguf, name, t, err);
    }
    int k = 0;
    if (s->weight_map) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(s->weight_map, name);
        k = -1;
        if (cJSON_IsString(f))
            for (int i = 0; i < im->n_shards; i++)
                if (strcmp(im->shard_names[i], f->valuestring) == 0) k = i;
        if (k < 0) {
            // Not in the index: look through every shard before giving up.
            for (int i = 0; i < im->n_shards; i++) {
                *file = im->shard_names[i];
                td_status st = td_st_get(im->shards[i], name, t, err);
                if (st != TD_ERR_NOT_FOUND) return st;
            }
            *file = "model.safetensors.index.json";
            return td_err_set(err, TD_ERR_NOT_FOUND, "model.safetensors.index.json: tensor %s not found", name);
        }
    }
    *file = im->shard_names[k];
    return td_st_get(im->shards[k], name, t, err);
}

static void shape_str(char *buf, size_t cap, int nd, const int64_t *ne) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < nd && o < cap; d++) o += (size_t)snprintf(buf + o, cap - o, "%s%" PRId64, d ? ", " : "", ne[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

// Element alignment a dtype's data needs (bytes); quantized blocks start with an f16 scale.
static size_t dtype_align(td_dtype t) { return t == TD_F32 ? 4 : 2; }

// Loads `name` into *out and checks it: shape [r] (c == 0) or [r, c]; vectors must be float types,
// matrices may be quantized when c is a multiple of the block. Optional tensors may be absent.
static td_status want(const source *s, const char *name, int required, int64_t r, int64_t c, td_tensor *out,
                      td_err *err) {
    const char *file = "";
    td_tensor t;
    td_status st = src_get(s, name, &t, &file, err);
    if (st == TD_ERR_NOT_FOUND) {
        memset(out, 0, sizeof *out);
        if (!required) return TD_OK;
        return td_err_set(err, TD_ERR_NOT_FOUND, "%s: tensor %s is missing", file, name);
    }
    if (st) return st;
    int nd = c ? 2 : 1;
    int64_t ne[2] = {r, c};
    if (t.ndim != nd || t.ne[0] != r || (nd == 2 && t.ne[1] != c)) {
        char got[128], exp[128];
        shape_str(got, sizeof got, t.ndim, t.ne);
        shape_str(exp, sizeof exp, nd, ne);
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s has shape %s, expected %s", file, name, got, exp);
    }
    if (nd == 1 && t.type != TD_F32 && t.type != TD_F16 && t.type != TD_BF16)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s, expected F32, F16 or BF16",
                          file, name, td_dtype_name(t.type));
    if (nd == 2 && td_row_bytes(t.type, c) == 0)
        return td_err_set(err, TD_ERR_FORMAT, "%s: tensor %s: %s needs the inner dimension %" PRId64
                          " to be a multiple of %d", file, name, td_dtype_name(t.type), c,
                          td_dtype_block(t.type));
    if ((uintptr_t)t.data % dtype_align(t.type)) {
        // Misaligned in the file (a header not padded to 8): one aligned copy, owned by the model.
        loader_impl *im = s->im;
        void **nb = realloc(im->bufs, (size_t)(im->n_bufs + 1) * sizeof *nb);
        if (!nb) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
        im->bufs = nb;
        void *p = malloc(t.nbytes ? t.nbytes : 1);
        if (!p) return td_err_set(err, TD_ERR_NOMEM, "%s: out of memory copying %s", file, name);
        memcpy(p, t.data, t.nbytes);
        im->bufs[im->n_bufs++] = p;
        t.data = p;
    }
    *out = t;
    return TD_OK;
}

// Per-layer tensors: HF and GGUF names, where they go, shape, and when they exist.
enum { SZ_DIM, SZ_Q, SZ_KV, SZ_FFN, SZ_HD, SZ_NONE };
enum { IF_ALWAYS, IF_BIAS, IF_QKNORM };
static const struct {
    const char *hf, *gguf;
    size_t off;
    int rows, cols, cond;
} LAYER_TENSORS[] = {
    {"input_layernorm.weight", "attn_norm.weight", offsetof(td_layer_weights, attn_norm), SZ_DIM, SZ_NONE, IF_ALWAYS},
    {"self_attn.q_proj.weight", "attn_q.weight", offsetof(td_layer_weights, wq), SZ_Q, SZ_DIM, IF_ALWAYS},
    {"self_attn.k_proj.weight", "attn_k.weight", offsetof(td_layer_weights, wk), SZ_KV, SZ_DIM, IF_ALWAYS},
    {"self_attn.v_proj.weight", "attn_v.weight", offsetof(td_layer_weights, wv), SZ_KV, SZ_DIM, IF_ALWAYS},
    {"self_attn.o_proj.weight", "attn_output.weight", offsetof(td_layer_weights, wo), SZ_DIM, SZ_Q, IF_ALWAYS},
    {"self_attn.q_proj.bias", "attn_q.bias", offsetof(td_layer_weights, bq), SZ_Q, SZ_NONE, IF_BIAS},
    {"self_attn.k_proj.bias", "attn_k.bias", offsetof(td_layer_weights, bk), SZ_KV, SZ_NONE, IF_BIAS},
    {"self_attn.v_proj.bias", "attn_v.bias", offsetof(td_layer_weights, bv), SZ_KV, SZ_NONE, IF_BIAS},
    {"self_attn.q_norm.weight", "attn_q_norm.weight", offsetof(td_layer_weights, q_norm), SZ_HD, SZ_NONE, IF_QKNORM},
    {"self_attn.k_norm.weight", "attn_k_norm.weight", offsetof(td_layer_weights, k_norm), SZ_HD, SZ_NONE, IF_QKNORM},
    {"post_attention_layernorm.weight", "ffn_norm.weight", offsetof(td_layer_weights, ffn_norm), SZ_DIM, SZ_NONE, IF_ALWAYS},
    {"mlp.gate_proj.weight", "ffn_gate.weight", offsetof(td_layer_weights, w_gate), SZ_FFN, SZ_DIM, IF_ALWAYS},
    {"mlp.up_proj.weight", "ffn_up.weight", offsetof(td_layer_weights, w_up), SZ_FFN, SZ_DIM, IF_ALWAYS},
    {"mlp.down_proj.weight", "ffn_down.weight", offsetof(td_layer_weights, w_down), SZ_DIM, SZ_FFN, IF_ALWAYS},
};

static int64_t size_of(const td_model_config *c, int which) {
    switch (which) {
    case SZ_DIM: return c->dim;
    case SZ_Q: return (int64_t)c->n_heads * c->head_dim;
    case SZ_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case SZ_FFN: return c->ffn_dim;
    case SZ_HD: return c->head_dim;
    default: return 0;
    }
}

static td_status load_tensors(td_model *m, const source *s, int gguf, td_err *err) {
    const td_model_config *c = &m->cfg;
    td_status st;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);  // n_layers validated positive
    if (!m->layers) return td_err_set(err, TD_ERR_NOMEM, "out of memory for %d layers", c->n_layers);
    if ((st = want(s, gguf ? "token_embd.weight" : "model.embed_tokens.weight", 1, c->vocab_size, c->dim,
                   &m->tok_embd, err)) ||
        (st = want(s, gguf ? "output_norm.weight" : "model.norm.weight", 1, c->dim, 0, &m->out_norm, err)))
        return st;
    if (c->tie_embeddings) {
        m->output = m->tok_embd;
    } else if ((st = want(s, gguf ? "output.weight" : "lm_head.weight", 1, c->vocab_size, c->dim, &m->output, err))) {
        if (st == TD_ERR_NOT_FOUND) td_err_prefix(err, "model is not tied (tie_word_embeddings false)");
        return st;
    }
    if (gguf && (st = want(s, "rope_freqs.weight", 0, c->head_dim / 2, 0, &m->rope_freqs, err))) return st;
    if (gguf && td_tensor_present(&m->rope_freqs) && m->rope_freqs.type != TD_F32)
        return td_err_set(err, TD_ERR_UNSUPPORTED, "%s: rope_freqs.weight must be F32", td_gguf_path(s->im->gguf));
    char name[160];
    for (int l = 0; l < c->n_layers; l++) {
        td_layer_weights *lw = &m->layers[l];
        for (size_t k = 0; k < sizeof LAYER_TENSORS / sizeof LAYER_TENSORS[0]; k++) {
            int cond = LAYER_TENSORS[k].cond;
            if ((cond == IF_BIAS && !c->qkv_bias) || (cond == IF_QKNORM && !c->qk_norm)) continue;
            if (gguf) snprintf(name, sizeof name, "blk.%d.%s", l, LAYER_TENSORS[k].gguf);
            else snprintf(name, sizeof name, "model.layers.%d.%s", l, LAYER_TENSORS[k].hf);
            td_tensor *dst = (td_tensor *)((char *)lw + LAYER_TENSORS[k].off);
            if ((st = want(s, name, 1, size_of(c, LAYER_TENSORS[k].rows), size_of(c, LAYER_TENSORS[k].cols), dst, err)))
                return st;
        }
    }
    return TD_OK;
}

// ---- Hugging Face directory ---------------------------------------------------------------

static td_status read_json_file(const char *dir, const char *name, char **text, size_t *len, td_err *err) {
    char p[4096];
    if (!td_path_join(p, sizeof p, dir, name)) return td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
    if (!td_file_exists(p)) return td_err_set(err, TD_ERR_NOT_FOUND, "%s: %s not found", dir, name);
    return td_read_file(p, MAX_JSON_BYTES, text, len, err);
}

static int safe_shard_name(const char *n) {
    return n[0] && n[0] != '.' && !strchr(n, '/') && !strchr(n, '\\') && strlen(n) < 256;
}

static td_status add_shard(loader_impl *im, const char *dir, const char *fname, td_err *err) {
    for (int i = 0; i < im->n_shards; i++)
        if (strcmp(im->shard_names[i], fname) == 0) return TD_OK;  // each shard mapped once
    char p[4096];
    if (!td_path_join(p, sizeof p, dir, fname)) return td_err_set(err, TD_ERR_INVALID, "%s: path too long", dir);
    td_st_file **ns = realloc(im->shards, (size_t)(im->n_shards + 1) * sizeof *ns);
    if (!ns) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    im->shards = ns;
    char **nn = realloc(im->shard_names, (size_t)(im->n_shards + 1) * sizeof *nn);
    if (!nn) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    im->shard_names = nn;
    char *name = strdup(fname);
    if (!name) return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    td_st_file *f;
    td_status st = td_st_open(p, &f, err);
    if (st) {
        free(name);
        return st;
    }
    im->shards[im->n_shards] = f;
    im->shard_names[im->n_shards] = name;
    im->n_shards++;
    return TD_OK;
}

static td_status load_hf(td_model *m, const char *dir, td_err *err) {
    char *text = NULL;
    size_t len = 0;
    td_status st = read_json_file(dir, "config.json", &text, &len, err);
    if (st) return st;
    st = td_config_from_hf_json(&m->cfg, text, len, "config.json", err);
    free(text);
    if (st) return td_err_prefix(err, "%s", dir);

    char p[4096];
    if (td_path_join(p, sizeof p, dir, "generation_config.json") && td_file_exists(p)) {
        if ((st = td_read_file(p, MAX_JSON_BYTES, &text, &len, err))) return st;
        st = td_config_merge_generation_json(&m->cfg, text, len, "generation_config.json", err);
        free(text);
        if (st) return td_err_prefix(err, "%s", dir);
    }
    if ((st = td_config_validate(&m->cfg, "config.json", err))) return td_err_prefix(err, "%s", dir);

    loader_impl *im = m->impl;
    source src = {im, NULL};
    cJSON *index = NULL;
    if (td_path_join(p, sizeof p, dir, "model.safetensors.index.json") && td_file_exists(p)) {
        if ((st = td_read_file(p, MAX_JSON_BYTES, &text, &len, err))) return st;
        index = cJSON_ParseWithLength(text, len);
        free(text);
        const cJSON *wm = index ? cJSON_GetObjectItemCaseSensitive(index, "weight_map") : NULL;
        if (!cJSON_IsObject(wm)) {
            cJSON_Delete(index);
            return td_err_set(err, TD_ERR_FORMAT, "%s: model.safetensors.index.json: %s", dir,
                              index ? "no weight_map object" : "malformed JSON");
        }
        const cJSON *e;
        cJSON_ArrayForEach(e, wm) {
            if (!cJSON_IsString(e) || !safe_shard_name(e->valuestring)) {
                st = td_err_set(err, TD_ERR_FORMAT, "%s: model.safetensors.index.json: tensor %.200s maps to a "
                                "bad file name", dir, e->string);
                break;
            }
            if ((st = add_shard(im, dir, e->valuestring, err))) break;
        }
        if (!st && im->n_shards == 0) st = td_err_set(err, TD_ERR_FORMAT, "%s: empty weight_map", dir);
        src.weight_map = wm;
    } else if (td_path_join(p, sizeof p, dir, "model.safetensors") && td_file_exists(p)) {
        st = add_shard(im, dir, "model.safetensors", err);
    } else {
        return td_err_set(err, TD_ERR_NOT_FOUND, "%s: neither model.safetensors nor model.safetensors.index.json found",
                          dir);
    }
    // Messages from the readers carry the shard's full path; the loader's own name the shard only.
    if (!st && (st = load_tensors(m, &src, 0, err)) && err && strncmp(err->msg, dir, strlen(dir)) != 0)
        td_err_prefix(err, "%s", dir);
    cJSON_Delete(index);
    return st;
}

// ---- GGUF ---------------------------------------------------------------------------------

static td_status load_gguf(td_model *m, const char *path, td_err *err) {
    loader_impl *im = m->impl;
    td_status st = td_gguf_open(path, &im->gguf, err);
    if (st) return st;
    if ((st = td_config_from_gguf(&m->cfg, im->gguf, err)) ||
        (st = td_config_validate(&m->cfg, path, err)))
        return st;
    source src = {im, NULL};
    return load_tensors(m, &src, 1, err);
}

static int looks_like_gguf(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char magic[4] = {0};
    size_t n = fread(magic, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(magic, "GGUF", 4) == 0;
}

td_status td_model_load(const char *path, td_model **out, td_err *err) {
    *out = NULL;
    if (!path || !*path) return td_err_set(err, TD_ERR_INVALID, "model path is empty");
    int is_dir = td_is_dir(path);
    size_t pl = strlen(path);
    int is_gguf = !is_dir && (looks_like_gguf(path) || (pl > 5 && strcmp(path + pl - 5, ".gguf") == 0));
    if (!is_dir && !is_gguf) {
        if (!td_file_exists(path)) return td_err_set(err, TD_ERR_NOT_FOUND, "%s: no such file or directory", path);
        return td_err_set(err, TD_ERR_FORMAT, "%s: not a model directory (config.json + safetensors) nor a GGUF file",
                          path);
    }
    td_model *m = calloc(1, sizeof *m);
    loader_impl *im = calloc(1, sizeof *im);
    if (!m || !im) {
        free(m);
        free(im);
        return td_err_set(err, TD_ERR_NOMEM, "out of memory");
    }
    m->impl = im;
    m->path = strdup(path);
    m->tokenizer_path = strdup(path);
    td_status st = (!m->path || !m->tokenizer_path) ? td_err_set(err, TD_ERR_NOMEM, "out of memory") : TD_OK;
    if (!st) st = is_dir ? load_hf(m, path, err) : load_gguf(m, path, err);
    if (st) {
        td_model_free(m);
        return st;
    }
    *out = m;
    return TD_OK;
}
